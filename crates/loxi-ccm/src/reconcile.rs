//! Reconciling one Service (docs/architecture.md#data-flow): read the stores, confirm or
//! claim an address, plan rules (pure), apply the difference to every loxilb, report.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use loxi_domain::ipam::Family;
use loxi_domain::plan::Plan;
use loxi_domain::{AllocError, AnnotationError, PlanError, Rule, parse_intent, plan_rules};
use loxilb_client::ClientError;
use serde_json::json;
use thiserror::Error;
use tracing::{Instrument, info, warn};

use crate::claims::{self, ClaimResult};
use crate::context::Context;
use crate::kube_view::{
    SERVICE_NAME_LABEL, endpoint_views, owner_key, published_addresses, secondary_owner_key,
    service_view,
};
use crate::status::{
    self, COND_ADDRESS, COND_ENDPOINTS, COND_PROGRAMMED, COND_SOURCE_RANGES, Cond, DesiredStatus,
};
use loxi_domain::addressing::{AddressInput, AddressSlot, address_slots};

#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// loxilb failed in a way that may pass (unreachable, timeout, 5xx): retried with backoff.
    #[error("loxilb: {0}")]
    Loxilb(String),
    /// This replica no longer holds the leader Lease: nothing more is written or retried.
    #[error("no longer the leader")]
    NotLeader,
}

/// Why a Service cannot have rules right now; each becomes a Warning Event and a condition.
#[derive(Debug, Error)]
pub enum Problem {
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error(transparent)]
    Address(#[from] AllocError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The API server refused to store the address's claim (a policy, a quota, a webhook):
    /// without it the address is neither published nor programmed.
    #[error("the AddressClaim for {ip} was refused by the API server: {message}")]
    ClaimRefused { ip: IpAddr, message: String },
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::Annotation(e) => e.reason(),
            Problem::Address(e) => e.reason(),
            Problem::Plan(e) => e.reason(),
            Problem::ClaimRefused { .. } => "AddressClaimRefused",
        }
    }
}

/// A claim write the API server will refuse again as it is (unlike a conflict, a throttle or
/// an outage): its message, for the Service's condition.
fn refusal(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(status) if matches!(status.code, 400 | 403 | 422) => {
            Some(status.message.clone())
        }
        _ => None,
    }
}

/// What a whole-instance pass (drift check, replay) should hold for one served Service.
pub enum Desired {
    Rules(Plan),
    /// No address yet: no rules.
    Nothing,
    /// Leave its rules as they are: it has a problem only its owner can fix, or an address
    /// that no claim in the store backs yet (being claimed, or refused).
    Keep,
}

/// The rules a served Service should have, computed from the stores only (no allocation).
/// Only addresses backed by a claim that lists the Service are ever programmed from here.
pub fn desired_rules(svc: &Service, ctx: &Context) -> Desired {
    let (addresses, secondaries): (Vec<IpAddr>, Vec<IpAddr>) = match ctx.ipam.lock() {
        Ok(ipam) => (
            ipam.addresses_of(&owner_key(svc)).to_vec(),
            ipam.addresses_of(&secondary_owner_key(svc)).to_vec(),
        ),
        Err(_) => (Vec::new(), Vec::new()),
    };
    if !addresses
        .iter()
        .chain(&secondaries)
        .all(|ip| claimed_by(svc, ctx, ip))
    {
        return Desired::Keep;
    }
    match desired_rules_for(svc, ctx, &addresses, &secondaries) {
        Ok(Some(plan)) => Desired::Rules(plan),
        Ok(None) => Desired::Nothing,
        Err(_) => Desired::Keep,
    }
}

/// Whether the claim store holds a claim for `ip` that lists `svc` (this very Service).
fn claimed_by(svc: &Service, ctx: &Context, ip: &IpAddr) -> bool {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    ctx.claims
        .get(&ObjectRef::new(&claims::claim_name(ip)))
        .is_some_and(|c| c.owner(&ns, &name).is_some_and(|o| o.uid == uid))
}

/// The rules for `svc` on the VIPs `addresses`, SCTP rules with `secondaries`.
pub fn desired_rules_for(
    svc: &Service,
    ctx: &Context,
    addresses: &[IpAddr],
    secondaries: &[IpAddr],
) -> Result<Option<Plan>, Problem> {
    let intent = parse_intent(svc.annotations(), ctx.cfg.defaults)?;
    status::IngressMode::from_annotation(svc)?;
    if addresses.is_empty() {
        return Ok(None);
    }
    let nodes = ctx.node_views();
    let mut view = service_view(svc);
    view.secondary_ips = secondaries.to_vec();
    if !ctx.cfg.enforce_source_ranges {
        // --source-ranges=ignore: said on the Service (source_ranges_condition).
        view.source_ranges.clear();
    }
    // Only externalTrafficPolicy Local and pod-network mode read endpoints: the others are
    // planned from Nodes alone, without a pass over every EndpointSlice.
    let needs_endpoints =
        view.external_traffic_policy == loxi_domain::TrafficPolicy::Local || intent.use_pod_network;
    let endpoints = if needs_endpoints {
        service_endpoints(svc, ctx)
    } else {
        Vec::new()
    };
    Ok(Some(plan_rules(
        &ctx.cluster,
        &view,
        &nodes,
        &endpoints,
        addresses,
        &intent,
    )?))
}

pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    ctx.wait_ready().await;
    // The Service as the store holds it now: a standby's reconciles wait above for
    // leadership with the object they were queued with, and a Service deleted meanwhile
    // must never be claimed or programmed from that old copy.
    let Some(svc) = ctx.services.get(&ObjectRef::from_obj(&*svc)) else {
        tracing::debug!(service = %owner_key(&svc), "gone from the store: nothing to do");
        ctx.fleet.forget_waiter(&ObjectRef::from_obj(&*svc)).await;
        return Ok(Action::await_change());
    };
    if !ctx.write_lease.holds() {
        return Err(ReconcileError::NotLeader);
    }
    if is_superseded(&svc, &ctx) {
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
    let label = match &result {
        Ok(Outcome::Done) => "success",
        Ok(Outcome::Problem) => "invalid",
        Err(_) => "error",
    };
    ctx.metrics.reconciled(label, started.elapsed());
    if result.is_ok()
        && let Ok(mut f) = ctx.failures.lock()
    {
        f.remove(&ObjectRef::from_obj(&*svc));
    }
    result.map(|_| Action::await_change())
}

