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
//! docs/BENCHMARKS.md). Here an entry is one hash of the object's UID and the event's type,
//! reason, action and note, mapped to the Event's name and count; expired entries are
//! dropped at most once a minute.
//!
//! Keying on the UID (not on the `resourceVersion` the `ObjectReference` carries) also
//! means a warning repeated on every retry of one Service becomes one Event with a growing
//! count, not one Event per version of the Service.
//!
//! Publishing is asynchronous, as with client-go's event broadcaster: `publish` puts the
//! Event on a bounded queue and returns at once; one background task writes the queue in
//! order. Events are diagnostics, so a reconcile never waits for them: during a burst of
//! new Services the API server's time goes to addresses and conditions first, and the
//! Events follow. A full queue (an API server too slow for a storm of Events) drops the
//! Event, counts it in `loxi_ccm_events_dropped_total` and logs it, as client-go does.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// The most an Event's note may hold: the API server refuses a longer one (1 KiB, counted in
/// bytes), and the Event would be lost.
pub const NOTE_MAX_BYTES: usize = 1024;

/// `note` cut to what an Event may carry, at a character boundary.
pub fn note_text(note: &str) -> String {
    loxi_domain::text::cut_to_bytes(note, NOTE_MAX_BYTES)
}

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tracing::warn;

/// How long a published Event is patched instead of created again (client-go's and
/// kube-runtime's value).
const REPEAT_WINDOW: Duration = Duration::from_secs(6 * 60);
/// How often expired cache entries are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Events waiting to be written. A burst of 1,000 new Services makes 2,000 Events within
/// seconds; client-go keeps 1,000.
const QUEUE: usize = 4096;

/// Which Events count as the same: a hash of the object's UID (or kind/namespace/name when
/// it has none), the event's type, reason, action and note. A hash rather than the strings
/// themselves keeps an entry small; a collision (odds ~1e-11 with 10,000 entries) would at
/// worst count an Event as a repeat of another.
type Key = u64;

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

/// Publishes Events on behalf of one controller (see the module docs). Clones share the
/// queue and the writer.
#[derive(Clone)]
pub struct EventRecorder {
    queue: mpsc::Sender<(Event, ObjectReference)>,
    /// Events queued and not yet written (or given up on).
    pending: Arc<watch::Sender<usize>>,
    dropped: Counter,
    writer: Arc<Writer>,
}

impl EventRecorder {
    /// Starts the writer task: call inside the Tokio runtime. `dropped` counts the Events
    /// a full queue refused.
    pub fn new(client: Client, reporter: Reporter, dropped: Counter) -> EventRecorder {
        let writer = Arc::new(Writer {
            client,
            reporter,
            cache: std::sync::Mutex::new(Cache {
                entries: HashMap::new(),
                swept: Instant::now(),
            }),
        });
        let (queue, mut rx) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
        let pending = Arc::new(watch::Sender::new(0usize));
        {
            let writer = writer.clone();
            let pending = pending.clone();
            // Ends when the recorder (the only sender) is dropped and the queue is empty.
            tokio::spawn(async move {
                while let Some((ev, regarding)) = rx.recv().await {
                    if let Err(e) = writer.write(&ev, &regarding).await {
                        warn!(
                            error = %e,
                            reason = %ev.reason,
                            object = regarding.name.as_deref().unwrap_or_default(),
                            "could not publish event"
                        );
                    }
                    pending.send_modify(|n| *n = n.saturating_sub(1));
                }
            });
        }
        EventRecorder {
            queue,
            pending,
            dropped,
            writer,
        }
    }

    /// Queues `ev` about `regarding`; it becomes a new Event, or the next count of the same
    /// one. Never waits (see the module docs).
    pub fn publish(&self, ev: Event, regarding: ObjectReference) {
        self.pending.send_modify(|n| *n += 1);
        if let Err(e) = self.queue.try_send((ev, regarding)) {
            self.pending.send_modify(|n| *n = n.saturating_sub(1));
            // Logged for the 1st, 2nd, 4th, 8th ... drop: a storm must not flood the log too.
            let dropped = self.dropped.inc() + 1;
            let (why, (ev, regarding)) = match e {
                mpsc::error::TrySendError::Full(v) => ("the event queue is full", v),
                mpsc::error::TrySendError::Closed(v) => ("the event writer stopped", v),
            };
            if dropped.is_power_of_two() {
                warn!(
                    reason = %ev.reason,
                    object = regarding.name.as_deref().unwrap_or_default(),
                    dropped,
                    "event dropped: {why}"
                );
            }
        }
    }

    /// Waits until every queued Event is written, at most `timeout`; false if some are
    /// still waiting (at shutdown, so that the last Events are not lost; in tests).
    pub async fn flush(&self, timeout: Duration) -> bool {
        let mut rx = self.pending.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Entries in the repeat cache (for tests).
    pub fn cached(&self) -> usize {
        self.writer.cache.lock().map_or(0, |c| c.entries.len())
    }
}

/// Writes Events one at a time, remembering what it wrote for the repeat window.
struct Writer {
    client: Client,
    reporter: Reporter,
    cache: std::sync::Mutex<Cache>,
}

impl Writer {
    /// Writes `ev` about `regarding`: a new Event, or the next count of the same one.
    async fn write(&self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
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
}

fn key_of(ev: &Event, regarding: &ObjectReference) -> Key {
    let mut h = DefaultHasher::new();
    match &regarding.uid {
        Some(uid) => uid.hash(&mut h),
        None => (&regarding.kind, &regarding.namespace, &regarding.name).hash(&mut h),
    }
    matches!(ev.type_, EventType::Warning).hash(&mut h);
    (&ev.reason, &ev.action, &ev.note).hash(&mut h);
    h.finish()
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

    /// `publish` never waits: beyond the queue's room an Event is dropped and counted, and
    /// what was queued is still worked off (here against an API server that refuses
    /// connections: each write fails and is logged).
    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_publish_never_waits() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let dropped = Counter::<u64>::default();
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        let recorder = EventRecorder::new(client, reporter, dropped.clone());
        // The writer task cannot run before this loop yields (current-thread runtime).
        for i in 0..QUEUE + 10 {
            recorder.publish(event(&format!("e{i}")), reference("u1", "1"));
        }
        assert_eq!(dropped.get(), 10);
        assert!(recorder.flush(Duration::from_secs(60)).await);
        assert_eq!(*recorder.pending.borrow(), 0);
        assert_eq!(recorder.cached(), 0, "nothing was written");
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
