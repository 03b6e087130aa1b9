//! The loxilb instances: a cache of the rules each one holds, health, loxilb's limits, and
//! applying a diff.
//!
//! Per-Service reconciles read the cache instead of listing loxilb each time; a full listing
//! refreshes it at start-up, after an instance comes back, and at every drift check. All
//! writes to one instance go through its lock, so a drift check and a reconcile never race
//! on the same rules (loxilb serializes its config calls anyway, docs/loxilb-api.md#transport).
//!
//! Rule state is not replicated between loxilb instances (docs/loxilb-api.md#restarts): each
//! instance is programmed, probed and repaired on its own.
//!
//! ## Noticing a restart
//!
//! A loxilb that restarts between two probes answers as if nothing happened, but holds
//! nothing (docs/loxilb-api.md#detecting-a-restart). Listing every rule at every probe would
//! show it, at the price of a 6 MB listing every few seconds on a full instance. Instead,
//! before its first listing of an instance, the controller places a *restart marker*: a
//! cluster-instance entry named `loxi-ccm.<cluster id>` in state `NOT_DEFINED`
//! (`POST /config/cistate`). Creating an unknown instance in the state it is created in
//! changes nothing in loxilb (no VIP, no BGP preference: docs/loxilb-api.md#ha-roles), and a
//! restart drops it like every other state. A probe then reads the small
//! `GET /config/cistate/all`: marker gone means restarted, and every rule is replayed. A
//! loxilb that refuses the marker is probed by listing its rules instead. Rules deleted
//! behind our back without a restart are put back by the drift check.
//!
//! ## loxilb's limits (docs/loxilb-api.md#limits)
//!
//! loxilb refuses the rule after its table is full (403 `rule-hwm error`), and refuses
//! `allowedSources` on a rule whose internal index is above 28 (400 `rule-allowed-src
//! error`). Neither is worth retrying until something changes on that instance, so the cache
//! is used to see them coming and a new rule is not POSTed when it would hit one:
//!
//! - **Capacity**: the instance holds `held` rules (every rule it listed, whoever owns it,
//!   plus what we created since); a Service's new rules are created only if all of them fit
//!   under the capacity (2048 by default, [`Fleet::set_capacity`]). A Service is never left
//!   half-created by the limit: if loxilb still answers 403 (its table is smaller than
//!   configured, or someone else filled it since our last listing), the rules of that Service
//!   created in the same pass are deleted again, and the capacity learned from the refusal
//!   (the number of rules loxilb then lists) is used until the instance restarts.
//! - **Source ranges**: loxilb allocates indexes 1, 2, 3, ... and reuses freed ones last-in
//!   first-out, and never shows them. The index a new rule gets is *estimated* as `held + 1`
//!   (`held + k` for the k-th new rule of a Service, rules with source ranges first). That is
//!   exact while the index space has no holes (nothing was deleted since loxilb started, or
//!   every freed index was reused). With holes it can be wrong both ways: too pessimistic
//!   when a low index is free (loxilb would have reused it), too optimistic when the latest
//!   freed index is above 28. The second case is caught by loxilb's own 400, which is
//!   reported the same way.
//!
//! A rule refused for a limit (predicted or answered) is remembered with the exact rule sent
//! and not sent again unchanged until room frees on that instance (a rule deleted there, a
//! listing showing fewer rules, a restart). Services waiting for room register a requeue
//! sender and are woken then, so a full instance costs no calls and no retry storm.

mod apply;
pub mod bgp;
mod bgp_plan;
mod firewall;
mod limits;
mod members;
mod metadata;
pub mod probe;
pub mod queues;
mod roles;
mod rules;
mod shared;
pub mod snat;
mod waiters;
mod window;

pub use members::{Fleet, Group, Member, MembersChanged};
pub use roles::HaSettings;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use loxi_domain::write_window::WindowSettings;
use loxi_domain::{ClusterId, Rule, RuleKey};
use loxilb_client::{ClientError, LoxilbClient};
use tokio::sync::Mutex;