fn is_superseded(svc: &Service, ctx: &Context) -> bool {
    let Some(rv) = svc.metadata.resource_version.as_deref() else {
        return false;
    };
    ctx.superseded
        .lock()
        .is_ok_and(|m| m.get(&ObjectRef::from_obj(svc)).is_some_and(|v| v == rv))
}

/// Records that `svc` (the version a status write was based on) is behind our write.
fn supersede(svc: &Service, ctx: &Context) {
    if let (Some(rv), Ok(mut m)) = (svc.metadata.resource_version.clone(), ctx.superseded.lock()) {
        m.insert(ObjectRef::from_obj(svc), rv);
    }
}

/// The endpoints of the Service's EndpointSlices (with Multus addresses of their pods).
fn service_endpoints(svc: &Service, ctx: &Context) -> Vec<loxi_domain::EndpointView> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let slices = ctx.endpoint_slices.state();
    let slices = slices.iter().map(|s| s.as_ref()).filter(|s| {
        s.metadata.namespace.as_deref() == Some(ns.as_str())
            && s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|n| *n == name)
    });
    endpoint_views(slices, |pod_ns, pod_name| {
        ctx.pods
            .as_ref()
            .and_then(|pods| pods.get(&ObjectRef::new(pod_name).within(pod_ns)))
            .and_then(|p| {
                p.metadata
                    .annotations
                    .as_ref()?
                    .get(crate::kube_view::NETWORK_STATUS_ANNOTATION)
                    .map(|a| crate::kube_view::multus_networks(a))
            })
            .unwrap_or_default()
    })
}

