//! One worker per loxilb (docs/fleet.md#one-worker-per-loxilb): its probes, its replay (HA
//! roles, BGP, rules, in loxilb's order), its BGP set-up and the retries of all of it run in
//! that loxilb's own task, so a loxilb that answers slowly, not at all, or is busy with a
//! replay of thousands of rules delays nobody but itself.
//!
//! A worker is two loops in one task:
//!
//! - the **prober** probes the loxilb every health interval (one attempt, bounded by the
//!   loxilb timeout), records the result on the instance (`Instance::probe`) and, when its
//!   state changed (down, back, restarted), tells the fleet at once ([`Workers::changed`]):
//!   the HA role decisions ([`super::roles`]) run from these results on their own tick and
//!   never wait for any loxilb's calls;
//! - the **driver** acts on what the prober found: a loxilb that came back or restarted is
//!   told its HA roles (a returning MASTER hears `BACKUP` before anything else, when the role
//!   moved while it was away), then its BGP settings, then every rule; BGP is kept in step
//!   at every interval, and retried there while loxilb's goBGP is still starting (it answers
//!   about 9 s after loxilb's API: docs/loxilb-api.md#the-global-configuration), without
//!   holding back the rules. From the probe that finds the restart until its role and BGP
//!   were sent, Services' passes leave that loxilb alone (`Instance::takes_passes`): a pass
//!   in between would send rules before them. During the rule replay they write there
//!   again, a change ahead of the replay's writes (`Instance::converge_all`).
//!
//! The rules of the replay come from the caller ([`Replay`]: the Services' desired rules are
//! the `service` subsystem's), and what a BGP pass found is kept for the health tick, which
//! publishes it ([`Workers::bgp_passes`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use loxi_domain::ClusterId;
use loxilb_client::ClientError;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::roles::Roles;
use crate::bgp::{Bgp, Plan};
use crate::loxilb::bgp::BgpReport;
use crate::loxilb::{Instance, Probe};
use crate::metrics::Metrics;

/// How often a loxilb that does not answer is probed.
const DOWN_PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Brings one loxilb to every rule of its group's Services; true when it holds them all.
pub type Replay = Arc<dyn Fn(Arc<Instance>) -> BoxFuture<'static, bool> + Send + Sync>;

/// A snapshot of loxilbs (the fleet's members, or the BGP-peer-only ones).
pub type Listed = Arc<Vec<Arc<Instance>>>;

/// One BGP pass's outcome, shared with the health tick that publishes it.
pub type PassResult = Arc<Result<BgpReport, ClientError>>;

/// What a worker is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A member of the fleet: roles, BGP and rules.
    Member,
    /// A BGP-peer-only loxilb (docs/fleet.md#bgp-peer-only-loxilbs): BGP settings only.
    PeerOnly,
}

/// The last BGP pass on one loxilb, and the plan it was made with.
pub struct BgpPass {
    pub plan: Arc<Plan>,
    /// `None`: the loxilb was not reached (down).
    pub result: Option<Arc<Result<BgpReport, ClientError>>>,
}

/// What every worker shares.
pub struct Settings {
    pub cluster: ClusterId,
    pub metrics: Metrics,
    pub interval: Duration,
    pub bgp: Option<Arc<Bgp>>,
    pub roles: Option<Arc<Roles>>,
    pub replay: Replay,
}

/// The workers of the fleet's loxilbs and of the BGP-peer-only ones: started for a loxilb
/// that joins ([`Workers::follow`]), stopped for one that leaves ([`Workers::stop_worker`]).
pub struct Workers {
    settings: Settings,
    /// The BGP plan the workers bring their loxilbs to (replaced at every health tick).
    plan: watch::Sender<Option<Arc<Plan>>>,
    /// Counts the changes of a loxilb's state (down, back, restarted, joined): the role
    /// decisions and the health tick each follow it.
    changes: watch::Sender<u64>,
    /// Something happened that Services' conditions show (read and cleared by the health
    /// tick).
    status_changed: std::sync::atomic::AtomicBool,
    /// The running workers by loxilb (the instance's address: the same URL in another group
    /// is another instance).
    running: Mutex<HashMap<usize, Running>>,
    /// The latest BGP pass of each loxilb, by URL.
    passes: Mutex<HashMap<String, BgpPass>>,
}

struct Running {
    url: String,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key(inst: &Arc<Instance>) -> usize {
    Arc::as_ptr(inst) as usize
}

impl Workers {
    pub fn new(settings: Settings) -> Arc<Workers> {
        Arc::new(Workers {
            settings,
            plan: watch::Sender::new(None),
            changes: watch::Sender::new(0),
            status_changed: false.into(),
            running: Mutex::default(),
            passes: Mutex::default(),
        })
    }

