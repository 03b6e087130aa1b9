//! Taking a Service's load balancer down: when it is deleted, or stops being ours (its type
//! or class changed), or left the watch carrying our finalizer (`departures`).
//!
//! The finalizer is hand-made rather than kube-runtime's `finalizer()` helper: cleanup also
//! runs for Services that stay (a type or class change), which that helper, made for objects
//! being deleted, does not cover; and the finalizer's name depends on the Service (the
//! standard one in CCM mode, our own for our class: `docs/architecture.md#finalizers`).

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use loxi_domain::addressing::{RETAIN_IGNORED, retention};
use serde_json::json;
use tracing::{info, warn};

use super::context::{Context, rule_owner};
use super::error::ReconcileError;
use super::status;
use crate::fleet::placement::Placed;

/// One step of taking a Service's load balancer down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Its rules off every reachable loxilb.
    RemoveRules,
    /// Its addresses back to the pool, or retained.
    ReleaseAddresses,
    /// What we wrote in its status (a Service that stays).
    ClearStatus,
    /// Our finalizer off it.
    RemoveFinalizer,
}

/// The steps, in the order they must run: rules first (no rule may point at an address that
/// someone else may get next), then the addresses, then the status of a Service that stays,
/// and the finalizer last: it is what guarantees the steps before it run. Nothing to do for
/// a Service that holds no address and carries no finalizer of ours.
pub fn steps(has_finalizer: bool, holds_address: bool, deleting: bool) -> Vec<Step> {
    if !has_finalizer && !holds_address {
        return Vec::new();
    }
    let mut steps = vec![Step::RemoveRules, Step::ReleaseAddresses];
    if !deleting {
        steps.push(Step::ClearStatus);
    }
    if has_finalizer {
        steps.push(Step::RemoveFinalizer);
    }
    steps
}

/// Runs the [`steps`] for `svc`.
pub async fn cleanup(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    ctx.report.forget(svc);
    let finalizers = ctx.selection.our_finalizers(svc);
    let plan = steps(
        !finalizers.is_empty(),
        ctx.ipam.holds_any(svc),
        svc.metadata.deletion_timestamp.is_some(),
    );
    for step in plan {
        match step {
            Step::RemoveRules => {
                // An early removal under way (`teardown`) finishes first; none starts now.
                ctx.teardown.close(svc).await;
                remove_rules(svc, ctx).await?
            }
            Step::ReleaseAddresses => {
                // One that does not parse counts as absent (reported while it was served).
                let retention = retention(svc.metadata.annotations.as_ref()).unwrap_or_else(|e| {
                    warn!("{e}; ignored: {RETAIN_IGNORED}");
                    None
                });
                ctx.ipam.release_all(svc, retention).await?;
            }
            Step::ClearStatus => {
                status::clear(&ctx.services_api(svc), svc, &ctx.report.field_manager).await?
            }
            Step::RemoveFinalizer => {
                let remaining: Vec<&String> = svc
                    .finalizers()
                    .iter()
                    .filter(|f| !finalizers.contains(&f.as_str()))
                    .collect();
                patch_finalizers(ctx, svc, json!(remaining)).await?;
            }
        }
    }
    // Its rules are gone: a Service waiting for room in its group may fit now.
    super::placing::service_left(svc, ctx).await;
    Ok(())
}

/// The Service's rules off every reachable loxilb. An unreachable one that may still hold
/// some keeps the Service's address and finalizer until it answers (its rules then go) or
/// counts as gone for good (`--loxilb-gone-after`, `Instance::gone_after`; should it come back
/// after that, it loses them as orphans in its replay): a slow or briefly unreachable loxilb
/// is not a gone one, and an address released while its old rule still forwards there could
/// go to another Service.
async fn remove_rules(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    let owner = rule_owner(svc);
    let unreachable: Vec<String> = ctx
        .fleet
        .instances()
        .iter()
        .filter(|i| i.may_still_hold(&owner.namespace, &owner.name))
        .map(|i| {
            let since = i.down_for().map_or(0, |d| d.as_secs());
            let gone = i.gone_after().as_secs();
            format!(
                "{} (unreachable for {since} s; gone for good after {gone} s)",
                i.url()
            )
        })
        .collect();
    let mut removed = 0;
    for (inst, result) in remove_everywhere(ctx, svc).await {
        match result {
            Ok(r) => removed += r.changes,
            Err(e) => {
                let message = format!("{}: {e}", inst.url());
                ctx.report
                    .event(svc, EventType::Warning, e.category(), "Cleanup", message);
                return Err(ReconcileError::Loxilb {
                    at: inst.url().to_string(),
                    error: e,
                });
            }
        }
    }
    rules_removed(svc, ctx, removed);
    let this = kube::runtime::reflector::ObjectRef::from_obj(svc);
    if unreachable.is_empty() {
        // The episode is over (nothing is remembered about it any more).
        ctx.report.first_warning(&this, None, |_| true);
    } else {
        let message = format!(
            "its rules may remain on {}: its address and finalizer are kept until that loxilb \
             answers or counts as gone for good (--loxilb-gone-after)",
            unreachable.join(", "),
        );
        let new = ctx
            .report
            .first_warning(&this, Some("LoxilbUnavailable"), |r| {
                ctx.inputs.services.get(r).is_some()
            });
        if new {
            warn!("{message}");
            ctx.report.event(
                svc,
                EventType::Warning,
                "LoxilbUnavailable",
                "Cleanup",
                message.clone(),
            );
        }
        return Err(ReconcileError::LoxilbUnavailable(message));
    }
    Ok(())
}

