//! Reconciling one Service (DESIGN.md §2): read the stores, confirm or claim an address,
//! plan rules (pure), apply the difference to every loxilb, report.

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
    SERVICE_NAME_LABEL, endpoint_views, node_view, owner_key, published_addresses, service_view,
};
use crate::status::{self, COND_ADDRESS, COND_ENDPOINTS, COND_PROGRAMMED, Cond, DesiredStatus};
use loxi_domain::addressing::{AddressInput, AddressSlot, address_slots};

#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// loxilb failed in a way that may pass (unreachable, timeout, 5xx): retried with backoff.
    #[error("loxilb: {0}")]
    Loxilb(String),
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
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::Annotation(e) => e.reason(),
            Problem::Address(e) => e.reason(),
            Problem::Plan(e) => e.reason(),
        }
    }
}

/// The rules a served Service should have, computed from the stores only (no allocation).
/// `Ok(None)` when it has no address yet.
pub fn desired_rules(svc: &Service, ctx: &Context) -> Result<Option<Plan>, Problem> {
    let addresses: Vec<IpAddr> = match ctx.ipam.lock() {
        Ok(ipam) => ipam.addresses_of(&owner_key(svc)).to_vec(),
        Err(_) => Vec::new(),
    };
    desired_rules_for(svc, ctx, &addresses)
}

/// The rules for `svc` on `addresses`.
pub fn desired_rules_for(
    svc: &Service,
    ctx: &Context,
    addresses: &[IpAddr],
) -> Result<Option<Plan>, Problem> {
    let intent = parse_intent(&svc.annotations().clone(), ctx.cfg.defaults)?;
    if addresses.is_empty() {
        return Ok(None);
    }
    let nodes: Vec<_> = ctx.nodes.state().iter().map(|n| node_view(n)).collect();
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let slices = ctx.endpoint_slices.state();
    let endpoints = endpoint_views(slices.iter().map(|s| s.as_ref()).filter(|s| {
        s.metadata.namespace.as_deref() == Some(ns.as_str())
            && s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .is_some_and(|n| *n == name)
    }));
    Ok(Some(plan_rules(
        &ctx.cluster,
        &service_view(svc),
        &nodes,
        &endpoints,
        addresses,
        &intent,
    )?))
}

pub async fn reconcile(svc: Arc<Service>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    ctx.wait_ready().await;
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

/// Per-Service exponential backoff (0.5 s doubling to 5 min), reset on success.
pub fn error_policy(svc: Arc<Service>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
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
    let served = ctx.selection.serves(svc);
    let deleting = svc.metadata.deletion_timestamp.is_some();
    if !served || deleting {
        cleanup(svc, ctx).await?;
        return Ok(Outcome::Done);
    }
    ensure_finalizer(svc, ctx).await?;

    // Address first: a Service with a bad annotation still keeps (and shows) its address.
    let (addresses, newly) = match ensure_addresses(svc, ctx).await? {
        Ok(x) => x,
        Err(problem) => {
            if matches!(problem, Problem::Address(AllocError::Exhausted { .. }))
                && let Ok(mut w) = ctx.waiting_for_address.lock()
            {
                w.insert(ObjectRef::from_obj(svc));
            }
            let cond = Cond::new(COND_ADDRESS, false, problem.reason(), problem.to_string());
            let programmed = Cond::new(COND_PROGRAMMED, false, problem.reason(), "no address");
            report_problem(svc, ctx, &problem, vec![], vec![cond, programmed]).await?;
            return Ok(Outcome::Problem);
        }
    };
    let described: Vec<String> = addresses
        .iter()
        .map(|ip| format!("{ip}{}", pool_suffix(ctx, ip)))
        .collect();
    if !newly.is_empty() {
        let text: Vec<String> = newly
            .iter()
            .map(|ip| format!("{ip}{}", pool_suffix(ctx, ip)))
            .collect();
        publish(
            ctx,
            svc,
            EventType::Normal,
            "AddressAllocated",
            "Allocate",
            format!("allocated {}", text.join(", ")),
        )
        .await;
    }
    let address_cond = Cond::new(COND_ADDRESS, true, "Allocated", described.join(", "));

    let plan = match desired_rules_for(svc, ctx, &addresses) {
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
            report_problem(svc, ctx, &problem, addresses, vec![address_cond, cond]).await?;
            return Ok(Outcome::Problem);
        }
    };

    let endpoints_cond = endpoint_limit_condition(svc, ctx, &plan);
    let (programmed, retry) = apply_everywhere(svc, ctx, &plan.rules).await;
    if retry.is_none() {
        // Addresses no longer wanted (an edited annotation, a lost race) go back only now
        // that their rules are gone.
        release_addresses_except(svc, ctx, &addresses).await?;
    }
    let want = DesiredStatus {
        addresses: addresses.clone(),
        conditions: vec![address_cond, programmed, endpoints_cond],
    };
    if !status::is_current(svc, &want) {
        status::write(&services_api(ctx, svc), svc, &want).await?;
    }
    match retry {
        Some(e) => Err(ReconcileError::Loxilb(e)),
        None => Ok(Outcome::Done),
    }
}