    /// Runs a worker for each loxilb `listed` names (the fleet's members, the BGP-peer-only
    /// ones) that has none, and returns them. `listed` is read under the lock that
    /// [`Workers::stop_worker`] takes: a loxilb that left by then is not listed, so a
    /// worker just stopped is never started again from a list read before it left.
    /// A worker is never stopped here: a loxilb leaves through `Fleet::set_source`, which
    /// stops its worker before its gauges are forgotten.
    pub fn follow(self: &Arc<Self>, listed: impl FnOnce() -> (Listed, Listed)) -> (Listed, Listed) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let (members, peers) = listed();
        let wanted = members
            .iter()
            .map(|i| (i, Kind::Member))
            .chain(peers.iter().map(|i| (i, Kind::PeerOnly)));
        for (inst, kind) in wanted {
            if running.contains_key(&key(inst)) {
                continue;
            }
            let task = tokio::spawn(self.clone().work(inst.clone(), kind));
            running.insert(
                key(inst),
                Running {
                    url: inst.url().to_string(),
                    task,
                },
            );
        }
        (members, peers)
    }

    /// Stops the worker of `inst` (a loxilb that left) and waits until it has stopped:
    /// afterwards nothing of it runs (no probe, replay, role or BGP post finishing late),
    /// so the gauges forgotten next are not set again. Its last BGP pass goes too, unless
    /// another worker follows the same URL (it moved to another group).
    pub async fn stop_worker(&self, inst: &Arc<Instance>) {
        let stopped = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key(inst));
        if let Some(mut worker) = stopped {
            worker.task.abort();
            // Cancelled (or ended): either way it no longer runs.
            let _ = (&mut worker.task).await;
        }
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if !running.values().any(|r| r.url == inst.url()) {
            self.passes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(inst.url());
        }
    }

    /// Whether each loxilb reaches the configured BGP peers (not the other loxilbs), from its
    /// latest pass: true when a session with one of them is ESTABLISHED, false when none
    /// is. A loxilb without a good pass (down, refused, not yet) is left out, and so is
    /// everyone when no peer is configured.
    pub fn bgp_reach(&self) -> HashMap<String, bool> {
        let Some(plan) = self.plan.borrow().clone() else {
            return HashMap::new();
        };
        let peers: Vec<std::net::IpAddr> = plan
            .desired
            .config
            .peers
            .iter()
            .map(|p| p.ip_address)
            .collect();
        if peers.is_empty() {
            return HashMap::new();
        }
        let passes = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        passes
            .iter()
            .filter_map(|(url, pass)| {
                let Ok(report) = pass.result.as_deref()? else {
                    return None;
                };
                let up = report.sessions.iter().any(|n| {
                    n.state == "ESTABLISHED"
                        && n.ip_address
                            .parse::<std::net::IpAddr>()
                            .is_ok_and(|ip| peers.contains(&ip))
                });
                Some((url.clone(), up))
            })
            .collect()
    }

    /// Stops every worker (the controller stops).
    pub fn stop(&self) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Hands the workers the BGP plan to bring their loxilbs to.
    pub fn set_plan(&self, plan: Arc<Plan>) {
        self.plan.send_replace(Some(plan));
    }

    /// Follows the changes of the loxilbs' states (down, back, restarted, joined).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether a loxilb changed state since the last call: Services' conditions (which name
    /// unreachable loxilbs and count serving ones) are stale.
    pub fn take_status_changed(&self) -> bool {
        self.status_changed
            .swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// The latest BGP pass of each of `urls` (`None`: down, or no pass yet), and whether
    /// every pass was made with `plan`'s settings for its loxilb (otherwise what the BGP
    /// resources' statuses say waits for the next passes).
    pub fn bgp_passes(
        &self,
        plan: &Plan,
        urls: &[String],
    ) -> (Vec<(String, Option<PassResult>)>, bool) {
        let passes = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        let mut current = true;
        let out = urls
            .iter()
            .map(|url| {
                let pass = passes.get(url);
                if let Some(p) = pass
                    && p.result.is_some()
                    && !Bgp::same_settings(&p.plan, plan, url)
                {
                    current = false;
                }
                (url.clone(), pass.and_then(|p| p.result.clone()))
            })
            .collect();
        (out, current)
    }

    fn note_pass(
        &self,
        url: &str,
        plan: Arc<Plan>,
        result: Option<Result<BgpReport, ClientError>>,
    ) {
        self.passes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                url.to_string(),
                BgpPass {
                    plan,
                    result: result.map(Arc::new),
                },
            );
    }

    fn tell(&self, status: bool) {
        if status {
            self.status_changed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The worker of one loxilb: the prober and the driver (module docs).
    async fn work(self: Arc<Self>, inst: Arc<Instance>, kind: Kind) {
        let (found_tx, found_rx) = mpsc::unbounded_channel::<Probe>();
        let prober = async {
            let mut tick = tokio::time::interval(self.settings.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                if inst.is_healthy() {
                    tick.tick().await;
                } else {
                    // Down: probed more often, so that a returning MASTER whose role moved
                    // is told BACKUP within moments of answering again.
                    tokio::time::sleep(DOWN_PROBE_INTERVAL.min(self.settings.interval)).await;
                }
                let probe = inst
                    .probe(&self.settings.cluster, &self.settings.metrics)
                    .await;
                if probe.changes_status() {
                    // Back with its passes held: the Services' conditions change once its
                    // replay ran (the driver tells then), not before; the roles hear now.
                    self.tell(!(probe == Probe::CameBack && inst.passes_held()));
                }
                if probe == Probe::WentDown
                    && let Some(bgp) = &self.settings.bgp
                    && let Some(plan) = self.plan.borrow().clone()
                {
                    // Its sessions are down with it: reported at once, not once it is back.
                    bgp.loxilb_down(&plan, inst.url());
                }
                if probe == Probe::CameBack
                    && let Some(bgp) = &self.settings.bgp
                {
                    bgp.loxilb_back(inst.url());
                }
                if found_tx.send(probe).is_err() {
                    return;
                }
            }
        };
        let driver = self.drive(&inst, kind, found_rx);
        tokio::join!(prober, driver);
    }

    /// Acts on the probes, in loxilb's order after a start (module docs).
    async fn drive(
        &self,
        inst: &Arc<Instance>,
        kind: Kind,
        mut found: mpsc::UnboundedReceiver<Probe>,
    ) {
        // A replay that did not end with every rule in place is tried again.
        let mut replay_owed = false;
        // BGP after a start: goBGP may not answer yet; tried at every probe until it does.
        let mut bgp_owed = false;
        while let Some(first) = found.recv().await {
            // Probes that came in while a replay ran: the latest state, and whether any of
            // them found a restart.
            let mut latest = first;
            let mut restarted = first.needs_replay();
            while let Ok(next) = found.try_recv() {
                restarted |= next.needs_replay();
                latest = next;
            }
            if matches!(latest, Probe::Down | Probe::WentDown) {
                if let Some(plan) = self.plan.borrow().clone() {
                    self.note_pass(inst.url(), plan, None);
                }
                if restarted {
                    // Back and gone again: the replay is owed when it is next back (the
                    // probe says `CameBack` then).
                    replay_owed = false;
                }
                continue;
            }
            if restarted {
                // Whatever it held may be gone: roles, BGP, rules, in loxilb's order.
                inst.forget_roles().await;
                inst.forget_bgp().await;
                if kind == Kind::Member {
                    if let Some(roles) = &self.settings.roles {
                        roles.tell(inst, &self.settings.metrics).await;
                    }
                    replay_owed = true;
                }
                bgp_owed = self.settings.bgp.is_some();
            }
            if let Some(bgp) = &self.settings.bgp {
                // Every interval: BGP in step with the plan (the first pass after a start).
                let plan = self.plan.borrow().clone();
                if let Some(plan) = plan {
                    let result = bgp.sync(inst, &plan).await;
                    match &result {
                        Ok(_) => {
                            if bgp_owed {
                                info!(instance = inst.url(), "BGP configured after a loxilb start");
                            }
                            bgp_owed = false;
                        }
                        Err(e)
                            if bgp_owed
                                && e.gobgp() == Some(loxilb_client::GobgpAnswer::Starting) =>
                        {
                            debug!(instance = inst.url(), error = %e, "goBGP not answering yet (loxilb starting); trying again");
                        }
                        Err(e) => {
                            warn!(instance = inst.url(), error = %e, "BGP settings not applied; trying again");
                        }
                    }
                    self.note_pass(inst.url(), plan, Some(result));
                }
            }
            if replay_owed && kind == Kind::Member && inst.is_healthy() {
                // Services' passes were held back since the restart was seen: its role and
                // BGP had to go first (above). From here they write there again, beside the
                // replay: a change made now (a Node gone, a new Service) goes ahead of the
                // replay's writes in the write window, and takes that Service's part of
                // the replay over (docs/architecture.md#writing-to-a-slow-loxilb).
                let held = inst.resume_passes();
                let complete = (self.settings.replay)(inst.clone()).await;
                replay_owed = !complete;
                // Each Service then gets a pass for its conditions (`Programmed` counts this
                // loxilb again).
                if held && inst.is_healthy() {
                    self.tell(true);
                }
                if complete && inst.start_serving() {
                    info!(
                        instance = inst.url(),
                        "loxilb joined: programmed, now serving"
                    );
                    self.tell(true);
                }
            }
        }
    }
}
