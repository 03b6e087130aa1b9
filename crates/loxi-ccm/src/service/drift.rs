//! The Services' rules on whole loxilbs: the replay a loxilb's worker runs after it came
//! back or restarted (`crate::fleet::workers`), and the periodic drift check of every
//! reachable loxilb, followed by the claim collection.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::Context;
use super::context::recorded_group;
use super::plan::{Desired, desired};
use crate::fleet::workers::Replay;
use crate::ipam::claims::ClaimedBy;
use crate::loxilb::{Instance, ServiceRules};
use loxi_domain::RuleName;
use loxi_domain::firewall::{FwRule, Preferences};

/// The replay of one loxilb for its worker (`crate::fleet::workers`): every rule of its
/// group's Services, from the stores.
pub fn replay(ctx: Arc<Context>) -> Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let ctx = ctx.clone();
        Box::pin(async move { converge_instance(&ctx, &inst).await })
    })
}

/// Periodic drift check of every reachable instance, then the claim collection (after it:
/// rules of deleted Services are gone before their claims go).
pub async fn drift_loop(ctx: Arc<Context>, interval: Duration) {
    ctx.gate.wait_ready().await;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the workers replay at start-up
    loop {
        tick.tick().await;
        for inst in ctx.fleet.instances().iter() {
            // One whose worker owes a replay (it restarted) is left to that replay.
            if inst.is_healthy() && inst.takes_passes() {
                wait_quiet(inst, interval).await;
                converge_instance(&ctx, inst).await;
            }
        }
        collect_claims(&ctx).await;
    }
}

/// Takes Services that no longer exist off their claims (`Ipam::collect`). With the watch
/// filtered by type, a Service missing from the store may have left LoadBalancer instead: its
/// cleanup (which honours retention) releases its address, and a sweep finds it if nothing
/// has yet.
async fn collect_claims(ctx: &Context) {
    let missing = |o: &ClaimedBy| {
        ctx.inputs
            .services
            .get(&ObjectRef::new(&o.name).within(&o.namespace))
            .is_none_or(|s| s.metadata.uid.as_deref() != Some(o.uid.as_str()))
    };
    let confirm_gone = |o: ClaimedBy| async move {
        if !ctx.departures.filtered {
            return true;
        }
        let api: Api<Service> = Api::namespaced(ctx.kube.clone(), &o.namespace);
        match api.get_opt(&o.name).await {
            Ok(Some(svc)) if svc.metadata.uid.as_deref() == Some(o.uid.as_str()) => {
                ctx.departures.sweep_soon();
                false
            }
            Ok(_) => true,
            Err(e) => {
                warn!(owner = %o.key(), error = %e, "could not check a claim's owner");
                false
            }
        }
    };
    ctx.ipam.collect(missing, confirm_gone).await;
}

/// How long an instance must have seen no write from a Service's own pass before a drift
/// check lists it.
const DRIFT_QUIET: Duration = Duration::from_secs(1);

/// Waits (at most `limit`) until no Service's pass has written to `inst` for [`DRIFT_QUIET`].
/// A drift check exists for changes made behind the controller's back; while the controller
/// is itself busy (a wave of Node changes re-plans every Service) it would only list the
/// instance mid-change and take the queued Services' work into one large pass under the
/// instance lock (at 2,000 rules: ~1,200 changes at once, a few MB of memory).
async fn wait_quiet(inst: &Instance, limit: Duration) {
    let started = tokio::time::Instant::now();
    while inst.since_service_write().is_some_and(|d| d < DRIFT_QUIET) && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The rules of every served Service placed on `group`, from the stores, one Service at a
/// time; Services with a problem keep the rules they have. A Service of another group has
/// no rule here (an owned rule of it found here is removed: it was moved by hand).
fn desired_in<'a>(ctx: &'a Context, group: &'a str) -> impl Iterator<Item = ServiceRules> + 'a {
    desired_of(ctx, group, |_| true)
}

/// [`desired_in`] for the Services `only` admits (the others are not planned).
fn desired_of<'a>(
    ctx: &'a Context,
    group: &'a str,
    only: impl Fn(&Service) -> bool + 'a,
) -> impl Iterator<Item = ServiceRules> + 'a {
    ctx.inputs
        .services
        .state()
        .into_iter()
        .filter(move |svc| only(svc))
        .filter_map(move |svc| {
            if !ctx.selection.serves(&svc) || svc.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let keep = || {
                ServiceRules::Keep(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                )
            };
            match recorded_group(&svc) {
                Some(recorded) if recorded != group => return None,
                // Not placed yet, outside the default group: whatever it has here stays
                // until its reconcile records where it is.
                None if group != ctx.settings.zone => return Some(keep()),
                _ => {}
            }
            match desired(&svc, ctx) {
                Desired::Rules(plan) => Some(ServiceRules::Want(plan.rules)),
                Desired::Nothing => None,
                Desired::Keep => Some(ServiceRules::Keep(
                    svc.metadata.namespace.clone().unwrap_or_default(),
                    svc.metadata.name.clone().unwrap_or_default(),
                )),
            }
        })
}