use rules::Holdings;

/// loxilb's rule table: internal indexes 1..=2048, the next rule is refused with 403
/// `rule-hwm error` (docs/loxilb-api.md#limits).
pub const DEFAULT_CAPACITY: usize = 2048;

/// Services whose new rules a replay sends at once, unless set (`--concurrency`).
pub const DEFAULT_PARALLEL_CALLS: usize = 16;

/// Rule writes in flight to one loxilb at most, however fast it answers (fewer when it is
/// slow: `loxi_domain::write_window`).
pub const DEFAULT_WRITE_WINDOW: usize = 16;

/// loxilb installs `allowedSources` only on rules with an internal index up to this
/// (docs/loxilb-api.md#source-ranges).
pub const MAX_ALLOWED_SOURCES_INDEX: usize = 28;

/// Condition reason / Event reason for [`Blocked::Capacity`]; the same as
/// `ClientError::Capacity`'s category, so a raw 403 and a predicted one read alike.
pub const REASON_CAPACITY: &str = "CapacityExceeded";
/// Condition reason / Event reason for [`Blocked::SourceRanges`].
pub const REASON_SOURCE_RANGES: &str = "SourceRangesUnsupported";

/// The Service a rule belongs to (namespace and name, as rule names carry them): the opaque
/// key a Service waiting for room is re-queued by. This subsystem knows no Kubernetes types.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleOwner {
    pub namespace: String,
    pub name: String,
}

impl RuleOwner {
    pub fn new(namespace: &str, name: &str) -> RuleOwner {
        RuleOwner {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

/// Where Services waiting for room on an instance are sent when room frees.
#[derive(Clone)]
pub struct Requeue(Arc<dyn Fn(&RuleOwner) + Send + Sync>);

impl Requeue {
    pub fn new(send: impl Fn(&RuleOwner) + Send + Sync + 'static) -> Requeue {
        Requeue(Arc::new(send))
    }

    fn send(&self, owner: &RuleOwner) {
        (self.0)(owner)
    }
}

impl fmt::Debug for Requeue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Requeue")
    }
}

/// Why some of a Service's rules are not on an instance: one of loxilb's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// The Service's new rules do not all fit in the instance's rule table.
    Capacity {
        /// Rules the instance holds (all owners).
        held: usize,
        /// Rules the Service still needs there.
        new: usize,
        capacity: usize,
        /// loxilb answered 403 (else: predicted, nothing was sent).
        refused: bool,
    },
    /// A rule with source ranges would not get one of the first 28 indexes.
    SourceRanges {
        key: RuleKey,
        /// The estimated index (see the module documentation); `None` when loxilb refused.
        index: Option<usize>,
    },
}

impl Blocked {
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::Capacity { .. } => REASON_CAPACITY,
            Blocked::SourceRanges { .. } => REASON_SOURCE_RANGES,
        }
    }
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::Capacity {
                held,
                new,
                capacity,
                refused,
            } => {
                if *refused {
                    write!(
                        f,
                        "loxilb refused a new rule: its rule table is full ({held} rules, rule-hwm)"
                    )?;
                } else {
                    write!(
                        f,
                        "{new} new rule(s) do not fit: it holds {held} of {capacity} rules"
                    )?;
                }
                f.write_str("; programmed when rules are deleted there")
            }
            Blocked::SourceRanges { key, index } => {
                write!(
                    f,
                    "{key} has loadBalancerSourceRanges, which loxilb applies only to its first \
                     {MAX_ALLOWED_SOURCES_INDEX} rules"
                )?;
                match index {
                    Some(i) => write!(f, "; it would be about rule {i}")?,
                    None => f.write_str("; loxilb refused it (rule-allowed-src)")?,
                }
                f.write_str("; retried when rules are deleted there")
            }
        }
    }
}

/// What one liveness probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Up, as before, holding what we believe.
    Up,
    /// Down, as before.
    Down,
    /// Up before, down now.
    WentDown,
    /// Down before (or never probed), up now: it may have restarted empty.
    CameBack,
    /// Up, but rules of ours we know it held are gone (restarted between two probes, or
    /// deleted behind our back).
    LostRules { missing: usize },
}

