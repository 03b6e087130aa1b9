//! Step 5 of a Service reconcile, in one place: the status (addresses, conditions), the
//! Events, and the per-Service metrics.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::addressing::{RETAIN_IGNORED, retention};
use loxi_domain::plan::Plan;
use tracing::{info, warn};

use super::conditions::{self, Programmed};
use super::context::Context;
use super::error::ReconcileError;
use super::plan::Problem;
use super::status::{self, COND_ADDRESS, COND_ENDPOINTS, COND_PROGRAMMED, Cond, DesiredStatus};
use crate::ipam::Held;
use crate::k8s::view::{owner_key, published_addresses};

// The report of each way a pass can end (step 5 of `reconcile`).

/// A `loxilb.io/retain-address` that does not parse: the warning that goes with the
/// Service's address (it is served all the same).
fn retention_warning(svc: &Service) -> Option<String> {
    let e = retention(svc.metadata.annotations.as_ref()).err()?;
    Some(format!("{e}; ignored: {RETAIN_IGNORED}"))
}

/// Where `ip` comes from, for messages: the pool its claim credits it to (the one the
/// Service selected when pools overlap), else the first pool holding it.
fn origin(ctx: &Context, held: &Held, ip: &IpAddr) -> String {
    match held.pool_of(ip) {
        Some(pool) => format!(" from pool {pool}"),
        None => ctx.ipam.origin(ip),
    }
}

/// What the Service is told about a VIP it keeps outside the pool its `loxilb.io/poolSelect`
/// names: it keeps the address, and the pool applies only once the address is released.
fn kept_notes(held: &Held) -> Vec<String> {
    held.kept_outside_selection
        .iter()
        .map(|(ip, pool)| conditions::kept_outside_selection(ip, pool))
        .collect()
}

/// The address condition of a Service holding `held`.
fn address_condition(svc: &Service, ctx: &Context, held: &Held) -> Cond {
    let mut described: Vec<String> = held
        .addresses
        .iter()
        .map(|ip| format!("{ip}{}", origin(ctx, held, ip)))
        .collect();
    described.extend(
        held.secondaries
            .iter()
            .map(|ip| format!("secondary {ip}{}", origin(ctx, held, ip))),
    );
    let mut text = described.join(", ");
    for note in kept_notes(held) {
        text = format!("{text}; {note}");
    }
    if let Some(warning) = retention_warning(svc) {
        text = format!("{text}; {warning}");
    }
    Cond::new(COND_ADDRESS, true, "Allocated", text)
}

/// Events about the Service's addresses: a Normal one for addresses newly allocated in this
/// pass, a Normal `AddressKept` for an address kept outside the pool `loxilb.io/poolSelect`
/// names, a Warning for a retention value that does not parse (the last two once: not while
/// the address condition already says it).
pub fn addresses(svc: &Service, ctx: &Context, held: &Held) {
    for note in kept_notes(held) {
        if status::current_condition(svc, COND_ADDRESS).is_some_and(|c| c.message.contains(&note)) {
            continue;
        }
        info!(reason = "AddressKept", "{note}");
        ctx.report
            .event(svc, EventType::Normal, "AddressKept", "Allocate", note);
    }
    if let Some(warning) = retention_warning(svc)
        && !status::current_condition(svc, COND_ADDRESS)
            .is_some_and(|c| c.message.contains(&warning))
    {
        warn!(reason = "InvalidAnnotation", "{warning}");
        ctx.report.event(
            svc,
            EventType::Warning,
            "InvalidAnnotation",
            "Reconcile",
            warning,
        );
    }
    if held.newly.is_empty() {
        return;
    }
    let text: Vec<String> = held
        .newly
        .iter()
        .map(|ip| {
            let role = if held.secondaries.contains(ip) {
                "secondary "
            } else {
                ""
            };
            format!("{role}{ip}{}", origin(ctx, held, ip))
        })
        .collect();
    ctx.report.event(
        svc,
        EventType::Normal,
        "AddressAllocated",
        "Allocate",
        format!("allocated {}", text.join(", ")),
    );
}