/// Per-Service exponential backoff (0.5 s doubling to 5 min), reset on success.
pub fn error_policy(svc: Arc<Service>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    if matches!(err, ReconcileError::NotLeader) {
        return Action::await_change();
    }
    let n = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(ObjectRef::from_obj(&*svc)).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    let delay = Duration::from_millis(500)
        .saturating_mul(1u32 << (n - 1).min(10))
        .min(Duration::from_secs(300));
    warn!(service = %owner_key(&svc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

enum Outcome {
    Done,
    /// The Service has a problem only its owner can fix; reported, nothing to retry.
    Problem,
}

async fn reconcile_service(svc: &Service, ctx: &Context) -> Result<Outcome, ReconcileError> {
    if crate::departures::is_placeholder(svc) {
        return departed(svc, ctx).await;
    }
    let served = ctx.selection.serves(svc);
    let deleting = svc.metadata.deletion_timestamp.is_some();
    if !served || deleting {
        cleanup(svc, ctx).await?;
        return Ok(Outcome::Done);
    }
    // Carry on with the Service as the finalizer patch returned it: its resourceVersion is
    // the one the status write below must match.
    let patched = ensure_finalizer(svc, ctx).await?;
    let svc = patched.as_ref().unwrap_or(svc);

    // Address first: a Service with a bad annotation still keeps (and shows) its address.
    let Held {
        addresses,
        secondaries,
        newly,
    } = match ensure_addresses(svc, ctx).await? {
        Ok(x) => x,
        Err(problem) => {
            if matches!(problem, Problem::Address(AllocError::Exhausted { .. }))
                && let Ok(mut w) = ctx.waiting_for_address.lock()
            {
                w.insert(ObjectRef::from_obj(svc));
            }
            // The addresses it shows and still holds stay published, with their rules, until
            // the owner fixes what stops a new decision (docs/annotations.md).
            let kept = kept_addresses(svc, ctx);
            let conditions = if kept.is_empty() {
                vec![
                    Cond::new(COND_ADDRESS, false, problem.reason(), problem.to_string()),
                    Cond::new(COND_PROGRAMMED, false, problem.reason(), "no address"),
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
            report_problem(svc, ctx, &problem, kept, conditions).await?;
            return Ok(Outcome::Problem);
        }
    };
    let mut described: Vec<String> = addresses
        .iter()
        .map(|ip| format!("{ip}{}", pool_suffix(ctx, ip)))
        .collect();
    described.extend(
        secondaries
            .iter()
            .map(|ip| format!("secondary {ip}{}", pool_suffix(ctx, ip))),
    );
    if !newly.is_empty() {
        let text: Vec<String> = newly
            .iter()
            .map(|ip| {
                let role = if secondaries.contains(ip) {
                    "secondary "
                } else {
                    ""
                };
                format!("{role}{ip}{}", pool_suffix(ctx, ip))
            })
            .collect();
        publish(
            ctx,
            svc,
            EventType::Normal,
            "AddressAllocated",
            "Allocate",
            format!("allocated {}", text.join(", ")),
        );
    }
    // A retain period that does not parse decides nothing now: the Service is served, and
    // told (condition message, one Warning per new problem) that the value is ignored.
    let mut address_text = described.join(", ");
    if let Err(e) = retain_annotation(svc) {
        let warning = format!("{e}; ignored: {RETAIN_IGNORED}");
        let shown = status::current_condition(svc, COND_ADDRESS)
            .is_some_and(|c| c.message.contains(&warning));
        if !shown {
            warn!(reason = e.reason(), "{warning}");
            publish(
                ctx,
                svc,
                EventType::Warning,
                e.reason(),
                "Reconcile",
                warning.clone(),
            );
        }
        address_text = format!("{address_text}; {warning}");
    }
    let address_cond = Cond::new(COND_ADDRESS, true, "Allocated", address_text);

    let plan = match desired_rules_for(svc, ctx, &addresses, &secondaries) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(Outcome::Done),
        Err(problem) => {
            // Existing rules stay as they were: only the owner can fix this.
            let cond = Cond::new(
                COND_PROGRAMMED,
                false,
                problem.reason(),
                problem.to_string(),
            );
            let mut conditions = vec![address_cond, cond];
            conditions.extend(carried_over(svc, &[COND_ENDPOINTS]));
            report_problem(svc, ctx, &problem, addresses, conditions).await?;
            return Ok(Outcome::Problem);
        }
    };

    let endpoints_cond = endpoint_limit_condition(svc, ctx, &plan);
    let (programmed, retry) = apply_everywhere(svc, ctx, &plan.rules).await;
    if !ctx.write_lease.holds() {
        // What the calls met (writes stopped) is not the Service's state to report.
        return Err(ReconcileError::NotLeader);
    }
    if retry.is_none() {
        // Addresses no longer wanted (an edited annotation, a lost race) go back only now
        // that their rules are gone.
        release_addresses_except(svc, ctx, &owner_key(svc), &addresses).await?;
        release_addresses_except(svc, ctx, &secondary_owner_key(svc), &secondaries).await?;
    }
    let mut conditions = vec![address_cond, programmed, endpoints_cond];
    conditions.extend(source_ranges_condition(svc, ctx));
    let want = DesiredStatus {
        addresses: addresses.clone(),
        conditions,
        ingress: status::IngressMode::for_service(svc, ctx.cfg.defaults),
    };
    if !status::is_current(svc, &want) {
        status::write(&services_api(ctx, svc), svc, &want).await?;
        supersede(svc, ctx);
    }
    match retry {
        Some(e) => Err(ReconcileError::Loxilb(e)),
        None => Ok(Outcome::Done),
    }
}

/// For a Service with source ranges: whether its rules enforce them (`--source-ranges`).
fn source_ranges_condition(svc: &Service, ctx: &Context) -> Option<Cond> {
    let ranges = svc
        .spec
        .as_ref()?
        .load_balancer_source_ranges
        .as_ref()
        .filter(|r| !r.is_empty())?;
    Some(if ctx.cfg.enforce_source_ranges {
        Cond::new(
            COND_SOURCE_RANGES,
            true,
            "Enforced",
            format!("loxilb accepts connections only from {}", ranges.join(", ")),
        )
    } else {
        Cond::new(
            COND_SOURCE_RANGES,
            false,
            "SourceRangesIgnored",
            "not enforced: the controller runs with --source-ranges=ignore (loxilb issue \
             #1036), so loxilb accepts connections from every source",
        )
    })
}

/// The addresses the Service shows whose claims still list it.
fn kept_addresses(svc: &Service, ctx: &Context) -> Vec<IpAddr> {
    published_addresses(svc)
        .into_iter()
        .filter(|ip| claimed_by(svc, ctx, ip))
        .collect()
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

/// loxilb takes at most 32 endpoints per rule: say so on the Service and in the metric when
/// candidates were left out (the subset is stable: rendezvous hashing on the Service).
fn endpoint_limit_condition(svc: &Service, ctx: &Context, plan: &Plan) -> Cond {
    let dropped = plan.endpoints_dropped;
    record_dropped(ctx, &owner_key(svc), dropped);
    if dropped > 0 {
        Cond::new(
            COND_ENDPOINTS,
            false,
            "EndpointLimit",
            // No count here: it changes with every Node that comes or goes, and a status write
            // per Service per Node change would load the API server for nothing. The number
            // is in the metric loxi_ccm_endpoints_dropped.
            format!(
                "more candidate endpoints than loxilb takes per rule ({}): a stable subset is used",
                loxi_domain::plan::MAX_ENDPOINTS
            ),
        )
    } else {
        Cond::new(
            COND_ENDPOINTS,
            true,
            "AllEndpoints",
            "every candidate endpoint is used",
        )
    }
}

/// Records how many candidate endpoints the Service's rules leave out (0: none, or gone).
fn record_dropped(ctx: &Context, key: &str, dropped: usize) {
    if let Ok(mut guard) = ctx.endpoints_dropped.lock() {
        let (per, total) = &mut *guard;
        let before = if dropped > 0 {
            per.insert(key.to_string(), dropped)
        } else {
            per.remove(key)
        };
        *total = (*total + dropped).saturating_sub(before.unwrap_or(0));
        ctx.metrics.set_endpoints_dropped(*total);
    }
}

/// Applies the plan to every reachable instance. Returns the Programmed condition and, when
/// some failure may pass by itself, its text for a retry.
///
/// Programmed is True when every reachable instance holds the rules: reason Programmed, or
/// PartiallyProgrammed naming the unreachable ones (each gets every rule replayed when it is
/// back, and Services are re-evaluated then). A loxilb limit (CapacityExceeded,
/// SourceRangesUnsupported) is no error to retry: nothing is sent again until room frees on
/// that instance, which re-queues the Service (`Fleet`). Rules of one Service that loxilb
/// refuses never hold back other rules or other Services.
async fn apply_everywhere(svc: &Service, ctx: &Context, rules: &[Rule]) -> (Cond, Option<String>) {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let total = ctx.fleet.instances.len();
    let mut ok = 0;
    let mut changes = 0;
    let mut updated = 0;
    let mut down: Vec<String> = Vec::new();
    let mut failures: Vec<(String, ClientError)> = Vec::new();
    let mut blocked: Vec<(String, crate::fleet::Blocked)> = Vec::new();
    let mut conflicts = Vec::new();
    for inst in ctx.fleet.instances.iter() {
        let url = inst.url().to_string();
        if !inst.is_healthy() {
            down.push(url);
            continue;
        }
        match inst
            .apply_service(
                &ctx.cluster,
                &ns,
                &name,
                rules,
                &ctx.metrics,
                Some(&ctx.requeue),
            )
            .await
        {
            Ok(report) => {
                changes += report.changes;
                updated += report.updated;
                if report.complete() {
                    ok += 1;
                }
                conflicts.extend(
                    report
                        .conflicts
                        .into_iter()
                        .map(|(k, n)| format!("{k} held by foreign rule {n:?} on {url}")),
                );
                blocked.extend(report.blocked.into_iter().map(|b| (url.clone(), b)));
                failures.extend(
                    report
                        .failed
                        .into_iter()
                        .map(|(k, e)| (format!("{url} ({k})"), e)),
                );
            }
            // It went away during the call: it is now marked down, and gets every rule
            // replayed when it is back.
            Err(ClientError::Unreachable { .. } | ClientError::Timeout { .. }) => down.push(url),
            Err(e) => failures.push((url, e)),
        }
    }
    // Also when another path made the calls: the drift check or a replay may program a new
    // Service's rules first, as soon as its address is indexed.
    let became_programmed = failures.is_empty()
        && blocked.is_empty()
        && conflicts.is_empty()
        && ok > 0
        && status::current_condition(svc, COND_PROGRAMMED).is_none_or(|c| c.status != "True");
    // An Event when rules appear, go or are re-created, not for in-place updates (a Node
    // change updates every Service's endpoints: one Event each would flood the API server).
    if changes > updated || became_programmed {
        info!(rules = rules.len(), changes, "rules programmed");
        publish(
            ctx,
            svc,
            EventType::Normal,
            "RulesProgrammed",
            "Program",
            format!("{} rule(s) on {ok}/{total} loxilb instance(s)", rules.len()),
        );
    } else if changes > 0 {
        tracing::debug!(rules = rules.len(), updated, "rules updated in place");
    }
    let retry = failures
        .iter()
        .find(|(_, e)| e.is_retryable())
        .map(|(url, e)| format!("{url}: {e}"));
    // Capacity first: it is the one a user fixes by freeing room, not by editing the Service.
    blocked.sort_by_key(|(_, b)| b.reason() != crate::fleet::REASON_CAPACITY);
    let cond = if let Some((_, first)) = blocked.first() {
        let text: Vec<String> = blocked
            .iter()
            .map(|(url, b)| format!("{url}: {b}"))
            .collect();
        Cond::new(COND_PROGRAMMED, false, first.reason(), text.join("; "))
    } else if let Some((url, e)) = failures.first() {
        Cond::new(COND_PROGRAMMED, false, e.category(), format!("{url}: {e}"))
    } else if !conflicts.is_empty() {
        Cond::new(COND_PROGRAMMED, false, "RuleConflict", conflicts.join("; "))
    } else if ok == 0 {
        Cond::new(
            COND_PROGRAMMED,
            false,
            "LoxilbUnavailable",
            format!("no loxilb instance is reachable ({})", down.join(", ")),
        )
    } else if !down.is_empty() {
        Cond::new(
            COND_PROGRAMMED,
            true,
            "PartiallyProgrammed",
            format!(
                "{} rule(s) on {ok}/{total} instances; unreachable, replayed when back: {}",
                rules.len(),
                down.join(", ")
            ),
        )
    } else {
        Cond::new(
            COND_PROGRAMMED,
            true,
            "Programmed",
            format!("{} rule(s) on {ok}/{total} loxilb instance(s)", rules.len()),
        )
    };
    // One Warning per episode: a Service that stays blocked (or keeps failing and retrying)
    // already shows why, and re-publishing on every pass would flood its Events.
    let shown = status::current_condition(svc, COND_PROGRAMMED)
        .is_some_and(|c| c.status == "False" && c.reason == cond.reason);
    let new = ctx.fleet.first_warning(
        &ObjectRef::from_obj(svc),
        (!cond.ok).then_some(cond.reason.as_str()),
        |r| ctx.services.get(r).is_some(),
    );
    if !cond.ok && !shown && new {
        warn!(reason = %cond.reason, "{}", cond.message);
        publish(
            ctx,
            svc,
            EventType::Warning,
            &cond.reason,
            "Program",
            cond.message.clone(),
        );
    }
    (cond, retry)
}

fn pool_suffix(ctx: &Context, ip: &IpAddr) -> String {
    let pool = ctx
        .ipam
        .lock()
        .map(|i| i.pool_containing(ip).to_string())
        .unwrap_or_default();
    if pool.is_empty() {
        " (outside every pool)".to_string()
    } else {
        format!(" from pool {pool}")
    }
}

/// Where a candidate address comes from; decides what happens when its claim is taken.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Already indexed for this Service (claimed before, or shown in its status at start-up).
    Indexed,
    /// Shown in the Service's status (adoption from kube-loxilb / loxi-ccm, or a restart).
    Published,
    /// `loxilb.io/staticIP` or `spec.loadBalancerIP`.
    Requested,
    /// From a pool: a free address, or (shared mode) one the Service fits on next to others.
    Allocated,
}

/// The (port, protocol) pairs a Service serves: what it occupies on a shared address.
fn service_ports(svc: &Service) -> Vec<loxi_domain::ipam::PortProto> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| {
                    let port = u16::try_from(p.port).ok()?;
                    let protocol =
                        loxi_domain::Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
                    Some(loxi_domain::ipam::PortProto::new(port, protocol))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the Service occupies on its addresses: its ports and `loxilb.io/sharing-key`
/// (`loxi_domain::sharing`; recorded in both modes, the mode only decides joining).
pub fn service_sharing(svc: &Service) -> Result<loxi_domain::ipam::Sharing, AnnotationError> {
    loxi_domain::sharing::service_sharing(svc.metadata.annotations.as_ref(), &service_ports(svc))
}

/// Makes the index's owners of the claim's address exactly the claim's (the durable record
/// wins over whatever the index guessed).
pub fn index_from_claim(ctx: &Context, claim: &claims::AddressClaim) {
    if let (Some(ip), Ok(mut ipam)) = (claim.ip(), ctx.ipam.lock()) {
        ipam.set_owners(
            ip,
            claim
                .owners()
                .iter()
                .map(|o| (o.key(), o.sharing()))
                .collect(),
        );
    }
}

/// Records the Service in the index as an owner of the address of `claim`, a claim from the
/// store listing it. The store may lag behind claim writes this replica just made, so the
/// claim's other owners replace the index's only when the index has an owner there the
/// Service cannot share with (the claim, listing the Service, says that owner is stale).
fn index_self(
    ctx: &Context,
    claim: &claims::AddressClaim,
    key: &str,
    sharing: &loxi_domain::ipam::Sharing,
) {
    let recorded = match (claim.ip(), ctx.ipam.lock()) {
        (Some(ip), Ok(mut ipam)) => ipam.assign_shared(ip, key, sharing.clone()).is_ok(),
        _ => true,
    };
    if !recorded {
        index_from_claim(ctx, claim);
    }
}

/// The addresses a Service holds, each backed by its claim.
struct Held {
    /// VIPs, one per IP family, in status order.
    addresses: Vec<IpAddr>,
    /// SCTP multi-homing addresses (only for a Service with an SCTP port).
    secondaries: Vec<IpAddr>,
    /// Those of both newly allocated by this pass.
    newly: Vec<IpAddr>,
}

/// What an address is for: decides its owner key, its claim entry, and whether the status
/// shows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Vip,
    Secondary,
}

/// Every address the Service asks for (one per IP family, plus SCTP secondary addresses),
/// each backed by its claim. A Service that cannot have its addresses now waits: it is
/// retried when an address is released or the pools change.
async fn ensure_addresses(
    svc: &Service,
    ctx: &Context,
) -> Result<Result<Held, Problem>, ReconcileError> {
    let result = ensure_addresses_now(svc, ctx).await?;
    if result.is_err()
        && let Ok(mut w) = ctx.waiting_for_address.lock()
    {
        w.insert(ObjectRef::from_obj(svc));
    }
    Ok(result)
}

async fn ensure_addresses_now(
    svc: &Service,
    ctx: &Context,
) -> Result<Result<Held, Problem>, ReconcileError> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.clone()).unwrap_or_default();
    let input = AddressInput {
        annotations: svc.metadata.annotations.as_ref(),
        ip_families: &families,
        ip_family_policy: spec.and_then(|s| s.ip_family_policy.as_deref()),
        load_balancer_ip: spec.and_then(|s| s.load_balancer_ip.as_deref()),
    };
    let sharing = match service_sharing(svc) {
        Ok(s) => s,
        Err(e) => return Ok(Err(Problem::Annotation(e))),
    };
    let pools = ctx.pools.current();
    let namespace_labels = ctx
        .pools
        .namespace_labels(&svc.namespace().unwrap_or_default());
    let who = loxi_domain::pools::Requester {
        namespace_labels: &namespace_labels,
        service_labels: svc.labels(),
    };
    let selected = svc
        .annotations()
        .get(loxi_domain::addressing::ANN_POOL_SELECT)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty());
    let slots = match address_slots(&input, |f| pools.serves(selected, &who, f)) {
        Ok(s) => s,
        Err(e) => return Ok(Err(Problem::Annotation(e))),
    };
    // Secondary addresses serve SCTP rules only: a Service without an SCTP port gets none.
    let has_sctp = service_ports(svc)
        .iter()
        .any(|p| p.protocol == loxi_domain::Protocol::Sctp);
    let secondary_slots = match slots.first() {
        Some(first) if has_sctp => match loxi_domain::addressing::secondary_slots(
            svc.metadata.annotations.as_ref(),
            first.family,
        ) {
            Ok(s) => s,
            Err(e) => return Ok(Err(Problem::Annotation(e))),
        },
        _ => Vec::new(),
    };
    let mut held = Held {
        addresses: Vec::new(),
        secondaries: Vec::new(),
        newly: Vec::new(),
    };
    let all = slots
        .iter()
        .map(|s| (s, Role::Vip))
        .chain(secondary_slots.iter().map(|s| (s, Role::Secondary)));
    for (slot, role) in all {
        let taken = match role {
            Role::Vip => &held.addresses,
            Role::Secondary => &held.secondaries,
        };
        let want = Want {
            slot,
            pools: &pools,
            who: &who,
            sharing: &sharing,
            unique: ctx.cfg.unique_ip,
            role,
            taken,
        };
        match ensure_address(svc, ctx, &want).await? {
            Ok((ip, new)) => {
                match role {
                    Role::Vip => held.addresses.push(ip),
                    Role::Secondary => held.secondaries.push(ip),
                }
                if new {
                    held.newly.push(ip);
                }
            }
            Err(Problem::Address(AllocError::UnknownPool(name)))
                if slot.pool.as_deref() == Some(name.as_str()) =>
            {
                let (annotation, reason) = match role {
                    Role::Vip => (
                        loxi_domain::addressing::ANN_POOL_SELECT,
                        "no pool with this name",
                    ),
                    Role::Secondary if secondary_pool_named(svc) => (
                        loxi_domain::addressing::ANN_POOL_SELECT_SECONDARY,
                        "no pool with this name",
                    ),
                    Role::Secondary => (
                        loxi_domain::addressing::ANN_NUM_SECONDARY,
                        "no such secondary pool: --external-secondary-cidrs has fewer blocks",
                    ),
                };
                return Ok(Err(Problem::Annotation(AnnotationError {
                    annotation,
                    value: name,
                    reason: reason.into(),
                })));
            }
            Err(problem) => return Ok(Err(problem)),
        }
    }
    Ok(Ok(held))
}

/// Whether the Service names its secondary pools (else they are `secondary0`, ...).
fn secondary_pool_named(svc: &Service) -> bool {
    svc.annotations()
        .get(loxi_domain::addressing::ANN_POOL_SELECT_SECONDARY)
        .is_some_and(|v| !v.trim().is_empty())
}

/// The Service's address of one family, backed by a durable claim listing it that exists
/// before this returns: the one it shows while its claim lists it, else the one already
/// indexed, else the one it shows (adoption), else the requested one, else one from its
/// pools. A claim made by someone else first (another replica, another process) is never
/// stolen: a pool address is then picked again, while an adopted or requested one is
/// reported as in use. In shared mode the Service joins a claim whose owners it is
/// compatible with; when its own ports change onto a sharer's, it moves to another address
/// (the sharer was there first), and the old one is let go once rules are on the new one.
///
/// A secondary address is claimed the same way, under its own owner entry (never shared,
/// never shown in the status, so never adopted from it).
async fn ensure_address(
    svc: &Service,
    ctx: &Context,
    want: &Want<'_, '_>,
) -> Result<Result<(IpAddr, bool), Problem>, ReconcileError> {
    let Want {
        slot,
        sharing,
        role,
        ..
    } = *want;
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    let (key, me) = match role {
        Role::Vip => (
            owner_key(svc),
            claims::ClaimedBy::new(&ns, &name, &uid, sharing),
        ),
        Role::Secondary => (
            secondary_owner_key(svc),
            claims::ClaimedBy::secondary(&ns, &name, &uid),
        ),
    };
    // The address the Service shows wins when its claim lists it: any other address indexed
    // for it (a replica that raced and lost the status write) is given back.
    if role == Role::Vip
        && let Some(shown) = published_addresses(svc)
            .into_iter()
            .find(|ip| Family::of(ip) == slot.family)
        && slot.requested.is_none_or(|r| r == shown)
        && let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&shown)))
        && c.owner(&ns, &name).is_some_and(|o| o.uid == uid)
        && c.spec.retain_until.is_none()
    {
        let current = if c.owner(&ns, &name) == Some(&me) {
            index_self(ctx, &c, &key, sharing);
            true
        } else {
            // Its ports or sharing key changed, or the claim predates sharing: record that,
            // unless the new ports land on another owner's.
            match claims::claim(&ctx.claims_api, &shown, &c.spec.pool, &me, false).await? {
                ClaimResult::Ours(written) => {
                    index_from_claim(ctx, &written);
                    true
                }
                ClaimResult::Taken(other) => {
                    index_from_claim(ctx, &other);
                    warn!(ip = %shown, "the Service's ports now overlap another owner's: moving to another address");
                    false
                }
            }
        };
        if current {
            let extra: Vec<IpAddr> = ctx
                .ipam
                .lock()
                .map(|i| {
                    i.addresses_of(&key)
                        .iter()
                        .copied()
                        .filter(|ip| *ip != shown && ip.is_ipv4() == shown.is_ipv4())
                        .collect()
                })
                .unwrap_or_default();
            let still_shown = if extra.is_empty() {
                Vec::new()
            } else {
                shown_now(svc, ctx).await?
            };
            for ip in extra.into_iter().filter(|ip| !still_shown.contains(ip)) {
                if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)))
                    && c.owner(&ns, &name).is_some()
                {
                    claims::leave(&ctx.claims_api, &c, &ns, &name).await?;
                }
                if let Ok(mut i) = ctx.ipam.lock() {
                    i.release_from(&ip, &key);
                }
                warn!(%ip, kept = %shown, "released a second address claimed for this Service");
            }
            return Ok(Ok((shown, false)));
        }
    }
    // Bounded: each lost race marks one more address as taken.
    for _ in 0..32 {
        let picked = {
            let mut ipam = ctx.ipam.lock().expect("ipam lock poisoned");
            pick_address(svc, &key, want, &mut ipam)
        };
        let (ip, source) = match picked {
            Ok(x) => x,
            Err(e) => return Ok(Err(e.into())),
        };
        let occupies = match role {
            Role::Vip => sharing.clone(),
            Role::Secondary => loxi_domain::ipam::Sharing::Exclusive,
        };
        // Fast path: the claim is already in the store and lists this Service as it is.
        if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)))
            && c.owner(&ns, &name) == Some(&me)
            && c.spec.retain_until.is_none()
        {
            index_self(ctx, &c, &key, &occupies);
            return Ok(Ok((ip, false)));
        }
        let pool = ctx
            .ipam
            .lock()
            .map(|i| i.pool_containing(&ip).to_string())
            .unwrap_or_default();
        // Never in unique mode; a specific address only by a shared key (sharing docs).
        let requested = source == Source::Requested;
        let may_join = role == Role::Vip
            && loxi_domain::sharing::may_join(ctx.cfg.unique_ip, requested, sharing);
        let claimed = match claims::claim(&ctx.claims_api, &ip, &pool, &me, may_join).await {
            Ok(claimed) => claimed,
            Err(e) => {
                // The pick may stay in the index only once its claim exists: the drift check
                // and the replay program what the index holds.
                if source != Source::Indexed
                    && let Ok(mut ipam) = ctx.ipam.lock()
                {
                    ipam.release_from(&ip, &key);
                }
                return match refusal(&e) {
                    Some(message) => Ok(Err(Problem::ClaimRefused { ip, message })),
                    None => Err(e.into()),
                };
            }
        };
        match claimed {
            ClaimResult::Ours(written) => {
                index_from_claim(ctx, &written);
                if !written.spec.shared_with.is_empty() {
                    let owners: Vec<String> = written.owners().iter().map(|o| o.key()).collect();
                    info!(%ip, ?owners, "address shared");
                }
                update_pool_metrics(ctx);
                return Ok(Ok((ip, source == Source::Allocated)));
            }
            ClaimResult::Taken(other) => {
                index_from_claim(ctx, &other);
                let owner = other
                    .owners()
                    .iter()
                    .find(|o| !o.is(&ns, &name))
                    .map(|o| o.key())
                    .unwrap_or_else(|| other.owner_key());
                if matches!(source, Source::Published | Source::Requested) {
                    return Ok(Err(AllocError::Taken { ip, owner }.into()));
                }
                warn!(%ip, %owner, "address claimed by someone else first; taking another");
            }
        }
    }
    Ok(Err(AllocError::Exhausted {
        pool: slot.pool.clone().unwrap_or_default(),
        family: slot.family,
    }
    .into()))
}