impl Probe {
    /// The instance needs every rule replayed.
    pub fn needs_replay(self) -> bool {
        matches!(self, Probe::CameBack | Probe::LostRules { .. })
    }

    /// Services' Programmed conditions (which name unreachable instances) are stale. Not
    /// after a restart seen while reachable (`LostRules`): no condition names it, and the
    /// Services' passes it would start would write their rules while the worker replays the
    /// role and BGP settings that must come first (docs/loxilb-api.md#replay-order).
    pub fn changes_status(self) -> bool {
        matches!(self, Probe::WentDown | Probe::CameBack)
    }
}

/// One Service's part of a whole-instance pass (drift check, replay).
#[derive(Debug)]
pub enum ServiceRules {
    /// The rules the Service wants.
    Want(Vec<Rule>),
    /// A Service with a problem (namespace, name): it keeps the rules it has.
    Keep(String, String),
}

pub struct Instance {
    pub client: LoxilbClient,
    /// The group of loxilbs it belongs to (kube-loxilb's zone): it holds the rules of the
    /// Services placed on that group only (docs/fleet.md#groups-and-placement).
    group: String,
    /// The restart marker's cluster-instance entry (module docs).
    marker: loxilb_client::CiState,
    healthy: AtomicBool,
    /// Whether its state is known (a probe ran, or a call failed): until then it is used as
    /// if healthy, so that neither programming nor a finalizer skips it at start-up.
    probed: AtomicBool,
    /// A failed call (not the probe) marked the instance down: the next probe still reports
    /// the transition, so Services get re-evaluated.
    down_unannounced: AtomicBool,
    /// Since when it has been unreachable (`None` while reachable or not probed yet): a
    /// deleted Service's rules may remain on it until it counts as gone for good
    /// (`gone_after`).
    down_since: std::sync::Mutex<Option<Instant>>,
    /// Unreachable this long, it counts as gone for good (`--loxilb-gone-after`, default
    /// `probe::GONE_FOR_GOOD_AFTER`), in milliseconds.
    gone_after_ms: std::sync::atomic::AtomicU64,
    /// While it is down because its certificate was refused (`ClientError::Tls`): that
    /// error's text. Services then say so (`LoxilbTLSError`) instead of "unavailable": a
    /// certificate or CA to fix, not an outage to wait out.
    tls_refusal: std::sync::Mutex<Option<String>>,
    capacity: AtomicUsize,
    /// How many Services' new rules a replay or drift repair sends at once.
    parallel_calls: AtomicUsize,
    holdings: Mutex<Holdings>,
    /// Held by the whole-instance pass running (a replay, a drift repair): one at a time.
    whole_pass: Mutex<()>,
    /// Told whenever a Service's part of a whole-instance pass is recorded.
    whole_progress: tokio::sync::Notify,
    /// Services whose part of the running whole-instance pass has calls under way
    /// (`Instance::converge_all`): their own pass waits for these to be recorded.
    whole_running: std::sync::Mutex<std::collections::HashSet<String>>,
    /// When a Service's own pass last wrote here: drift checks wait for a quiet moment.
    last_service_write: std::sync::Mutex<Option<Instant>>,
    /// Its BGP as this controller configured it (`bgp.rs`).
    bgp: Mutex<bgp::BgpState>,
    /// The HA states this controller posted since it last (re)started (`roles.rs`).
    roles: Mutex<roles::PostedRoles>,
    /// Services' passes program it. A discovered instance joins without (`Fleet::set_members`)
    /// and serves once its first replay programmed it completely.
    serving: AtomicBool,
    /// Services' passes are held back from it: it restarted (or came back after being
    /// away) and its worker replays its roles, BGP and rules, in that order
    /// (docs/loxilb-api.md#replay-order); a pass in between would write rules before the
    /// settings that must come first. Lifted once the replay ran (`resume_passes`).
    passes_held: AtomicBool,
    /// Rule writes wait for their turn here (`window.rs`): as many in flight as loxilb
    /// answers in time, the most urgent first, superseded ones never sent.
    window: window::Window,
    /// The firewall rules of ours it holds (`firewall.rs`, `--source-ranges=firewall`).
    firewall: Mutex<firewall::FwBook>,
    /// `--appendEPs`: rules shared with other controllers, and what we attached (`shared.rs`).
    shared: shared::SharedRules,
    /// It holds SNAT rules of ours (`snat.rs`): the probe looks for a restart even when it
    /// holds no LB rule, so an Egress-only loxilb is replayed at once (`probe.rs`).
    holds_snat: AtomicBool,
}

