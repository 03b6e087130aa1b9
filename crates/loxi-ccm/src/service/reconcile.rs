//! Reconciling one Service, in the five steps of `docs/architecture.md#data-flow`:
//! inputs from the stores, addresses from `ipam`, the plan from the domain, the rules through
//! `loxilb`, and the report. This file only orchestrates; each step lives with its owner.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{Instrument, warn};

use super::apply::apply_everywhere;
use super::cleanup::{cleanup, ensure_finalizer};
use super::context::{Context, rule_owner};
use super::departures;
use super::error::ReconcileError;
use super::plan::{Problem, rules_for};
use super::report;
use crate::ipam::EnsureError;
use crate::k8s::view::owner_key;

/// How a pass ended, for the metric.
pub enum PassEnd {
    Done,
    /// The Service has a problem only its owner can fix; reported, nothing to retry.
    Problem,
}

/// The reconcile entry point: waits until this replica may act, re-reads the Service from the
/// store, and runs [`reconcile_service`] in a span, with its metric.
pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    ctx.gate.wait_ready().await;
    // A standby's reconciles wait above for leadership with the object they were queued
    // with: a Service deleted meanwhile must never be claimed or programmed from that copy.
    let Some(svc) = ctx.inputs.service(&svc) else {
        tracing::debug!(service = %owner_key(&svc), "gone from the store: nothing to do");
        ctx.fleet.forget_waiter(&rule_owner(&svc)).await;
        super::placing::service_left(&svc, &ctx).await;
        // Nor is it counted any more (endpoints dropped, not programmed).
        ctx.report.forget(&svc);
        return Ok(Action::await_change());
    };
    if !ctx.gate.holds_lease() {
        return Err(ReconcileError::NotLeader);
    }
    if ctx.report.is_superseded(&svc) {
        tracing::debug!(service = %owner_key(&svc), "store behind our own write: skipped");
        return Ok(Action::await_change());
    }
    let span = tracing::info_span!(
        "reconcile",
        namespace = svc.namespace().unwrap_or_default(),
        name = svc.name_any()
    );
    let started = Instant::now();
    let result = reconcile_service(&svc, &ctx).instrument(span).await;
    let (label, category) = match &result {
        Ok(PassEnd::Done) => ("success", ""),
        Ok(PassEnd::Problem) => ("invalid", ""),
        Err(e) => ("error", e.category()),
    };
    ctx.report
        .metrics
        .reconciled(label, category, started.elapsed());
    if result.is_ok() {
        ctx.backoff.succeeded(&svc);
    }
    result.map(|_| Action::await_change())
}

/// One pass over one Service.
async fn reconcile_service(svc: &Service, ctx: &Context) -> Result<PassEnd, ReconcileError> {
    if departures::is_placeholder(svc) {
        return departed(svc, ctx).await;
    }
    if !ctx.selection.serves(svc) || svc.metadata.deletion_timestamp.is_some() {
        cleanup(svc, ctx).await?;
        return Ok(PassEnd::Done);
    }
    // 1. Inputs: the Service as the store holds it (read above); the Nodes and endpoints
    //    are read from their stores by the planner in step 3. Its group of loxilbs
    //    (`placing`): a Service no group has room for waits before anything is claimed.
    //    Before anything is claimed, the finalizer that guarantees the cleanup, with the
    //    group and HA instance recorded; the status write matches the Service as that patch
    //    returned it.
    let already_ours = svc
        .finalizers()
        .iter()
        .any(|f| f == ctx.selection.finalizer_for(svc));
    let placed = match super::placing::place(svc, ctx, already_ours).await {
        Ok(placed) => placed,
        Err(e) => {
            report::address_problem(svc, ctx, &Problem::Placement(e)).await?;
            return Ok(PassEnd::Problem);
        }
    };
    let patched = ensure_finalizer(svc, ctx, &placed).await?;
    let svc = patched.as_ref().unwrap_or(svc);

    // 2. Addresses, each backed by its claim. A Service with a bad annotation still keeps
    //    (and shows) the addresses it has.
    let held = match ctx.ipam.ensure(svc).await {
        Ok(held) => held,
        Err(EnsureError::Kube(e)) => return Err(e.into()),
        Err(EnsureError::Problem(problem)) => {
            report::address_problem(svc, ctx, &Problem::Address(problem)).await?;
            return Ok(PassEnd::Problem);
        }
    };
    report::addresses(svc, ctx, &held);

    // 3. The plan (pure). A problem only the owner can fix leaves existing rules as they are.
    let plan = match rules_for(svc, ctx, &held.addresses, &held.secondaries) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(PassEnd::Done),
        Err(problem) => {
            report::plan_problem(svc, ctx, &held, &problem).await?;
            return Ok(PassEnd::Problem);
        }
    };

    // 4. Apply: only the difference, on every reachable loxilb.
    let applying = apply_everywhere(svc, ctx, &placed.group, &plan.rules);
    let (programmed, queued) =
        report::while_queued(svc, ctx, &placed.group, &held, applying).await?;
    // Said queued meanwhile: the status write below goes on from that version.
    let svc = queued.as_ref().unwrap_or(svc);
    if !ctx.gate.holds_lease() {
        // What the calls met (writes stopped) is not the Service's state to report.
        return Err(ReconcileError::NotLeader);
    }

    // 5. Report: status, conditions and Events, in one place.
    report::programmed(svc, ctx, &held, &plan, &programmed).await?;
    if programmed.retry.is_none() {
        // Addresses no longer wanted (an edited annotation, a lost race) go back only now
        // that their rules are gone, and only after our status write: that write is
        // conditional on the resourceVersion we read, so once it landed no other replica
        // can still publish an address decided on an older read. Releasing first let a
        // racing replica publish the address we had just let go, while a third Service
        // claimed it (two Services showing one address, tests/ipam_claims.rs).
        report::release_unwanted(svc, ctx, &held).await?;
    }
    match programmed.retry {
        Some((at, error)) => Err(ReconcileError::Loxilb { at, error }),
        None => Ok(PassEnd::Done),
    }
}

/// A Service that left the Service watch while carrying our finalizer (`departures`):
/// cleaned up as it is now, then its placeholder is dropped.
async fn departed(placeholder: &Service, ctx: &Context) -> Result<PassEnd, ReconcileError> {
    let now = ctx
        .services_api(placeholder)
        .get_opt(&placeholder.name_any())
        .await?;
    match now {
        Some(now) if now.metadata.uid == placeholder.metadata.uid => {
            if ctx.selection.serves(&now) && now.metadata.deletion_timestamp.is_none() {
                // Back to LoadBalancer: the watch sends it again, which replaces the
                // placeholder and reconciles it.
                return Ok(PassEnd::Done);
            }
            cleanup(&now, ctx).await?;
        }
        // Gone, or a new Service of that name: nothing of the old one left to write on. Its
        // rules go with the next drift check, its claims with the claim collector.
        _ => {}
    }
    ctx.departures.forget(placeholder);
    Ok(PassEnd::Done)
}

/// kube-runtime's error policy: backoff per Service; nothing more once leadership is lost.
pub fn error_policy(svc: Arc<Service>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    if matches!(err, ReconcileError::NotLeader) {
        return Action::await_change();
    }
    let delay = ctx.backoff.failed(&svc);
    warn!(service = %owner_key(&svc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