/// The Service's current conditions of these types, unchanged (a status write names every
/// condition it keeps: server-side apply drops the ones it leaves out).
fn carried_over(svc: &Service, types: &[&'static str]) -> Vec<Cond> {
    types
        .iter()
        .filter_map(|t| {
            let c = status::current_condition(svc, t)?;
            Some(Cond::new(
                t,
                c.status == "True",
                &c.reason,
                c.message.clone(),
            ))
        })
        .collect()
}

/// No address decision possible now. The addresses the Service shows and still holds stay
/// published, with their rules, until the owner fixes what stops a new decision
/// (`docs/annotations.md`).
pub async fn address_problem(
    svc: &Service,
    ctx: &Context,
    problem: &Problem,
) -> Result<(), ReconcileError> {
    let kept = ctx.ipam.kept_addresses(svc);
    if kept.is_empty() {
        ctx.report
            .record_not_programmed(&owner_key(svc), Some(problem.reason()));
    }
    let conditions = if kept.is_empty() {
        // A Service waiting for a group of loxilbs is not programmed for that very reason.
        let programmed = match problem {
            Problem::Placement(_) => problem.to_string(),
            _ => "no address".to_string(),
        };
        vec![
            Cond::new(COND_ADDRESS, false, problem.reason(), problem.to_string()),
            Cond::new(COND_PROGRAMMED, false, problem.reason(), programmed),
        ]
    } else {
        let shown: Vec<String> = kept.iter().map(IpAddr::to_string).collect();
        let mut conditions = vec![Cond::new(
            COND_ADDRESS,
            false,
            problem.reason(),
            format!(
                "{problem}; keeps {} and its rules until this is fixed",
                shown.join(", ")
            ),
        )];
        conditions.extend(carried_over(svc, &[COND_PROGRAMMED, COND_ENDPOINTS]));
        conditions
    };
    problem_status(svc, ctx, problem, kept, conditions).await
}

/// The addresses are there, the rules cannot be planned: existing rules stay as they were.
pub async fn plan_problem(
    svc: &Service,
    ctx: &Context,
    held: &Held,
    problem: &Problem,
) -> Result<(), ReconcileError> {
    ctx.report
        .record_not_programmed(&owner_key(svc), Some(problem.reason()));
    let mut conditions = vec![
        address_condition(svc, ctx, held),
        Cond::new(
            COND_PROGRAMMED,
            false,
            problem.reason(),
            problem.to_string(),
        ),
    ];
    conditions.extend(carried_over(svc, &[COND_ENDPOINTS]));
    // Rules that cannot be planned are on no loxilb for a new Service: it shows only what it
    // already showed (`conditions::addresses_to_show`).
    problem_status(svc, ctx, problem, ctx.ipam.kept_addresses(svc), conditions).await
}

/// The status for a problem, with one Warning Event when it is not shown yet.
async fn problem_status(
    svc: &Service,
    ctx: &Context,
    problem: &Problem,
    addresses: Vec<IpAddr>,
    conditions: Vec<Cond>,
) -> Result<(), ReconcileError> {
    let want = DesiredStatus {
        addresses,
        conditions,
        ingress: status::ingress_mode(svc, ctx.settings.defaults),
    };
    if !status::is_current(svc, &want) {
        warn!(reason = problem.reason(), "{problem}");
        ctx.report.event(
            svc,
            EventType::Warning,
            problem.reason(),
            "Reconcile",
            problem.to_string(),
        );
        ctx.report
            .write_status(&ctx.services_api(svc), svc, &want)
            .await?;
    }
    Ok(())
}

/// How long a Service's rules may wait for loxilb before its status says they are queued:
/// longer than one write takes on a loxilb that takes one per second, so a routine change
/// does not flip the condition.
const QUEUED_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `applying` (the pass's writes); when they still wait after [`QUEUED_AFTER`] in a
/// loxilb's write window, the Service says so meanwhile: `Programmed` False, reason
/// `Queued`, with how many writes are ahead of its first one and when it may go
/// (docs/architecture.md#writing-to-a-slow-loxilb). It keeps the addresses it shows. Returns
/// what `applying` returned, and the Service as that status write left it (the pass's own
/// status write must be based on it).
pub async fn while_queued<F>(
    svc: &Service,
    ctx: &Context,
    group: &str,
    held: &Held,
    applying: F,
) -> Result<(Programmed, Option<Service>), ReconcileError>
where
    F: std::future::Future<Output = Programmed>,
{
    let mut applying = std::pin::pin!(applying);
    tokio::select! {
        done = &mut applying => return Ok((done, None)),
        () = tokio::time::sleep(QUEUED_AFTER) => {}
    }
    let (namespace, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
    let furthest = ctx
        .fleet
        .instances()
        .iter()
        .filter(|i| i.group() == group)
        .filter_map(|i| {
            i.queued(&namespace, &name)
                .map(|p| (i.url().to_string(), p))
        })
        .max_by_key(|(_, p)| p.ahead);
    let mut written = None;
    if let Some((url, position)) = furthest {
        let when = position
            .estimate
            .map(|d| format!(", about {} s", d.as_secs().max(1)))
            .unwrap_or_default();
        let message = format!(
            "its rule writes wait for loxilb at {url}: {} write(s) ahead{when}",
            position.ahead
        );
        ctx.report
            .record_not_programmed(&owner_key(svc), Some(REASON_QUEUED));
        let mut conditions = vec![
            address_condition(svc, ctx, held),
            Cond::new(COND_PROGRAMMED, false, REASON_QUEUED, message),
        ];
        conditions.extend(carried_over(svc, &[COND_ENDPOINTS]));
        let want = DesiredStatus {
            addresses: published_addresses(svc),
            conditions,
            ingress: status::ingress_mode(svc, ctx.settings.defaults),
        };
        written = ctx
            .report
            .write_status(&ctx.services_api(svc), svc, &want)
            .await?;
    }
    Ok((applying.await, written))
}

/// The reason of `Programmed` while a Service's rule writes wait in a loxilb's write window.
pub const REASON_QUEUED: &str = "Queued";

/// Lets go of addresses the Service no longer wants; called after the pass's status write.
/// Reads what it shows right now from the API server (not the store): an address it shows
/// (another replica's write that won) is not released.
pub async fn release_unwanted(
    svc: &Service,
    ctx: &Context,
    held: &Held,
) -> Result<(), ReconcileError> {
    if !ctx.ipam.unwanted(svc, &held.addresses, &held.secondaries) {
        return Ok(());
    }
    let shown = ctx
        .services_api(svc)
        .get_opt(&svc.name_any())
        .await?
        .filter(|now| now.metadata.uid == svc.metadata.uid)
        .map(|now| published_addresses(&now))
        .unwrap_or_default();
    ctx.ipam
        .release_unwanted(svc, &held.addresses, &held.secondaries, &shown)
        .await?;
    Ok(())
}

/// The report of a pass that applied its rules: Events for what changed and for a new
/// problem (one Warning per episode: a Service that stays blocked, or keeps failing and
/// retrying, already shows why), and the status.
pub async fn programmed(
    svc: &Service,
    ctx: &Context,
    held: &Held,
    plan: &Plan,
    programmed: &Programmed,
) -> Result<(), ReconcileError> {
    ctx.report
        .record_dropped(&owner_key(svc), plan.endpoints_dropped);
    let cond = &programmed.condition;
    ctx.report
        .record_not_programmed(&owner_key(svc), (!cond.ok).then_some(cond.reason.as_str()));
    let shown = status::current_condition(svc, COND_PROGRAMMED);
    if programmed.worth_an_event(shown.is_some_and(|c| c.status == "True")) {
        info!(
            rules = plan.rules.len(),
            changes = programmed.changes,
            "rules programmed"
        );
        ctx.report.event(
            svc,
            EventType::Normal,
            "RulesProgrammed",
            "Program",
            format!(
                "{} rule(s) on {}/{} loxilb instance(s)",
                plan.rules.len(),
                programmed.complete,
                programmed.total
            ),
        );
    } else if programmed.changes > 0 {
        tracing::debug!(
            rules = plan.rules.len(),
            updated = programmed.updated,
            "rules updated in place"
        );
    }
    let already_shown = shown.is_some_and(|c| c.status == "False" && c.reason == cond.reason);
    let new = ctx.report.first_warning(
        &ObjectRef::from_obj(svc),
        (!cond.ok).then_some(cond.reason.as_str()),
        |r| ctx.inputs.services.get(r).is_some(),
    );
    if !cond.ok && !already_shown && new {
        warn!(reason = %cond.reason, "{}", cond.message);
        ctx.report.event(
            svc,
            EventType::Warning,
            &cond.reason,
            "Program",
            cond.message.clone(),
        );
    }
    let ranges = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default();
    let mut conditions = vec![
        address_condition(svc, ctx, held),
        cond.clone(),
        conditions::endpoints(plan.endpoints_dropped),
    ];
    conditions.extend(conditions::source_ranges(
        &ranges,
        ctx.settings.enforce_source_ranges,
    ));
    let want = DesiredStatus {
        addresses: conditions::addresses_to_show(
            programmed,
            &held.addresses,
            ctx.ipam.kept_addresses(svc),
        ),
        conditions,
        ingress: status::ingress_mode(svc, ctx.settings.defaults),
    };
    ctx.report
        .write_status(&ctx.services_api(svc), svc, &want)
        .await?;
    Ok(())
}