/// The outcome of applying rules to one instance. Only transport failures (the instance is
/// gone) abort an apply; everything else is reported here and the other rules still go in.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Rules created, changed or deleted (0 when the instance already held exactly the
    /// desired rules; a rule created and taken back in the same pass does not count).
    pub changes: usize,
    /// Of `changes`, rules updated in place (endpoints and the other fields loxilb can change
    /// on a live rule): routine, e.g. after a Node change.
    pub updated: usize,
    /// Keys held by rules this cluster does not own.
    pub conflicts: Vec<(RuleKey, String)>,
    /// Rules held back by one of loxilb's limits (one entry per Service and limit).
    pub blocked: Vec<Blocked>,
    /// Calls loxilb refused or failed for any other reason.
    pub failed: Vec<(RuleKey, ClientError)>,
    /// Writes not sent because a newer write of the same rule came while they waited.
    pub superseded: usize,
}

impl ApplyReport {
    /// The instance holds everything asked for.
    pub fn complete(&self) -> bool {
        self.conflicts.is_empty() && self.blocked.is_empty() && self.failed.is_empty()
    }
}

fn is_transport(e: &ClientError) -> bool {
    e.is_transport()
}

impl Instance {
    pub fn new(client: LoxilbClient, cluster: &ClusterId) -> Instance {
        let client_timeout = client.timeout();
        Instance {
            client,
            group: loxi_domain::roles::DEFAULT_ZONE.to_string(),
            marker: loxilb_client::CiState {
                instance: format!("loxi-ccm.{cluster}"),
                state: "NOT_DEFINED".into(),
                vip: "0.0.0.0".into(),
            },
            healthy: AtomicBool::new(false),
            probed: AtomicBool::new(false),
            down_unannounced: AtomicBool::new(false),
            down_since: std::sync::Mutex::new(None),
            gone_after_ms: std::sync::atomic::AtomicU64::new(millis(probe::GONE_FOR_GOOD_AFTER)),
            tls_refusal: std::sync::Mutex::new(None),
            capacity: AtomicUsize::new(DEFAULT_CAPACITY),
            parallel_calls: AtomicUsize::new(DEFAULT_PARALLEL_CALLS),
            holdings: Mutex::new(Holdings::default()),
            whole_pass: Mutex::new(()),
            whole_progress: tokio::sync::Notify::new(),
            whole_running: std::sync::Mutex::default(),
            last_service_write: std::sync::Mutex::new(None),
            bgp: Mutex::default(),
            roles: Mutex::default(),
            serving: AtomicBool::new(true),
            passes_held: AtomicBool::new(false),
            window: window::Window::new(WindowSettings::for_timeout(
                DEFAULT_WRITE_WINDOW,
                client_timeout,
            )),
            firewall: Mutex::default(),
            shared: shared::SharedRules::default(),
            holds_snat: AtomicBool::new(false),
        }
    }

    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// The instance as a member of `group`.
    pub fn in_group(mut self, group: &str) -> Instance {
        self.group = group.to_string();
        self
    }

