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
//! closes the Service's entry (`RulesFirst::close`, `rules_first`), which waits for an early removal under way
//! and stops one not yet started, then removes whatever rules are left itself (none, after
//! an early removal). So a claim is never released before the rules are gone, and the
//! finalizer stays until both are done. A deletion cannot be undone, and a Service that
//! carries our finalizer cannot disappear (nor a new one take its name) before its cleanup
//! closed the entry, so an early removal never takes the rules of a re-created Service of
//! the same name; it also checks, before it starts, that the store still holds that very
//! Service (same uid) being deleted with our finalizer.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tracing::debug;

use super::context::{Context, rule_owner};
use super::departures::is_placeholder;

/// The watch shows `svc` (as the store now holds it): when it is a Service of ours being
/// deleted, its rules are removed now, in a task of their own (returned, for tests).
/// Nothing happens on a standby, for a Service without our finalizer, or for one whose
/// removal was already asked for (`ctx.teardown`, the book of early removals).
pub fn deleting(ctx: &Arc<Context>, svc: &Service) -> Option<tokio::task::JoinHandle<()>> {
    if !wants_early_removal(ctx, svc) || !ctx.gate.is_ready() {
        return None;
    }
    let uid = svc.uid()?;
    let asked = ctx.teardown.ask(&uid)?;
    let ctx = ctx.clone();
    let svc_ref = ObjectRef::from_obj(svc);
    Some(tokio::spawn(async move {
        asked
            .run(|| async {
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
            })
            .await;
    }))
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
    for (inst, result) in super::cleanup::remove_everywhere(ctx, svc).await {
        match result {
            Ok(r) => removed += r.changes,
            Err(e) => {
                debug!(instance = inst.url(), service = ?owner, error = %e, "early rule removal failed; left to the cleanup");
            }
        }
    }
    super::cleanup::rules_removed(svc, ctx, removed);
}