/// loxilb takes at most 32 endpoints per rule: say so on the Service and in the metric when
/// candidates were left out (the subset is stable: rendezvous hashing on the Service).
fn endpoint_limit_condition(svc: &Service, ctx: &Context, plan: &Plan) -> Cond {
    let dropped = plan.endpoints_dropped;
    if let Ok(mut map) = ctx.endpoints_dropped.lock() {
        if dropped > 0 {
            map.insert(owner_key(svc), dropped);
        } else {
            map.remove(&owner_key(svc));
        }
        ctx.metrics.set_endpoints_dropped(map.values().sum());
    }
    if dropped > 0 {
        Cond::new(
            COND_ENDPOINTS,
            false,
            "EndpointLimit",
            format!(
                "{dropped} candidate endpoint(s) left out: loxilb takes at most {} per rule; a stable subset is used",
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

/// Applies the plan to every healthy instance. Returns the Programmed condition and, when
/// some failure may pass by itself, its text for a retry.
async fn apply_everywhere(svc: &Service, ctx: &Context, rules: &[Rule]) -> (Cond, Option<String>) {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let total = ctx.fleet.instances.len();
    let mut ok = 0;
    let mut changes = 0;
    let mut failures: Vec<(String, ClientError)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut conflicts = Vec::new();
    for inst in ctx.fleet.instances.iter() {
        if !inst.is_healthy() {
            skipped.push(inst.url().to_string());
            continue;
        }
        match inst
            .apply_service(&ctx.cluster, &ns, &name, rules, &ctx.metrics)
            .await
        {
            Ok(report) => {
                changes += report.changes;
                if report.conflicts.is_empty() {
                    ok += 1;
                }
                conflicts.extend(
                    report
                        .conflicts
                        .into_iter()
                        .map(|(k, n)| format!("{k} held by foreign rule {n:?} on {}", inst.url())),
                );
            }
            Err(e) => failures.push((inst.url().to_string(), e)),
        }
    }
    for (url, e) in &failures {
        publish(
            ctx,
            svc,
            EventType::Warning,
            e.category(),
            "Program",
            format!("{url}: {e}"),
        )
        .await;
    }
    if !conflicts.is_empty() {
        publish(
            ctx,
            svc,
            EventType::Warning,
            "RuleConflict",
            "Program",
            conflicts.join("; "),
        )
        .await;
    }
    if changes > 0 {
        info!(rules = rules.len(), changes, "rules programmed");
        publish(
            ctx,
            svc,
            EventType::Normal,
            "RulesProgrammed",
            "Program",
            format!("{} rule(s) on {ok}/{total} loxilb instance(s)", rules.len()),
        )
        .await;
    }
    let retry = failures
        .iter()
        .find(|(_, e)| e.is_retryable())
        .map(|(url, e)| format!("{url}: {e}"));
    let cond = if let Some((url, e)) = failures.first() {
        Cond::new(COND_PROGRAMMED, false, e.category(), format!("{url}: {e}"))
    } else if !conflicts.is_empty() {
        Cond::new(COND_PROGRAMMED, false, "RuleConflict", conflicts.join("; "))
    } else if ok == 0 {
        Cond::new(
            COND_PROGRAMMED,
            false,
            "LoxilbUnavailable",
            format!("no loxilb instance is reachable ({})", skipped.join(", ")),
        )
    } else if !skipped.is_empty() {
        Cond::new(
            COND_PROGRAMMED,
            true,
            "PartiallyProgrammed",
            format!(
                "{} rule(s) on {ok}/{total} instances; unreachable, replayed when back: {}",
                rules.len(),
                skipped.join(", ")
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
    /// `spec.loadBalancerIP`.
    Requested,
    /// Fresh from the pool.
    Allocated,
}

/// The Service's address, backed by a durable claim that exists before this returns: the one
/// already indexed, else the one it already shows (adoption), else `spec.loadBalancerIP`,
/// else the lowest free address. A claim created by someone else first (another replica,
/// another process) is never stolen: a fresh address is then taken from the pool, while an
/// adopted or requested one is reported as in use.
/// Every address the Service asks for (one per IP family), each backed by its claim.
/// Returns them in status order, plus those newly allocated.
async fn ensure_addresses(
    svc: &Service,
    ctx: &Context,
) -> Result<Result<(Vec<IpAddr>, Vec<IpAddr>), Problem>, ReconcileError> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.clone()).unwrap_or_default();
    let input = AddressInput {
        annotations: svc.metadata.annotations.as_ref(),
        ip_families: &families,
        ip_family_policy: spec.and_then(|s| s.ip_family_policy.as_deref()),
        load_balancer_ip: spec.and_then(|s| s.load_balancer_ip.as_deref()),
    };
    let slots = match address_slots(&input, |f| ctx.cfg.pools.iter().any(|p| p.size(f) > 0)) {
        Ok(s) => s,
        Err(e) => return Ok(Err(Problem::Annotation(e))),
    };
    let mut addresses = Vec::new();
    let mut newly = Vec::new();
    for slot in &slots {
        match ensure_address(svc, ctx, slot).await? {
            Ok((ip, new)) => {
                addresses.push(ip);
                if new {
                    newly.push(ip);
                }
            }
            Err(AllocError::UnknownPool(name)) if slot.pool.as_deref() == Some(name.as_str()) => {
                return Ok(Err(Problem::Annotation(AnnotationError {
                    annotation: loxi_domain::addressing::ANN_POOL_SELECT,
                    value: name,
                    reason: "no pool with this name".into(),
                })));
            }
            Err(e) => return Ok(Err(Problem::Address(e))),
        }
    }
    Ok(Ok((addresses, newly)))
}

async fn ensure_address(
    svc: &Service,
    ctx: &Context,
    slot: &AddressSlot,
) -> Result<Result<(IpAddr, bool), AllocError>, ReconcileError> {
    let key = owner_key(svc);
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let uid = svc.uid().unwrap_or_default();
    // The address the Service shows wins when it holds its claim: any other address indexed
    // for it (a replica that raced and lost the status write) is given back.
    if let Some(shown) = published_addresses(svc)
        .into_iter()
        .find(|ip| Family::of(ip) == slot.family)
        && slot.requested.is_none_or(|r| r == shown)
        && let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&shown)))
        && c.owner_key() == key
        && c.spec.service.uid == uid
        && c.spec.retain_until.is_none()
    {
        let extra: Vec<IpAddr> = ctx
            .ipam
            .lock()
            .map(|mut i| {
                let _ = i.assign(shown, &key);
                i.addresses_of(&key)
                    .iter()
                    .copied()
                    .filter(|ip| *ip != shown && ip.is_ipv4() == shown.is_ipv4())
                    .collect()
            })
            .unwrap_or_default();
        for ip in extra {
            if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)))
                && c.owner_key() == key
            {
                claims::release(&ctx.claims_api, &c).await?;
            }
            if let Ok(mut i) = ctx.ipam.lock() {
                i.release(&ip);
            }
            warn!(%ip, kept = %shown, "released a second address claimed for this Service");
        }
        return Ok(Ok((shown, false)));
    }
    // Bounded: each lost race marks one more address as taken.
    for _ in 0..32 {
        let picked = {
            let mut ipam = ctx.ipam.lock().expect("ipam lock poisoned");
            pick_address(svc, &key, slot, &mut ipam)
        };
        let (ip, source) = match picked {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        // Fast path: the claim is already in the store and is this Service's.
        if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)))
            && c.owner_key() == key
            && c.spec.service.uid == uid
            && c.spec.retain_until.is_none()
        {
            return Ok(Ok((ip, false)));
        }
        let pool = ctx
            .ipam
            .lock()
            .map(|i| i.pool_containing(&ip).to_string())
            .unwrap_or_default();
        match claims::claim(&ctx.claims_api, &ip, &pool, &ns, &name, &uid).await? {
            ClaimResult::Ours => {
                update_pool_metrics(ctx);
                return Ok(Ok((ip, source == Source::Allocated)));
            }
            ClaimResult::Taken(other) => {
                let owner = other.owner_key();
                if let Ok(mut ipam) = ctx.ipam.lock() {
                    if ipam.owner_of(&ip) == Some(key.as_str()) {
                        ipam.release(&ip);
                    }
                    let _ = ipam.assign(ip, &owner);
                }
                if matches!(source, Source::Published | Source::Requested) {
                    return Ok(Err(AllocError::Taken { ip, owner }));
                }
                warn!(%ip, %owner, "address claimed by someone else first; taking another");
            }
        }
    }
    Ok(Err(AllocError::Exhausted {
        pool: slot.pool.clone().unwrap_or_default(),
        family: slot.family,
    }))
}

