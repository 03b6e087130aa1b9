//! The reporting handle of the Service reconcile (`report` runs step 5 with it): Events,
//! status writes, the per-Service metrics, and what it remembers between passes. It holds no
//! reconcile context, so the context can hold it.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;

use super::status::{self, DesiredStatus};
use crate::k8s::events::{EventRecorder, note_text};
use crate::metrics::Metrics;

/// The reporting side of the Service reconcile and what it remembers between passes.
pub struct Report {
    pub recorder: EventRecorder,
    pub metrics: Metrics,
    /// The server-side apply field manager of this controller's status writes
    /// (`crate::k8s::api::FIELD_MANAGER`, suffixed with the controller's name for another
    /// controller than the default one): clearing a Service's status removes only what this
    /// controller wrote, never what the controller now serving it wrote.
    pub field_manager: String,
    /// Per Service, the resourceVersion our last status write was based on: a reconcile that
    /// gets exactly that version again runs on a store that has not seen our write yet, and
    /// would only repeat it (with a 409 when it publishes an address). Skipped: the write's
    /// own watch event brings the current version right after.
    superseded: Mutex<HashMap<ObjectRef<Service>, String>>,
    /// Candidate endpoints left out per Service (loxilb's 32-per-rule limit), and their sum
    /// (kept as it changes, so that no reconcile sums over every Service).
    endpoints_dropped: Mutex<(HashMap<String, usize>, usize)>,
    /// The programming problem each Service was last warned about ([`Report::first_warning`]).
    warned: Mutex<HashMap<ObjectRef<Service>, String>>,
    /// Why each Service is not programmed (its `Programmed=False` reason), and how many
    /// Services have each reason: the metric alerts are based on.
    not_programmed: Mutex<NotProgrammed>,
}

/// Services whose `Programmed` condition is `False`, by reason, kept as they change.
#[derive(Default)]
struct NotProgrammed {
    reason_of: HashMap<String, String>,
    count_by_reason: HashMap<String, usize>,
}

impl NotProgrammed {
    /// Records the reason `key` is not programmed (`None`: it is, or it is gone) and returns
    /// the reasons whose count changed, with their new count.
    fn record(&mut self, key: &str, reason: Option<&str>) -> Vec<(String, usize)> {
        let before = match reason {
            Some(r) => self.reason_of.insert(key.to_string(), r.to_string()),
            None => self.reason_of.remove(key),
        };
        if before.as_deref() == reason {
            return Vec::new();
        }
        let mut changed = Vec::new();
        if let Some(old) = before {
            let n = self.count_by_reason.entry(old.clone()).or_default();
            *n = n.saturating_sub(1);
            changed.push((old, *n));
        }
        if let Some(new) = reason {
            let n = self.count_by_reason.entry(new.to_string()).or_default();
            *n += 1;
            changed.push((new.to_string(), *n));
        }
        changed
    }
}

impl Report {
    pub fn new(recorder: EventRecorder, metrics: Metrics, field_manager: String) -> Report {
        Report {
            recorder,
            metrics,
            field_manager,
            superseded: Mutex::default(),
            endpoints_dropped: Mutex::default(),
            warned: Mutex::default(),
            not_programmed: Mutex::default(),
        }
    }

