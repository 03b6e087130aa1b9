//! Step 5 of a Service reconcile, in one place: the status (addresses, conditions), the
//! Events, and the per-Service metrics.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use loxi_domain::addressing::{RETAIN_IGNORED, retention};
use loxi_domain::plan::Plan;
use tracing::{info, warn};

use super::conditions::{self, Programmed};
use super::context::Context;
use super::plan::Problem;
use super::reconcile::ReconcileError;
use super::status::{self, COND_ADDRESS, COND_ENDPOINTS, COND_PROGRAMMED, Cond, DesiredStatus};
use crate::ipam::Held;
use crate::k8s::events::{EventRecorder, note_text};
use crate::k8s::view::{owner_key, published_addresses};
use crate::metrics::Metrics;

/// The reporting side of the Service reconcile and what it remembers between passes.
pub struct Report {
    pub recorder: EventRecorder,
    pub metrics: Metrics,
    /// The server-side apply field manager of this controller's status writes
    /// (`crate::k8s::api::FIELD_MANAGER`, suffixed with the controller's name for another
    /// controller than the default one): clearing a Service's status removes only what this
    /// controller wrote, never what the controller now serving it wrote.
    pub field_manager: String,
    /// Per Service, the resourceVersion our last status write was based on: a reconcile that
    /// gets exactly that version again runs on a store that has not seen our write yet, and
    /// would only repeat it (with a 409 when it publishes an address). Skipped: the write's
    /// own watch event brings the current version right after.
    superseded: Mutex<HashMap<ObjectRef<Service>, String>>,
    /// Candidate endpoints left out per Service (loxilb's 32-per-rule limit), and their sum
    /// (kept as it changes, so that no reconcile sums over every Service).
    endpoints_dropped: Mutex<(HashMap<String, usize>, usize)>,
    /// The programming problem each Service was last warned about ([`Report::first_warning`]).
    warned: Mutex<HashMap<ObjectRef<Service>, String>>,
    /// Why each Service is not programmed (its `Programmed=False` reason), and how many
    /// Services have each reason: the metric alerts are based on.
    not_programmed: Mutex<NotProgrammed>,
}

/// Services whose `Programmed` condition is `False`, by reason, kept as they change.
#[derive(Default)]
struct NotProgrammed {
    reason_of: HashMap<String, String>,
    count_by_reason: HashMap<String, usize>,
}

impl NotProgrammed {
    /// Records the reason `key` is not programmed (`None`: it is, or it is gone) and returns
    /// the reasons whose count changed, with their new count.
    fn record(&mut self, key: &str, reason: Option<&str>) -> Vec<(String, usize)> {
        let before = match reason {
            Some(r) => self.reason_of.insert(key.to_string(), r.to_string()),
            None => self.reason_of.remove(key),
        };
        if before.as_deref() == reason {
            return Vec::new();
        }
        let mut changed = Vec::new();
        if let Some(old) = before {
            let n = self.count_by_reason.entry(old.clone()).or_default();
            *n = n.saturating_sub(1);
            changed.push((old, *n));
        }
        if let Some(new) = reason {
            let n = self.count_by_reason.entry(new.to_string()).or_default();
            *n += 1;
            changed.push((new.to_string(), *n));
        }
        changed
    }
}

impl Report {
    pub fn new(recorder: EventRecorder, metrics: Metrics, field_manager: String) -> Report {
        Report {
            recorder,
            metrics,
            field_manager,
            superseded: Mutex::default(),
            endpoints_dropped: Mutex::default(),
            warned: Mutex::default(),
            not_programmed: Mutex::default(),
        }
    }

