//! The book of early rule removals of deleted Services (`teardown` runs them), by Service
//! uid: which were asked for, which ran, which the cleanup took over. It holds no reconcile
//! context, so the context can hold it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tokio::sync::Semaphore;

/// Entries older than this are dropped once the map is large: a Service whose deletion the
/// watch never confirmed (a re-list) must not keep its entry for ever.
const STALE_AFTER: Duration = Duration::from_secs(600);
/// Size at which stale entries are looked for.
const PRUNE_AT: usize = 1024;

/// Where one Service's early removal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Asked for, not run yet.
    Pending,
    /// Ran (whatever it found).
    Done,
    /// The cleanup took over: nothing more may run early.
    Closed,
}

struct Entry {
    state: tokio::sync::Mutex<State>,
    since: Instant,
}

/// Early rule removals of deleted Services, by Service uid (`teardown`'s module docs).
pub struct RulesFirst {
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    permits: Arc<Semaphore>,
}

impl RulesFirst {
    /// `parallel`: Services whose rules are removed at once (`--concurrency`).
    pub fn new(parallel: usize) -> RulesFirst {
        RulesFirst {
            entries: Mutex::default(),
            permits: Arc::new(Semaphore::new(parallel.max(1))),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An early removal for the Service `uid` is asked for: `None` when one already was.
    pub fn ask(&self, uid: &str) -> Option<Asked> {
        let mut entries = self.entries();
        if entries.contains_key(uid) {
            return None;
        }
        if entries.len() >= PRUNE_AT {
            entries.retain(|_, e| e.since.elapsed() < STALE_AFTER);
        }
        let entry = Arc::new(Entry {
            state: tokio::sync::Mutex::new(State::Pending),
            since: Instant::now(),
        });
        entries.insert(uid.to_string(), entry.clone());
        Some(Asked {
            entry,
            permits: self.permits.clone(),
        })
    }

    /// The cleanup's rule step starts: waits for an early removal of `svc` under way, and
    /// keeps one not started yet from running.
    pub async fn close(&self, svc: &Service) {
        let Some(uid) = svc.uid() else { return };
        let entry = self.entries().get(&uid).cloned();
        if let Some(entry) = entry {
            *entry.state.lock().await = State::Closed;
        }
    }

    /// The watch saw the Service go for good: its entry is no longer needed.
    pub fn gone(&self, uid: &str) {
        self.entries().remove(uid);
    }

    /// Entries kept (a metric of sorts for tests and debugging).
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An early removal asked for, not run yet.
pub struct Asked {
    entry: Arc<Entry>,
    permits: Arc<Semaphore>,
}

impl Asked {
    /// Waits for a permit, then runs `removal` unless the cleanup closed the entry meanwhile;
    /// the entry stays locked until `removal` ends, which is what [`RulesFirst::close`] waits
    /// for.
    pub async fn run<F: Future<Output = ()>>(self, removal: impl FnOnce() -> F) {
        let Ok(_permit) = self.permits.acquire_owned().await else {
            return;
        };
        let mut state = self.entry.state.lock().await;
        if *state != State::Pending {
            return;
        }
        *state = State::Done;
        removal().await;
    }
}