    /// Publishes an Event on the Service; failing to do so is logged, never fatal.
    pub fn event(&self, svc: &Service, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note_text(&note)),
            action: action.to_string(),
            secondary: None,
        };
        self.recorder.publish(event, svc.object_ref(&()));
    }

    /// Writes `want` when the Service does not show it yet: the Service as written, if it
    /// was.
    pub async fn write_status(
        &self,
        api: &Api<Service>,
        svc: &Service,
        want: &DesiredStatus,
    ) -> kube::Result<Option<Service>> {
        if status::is_current(svc, want) {
            return Ok(None);
        }
        let written = status::write(api, svc, want, &self.field_manager).await?;
        if let Some(rv) = svc.metadata.resource_version.clone() {
            lock(&self.superseded).insert(ObjectRef::from_obj(svc), rv);
        }
        Ok(Some(written))
    }

    /// Whether `svc` is the very version our last status write was based on.
    pub fn is_superseded(&self, svc: &Service) -> bool {
        let Some(rv) = svc.metadata.resource_version.as_deref() else {
            return false;
        };
        lock(&self.superseded)
            .get(&ObjectRef::from_obj(svc))
            .is_some_and(|v| v == rv)
    }

    /// The Service is no longer ours: nothing remembered about it is kept.
    pub fn forget(&self, svc: &Service) {
        lock(&self.superseded).remove(&ObjectRef::from_obj(svc));
        self.record_dropped(&crate::k8s::view::owner_key(svc), 0);
        self.record_not_programmed(&crate::k8s::view::owner_key(svc), None);
    }

    /// Records why the Service `key` is not programmed now (`None`: it is, or it is gone).
    pub fn record_not_programmed(&self, key: &str, reason: Option<&str>) {
        let changed = lock(&self.not_programmed).record(key, reason);
        for (reason, n) in changed {
            self.metrics.set_services_not_programmed(&reason, n);
        }
    }

    /// Records how many candidate endpoints the Service's rules leave out (0: none, or gone).
    pub fn record_dropped(&self, key: &str, dropped: usize) {
        let mut guard = lock(&self.endpoints_dropped);
        let (per, total) = &mut *guard;
        let before = if dropped > 0 {
            per.insert(key.to_string(), dropped)
        } else {
            per.remove(key)
        };
        *total = (*total + dropped).saturating_sub(before.unwrap_or(0));
        self.metrics.set_endpoints_dropped(*total);
    }

    /// Records the programming problem `svc` has now (`None`: none) and says whether it is
    /// new, i.e. worth a Warning Event. Kept in memory because the Service a reconcile reads
    /// may not show the condition written by the previous pass yet (a status write that lost
    /// a race is retried), and one problem must make one Event, not one per pass.
    /// `exists` prunes entries of deleted Services once the map grows.
    pub fn first_warning(
        &self,
        svc: &ObjectRef<Service>,
        problem: Option<&str>,
        exists: impl Fn(&ObjectRef<Service>) -> bool,
    ) -> bool {
        let mut warned = lock(&self.warned);
        let Some(reason) = problem else {
            warned.remove(svc);
            return false;
        };
        if warned.get(svc).is_some_and(|r| r == reason) {
            return false;
        }
        if warned.len() >= 1024 {
            warned.retain(|k, _| exists(k));
        }
        warned.insert(svc.clone(), reason.to_string());
        true
    }
}

/// The map behind a lock, also after a panic elsewhere held it: each change to it is one
/// whole insert or remove, so what a panicking holder left is consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::NotProgrammed;

    #[test]
    fn not_programmed_counts_follow_each_services_reason() {
        let mut np = NotProgrammed::default();
        assert_eq!(
            np.record("a", Some("CapacityExceeded")),
            vec![("CapacityExceeded".to_string(), 1)]
        );
        assert_eq!(
            np.record("b", Some("CapacityExceeded")),
            vec![("CapacityExceeded".to_string(), 2)]
        );
        // The same reason again changes nothing.
        assert!(np.record("a", Some("CapacityExceeded")).is_empty());
        // A new reason moves the Service from one count to the other.
        assert_eq!(
            np.record("a", Some("LoxilbUnavailable")),
            vec![
                ("CapacityExceeded".to_string(), 1),
                ("LoxilbUnavailable".to_string(), 1)
            ]
        );
        // Programmed, or gone: out of the counts; an unknown Service changes nothing.
        assert_eq!(
            np.record("b", None),
            vec![("CapacityExceeded".to_string(), 0)]
        );
        assert!(np.record("never-seen", None).is_empty());
        assert_eq!(
            np.record("a", None),
            vec![("LoxilbUnavailable".to_string(), 0)]
        );
    }
}