/// One address slot of a Service and what may fill it.
#[derive(Clone, Copy)]
struct Want<'a, 'l> {
    slot: &'a AddressSlot,
    pools: &'a loxi_domain::pools::PoolSet,
    who: &'a loxi_domain::pools::Requester<'l>,
    /// What the Service occupies (its ports and key) on a VIP.
    sharing: &'a loxi_domain::ipam::Sharing,
    /// `--set-unique-ip`: join nobody.
    unique: bool,
    role: Role,
    /// Addresses of the same role already filled by earlier slots of this pass.
    taken: &'a [IpAddr],
}

/// Picks the candidate address from the index (and records it there). Pools come in the
/// order `loxi_domain::pools` gives for this Service; an address it already has is kept even
/// when its pool was shrunk, disabled, or no longer admits it (no reshuffle), and even in
/// unique mode when it shares it (switching modes moves nobody).
fn pick_address(
    svc: &Service,
    key: &str,
    want: &Want<'_, '_>,
    ipam: &mut loxi_domain::Allocator,
) -> Result<(IpAddr, Source), AllocError> {
    let Want {
        slot,
        pools,
        who,
        unique,
        role,
        taken,
        ..
    } = *want;
    // A secondary address is never shared.
    let exclusive = loxi_domain::ipam::Sharing::Exclusive;
    let sharing = match role {
        Role::Vip => want.sharing,
        Role::Secondary => &exclusive,
    };
    let mine = |ip: &IpAddr| Family::of(ip) == slot.family && !taken.contains(ip);
    if let Some(wanted) = slot.requested {
        if ipam.holds(&wanted, key) {
            // Refreshed when the new sharing still fits; a clash is settled by the claim.
            let _ = ipam.assign_shared(wanted, key, sharing.clone());
            return Ok((wanted, Source::Indexed));
        }
        pools.admits_address(&wanted, who)?;
        if let Some(owner) = ipam.owner_of(&wanted)
            && (role == Role::Secondary || !loxi_domain::sharing::may_join(unique, true, sharing))
        {
            return Err(AllocError::Taken {
                ip: wanted,
                owner: owner.to_string(),
            });
        }
        ipam.assign_shared(wanted, key, sharing.clone())?;
        return Ok((wanted, Source::Requested));
    }
    // Indexed, but possibly from another pool than the one now selected: kept unless the
    // selection names a pool that does not contain it, or its ports now overlap another
    // owner's.
    let indexed = ipam.addresses_of(key).iter().copied().find(|ip| {
        mine(ip)
            && slot.pool.as_deref().is_none_or(|p| {
                pools.get(p).is_some_and(|d| d.pool.contains(ip))
                    || ipam.pool_containing(ip).is_empty()
            })
            && ipam.conflict(ip, key, sharing).is_none()
    });
    if let Some(ip) = indexed {
        ipam.assign_shared(ip, key, sharing.clone())?;
        return Ok((ip, Source::Indexed));
    }
    // Adoption joins the address's other owners only in shared mode (kube-loxilb's shared
    // mode shows several Services on one address).
    if role == Role::Vip
        && let Some(ip) = published_addresses(svc).into_iter().find(|ip| mine(ip))
        && ipam.conflict(&ip, key, sharing).is_none()
        && (!unique || ipam.owners_of(&ip).iter().all(|o| *o == key))
    {
        ipam.assign_shared(ip, key, sharing.clone())?;
        return Ok((ip, Source::Published));
    }
    let candidates = pools.candidates(slot.pool.as_deref(), who, slot.family)?;
    // Unique mode takes free addresses only (the claim then records the real ports).
    let take = if unique || role == Role::Secondary {
        loxi_domain::ipam::Sharing::Exclusive
    } else {
        sharing.clone()
    };
    let grant = ipam.allocate_from(key, &candidates, slot.family, &take)?;
    Ok((grant.ip, Source::Allocated))
}