fn pick_address(
    svc: &Service,
    key: &str,
    slot: &AddressSlot,
    ipam: &mut loxi_domain::Allocator,
) -> Result<(IpAddr, Source), AllocError> {
    let mine = |ip: &IpAddr| Family::of(ip) == slot.family;
    if let Some(wanted) = slot.requested {
        let already = ipam.addresses_of(key).contains(&wanted);
        ipam.assign(wanted, key)?;
        let source = if already {
            Source::Indexed
        } else {
            Source::Requested
        };
        return Ok((wanted, source));
    }
    if let Some(ip) = ipam.addresses_of(key).iter().find(|ip| mine(ip)) {
        // Indexed, but possibly from another pool than the one now selected: keep it unless
        // the selection names a pool that does not contain it.
        let in_selected = slot
            .pool
            .as_deref()
            .is_none_or(|p| ipam.pool_containing(ip) == p || ipam.pool_containing(ip).is_empty());
        if in_selected {
            return Ok((*ip, Source::Indexed));
        }
    }
    if let Some(ip) = published_addresses(svc).into_iter().find(|ip| mine(ip))
        && ipam.owner_of(&ip).is_none_or(|o| o == key)
    {
        ipam.assign(ip, key)?;
        return Ok((ip, Source::Published));
    }
    let ip = ipam.allocate_new(key, slot.pool.as_deref(), slot.family)?;
    Ok((ip, Source::Allocated))
}