/// What a whole-instance pass collects for the firewall while the Services' rules go by:
/// the firewall rules wanted, and the Services that keep what they have.
#[derive(Default)]
struct FirewallWanted {
    rules: Vec<FwRule>,
    keep: Vec<(String, String)>,
}

/// Converges one instance to the rules of every served Service of its group, from the
/// stores; true when it now holds every rule it should (nothing failed, nothing held back).
/// With `--source-ranges=firewall` the rules go without their source ranges and the
/// firewall is converged after them; in the other settings our firewall rules (left by an
/// earlier `firewall` setting) are removed.
async fn converge_instance(ctx: &Context, inst: &Instance) -> bool {
    let firewall = ctx.settings.source_ranges_firewall;
    let prefs = Preferences::of(&ctx.cluster);
    // The firewall rules of ours there: a Service whose firewall rules are not all there
    // (they could not be made, or it got its address since) keeps its LB rules as they are,
    // so none is created open to every source; its own pass programs both.
    let protected = if firewall {
        // Firewall rules first, so that a restricted address is never open while its rule
        // is replayed (a replay of thousands of rules takes a while on a slow loxilb). Only
        // the Services with source ranges are planned for this.
        let has_ranges = |svc: &Service| {
            svc.spec
                .as_ref()
                .and_then(|s| s.load_balancer_source_ranges.as_ref())
                .is_some_and(|r| !r.is_empty())
        };
        let fw: Vec<FwRule> = desired_of(ctx, inst.group(), has_ranges)
            .flat_map(|sr| match sr {
                ServiceRules::Want(rules) => loxi_domain::firewall::split(&rules, prefs).1,
                ServiceRules::Keep(..) => Vec::new(),
            })
            .collect();
        if let Err(e) = inst
            .add_firewall_rules(&ctx.cluster, &fw, &ctx.report.metrics)
            .await
        {
            warn!(instance = inst.url(), error = %e, "firewall replay failed");
        }
        inst.firewall_held().await
    } else {
        None
    };
    let wanted_fw: std::sync::Mutex<FirewallWanted> = Default::default();
    let desired = || {
        desired_in(ctx, inst.group()).map(|sr| {
            let mut fw = wanted_fw.lock().unwrap_or_else(|e| e.into_inner());
            match sr {
                ServiceRules::Want(rules) if firewall => {
                    let (lb, rules_fw) = loxi_domain::firewall::split(&rules, prefs);
                    let exposed = rules_fw
                        .iter()
                        .any(|r| protected.as_ref().is_none_or(|held| !held.contains(r)));
                    fw.rules.extend(rules_fw);
                    match lb.first().and_then(|r| RuleName::parse(&r.name)) {
                        Some(n) if exposed => {
                            fw.keep.push((n.namespace.clone(), n.service.clone()));
                            ServiceRules::Keep(n.namespace, n.service)
                        }
                        _ => ServiceRules::Want(lb),
                    }
                }
                ServiceRules::Keep(ns, name) => {
                    fw.keep.push((ns.clone(), name.clone()));
                    ServiceRules::Keep(ns, name)
                }
                want => want,
            }
        })
    };
    let lb = inst
        .converge_all(
            &ctx.cluster,
            ctx.settings.namespace.as_deref(),
            desired,
            &ctx.report.metrics,
        )
        .await;
    let complete = match lb {
        Ok(report) => {
            if report.changes > 0 {
                info!(
                    instance = inst.url(),
                    changes = report.changes,
                    "drift repaired"
                );
            }
            report.failed.is_empty()
        }
        Err(e) => {
            warn!(instance = inst.url(), error = %e, "drift check failed");
            return false;
        }
    };
    let FirewallWanted { rules: fw, keep } =
        wanted_fw.into_inner().unwrap_or_else(|e| e.into_inner());
    match inst
        .converge_firewall(
            &ctx.cluster,
            ctx.settings.namespace.as_deref(),
            &fw,
            &keep,
            &ctx.report.metrics,
        )
        .await
    {
        Ok(changes) => {
            if changes > 0 {
                info!(instance = inst.url(), changes, "firewall repaired");
            }
            complete
        }
        Err(e) => {
            warn!(instance = inst.url(), error = %e, "firewall check failed");
            // A replay is complete without the firewall only when nothing there is ours to
            // restore.
            complete && fw.is_empty()
        }
    }
}