/// Pool metrics from the index, and a nudge to the pool status writer.
pub fn update_pool_metrics(ctx: &Context) {
    if let Ok(ipam) = ctx.ipam.lock() {
        for pool in ipam.pools() {
            let total = ipam
                .total_in(&pool.name, Family::V4)
                .saturating_add(ipam.total_in(&pool.name, Family::V6));
            ctx.metrics
                .set_pool(&pool.name, total, ipam.used_in(&pool.name));
        }
    }
    ctx.pools.changed.notify_one();
}

async fn report_problem(
    svc: &Service,
    ctx: &Context,
    problem: &Problem,
    addresses: Vec<IpAddr>,
    conditions: Vec<Cond>,
) -> Result<(), ReconcileError> {
    let want = DesiredStatus {
        addresses,
        conditions,
        ingress: status::IngressMode::for_service(svc, ctx.cfg.defaults),
    };
    if !status::is_current(svc, &want) {
        warn!(reason = problem.reason(), "{problem}");
        publish(
            ctx,
            svc,
            EventType::Warning,
            problem.reason(),
            "Reconcile",
            problem.to_string(),
        );
        status::write(&services_api(ctx, svc), svc, &want).await?;
        supersede(svc, ctx);
    }
    Ok(())
}

/// The Service is gone or no longer ours: rules off every reachable loxilb, then the address
/// back to the pool, then (for a Service that stays) our status fields, then the finalizer.
async fn cleanup(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    if let Ok(mut m) = ctx.superseded.lock() {
        m.remove(&ObjectRef::from_obj(svc));
    }
    record_dropped(ctx, &owner_key(svc), 0);
    let finalizers = ctx.selection.our_finalizers(svc);
    let holds_address = ctx
        .ipam
        .lock()
        .map(|i| {
            !i.addresses_of(&owner_key(svc)).is_empty()
                || !i.addresses_of(&secondary_owner_key(svc)).is_empty()
        })
        .unwrap_or(false);
    if finalizers.is_empty() && !holds_address {
        return Ok(());
    }
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let mut removed = 0;
    for inst in ctx.fleet.instances.iter() {
        if !inst.is_healthy() {
            // Unreachable: its orphans are removed by the replay when it comes back.
            continue;
        }
        match inst
            .remove_service(&ctx.cluster, &ns, &name, &ctx.metrics)
            .await
        {
            Ok(r) => removed += r.changes,
            Err(e) => {
                publish(
                    ctx,
                    svc,
                    EventType::Warning,
                    e.category(),
                    "Cleanup",
                    format!("{}: {e}", inst.url()),
                );
                return Err(ReconcileError::Loxilb(format!("{}: {e}", inst.url())));
            }
        }
    }
    if removed > 0 {
        publish(
            ctx,
            svc,
            EventType::Normal,
            "RulesDeleted",
            "Cleanup",
            format!("deleted {removed} rule(s)"),
        );
    }
    release_addresses(svc, ctx).await?;
    if svc.metadata.deletion_timestamp.is_none() {
        status::clear(&services_api(ctx, svc), svc).await?;
    }
    if !finalizers.is_empty() {
        let remaining: Vec<&String> = svc
            .finalizers()
            .iter()
            .filter(|f| !finalizers.contains(&f.as_str()))
            .collect();
        patch_finalizers(ctx, svc, json!(remaining)).await?;
    }
    Ok(())
}