    /// The group it belongs to.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The error a rule shows while its last write is unanswered (`Holdings::unsure`).
    fn unanswered(&self) -> ClientError {
        ClientError::Timeout {
            url: self.url().to_string(),
            timeout_ms: u64::try_from(self.client.timeout().as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Where the Service's first waiting write stands in the window (`None`: none waits).
    pub fn queued(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<loxi_domain::write_window::Position> {
        self.window.queued(&window::owner_key(namespace, name))
    }

    /// Drops the Service's writes that still wait in the window (it is being deleted).
    pub fn drop_queued(&self, namespace: &str, name: &str) {
        self.window.drop_owner(&window::owner_key(namespace, name));
    }

    /// Sets the most writes in flight to it at once (`--loxilb-write-window`).
    pub fn set_write_window(&self, max: usize) {
        self.window
            .set_settings(WindowSettings::for_timeout(max, self.client.timeout()));
    }

    /// How long ago a Service's own pass last wrote here (`None`: never; zero while writes
    /// wait in its window).
    pub fn since_service_write(&self) -> Option<std::time::Duration> {
        if !self.window.idle() {
            // Writes queued there: a drift check now would list while they run.
            return Some(std::time::Duration::ZERO);
        }
        self.last_service_write
            .lock()
            .ok()
            .and_then(|t| t.map(|t| t.elapsed()))
    }

    fn note_service_write(&self) {
        if let Ok(mut t) = self.last_service_write.lock() {
            *t = Some(Instant::now());
        }
    }

    /// Services' passes program it (every configured instance; a discovered one once its
    /// first replay is done).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Its first replay programmed it completely: Services' passes program it from now on.
    pub fn start_serving(&self) -> bool {
        !self.serving.swap(true, Ordering::SeqCst)
    }

    /// Whether Services' passes write to it now: it serves, and no replay after a restart
    /// is owed (`passes_held`).
    pub fn takes_passes(&self) -> bool {
        self.is_serving() && !self.passes_held()
    }

    /// How long it may stay unreachable before it counts as gone for good.
    pub fn gone_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.gone_after_ms.load(Ordering::Relaxed))
    }

    /// Sets [`Instance::gone_after`] (`--loxilb-gone-after`).
    pub fn set_gone_after(&self, after: std::time::Duration) {
        self.gone_after_ms.store(millis(after), Ordering::Relaxed);
    }

    /// Whether Services' passes are held back until its replay ran (`passes_held`).
    pub fn passes_held(&self) -> bool {
        self.passes_held.load(Ordering::SeqCst)
    }

    /// Holds Services' passes back until its replay ran (`passes_held`).
    pub(super) fn hold_passes(&self) {
        self.passes_held.store(true, Ordering::SeqCst);
    }

    /// Its replay ran: Services' passes write to it again. True when they were held back
    /// (their conditions, and what changed during the replay, need a pass).
    pub fn resume_passes(&self) -> bool {
        self.passes_held.swap(false, Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating.
fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::rules::Marker;
    use super::waiters::{TURN_HOLD, Waiters};
    use super::*;
    use crate::metrics::Metrics;
    use loxi_domain::RuleName;
    use loxi_domain::model::Probe as RuleProbe;
    use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol};
    use loxilb_client::ClientConfig;
    use loxilb_client::convert::to_entry;
    use loxilb_sim::{SimConfig, Simulator};

    /// A requeue that forwards to a channel, for tests to read what was woken.
    fn requeue_channel() -> (Requeue, tokio::sync::mpsc::UnboundedReceiver<RuleOwner>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (
            Requeue::new(move |owner| {
                let _ = tx.send(owner.clone());
            }),
            rx,
        )
    }

    fn cluster() -> ClusterId {
        ClusterId::new("unit").unwrap()
    }

    fn rule(svc: &str, ip: &str, port: u16, sources: &[&str]) -> Rule {
        Rule {
            key: RuleKey {
                ip: ip.parse().unwrap(),
                port,
                protocol: Protocol::Tcp,
            },
            name: RuleName::new(&cluster(), "ns", svc, port, Protocol::Tcp).to_string(),
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            endpoints: vec![Endpoint {
                ip: "10.0.0.1".parse().unwrap(),
                target_port: 30000,
                weight: 1,
            }],
            monitor: false,
            managed: true,
            probe: RuleProbe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: sources.iter().map(|s| s.parse().unwrap()).collect(),
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
        }
    }

    async fn sim(max_rules: usize) -> (Simulator, Instance) {
        let sim = Simulator::start(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                max_rules,
                ..SimConfig::default()
            },
        )
        .await
        .unwrap();
        let client = LoxilbClient::new(ClientConfig::new(&sim.url())).unwrap();
        let inst = Instance::new(client, &cluster());
        (sim, inst)
    }

    #[tokio::test]
    async fn configured_capacity_holds_rules_back_without_calls() {
        let (sim, inst) = sim(2048).await;
        inst.set_capacity(3);
        let m = Metrics::new();
        let c = cluster();
        let a = [
            rule("a", "192.0.2.1", 80, &[]),
            rule("a", "192.0.2.1", 81, &[]),
        ];
        let b = [
            rule("b", "192.0.2.2", 80, &[]),
            rule("b", "192.0.2.2", 81, &[]),
        ];
        let r = inst
            .apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert!(r.complete() && r.changes == 2, "{r:?}");
        let (tx, mut rx) = requeue_channel();
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert_eq!(r.changes, 0);
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::Capacity {
                    held: 2,
                    new: 2,
                    capacity: 3,
                    refused: false
                }]
            ),
            "{r:?}"
        );
        assert_eq!(
            sim.request_count(),
            calls,
            "nothing sent to a full instance"
        );
        assert_eq!(sim.rules().len(), 2);
        assert!(rx.try_recv().is_err());
        // Room frees: b is woken, and then fits.
        inst.remove_service(&c, "ns", "a", &m).await.unwrap();
        assert_eq!(rx.try_recv().unwrap().name, "b");
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert!(r.complete() && r.changes == 2, "{r:?}");
    }

    #[test]
    fn room_freed_between_decision_and_waiting_requeues_at_once() {
        let (tx, mut rx) = requeue_channel();
        let mut h = Holdings::default();
        let b = RuleOwner::new("ns", "b");
        // Decided with no room, and nothing freed until it waits: it waits for a wake-up.
        let decided = h.room_freed_count;
        h.wait_for_room(b.clone(), 1, &tx, decided);
        assert!(rx.try_recv().is_err());
        // Room frees: woken.
        h.room_freed();
        assert_eq!(rx.try_recv().unwrap(), b);
        // Decided with no room, room freed while its calls ran (the waiters woken then did
        // not include it), then it waits: re-queued at once, and it keeps waiting.
        h.waiters.done(&b);
        let decided = h.room_freed_count;
        h.room_freed();
        assert!(rx.try_recv().is_err(), "not a waiter yet");
        h.wait_for_room(b.clone(), 1, &tx, decided);
        assert_eq!(rx.try_recv().unwrap(), b);
        h.room_freed();
        assert_eq!(rx.try_recv().unwrap(), b);
    }

    #[tokio::test]
    async fn a_drift_repair_that_creates_a_waiters_rules_wakes_it() {
        let (_sim, inst) = sim(2048).await;
        inst.set_capacity(1);
        let m = Metrics::new();
        let c = cluster();
        let a = [rule("a", "192.0.2.1", 80, &[])];
        let b = [rule("b", "192.0.2.2", 80, &[])];
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        let (tx, mut rx) = requeue_channel();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, Some(&tx))
            .await
            .unwrap();
        assert!(!r.blocked.is_empty(), "{r:?}");
        // Room appears without anything being deleted (here: a larger table), and the drift
        // check programs b: b is woken, so that its condition stops saying it waits.
        inst.set_capacity(2);
        let r = inst
            .converge_all(
                &c,
                None,
                || {
                    vec![
                        ServiceRules::Want(a.to_vec()),
                        ServiceRules::Want(b.to_vec()),
                    ]
                    .into_iter()
                },
                &m,
            )
            .await
            .unwrap();
        assert_eq!(r.changes, 1, "{r:?}");
        assert_eq!(rx.try_recv().unwrap().name, "b");
    }

    #[tokio::test]
    async fn refused_capacity_rolls_back_and_is_learned() {
        let (sim, inst) = sim(3).await;
        let m = Metrics::new();
        let c = cluster();
        let a = [
            rule("a", "192.0.2.1", 80, &[]),
            rule("a", "192.0.2.1", 81, &[]),
        ];
        let b = [
            rule("b", "192.0.2.2", 80, &[]),
            rule("b", "192.0.2.2", 81, &[]),
        ];
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(r.blocked[..], [Blocked::Capacity { refused: true, .. }]),
            "{r:?}"
        );
        // b's first rule went in and came out again: a half Service takes no room.
        assert_eq!(sim.rules().len(), 2);
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "b", &b, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::Capacity {
                    capacity: 3,
                    refused: false,
                    ..
                }]
            ),
            "{r:?}"
        );
        assert_eq!(sim.request_count(), calls, "the learned capacity is used");
        // A one-rule Service still fits.
        let d = [rule("d", "192.0.2.4", 80, &[])];
        let r = inst
            .apply_service(&c, "ns", "d", &d, &m, None)
            .await
            .unwrap();
        assert!(r.complete(), "{r:?}");
        assert_eq!(sim.rules().len(), 3);
    }

    #[tokio::test]
    async fn source_ranges_past_index_28_are_predicted_and_refusals_remembered() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        let big: Vec<Rule> = (0..28)
            .map(|i| rule("big", "192.0.2.1", 1000 + i, &[]))
            .collect();
        inst.apply_service(&c, "ns", "big", &big, &m, None)
            .await
            .unwrap();
        let calls = sim.request_count();
        let src = [rule("src", "192.0.2.2", 80, &["198.51.100.0/24"])];
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(
                r.blocked[..],
                [Blocked::SourceRanges {
                    index: Some(29),
                    ..
                }]
            ),
            "{r:?}"
        );
        assert_eq!(sim.request_count(), calls);
        // A rule without source ranges is not affected.
        let plain = [rule("plain", "192.0.2.3", 80, &[])];
        let r = inst
            .apply_service(&c, "ns", "plain", &plain, &m, None)
            .await
            .unwrap();
        assert!(r.complete());

        // Holes above 28 fool the estimate: loxilb's 400 is reported the same way, once.
        inst.remove_service(&c, "ns", "big", &m).await.unwrap();
        let filler: Vec<Rule> = (0..27)
            .map(|i| rule("filler", "192.0.2.5", 2000 + i, &[]))
            .collect();
        // plain holds index 29 and 1..=28 are free: filler takes 27 of them, then plain's 29
        // is the latest freed, so loxilb hands it out next although the count says 28.
        inst.apply_service(&c, "ns", "filler", &filler, &m, None)
            .await
            .unwrap();
        inst.remove_service(&c, "ns", "plain", &m).await.unwrap();
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(
            matches!(r.blocked[..], [Blocked::SourceRanges { index: None, .. }]),
            "{r:?}"
        );
        let calls = sim.request_count();
        let r = inst
            .apply_service(&c, "ns", "src", &src, &m, None)
            .await
            .unwrap();
        assert!(!r.blocked.is_empty());
        assert_eq!(sim.request_count(), calls, "a refusal is not repeated");
    }

    #[tokio::test]
    async fn probe_sees_a_restart_between_two_probes() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        // The first listing placed the marker; probes read it instead of listing rules.
        let states = inst.client.cluster_states().await.unwrap();
        assert!(states.iter().any(|s| s.instance == format!("loxi-ccm.{c}")));
        let before = listings(&m);
        assert!(before >= 1);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(listings(&m), before);
        sim.restart();
        assert_eq!(inst.probe(&c, &m).await, Probe::LostRules { missing: 1 });
        // Until the replay lists it again, nothing is believed.
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        assert_eq!(sim.rules().len(), 1);
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        sim.go_down().await;
        assert_eq!(inst.probe(&c, &m).await, Probe::WentDown);
        assert_eq!(inst.probe(&c, &m).await, Probe::Down);
        sim.come_up().await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
    }

    #[test]
    fn room_goes_to_waiters_in_the_order_they_started_waiting() {
        let (tx, mut rx) = requeue_channel();
        let svc = |n: &str| RuleOwner::new("ns", n);
        let mut w = Waiters::default();
        w.wait(svc("first"), 3, tx.clone());
        w.wait(svc("second"), 1, tx.clone());
        w.wait(svc("third"), 2, tx.clone());
        w.wait(svc("first"), 3, tx.clone()); // waits again: keeps its place
        let now = Instant::now();
        assert_eq!(w.kept_ahead(&svc("new"), 4, now), 0, "nobody woken yet");
        w.wake_all(now);
        let woken: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.name)
            .collect();
        assert_eq!(woken, ["first", "second", "third"]);
        // 4 free: first (3) and second (1) fit in order; third (2) does not any more.
        assert_eq!(w.kept_ahead(&svc("first"), 4, now), 0);
        assert_eq!(w.kept_ahead(&svc("second"), 4, now), 3);
        assert_eq!(w.kept_ahead(&svc("third"), 4, now), 4);
        assert_eq!(
            w.kept_ahead(&svc("new"), 4, now),
            4,
            "newcomers queue behind"
        );
        // 2 free: first (3) does not fit and holds nobody back.
        assert_eq!(w.kept_ahead(&svc("second"), 2, now), 0);
        assert_eq!(w.kept_ahead(&svc("third"), 2, now), 1);
        w.done(&svc("first"));
        assert_eq!(w.kept_ahead(&svc("third"), 4, now), 1);
        // The turn is over: no room is kept any more.
        assert_eq!(w.kept_ahead(&svc("third"), 4, now + TURN_HOLD), 0);
    }

    #[tokio::test]
    async fn a_restart_while_down_is_replayed_once() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        let a = [rule("a", "192.0.2.1", 80, &[])];
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        sim.go_down().await;
        assert_eq!(inst.probe(&c, &m).await, Probe::WentDown);
        sim.restart();
        sim.come_up().await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        // The replay (as the health loop runs it after CameBack).
        inst.apply_service(&c, "ns", "a", &a, &m, None)
            .await
            .unwrap();
        assert_eq!(sim.rules().len(), 1);
        for _ in 0..3 {
            assert_eq!(
                inst.probe(&c, &m).await,
                Probe::Up,
                "replayed a second time"
            );
        }
    }

    /// Successful rule listings so far, from the call counter.
    fn listings(m: &Metrics) -> usize {
        m.encode()
            .lines()
            .filter(|l| l.contains("op=\"list\"") && l.contains("result=\"ok\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as usize
    }

    #[tokio::test]
    async fn without_the_marker_probes_list_and_see_a_restart() {
        let (sim, inst) = sim(2048).await;
        let m = Metrics::new();
        let c = cluster();
        inst.holdings.lock().await.marker = Marker::Refused;
        assert_eq!(inst.probe(&c, &m).await, Probe::CameBack);
        inst.apply_service(&c, "ns", "a", &[rule("a", "192.0.2.1", 80, &[])], &m, None)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        // Another owner's rule comes and goes: counted, but no reason to replay.
        let mut foreign = rule("x", "192.0.2.9", 80, &[]);
        foreign.name = "default_x:llb-inst0".into();
        inst.client.apply_rule(&to_entry(&foreign)).await.unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.rule_count().await, 2);
        inst.client
            .delete_rule("192.0.2.9", 80, "tcp", false)
            .await
            .unwrap();
        assert_eq!(inst.probe(&c, &m).await, Probe::Up);
        assert_eq!(inst.rule_count().await, 1);
        sim.restart();
        assert_eq!(inst.probe(&c, &m).await, Probe::LostRules { missing: 1 });
    }
}