pub fn update_pool_metrics(ctx: &Context) {
    if let Ok(ipam) = ctx.ipam.lock() {
        for pool in ipam.pools() {
            let total = pool.size(Family::V4).saturating_add(pool.size(Family::V6));
            ctx.metrics
                .set_pool(&pool.name, total, ipam.used_in(&pool.name));
        }
    }
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
        )
        .await;
        status::write(&services_api(ctx, svc), svc, &want).await?;
    }
    Ok(())
}

/// The Service is gone or no longer ours: rules off every reachable loxilb, then the address
/// back to the pool, then (for a Service that stays) our status fields, then the finalizer.
async fn cleanup(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    let key = owner_key(svc);
    let finalizers = ctx.selection.our_finalizers(svc);
    let holds_address = ctx
        .ipam
        .lock()
        .map(|i| !i.addresses_of(&key).is_empty())
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
                )
                .await;
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
        )
        .await;
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

/// Gives back every address of the Service not in `keep` (claims deleted, index freed).
async fn release_addresses_except(
    svc: &Service,
    ctx: &Context,
    keep: &[IpAddr],
) -> Result<(), ReconcileError> {
    let key = owner_key(svc);
    let extra: Vec<IpAddr> = ctx
        .ipam
        .lock()
        .map(|i| {
            i.addresses_of(&key)
                .iter()
                .copied()
                .filter(|ip| !keep.contains(ip))
                .collect()
        })
        .unwrap_or_default();
    if extra.is_empty() {
        return Ok(());
    }
    for ip in &extra {
        if let Some(c) = ctx.claims.get(&ObjectRef::new(&claims::claim_name(ip)))
            && c.owner_key() == key
        {
            claims::release(&ctx.claims_api, &c).await?;
        }
        if let Ok(mut i) = ctx.ipam.lock() {
            i.release(ip);
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

/// Gives the Service's addresses back (their rules are gone by now): deletes their claims,
/// or keeps them as retained for this namespace/name when asked to.
async fn release_addresses(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    let key = owner_key(svc);
    let uid = svc.uid().unwrap_or_default();
    let ips: Vec<IpAddr> = ctx
        .ipam
        .lock()
        .map(|i| i.addresses_of(&key).to_vec())
        .unwrap_or_default();
    let retain = svc
        .annotations()
        .get(ANN_RETAIN)
        .and_then(|v| crate::cli::parse_duration(v).ok())
        .filter(|d| !d.is_zero());
    let mut released = Vec::new();
    for ip in ips {
        let claim = ctx.claims.get(&ObjectRef::new(&claims::claim_name(&ip)));
        let ours = claim.as_ref().is_some_and(|c| {
            c.owner_key() == key && (c.spec.service.uid.is_empty() || c.spec.service.uid == uid)
        });
        match (claim, ours, retain) {
            (Some(c), true, Some(d)) => {
                let until = k8s_openapi::jiff::Timestamp::now()
                    + k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or_default();
                claims::retain(&ctx.claims_api, &c, until).await?;
                info!(%ip, %until, "address retained");
                continue; // still indexed for this namespace/name
            }
            (Some(c), true, None) => claims::release(&ctx.claims_api, &c).await?,
            _ => {}
        }
        if let Ok(mut ipam) = ctx.ipam.lock() {
            ipam.release(&ip);
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

async fn ensure_finalizer(svc: &Service, ctx: &Context) -> Result<(), ReconcileError> {
    let wanted = ctx.selection.finalizer_for(svc);
    if svc.finalizers().iter().any(|f| f == wanted) {
        return Ok(());
    }
    let mut list: Vec<String> = svc.finalizers().to_vec();
    list.push(wanted.to_string());
    patch_finalizers(ctx, svc, json!(list)).await
}

/// Sets the finalizer list; the resourceVersion makes it fail (409) rather than overwrite a
/// list someone else changed meanwhile.
async fn patch_finalizers(
    ctx: &Context,
    svc: &Service,
    list: serde_json::Value,
) -> Result<(), ReconcileError> {
    let patch = json!({
        "metadata": {
            "finalizers": list,
            "resourceVersion": svc.resource_version(),
        }
    });
    services_api(ctx, svc)
        .patch(
            &svc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

fn services_api(ctx: &Context, svc: &Service) -> Api<Service> {
    Api::namespaced(ctx.client.clone(), &svc.namespace().unwrap_or_default())
}

/// Publishes an Event; failing to do so is logged, never fatal.
pub async fn publish(
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
        note: Some(note.chars().take(1000).collect()),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &svc.object_ref(&())).await {
        warn!(error = %e, reason, "could not publish event");
    }
}