    /// Publishes an Event on the Service; failing to do so is logged, never fatal.
    pub fn event(&self, svc: &Service, type_: EventType, reason: &str, action: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note_text(&note)),
            action: action.to_string(),
            secondary: None,
        };
        self.recorder.publish(event, svc.object_ref(&()));
    }

    /// Writes `want` when the Service does not show it yet: the Service as written, if it
    /// was.
    pub async fn write_status(
        &self,
        api: &Api<Service>,
        svc: &Service,
        want: &DesiredStatus,
    ) -> kube::Result<Option<Service>> {
        if status::is_current(svc, want) {
            return Ok(None);
        }
        let written = status::write(api, svc, want, &self.field_manager).await?;
        if let Some(rv) = svc.metadata.resource_version.clone() {
            lock(&self.superseded).insert(ObjectRef::from_obj(svc), rv);
        }
        Ok(Some(written))
    }

    /// Whether `svc` is the very version our last status write was based on.
    pub fn is_superseded(&self, svc: &Service) -> bool {
        let Some(rv) = svc.metadata.resource_version.as_deref() else {
            return false;
        };
        lock(&self.superseded)
            .get(&ObjectRef::from_obj(svc))
            .is_some_and(|v| v == rv)
    }

    /// The Service is no longer ours: nothing remembered about it is kept.
    pub fn forget(&self, svc: &Service) {
        lock(&self.superseded).remove(&ObjectRef::from_obj(svc));
        self.record_dropped(&crate::k8s::view::owner_key(svc), 0);
        self.record_not_programmed(&crate::k8s::view::owner_key(svc), None);
    }

    /// Records why the Service `key` is not programmed now (`None`: it is, or it is gone).
    pub fn record_not_programmed(&self, key: &str, reason: Option<&str>) {
        let changed = lock(&self.not_programmed).record(key, reason);
        for (reason, n) in changed {
            self.metrics.set_services_not_programmed(&reason, n);
        }
    }

    /// Records how many candidate endpoints the Service's rules leave out (0: none, or gone).
    pub fn record_dropped(&self, key: &str, dropped: usize) {
        let mut guard = lock(&self.endpoints_dropped);
        let (per, total) = &mut *guard;
        let before = if dropped > 0 {
            per.insert(key.to_string(), dropped)
        } else {
            per.remove(key)
        };
        *total = (*total + dropped).saturating_sub(before.unwrap_or(0));
        self.metrics.set_endpoints_dropped(*total);
    }

    /// Records the programming problem `svc` has now (`None`: none) and says whether it is
    /// new, i.e. worth a Warning Event. Kept in memory because the Service a reconcile reads
    /// may not show the condition written by the previous pass yet (a status write that lost
    /// a race is retried), and one problem must make one Event, not one per pass.
    /// `exists` prunes entries of deleted Services once the map grows.
    pub fn first_warning(
        &self,
        svc: &ObjectRef<Service>,
        problem: Option<&str>,
        exists: impl Fn(&ObjectRef<Service>) -> bool,
    ) -> bool {
        let mut warned = lock(&self.warned);
        let Some(reason) = problem else {
            warned.remove(svc);
            return false;
        };
        if warned.get(svc).is_some_and(|r| r == reason) {
            return false;
        }
        if warned.len() >= 1024 {
            warned.retain(|k, _| exists(k));
        }
        warned.insert(svc.clone(), reason.to_string());
        true
    }
}

/// The map behind a lock, also after a panic elsewhere held it: each change to it is one
/// whole insert or remove, so what a panicking holder left is consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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

#[cfg(test)]
mod tests {
    use super::NotProgrammed;

    #[test]
    fn not_programmed_counts_follow_each_services_reason() {
        let mut np = NotProgrammed::default();
        assert_eq!(
            np.record("a", Some("CapacityExceeded")),
            vec![("CapacityExceeded".to_string(), 1)]
        );
        assert_eq!(
            np.record("b", Some("CapacityExceeded")),
            vec![("CapacityExceeded".to_string(), 2)]
        );
        // The same reason again changes nothing.
        assert!(np.record("a", Some("CapacityExceeded")).is_empty());
        // A new reason moves the Service from one count to the other.
        assert_eq!(
            np.record("a", Some("LoxilbUnavailable")),
            vec![
                ("CapacityExceeded".to_string(), 1),
                ("LoxilbUnavailable".to_string(), 1)
            ]
        );
        // Programmed, or gone: out of the counts; an unknown Service changes nothing.
        assert_eq!(
            np.record("b", None),
            vec![("CapacityExceeded".to_string(), 0)]
        );
        assert!(np.record("never-seen", None).is_empty());
        assert_eq!(
            np.record("a", None),
            vec![("LoxilbUnavailable".to_string(), 0)]
        );
    }
}