/// A Service that left the Service watch while carrying our finalizer (crate::departures):
/// cleaned up as it is now, then its placeholder is dropped.
async fn departed(placeholder: &Service, ctx: &Context) -> Result<Outcome, ReconcileError> {
    let now = services_api(ctx, placeholder)
        .get_opt(&placeholder.name_any())
        .await?;
    match now {
        Some(now) if now.metadata.uid == placeholder.metadata.uid => {
            if ctx.selection.serves(&now) && now.metadata.deletion_timestamp.is_none() {
                // Back to LoadBalancer: the watch sends it again, which replaces the
                // placeholder and reconciles it.
                return Ok(Outcome::Done);
            }
            cleanup(&now, ctx).await?;
        }
        // Gone, or a new Service of that name: nothing of the old one left to write on. Its
        // rules go with the next drift check, its claims with the claim collector.
        _ => {}
    }
    ctx.departures.forget(placeholder);
    Ok(Outcome::Done)
}

/// Addresses the Service shows right now, read from the API server rather than the store:
/// with two replicas racing, the other may have just published an address this replica's
/// (stale) view says is unused, and letting it go would hand a published address to someone
/// else. An address a Service shows is released only after its status moved on (the status
/// write triggers another reconcile, which then releases it).
async fn shown_now(svc: &Service, ctx: &Context) -> Result<Vec<IpAddr>, ReconcileError> {
    let now = services_api(ctx, svc).get_opt(&svc.name_any()).await?;
    Ok(now
        .filter(|now| now.metadata.uid == svc.metadata.uid)
        .map(|now| published_addresses(&now))
        .unwrap_or_default())
}