/// The rules of `svc` off every reachable loxilb, all at once (as a Service's pass
/// programs them), with what each answered. With `--appendEPs` its endpoints are detached,
/// those of the rules it would have now recognised as its own first: a controller that
/// restarted since they were attached knows them only so (`Instance::recall_shared`).
pub async fn remove_everywhere(
    ctx: &Context,
    svc: &Service,
) -> Vec<(
    std::sync::Arc<crate::loxilb::Instance>,
    Result<crate::loxilb::ApplyReport, loxilb_client::ClientError>,
)> {
    let owner = &rule_owner(svc);
    let would_have = if ctx.settings.shared_rules
        && let super::plan::Desired::Rules(plan) = super::plan::desired(svc, ctx)
    {
        plan.rules
    } else {
        Vec::new()
    };
    let instances = ctx.fleet.instances();
    let calls = instances
        .iter()
        .filter(|i| i.is_healthy())
        .map(|inst| async {
            let (cluster, metrics) = (&ctx.cluster, &ctx.report.metrics);
            if let Err(e) = inst
                .recall_shared(&owner.namespace, &owner.name, &would_have, metrics)
                .await
            {
                return (inst.clone(), Err(e));
            }
            let result = if ctx.settings.source_ranges_firewall {
                inst.remove_service_and_firewall(cluster, &owner.namespace, &owner.name, metrics)
                    .await
            } else {
                inst.remove_service(cluster, &owner.namespace, &owner.name, metrics)
                    .await
            };
            (inst.clone(), result)
        });
    futures::future::join_all(calls).await
}

/// Says that `removed` rules of the Service left loxilb: a `RulesDeleted` Event on a Service
/// that stays (its type or class changed), a log line for one being deleted. An Event about
/// an object on its way out is read by nobody (`kubectl describe` cannot show it any more),
/// while each one is an API server write, the resource a mass deletion is bound by
/// (docs/BENCHMARKS.md: with it, loxi-ccm's teardown made one write per Service more than
/// the baseline's).
pub fn rules_removed(svc: &Service, ctx: &Context, removed: usize) {
    if removed == 0 {
        return;
    }
    if svc.metadata.deletion_timestamp.is_some() {
        info!(service = %crate::k8s::view::owner_key(svc), removed, "rules deleted");
        return;
    }
    ctx.report.event(
        svc,
        EventType::Normal,
        "RulesDeleted",
        "Cleanup",
        format!("deleted {removed} rule(s)"),
    );
}

/// Adds our finalizer when missing, and records the Service's group of loxilbs when it was
/// just placed (`placing`) and its HA instance when it has none yet and there are several
/// (`plan::instance_to_pin`), in one patch; returns the Service as written then (its
/// resourceVersion is the one the status write must match).
pub async fn ensure_finalizer(
    svc: &Service,
    ctx: &Context,
    placed: &Placed,
) -> Result<Option<Service>, ReconcileError> {
    let wanted = ctx.selection.finalizer_for(svc);
    let has_finalizer = svc.finalizers().iter().any(|f| f == wanted);
    let pin = super::plan::instance_to_pin(svc, ctx, has_finalizer, &placed.group);
    if has_finalizer && pin.is_none() && !placed.record {
        return Ok(None);
    }
    if pin.is_none() && !placed.record {
        let mut list: Vec<String> = svc.finalizers().to_vec();
        list.push(wanted.to_string());
        return patch_finalizers(ctx, svc, json!(list)).await.map(Some);
    }
    let mut list: Vec<String> = svc.finalizers().to_vec();
    if !has_finalizer {
        list.push(wanted.to_string());
    }
    let mut annotations = serde_json::Map::new();
    if let Some(instance) = pin {
        annotations.insert(
            loxi_domain::roles::ZONE_INSTANCE_ANNOTATION.to_string(),
            json!(instance),
        );
    }
    if placed.record {
        annotations.insert(
            loxi_domain::placement::ZONE_SELECT_ANNOTATION.to_string(),
            json!(placed.group),
        );
    }
    let patch = json!({
        "metadata": {
            "finalizers": list,
            "annotations": annotations,
            "resourceVersion": svc.resource_version(),
        }
    });
    Ok(Some(
        ctx.services_api(svc)
            .patch(
                &svc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?,
    ))
}

/// Sets the finalizer list; the resourceVersion makes it fail (409) rather than overwrite a
/// list someone else changed meanwhile.
async fn patch_finalizers(
    ctx: &Context,
    svc: &Service,
    list: serde_json::Value,
) -> Result<Service, ReconcileError> {
    let patch = json!({
        "metadata": {
            "finalizers": list,
            "resourceVersion": svc.resource_version(),
        }
    });
    Ok(ctx
        .services_api(svc)
        .patch(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_go_before_addresses_and_the_finalizer_goes_last() {
        assert_eq!(
            steps(true, true, true),
            [
                Step::RemoveRules,
                Step::ReleaseAddresses,
                Step::RemoveFinalizer
            ]
        );
        assert_eq!(
            steps(true, false, false),
            [
                Step::RemoveRules,
                Step::ReleaseAddresses,
                Step::ClearStatus,
                Step::RemoveFinalizer
            ]
        );
        // An address without our finalizer (adopted, never finalized) still goes back.
        assert_eq!(
            steps(false, true, false),
            [Step::RemoveRules, Step::ReleaseAddresses, Step::ClearStatus]
        );
        assert!(steps(false, false, true).is_empty());
    }
}
