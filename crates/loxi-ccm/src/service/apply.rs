//! Step 4 of a Service reconcile: its planned rules onto every reachable loxilb instance of
//! its group, all of them at once, only the difference sent (`crate::loxilb`). What each instance met is collected for the
//! report; what it means is decided in `conditions`.

use k8s_openapi::api::core::v1::Service;
use loxi_domain::Rule;
use loxilb_client::ClientError;

use super::conditions::{self, InstanceResult, Programmed};
use super::context::{Context, rule_owner};

/// Applies `rules` to every reachable instance of `group`. Rules of one Service that loxilb refuses
/// never hold back other rules or other Services. A loxilb limit (capacity, source ranges)
/// is no error to retry: nothing is sent again until room frees on that instance, which
/// re-queues the Service.
pub async fn apply_everywhere(
    svc: &Service,
    ctx: &Context,
    group: &str,
    rules: &[Rule],
) -> Programmed {
    let owner = rule_owner(svc);
    let instances = ctx.fleet.instances();
    // Every loxilb of the group at once: a real loxilb takes about a second per rule write,
    // and one after the other the last of N loxilbs would hear of a change N seconds late
    // (docs/fleet.md). The results stay in the fleet's order.
    let calls = instances
        .iter()
        .filter(|i| i.group() == group)
        // Joining (discovery), or replaying after a restart: the replay programs
        // everything, this rule set too, and a pass follows it.
        .filter(|i| i.takes_passes())
        .map(|inst| {
            let owner = &owner;
            async move {
                let url = inst.url().to_string();
                if !inst.is_healthy() {
                    return (url, InstanceResult::Down(inst.tls_refusal()));
                }
                let (cluster, metrics) = (&ctx.cluster, &ctx.report.metrics);
                let (ns, name, requeue) = (&owner.namespace, &owner.name, Some(&ctx.room_requeue));
                let result = if ctx.settings.source_ranges_firewall {
                    // Source ranges as firewall rules (docs/configuration.md#source-ranges).
                    inst.program_service(cluster, ns, name, rules, metrics, requeue)
                        .await
                } else {
                    inst.apply_service(cluster, ns, name, rules, metrics, requeue)
                        .await
                };
                let result = match result {
                    Ok(report) => InstanceResult::Applied(report),
                    // It went away during the call (or refused TLS): it is now marked down,
                    // and gets every rule replayed when it is back.
                    Err(e @ ClientError::Tls { .. }) => InstanceResult::Down(Some(e.to_string())),
                    Err(e) if e.is_transport() => InstanceResult::Down(None),
                    Err(e) => InstanceResult::Failed(e),
                };
                (url, result)
            }
        });
    let results = futures::future::join_all(calls).await;
    let mut programmed = conditions::programmed(&results, rules.len());
    if results.is_empty() {
        programmed.condition.message = format!("no loxilb of group {group} serves (yet)");
    } else if programmed.condition.ok && ctx.fleet.groups().len() > 1 {
        // With several groups, where the Service is placed is part of what it shows.
        programmed
            .condition
            .message
            .push_str(&format!(" of group {group}"));
    }
    programmed
}
