//! A deleted Service's rules leave loxilb as soon as the Service watch shows the deletion,
//! ahead of its place in the reconcile queue.
//!
//! The cleanup of a deleted Service is three steps in a fixed order (`cleanup::steps`): its
//! rules off loxilb, its address released (an `AddressClaim` write), our finalizer off (a
//! Service write). Run as one reconcile, the rules of the last of a thousand deleted Services
//! wait for the claim and finalizer writes of all the others, `--concurrency` at a time,
//! although nothing forces rules to wait for bookkeeping. So the rules go first, on their
//! own: when the watch shows a Service of ours with a `deletionTimestamp`, a task removes its
//! rules from every reachable loxilb at once (`--concurrency` Services at a time); the
//! reconcile's cleanup follows with the claim and the finalizer, as before.
//!
//! The order the cleanup guarantees still holds: the cleanup's own rule step first
//! [`RulesFirst::close`]s the Service's entry, which waits for an early removal under way
//! and stops one not yet started, then removes whatever rules are left itself (none, after
//! an early removal). So a claim is never released before the rules are gone, and the
//! finalizer stays until both are done. A deletion cannot be undone, and a Service that
//! carries our finalizer cannot disappear (nor a new one take its name) before its cleanup
//! closed the entry, so an early removal never takes the rules of a re-created Service of
//! the same name; it also checks, before it starts, that the store still holds that very
//! Service (same uid) being deleted with our finalizer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Semaphore;
use tracing::debug;

use super::context::{Context, rule_owner};
use super::departures::is_placeholder;

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

/// Early rule removals of deleted Services, by Service uid (module docs).
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

    /// The watch shows `svc` (as the store now holds it): when it is a Service of ours being
    /// deleted, its rules are removed now, in a task of their own (returned, for tests).
    /// Nothing happens on a standby, for a Service without our finalizer, or for one whose
    /// removal was already asked for.
    pub fn deleting(
        &self,
        ctx: &Arc<Context>,
        svc: &Service,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !wants_early_removal(ctx, svc) || !ctx.gate.is_ready() {
            return None;
        }
        let uid = svc.uid()?;
        let entry = {
            let mut entries = self.entries();
            if entries.contains_key(&uid) {
                return None;
            }
            if entries.len() >= PRUNE_AT {
                entries.retain(|_, e| e.since.elapsed() < STALE_AFTER);
            }
            let entry = Arc::new(Entry {
                state: tokio::sync::Mutex::new(State::Pending),
                since: Instant::now(),
            });
            entries.insert(uid.clone(), entry.clone());
            entry
        };
        let ctx = ctx.clone();
        let permits = self.permits.clone();
        let svc_ref = ObjectRef::from_obj(svc);
        Some(tokio::spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            let mut state = entry.state.lock().await;
            if *state != State::Pending {
                return;
            }
            *state = State::Done;
            // The store may have moved on while this waited for a permit.
            let Some(now) = ctx.inputs.services.get(&svc_ref) else {
                return;
            };
            if now.uid().as_deref() != Some(uid.as_str())
                || !wants_early_removal(&ctx, &now)
                || !ctx.gate.holds_lease()
            {
                return;
            }
            remove_now(&ctx, &now).await;
            // `state` (held until here) is what the cleanup's `close` waits for.
        }))
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

/// A real Service of ours (not a placeholder) being deleted and still carrying our
/// finalizer: its cleanup is bound to run, and its rules may go at once.
fn wants_early_removal(ctx: &Context, svc: &Service) -> bool {
    svc.metadata.deletion_timestamp.is_some()
        && !is_placeholder(svc)
        && !ctx.selection.our_finalizers(svc).is_empty()
}

/// The Service's rules off every reachable loxilb. A failure is left to the cleanup, which
/// removes what is left and retries with backoff; the removal is reported here, as the
/// cleanup would have (`cleanup::rules_removed`).
async fn remove_now(ctx: &Context, svc: &Service) {
    let owner = rule_owner(svc);
    let mut removed = 0;
    for (inst, result) in super::cleanup::remove_everywhere(ctx, &owner).await {
        match result {
            Ok(r) => removed += r.changes,
            Err(e) => {
                debug!(instance = inst.url(), service = ?owner, error = %e, "early rule removal failed; left to the cleanup");
            }
        }
    }
    super::cleanup::rules_removed(svc, ctx, removed);
}