/// Lets go of every address the Service holds under owner key `key` (its VIPs or its
/// secondary addresses) not in `keep` and not shown in its status (its claims updated or
/// deleted, the index freed where nobody else holds the address).
async fn release_addresses_except(
    svc: &Service,
    ctx: &Context,
    key: &str,
    keep: &[IpAddr],
) -> Result<(), ReconcileError> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let extra: Vec<IpAddr> = ctx
        .ipam
        .lock()
        .map(|i| {
            i.addresses_of(key)
                .iter()
                .copied()
                .filter(|ip| !keep.contains(ip))
                .collect()
        })
        .unwrap_or_default();
    if extra.is_empty() {
        return Ok(());
    }
    let shown = shown_now(svc, ctx).await?;
    let extra: Vec<IpAddr> = extra.into_iter().filter(|ip| !shown.contains(ip)).collect();
    if extra.is_empty() {
        return Ok(());
    }
    for ip in &extra {
        if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(ip)))
            && c.owner(&ns, &name).is_some()
        {
            claims::leave(&ctx.claims_api, &c, &ns, &name).await?;
        }
        if let Ok(mut i) = ctx.ipam.lock() {
            i.release_from(ip, key);
        }
    }
    info!(released = ?extra, "addresses no longer wanted released");
    update_pool_metrics(ctx);
    ctx.wake_address_waiters();
    Ok(())
}

