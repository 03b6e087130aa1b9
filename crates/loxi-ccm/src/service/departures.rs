//! Services that leave type LoadBalancer while the Service watch only sees that type.
//!
//! The Service watch asks the API server for type LoadBalancer only (field selector
//! `spec.type=LoadBalancer`, served since Kubernetes 1.31), so the ClusterIP, NodePort and
//! ExternalName Services of a cluster are never sent, parsed or stored. The price: a Service
//! that changes its type away from LoadBalancer leaves the watch as a *deletion*, although it
//! still exists with our finalizer, its rules and its address. Such a Service is put back into
//! the store as a **placeholder** (its metadata, no spec: never served), which the reconciler
//! treats like any Service this controller stops serving: it reads the Service's current
//! state, deletes its rules, releases its address and removes the finalizer, then drops the
//! placeholder. A Service that left while no watch was open (controller down, or a re-list
//! after the watch expired) is found by a sweep after every full listing: a metadata-only
//! list for Services that carry our finalizer but are missing from the store.
//!
//! API servers without that field selector (before 1.31) answer 400: the controller then
//! watches every Service and sees type changes as ordinary updates.
//!
//! Placeholders enter and leave the store through the watch stream itself (injected events),
//! so the reconciler's one-at-a-time guarantee per Service holds and the store never mixes
//! a placeholder with a newer real object: see [`admit`].

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams};
use kube::core::{ObjectMeta, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::{Notify, mpsc};
use tracing::{info, warn};

use crate::k8s::view::Selection;

pub use crate::k8s::view::TYPE_SELECTOR;

/// Page size of the sweep's metadata list.
const SWEEP_PAGE: u32 = 500;

/// A placeholder for a Service that left the watch: what we last saw of its metadata, no
/// spec (the API server always sends one, so a real object never looks like this) and no
/// resourceVersion (writes for it go to the Service as it is now).
pub fn placeholder(meta: ObjectMeta) -> Service {
    Service {
        metadata: ObjectMeta {
            resource_version: None,
            managed_fields: None,
            ..meta
        },
        spec: None,
        status: None,
    }
}

/// Whether `svc` is a [`placeholder`] rather than a Service read from the API server.
pub fn is_placeholder(svc: &Service) -> bool {
    svc.spec.is_none()
}

/// Whether metadata alone shows a finalizer of ours. A metadata list has no spec, so the
/// standard finalizer counts whenever CCM mode is on: a Service that left LoadBalancer has
/// no class any more (the API server drops it with the type).
fn has_our_finalizer(meta: &ObjectMeta, selection: &Selection) -> bool {
    !selection
        .finalizers_in(meta.finalizers.as_deref(), true)
        .is_empty()
}

/// A watch event as the store should see it: a Service that leaves the filtered watch while
/// still carrying our finalizer is not gone, it left LoadBalancer (or stopped matching
/// otherwise): it stays as a placeholder until cleaned up. A real deletion never carries our
/// finalizer: the API server only deletes a Service once every finalizer is removed.
pub fn on_watch_event(
    event: watcher::Event<Service>,
    selection: &Selection,
) -> watcher::Event<Service> {
    match event {
        watcher::Event::Delete(svc) if !selection.our_finalizers(&svc).is_empty() => {
            info!(
                namespace = svc.metadata.namespace.as_deref().unwrap_or_default(),
                name = svc.metadata.name.as_deref().unwrap_or_default(),
                "Service left type LoadBalancer: cleaning up"
            );
            watcher::Event::Apply(placeholder(svc.metadata))
        }
        other => other,
    }
}

/// An event the controller itself feeds into the Service watch stream.
#[derive(Debug)]
pub enum Injected {
    /// Put a placeholder in (found by a sweep).
    Add(Service),
    /// Take a placeholder out (its cleanup is done).
    Remove(Service),
}

impl Injected {
    /// The Service it is about.
    pub fn key(&self) -> ObjectRef<Service> {
        match self {
            Injected::Add(svc) | Injected::Remove(svc) => ObjectRef::from_obj(svc),
        }
    }
}

/// Whether an injected event may reach the store, given what the store holds for that
/// Service now. Checked in the stream right before the store applies it, so nothing slips
/// in between: a placeholder never replaces a real object (the Service came back to
/// LoadBalancer meanwhile), and removing one never removes a real object or a newer
/// placeholder of a re-created Service.
pub fn admit(event: &Injected, current: Option<&Service>) -> bool {
    match (event, current) {
        (Injected::Add(_), None) => true,
        (Injected::Add(_), Some(now)) => is_placeholder(now),
        (Injected::Remove(p), Some(now)) => {
            is_placeholder(now) && now.metadata.uid == p.metadata.uid
        }
        (Injected::Remove(_), None) => false,
    }
}

/// The watch event an admitted injection becomes.
pub fn into_event(event: Injected) -> watcher::Event<Service> {
    match event {
        Injected::Add(svc) => watcher::Event::Apply(svc),
        Injected::Remove(svc) => watcher::Event::Delete(svc),
    }
}

/// The controller's handle on departures: whether the watch is filtered, and the way into
/// the watch stream.
pub struct Departures {
    /// The Service watch uses [`TYPE_SELECTOR`].
    pub filtered: bool,
    inject: mpsc::UnboundedSender<Injected>,
    /// Wakes the sweep after a full listing.
    relisted: Relisted,
}

/// Tells the sweep that the Service watch finished a full listing (the watch's own task
/// holds one; the sweep waits on another).
#[derive(Clone, Default)]
pub struct Relisted(Arc<Notify>);

impl Relisted {
    /// A full listing of the Services is in the store.
    pub fn notify(&self) {
        self.0.notify_one();
    }

    async fn notified(&self) {
        self.0.notified().await;
    }
}

impl Departures {
    pub fn new(
        filtered: bool,
        inject: mpsc::UnboundedSender<Injected>,
        relisted: Relisted,
    ) -> Self {
        Departures {
            filtered,
            inject,
            relisted,
        }
    }

    /// Drops the placeholder of a Service whose cleanup is done.
    pub fn forget(&self, placeholder: &Service) {
        let _ = self.inject.send(Injected::Remove(placeholder.clone()));
    }

    /// Asks for a sweep (a Service with our finalizer turned up outside the store).
    pub fn sweep_soon(&self) {
        if self.filtered {
            self.relisted.notify();
        }
    }
}

/// Decides whether the API server filters Services by type: asks once for one Service with
/// the selector. A 400 is its answer "field label not supported"; any other failure is
/// retried a few times, then the unfiltered watch is used (it works everywhere).
pub async fn type_selector_supported(api: &Api<Service>) -> bool {
    let probe = ListParams::default().fields(TYPE_SELECTOR).limit(1);
    use backon::BackoffBuilder;
    // Five probes, 0.2 s apart at first, doubling.
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_factor(2.0)
        .with_max_times(5)
        .build();
    for attempt in 1.. {
        let answer = api.list_metadata(&probe).await;
        match (selector_answer(&answer), answer) {
            (Some(true), _) => return true,
            (Some(false), answer) => {
                warn!(error = ?answer.err(), "the API server cannot filter Services by type (Kubernetes < 1.31): watching every Service");
                return false;
            }
            (None, answer) => {
                warn!(error = ?answer.err(), attempt, "probing the Service type field selector");
                let Some(delay) = delays.next() else { break };
                tokio::time::sleep(delay).await;
            }
        }
    }
    warn!("no answer on the Service type field selector: watching every Service");
    false
}

/// What a probe's answer says: supported, not supported (400, "field label not supported"),
/// or nothing yet (any other failure: ask again).
fn selector_answer<T>(answer: &kube::Result<T>) -> Option<bool> {
    match answer {
        Ok(_) => Some(true),
        Err(kube::Error::Api(status)) if status.code == 400 => Some(false),
        Err(_) => None,
    }
}

/// After every full listing of the filtered watch: finds Services with our finalizer that
/// the listing lacked and puts placeholders in for them. Runs for the life of the controller.
pub async fn sweep_loop(
    api: Api<Service>,
    store: Store<Service>,
    selection: Selection,
    inject: mpsc::UnboundedSender<Injected>,
    relisted: Relisted,
) {
    loop {
        relisted.notified().await;
        let mut attempt = 0u32;
        loop {
            match sweep(&api, &store, &selection, &inject).await {
                Ok(found) => {
                    if found > 0 {
                        info!(
                            found,
                            "Services that left type LoadBalancer while unwatched: cleaning up"
                        );
                    }
                    break;
                }
                Err(e) => {
                    attempt = attempt.saturating_add(1);
                    let wait = std::time::Duration::from_secs(1 << attempt.min(6));
                    warn!(error = %e, retry_in = ?wait, "sweep for Services that left type LoadBalancer failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

async fn sweep(
    api: &Api<Service>,
    store: &Store<Service>,
    selection: &Selection,
    inject: &mpsc::UnboundedSender<Injected>,
) -> kube::Result<usize> {
    let mut found = 0;
    let mut params = ListParams::default().limit(SWEEP_PAGE);
    loop {
        let page = api.list_metadata(&params).await?;
        for item in page.items {
            if let Some(meta) = departed(item, store, selection) {
                let _ = inject.send(Injected::Add(placeholder(meta)));
                found += 1;
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(found),
        }
    }
}

/// The metadata of a listed Service that carries our finalizer but is not in the store.
fn departed(
    item: PartialObjectMeta<Service>,
    store: &Store<Service>,
    selection: &Selection,
) -> Option<ObjectMeta> {
    if !has_our_finalizer(&item.metadata, selection) {
        return None;
    }
    let name = item.metadata.name.as_deref()?;
    let key = ObjectRef::new(name).within(item.metadata.namespace.as_deref().unwrap_or_default());
    let held = store.get(&key);
    held.is_none_or(|s| s.metadata.uid != item.metadata.uid)
        .then_some(item.metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::view::{CCM_FINALIZER, CLASS_FINALIZER};
    use k8s_openapi::api::core::v1::ServiceSpec;

    fn selection(ccm_mode: bool) -> Selection {
        Selection::new(
            "loxilb.io/loxilb",
            ccm_mode,
            loxi_domain::ControllerName::default(),
        )
    }

    fn svc(uid: &str, finalizers: &[&str], class: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some("42".into()),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_class: class.map(str::to_string),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn only_a_400_means_the_selector_is_unsupported() {
        let api = |code: u16, message: &str| -> kube::Result<()> {
            Err(kube::Error::Api(
                kube::core::Status {
                    code,
                    message: message.into(),
                    ..Default::default()
                }
                .boxed(),
            ))
        };
        assert_eq!(selector_answer(&Ok::<(), kube::Error>(())), Some(true));
        assert_eq!(
            selector_answer(&api(400, "field label not supported: spec.type")),
            Some(false)
        );
        assert_eq!(selector_answer(&api(403, "forbidden")), None);
        assert_eq!(selector_answer(&api(503, "unavailable")), None);
    }

    #[test]
    fn a_deletion_with_our_finalizer_becomes_a_placeholder() {
        let sel = selection(false);
        let left = svc("u1", &[CLASS_FINALIZER], Some("loxilb.io/loxilb"));
        match on_watch_event(watcher::Event::Delete(left), &sel) {
            watcher::Event::Apply(p) => {
                assert!(is_placeholder(&p));
                assert!(!sel.serves(&p));
                assert_eq!(p.metadata.uid.as_deref(), Some("u1"));
                assert_eq!(p.metadata.resource_version, None);
                assert_eq!(sel.our_finalizers(&p), vec![CLASS_FINALIZER]);
            }
            other => panic!("expected a placeholder, got {other:?}"),
        }
    }

    #[test]
    fn real_deletions_and_other_events_pass_unchanged() {
        let sel = selection(false);
        // Deleted for real: our finalizer was removed first.
        let gone = svc("u1", &[], Some("loxilb.io/loxilb"));
        assert!(matches!(
            on_watch_event(watcher::Event::Delete(gone), &sel),
            watcher::Event::Delete(_)
        ));
        // Another cloud provider's finalizer on a class-less Service is not ours.
        let theirs = svc("u2", &[CCM_FINALIZER], None);
        assert!(matches!(
            on_watch_event(watcher::Event::Delete(theirs.clone()), &sel),
            watcher::Event::Delete(_)
        ));
        // ... but it is in CCM mode.
        assert!(matches!(
            on_watch_event(watcher::Event::Delete(theirs.clone()), &selection(true)),
            watcher::Event::Apply(_)
        ));
        assert!(matches!(
            on_watch_event(watcher::Event::Apply(theirs), &sel),
            watcher::Event::Apply(s) if !is_placeholder(&s)
        ));
    }

    #[test]
    fn injections_never_displace_real_objects() {
        let real = svc("u1", &[CLASS_FINALIZER], Some("loxilb.io/loxilb"));
        let p = placeholder(real.metadata.clone());
        let add = Injected::Add(p.clone());
        let remove = Injected::Remove(p.clone());
        // A placeholder goes in where there is nothing, or over an older placeholder.
        assert!(admit(&add, None));
        assert!(admit(&add, Some(&p)));
        // Not over a Service that came back to LoadBalancer.
        assert!(!admit(&add, Some(&real)));
        // Removal takes out only the same placeholder.
        assert!(admit(&remove, Some(&p)));
        assert!(!admit(&remove, Some(&real)));
        assert!(!admit(&remove, None));
        let recreated = placeholder(svc("u2", &[CLASS_FINALIZER], None).metadata);
        assert!(!admit(&remove, Some(&recreated)));
    }

    #[test]
    fn the_sweep_picks_services_with_our_finalizer_missing_from_the_store() {
        let (reader, mut writer) = kube::runtime::reflector::store::<Service>();
        let held = svc("u1", &[CLASS_FINALIZER], Some("loxilb.io/loxilb"));
        writer.apply_watcher_event(&watcher::Event::Apply(held.clone()));
        let meta = |uid: &str, name: &str, fin: &[&str]| PartialObjectMeta::<Service> {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                finalizers: Some(fin.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        };
        let sel = selection(false);
        // In the store: nothing to do.
        assert!(departed(meta("u1", "web", &[CLASS_FINALIZER]), &reader, &sel).is_none());
        // Same name, another object (deleted and re-created while unwatched).
        assert!(departed(meta("u9", "web", &[CLASS_FINALIZER]), &reader, &sel).is_some());
        // Missing, with our finalizer.
        assert!(departed(meta("u3", "db", &[CLASS_FINALIZER]), &reader, &sel).is_some());
        // Missing, without: not ours.
        assert!(departed(meta("u4", "x", &[]), &reader, &sel).is_none());
        // The standard finalizer only in CCM mode.
        assert!(departed(meta("u5", "y", &[CCM_FINALIZER]), &reader, &sel).is_none());
        assert!(departed(meta("u5", "y", &[CCM_FINALIZER]), &reader, &selection(true)).is_some());
    }
}
