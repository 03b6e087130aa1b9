//! Publishing Kubernetes Events (`events.k8s.io/v1`) with a small repeat cache.
//!
//! Same behaviour as kube-runtime's `Recorder` (whose `Event`, `EventType` and `Reporter`
//! types are used here): an Event the controller already published for the same object
//! within 6 minutes is not created again, its `series` (count, last time seen) is patched
//! instead, as client-go's recorder does. The difference is what is remembered. The
//! `Recorder` keeps every Event it published, whole, in a map keyed by a full
//! `ObjectReference`, and scans the whole map on every publish: with 1,000 Services
//! (two Events each when they get their address, one when deleted) that map was the largest
//! single item of the controller's heap (17.7 MB of a 27.6 MB peak, heaptrack, see
//! docs/BENCHMARKS.md). Here an entry is the object's UID, the event's type, reason, action
//! and a hash of its note, mapped to the Event's name and count; expired entries
//! are dropped at most once a minute.
//!
//! Keying on the UID (not on the `resourceVersion` the `ObjectReference` carries) also
//! means a warning repeated on every retry of one Service becomes one Event with a growing
//! count, not one Event per version of the Service.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use serde_json::json;

/// How long a published Event is patched instead of created again (client-go's and
/// kube-runtime's value).
const REPEAT_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often expired cache entries are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The object's UID (or namespace/name when it has none).
    regarding: String,
    warning: bool,
    reason: String,
    action: String,
    note: u64,
}

#[derive(Debug, Clone)]
struct Published {
    name: String,
    count: i32,
    last: Instant,
}

struct Cache {
    entries: HashMap<Key, Published>,
    swept: Instant,
}

/// Publishes Events on behalf of one controller (see the module docs).
pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    cache: std::sync::Mutex<Cache>,
}

impl EventRecorder {
    pub fn new(client: Client, reporter: Reporter) -> EventRecorder {
        EventRecorder {
            client,
            reporter,
            cache: std::sync::Mutex::new(Cache {
                entries: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// Publishes `ev` about `regarding`: a new Event, or the next count of the same one.
    pub async fn publish(
        &self,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = key_of(ev, regarding);
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let now = Instant::now();
        let repeat = self.lookup(&key, now);
        if let Some(seen) = repeat {
            let count = seen.count + 1;
            let patch = json!({
                "series": EventSeries {
                    count,
                    last_observed_time: MicroTime(Timestamp::now()),
                }
            });
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(
                        key,
                        Published {
                            count,
                            last: now,
                            ..seen
                        },
                    );
                    return Ok(());
                }
                // Expired in the API server (its event TTL) or deleted: publish anew.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.new_event(ev, regarding, &namespace);
        let created = api.create(&PostParams::default(), &event).await?;
        self.remember(
            key,
            Published {
                name: created.metadata.name.unwrap_or_default(),
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn lookup(&self, key: &Key, now: Instant) -> Option<Published> {
        let mut cache = self.cache.lock().ok()?;
        if now.duration_since(cache.swept) >= SWEEP_EVERY {
            cache
                .entries
                .retain(|_, p| now.duration_since(p.last) < REPEAT_WINDOW);
            cache.entries.shrink_to_fit();
            cache.swept = now;
        }
        cache
            .entries
            .get(key)
            .filter(|p| now.duration_since(p.last) < REPEAT_WINDOW)
            .cloned()
    }

    fn remember(&self, key: Key, published: Published) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.entries.insert(key, published);
        }
    }

    fn new_event(&self, ev: &Event, regarding: &ObjectReference, namespace: &str) -> K8sEvent {
        let now = Timestamp::now();
        let object = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        K8sEvent {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and the time in hex nanoseconds.
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..K8sEvent::default()
        }
    }

    /// Entries in the repeat cache (for tests).
    pub fn cached(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.entries.len())
    }
}

fn key_of(ev: &Event, regarding: &ObjectReference) -> Key {
    let mut note = DefaultHasher::new();
    ev.note.hash(&mut note);
    Key {
        regarding: regarding.uid.clone().unwrap_or_else(|| {
            format!(
                "{}/{}/{}",
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default()
            )
        }),
        warning: matches!(ev.type_, EventType::Warning),
        reason: ev.reason.clone(),
        action: ev.action.clone(),
        note: note.finish(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(note: &str) -> Event {
        Event {
            type_: EventType::Warning,
            reason: "PoolExhausted".into(),
            note: Some(note.into()),
            action: "Allocate".into(),
            secondary: None,
        }
    }

    fn reference(uid: &str, version: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Service".into()),
            namespace: Some("ns".into()),
            name: Some("web".into()),
            uid: Some(uid.into()),
            resource_version: Some(version.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn same_object_reason_and_note_is_a_repeat_whatever_the_version() {
        let a = key_of(&event("pool full"), &reference("u1", "10"));
        assert_eq!(a, key_of(&event("pool full"), &reference("u1", "11")));
        assert_ne!(a, key_of(&event("pool gone"), &reference("u1", "10")));
        assert_ne!(a, key_of(&event("pool full"), &reference("u2", "10")));
        let mut normal = event("pool full");
        normal.type_ = EventType::Normal;
        assert_ne!(a, key_of(&normal, &reference("u1", "10")));
    }
}