/// Annotation asking to keep a deleted Service's address for a while (e.g. `24h`), so that
/// re-creating the Service gets the same address.
pub const ANN_RETAIN: &str = "loxilb.io/retain-address";

/// What a `loxilb.io/retain-address` that does not parse means (docs/annotations.md).
const RETAIN_IGNORED: &str =
    "at deletion the address is retained as its pool's retainAddresses says (default: released)";

/// The period `loxilb.io/retain-address` asks for: `None` when absent or empty (kube-loxilb's
/// rule), `0` to release at once. A value that does not parse is reported and otherwise
/// ignored, as if absent: it never stops the Service from being served.
fn retain_annotation(svc: &Service) -> Result<Option<Duration>, AnnotationError> {
    let Some(value) = svc
        .annotations()
        .get(ANN_RETAIN)
        .filter(|v| !v.trim().is_empty())
    else {
        return Ok(None);
    };
    crate::cli::parse_duration(value)
        .map(Some)
        .map_err(|_| AnnotationError {
            annotation: ANN_RETAIN,
            value: value.clone(),
            reason: "expected a duration such as 30m, 24h or 3600".into(),
        })
}

/// Gives the Service's addresses back (their rules are gone by now): takes it off their
/// claims (deleted when it was the last owner), or keeps an address it held alone as
/// retained for this namespace/name when asked to. A shared address is not retained: it
/// stays with its other owners anyway.
async fn release_addresses(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    // The annotation wins over the pool's `retainAddresses` (`0` there: release at once);
    // one that does not parse counts as absent (reported while the Service was served).
    let annotated = retain_annotation(svc).unwrap_or_else(|e| {
        warn!("{e}; ignored: {RETAIN_IGNORED}");
        None
    });
    release_addresses_of(svc, ctx, &owner_key(svc), annotated).await?;
    release_addresses_of(svc, ctx, &secondary_owner_key(svc), annotated).await
}

/// [`release_addresses`] for the addresses held under owner key `key`; `annotated` is the
/// Service's `loxilb.io/retain-address`.
async fn release_addresses_of(
    svc: &Service,
    ctx: &Context,
    key: &str,
    annotated: Option<Duration>,
) -> Result<(), ReconcileError> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    let ips: Vec<IpAddr> = ctx
        .ipam
        .lock()
        .map(|i| i.addresses_of(key).to_vec())
        .unwrap_or_default();
    let pools = ctx.pools.current();
    let mut released = Vec::new();
    for ip in ips {
        let retain = annotated
            .or_else(|| {
                let pool = ctx
                    .ipam
                    .lock()
                    .map(|i| i.pool_containing(&ip).to_string())
                    .unwrap_or_default();
                pools.get(&pool).and_then(|d| d.retain)
            })
            .filter(|d| !d.is_zero());
        let claim = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)));
        let ours = claim.as_ref().is_some_and(|c| {
            c.owner(&ns, &name)
                .is_some_and(|o| o.uid.is_empty() || o.uid == uid)
        });
        let alone = claim.as_ref().is_some_and(|c| c.owners().len() == 1);
        match (claim, ours, retain) {
            (Some(c), true, Some(d)) if alone => {
                // Saturating: a period past the year 9999 keeps the address for good.
                let until = k8s_openapi::jiff::Timestamp::now()
                    .saturating_add(d)
                    .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
                claims::retain(&ctx.claims_api, &c, until).await?;
                info!(%ip, %until, "address retained");
                continue; // still indexed for this namespace/name
            }
            (Some(c), true, _) => claims::leave(&ctx.claims_api, &c, &ns, &name).await?,
            _ => {}
        }
        if let Ok(mut ipam) = ctx.ipam.lock() {
            ipam.release_from(&ip, key);
        }
        released.push(ip);
    }
    if !released.is_empty() {
        info!(?released, "addresses released");
        update_pool_metrics(ctx);
        ctx.wake_address_waiters();
    }
    Ok(())
}

/// Adds our finalizer when missing; returns the Service as written then.
async fn ensure_finalizer(svc: &Service, ctx: &Context) -> Result<Option<Service>, ReconcileError> {
    let wanted = ctx.selection.finalizer_for(svc);
    if svc.finalizers().iter().any(|f| f == wanted) {
        return Ok(None);
    }
    let mut list: Vec<String> = svc.finalizers().to_vec();
    list.push(wanted.to_string());
    patch_finalizers(ctx, svc, json!(list)).await.map(Some)
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
    Ok(services_api(ctx, svc)
        .patch(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?)
}

fn services_api(ctx: &Context, svc: &Service) -> Api<Service> {
    Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default())
}

/// Publishes an Event; failing to do so is logged, never fatal.
pub fn publish(
    ctx: &Context,
    svc: &Service,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(crate::events::note_text(&note)),
        action: action.to_string(),
        secondary: None,
    };
    ctx.recorder.publish(event, svc.object_ref(&()));
}
