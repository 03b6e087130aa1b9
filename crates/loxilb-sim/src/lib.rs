//! `loxilb-sim`: a faithful, stateful stand-in for the loxilb REST API
//! (see `docs/loxilb-api.md`).
//!
//! It parses requests itself (from `serde_json::Value`, Go decoding rules)
//! instead of reusing the client's DTOs, so that it checks the client rather
//! than mirroring it.
//!
//! The API lives under [`API_BASE`]; a small admin API under `/admin` on the
//! same listener drives the simulation (restart, down/up, latency, faults, BGP, cost profile).
//! While the simulator is down its listener is closed, so `POST /admin/up`
//! cannot be reached: come back with [`Simulator::come_up`] or with the timed
//! form `POST /admin/down {"seconds":N}`.
//!
//! Calls are answered at once by default; the cost profile `loxilb-0.9.8` ([`Profile`])
//! makes rule writes cost what they cost on loxilb since 2026-03-04
//! (docs/loxilb-api.md#costs-and-versions).

mod admin;
mod bgp;
mod decode;
mod endpoints;
mod errors;
mod firewall;
mod k8smeta;
mod profile;
mod routes;
mod server;
mod state;
mod traffic;
mod validate;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use bgp::{
    SESSION_STATES, SimBgp, SimBgpAssignment, SimBgpDefinedSet, SimBgpGlobal, SimBgpNeighbor,
    SimBgpPolicy,
};
pub use errors::status_for;
pub use firewall::{FwAction, PortRange, SimFwRule};
pub use k8smeta::{
    K8S_METADATA_LIMIT, SimK8sMeta, SimNodeMeta, SimPodMeta, SimServiceMeta, SimServicePortMeta,
};
pub use profile::{Profile, SimCosts};
pub use routes::{ApiRoute, api_routes, unpublished_api_routes};
pub use state::{SimEndpoint, SimRule};
pub use traffic::Traffic;

/// Base path of the loxilb API.
pub const API_BASE: &str = "/netlox/v1";

/// Simulator settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of LB rules (internal indexes `1..=max_rules`); loxilb: 2048.
    pub max_rules: usize,
    /// When set, every API call except `/version` needs `Authorization: <token>`.
    pub auth_token: Option<String>,
    /// Reported by `GET /version`.
    pub version: String,
    /// loxilb started with BGP (`-b`): the `/config/bgp` calls work and rules with `bgp`
    /// are counted for advertisement. Off (loxilb's default), every BGP call answers 403
    /// (docs/loxilb-api.md#bgp). Can be switched later with [`Simulator::set_bgp_enabled`].
    pub bgp: bool,
    /// loxilb runs as a BGP peer only (the instances behind kube-loxilb's
    /// `loxilb-peer-service`): BGP works (as with `bgp`), and every rule, endpoint and
    /// cluster-state call answers 403 `running in bgp only mode` (docs/loxilb-api.md#bgp-peer-only-mode).
    pub bgp_only: bool,
    /// How long after loxilb (re)starts its goBGP answers: until then every `/config/bgp`
    /// call that reaches goBGP answers 500 `... connect: connection refused`, as loxilb's
    /// do (about 9 s on loxilb 0.9.8, docs/loxilb-api.md#bgp). Default 0 (at once); changed
    /// while running with [`Simulator::set_gobgp_delay`]. A profile with a start-up delay
    /// ([`Profile::gobgp_delay`]) makes it at least that.
    pub gobgp_delay: Duration,
    /// What rule writes cost (docs/loxilb-api.md#costs-and-versions): [`Profile::Instant`]
    /// (the default, every call answered at once) or [`Profile::Loxilb098`]. Changed while
    /// running with [`Simulator::set_profile`].
    pub profile: Profile,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            max_rules: 2048,
            auth_token: None,
            version: "0.9.8-sim".to_string(),
            bgp: false,
            bgp_only: false,
            gobgp_delay: Duration::ZERO,
            profile: Profile::Instant,
        }
    }
}

/// Error injection: matched API calls answer `status` (handler error shape)
/// without touching state. `rate` in `0..=1` is applied deterministically:
/// the n-th eligible call fails iff `floor(n*rate) > floor((n-1)*rate)`
/// (1.0 = every call, 0.5 = every 2nd, 0.25 = every 4th).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    pub status: u16,
    #[serde(default = "default_rate")]
    pub rate: f64,
    /// Only non-GET calls are eligible.
    #[serde(default)]
    pub only_writes: bool,
}

fn default_rate() -> f64 {
    1.0
}

/// State and knobs shared by the handlers.
pub(crate) struct Shared {
    cfg: SimConfig,
    state: Mutex<state::SimState>,
    latency_nanos: AtomicU64,
    /// Extra delay for writes only (everything but GET): lets a test hold a write in flight
    /// while reads go through.
    write_latency_nanos: AtomicU64,
    /// Time each rule write (`/config/loadbalancer...`, any method but GET) takes, one after
    /// the other (`rule_writes`), as on a real loxilb (about 1 s each on 0.9.8).
    rule_write_latency_nanos: AtomicU64,
    pub(crate) rule_writes: Arc<tokio::sync::Mutex<()>>,
    fault: Mutex<Option<Fault>>,
    fault_seen: AtomicU64,
    faults_injected: AtomicU64,
    requests: AtomicU64,
    /// `POST /config/loadbalancer` calls received (creates and updates).
    rule_posts: AtomicU64,
    /// API calls other than GET received (every write, whatever its path).
    writes: AtomicU64,
    /// The same, per caller ([`SimWrite::caller`]; writes without one are not in it).
    writes_by_caller: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Endpoint addresses a test made unreachable (kept across restarts: not loxilb state).
    reachability: Mutex<endpoints::Reachability>,
    restarts: AtomicU64,
    /// loxilb runs with BGP: a start option, so a restart keeps it.
    bgp_enabled: AtomicBool,
    /// goBGP answers this long after loxilb's (re)start (`SimConfig::gobgp_delay`).
    gobgp_delay_nanos: AtomicU64,
    /// When loxilb last (re)started: goBGP's delay counts from here.
    started: Mutex<std::time::Instant>,
    /// The token every API call but `/version` needs (`SimConfig::auth_token` at start);
    /// replaced by [`Simulator::set_auth_token`] (loxilb re-reads its manual token file).
    auth_token: Mutex<Option<String>>,
    /// The API writes since start or the last restart, in the order they were answered
    /// (the last [`WRITE_LOG_LIMIT`]): lets a test see the order of a replay.
    write_log: Mutex<std::collections::VecDeque<SimWrite>>,
    /// What rule writes cost (`SimConfig::profile`).
    profile: Mutex<Profile>,
    /// What the writes cost so far ([`Simulator::costs`]).
    pub(crate) costs: profile::CostCounters,
    /// When the simulator started (never reset): the origin of the write log's times and of
    /// the profile's worker ticks.
    pub(crate) born: std::time::Instant,
    /// The traffic model reproduces loxilb issue #1036 ([`Simulator::set_issue_1036`]).
    pub(crate) issue_1036: AtomicBool,
    /// Firewall table size ([`Simulator::set_firewall_capacity`]); a start option, so a
    /// restart keeps it.
    pub(crate) fw_capacity: std::sync::atomic::AtomicUsize,
}

/// How many API writes [`Simulator::write_log`] keeps.
pub const WRITE_LOG_LIMIT: usize = 10_000;

/// One API write as the simulator answered it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SimWrite {
    pub method: String,
    /// The path under the API base, with the query (`/config/bgp/neigh/10.0.0.1?remoteAs=1`).
    pub path: String,
    pub status: u16,
    /// The rule a rule POST wrote, as `ip:port/protocol` (`192.0.2.1:80/tcp`), answered or
    /// refused; `None` for other writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Who sent it: the [`CALLER_HEADER`] loxi-ccm sends (its leader-election identity),
    /// else the `User-Agent`; `None` with neither.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// When it arrived, since the simulator started (not reset by restarts); in JSON
    /// `accepted_ms`, in milliseconds.
    #[serde(rename = "accepted_ms", serialize_with = "millis")]
    pub accepted: Duration,
    /// When it was answered (or, unanswered, dropped), on the same clock; `completed_ms`.
    #[serde(rename = "completed_ms", serialize_with = "millis")]
    pub completed: Duration,
    /// The tick of the profile's datapath worker that completed it (a rule create or
    /// update under [`Profile::Loxilb098`]), ticks counted from the simulator's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick: Option<u64>,
    /// `false`: applied, but it waited longer than the profile's write timeout and its
    /// connection was closed without an answer ([`Profile::write_timeout`]).
    pub answered: bool,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `serialize_with` signature
fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// The header loxi-ccm names its process in (`loxilb_client::IDENTITY_HEADER`): not
/// loxilb's, which ignores it; the simulator records it with every write
/// (docs/loxilb-api.md#transport).
pub const CALLER_HEADER: &str = "x-loxi-ccm-identity";

/// The caller a request names: [`CALLER_HEADER`], else its `User-Agent`.
pub(crate) fn caller(headers: &axum::http::HeaderMap) -> Option<String> {
    [CALLER_HEADER, "user-agent"]
        .into_iter()
        .find_map(|h| headers.get(h)?.to_str().ok())
        .map(str::to_string)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the state half-updated in a
    // way worse than a crash would; keep serving instead of propagating.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn new(cfg: SimConfig) -> Self {
        let bgp = cfg.bgp || cfg.bgp_only;
        let gobgp_delay = cfg.gobgp_delay.max(cfg.profile.gobgp_delay());
        Shared {
            state: Mutex::new(state::SimState::new(cfg.max_rules)),
            latency_nanos: AtomicU64::new(0),
            write_latency_nanos: AtomicU64::new(0),
            rule_write_latency_nanos: AtomicU64::new(0),
            rule_writes: Arc::default(),
            fault: Mutex::new(None),
            fault_seen: AtomicU64::new(0),
            faults_injected: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            rule_posts: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            writes_by_caller: Mutex::default(),
            reachability: Mutex::default(),
            restarts: AtomicU64::new(0),
            bgp_enabled: AtomicBool::new(bgp),
            gobgp_delay_nanos: AtomicU64::new(
                u64::try_from(gobgp_delay.as_nanos()).unwrap_or(u64::MAX),
            ),
            started: Mutex::new(std::time::Instant::now()),
            auth_token: Mutex::new(cfg.auth_token.clone()),
            profile: Mutex::new(cfg.profile),
            costs: profile::CostCounters::default(),
            born: std::time::Instant::now(),
            issue_1036: AtomicBool::new(true),
            fw_capacity: std::sync::atomic::AtomicUsize::new(firewall::MAX_FW_RULES),
            cfg,
            write_log: Mutex::default(),
        }
    }

    pub(crate) fn profile(&self) -> Profile {
        *lock(&self.profile)
    }

    /// Also sets goBGP's start-up delay to the profile's.
    fn set_profile(&self, p: Profile) {
        *lock(&self.profile) = p;
        self.set_gobgp_delay(p.gobgp_delay());
    }

    /// `GET /admin/profile`.
    fn profile_json(&self) -> serde_json::Value {
        let p = self.profile();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        serde_json::json!({
            "profile": p.name(),
            "tickMs": p.tick().map(ms),
            "writeTimeoutMs": p.write_timeout().map(ms),
            "gobgpDelayMs": ms(Duration::from_nanos(self.gobgp_delay_nanos.load(Ordering::Relaxed))),
        })
    }

    pub(crate) fn auth_token(&self) -> Option<String> {
        lock(&self.auth_token).clone()
    }

    pub(crate) fn bgp_enabled(&self) -> bool {
        self.bgp_enabled.load(Ordering::Relaxed)
    }

    fn set_bgp_enabled(&self, on: bool) {
        self.bgp_enabled.store(on, Ordering::Relaxed);
    }

    /// goBGP is not answering yet: loxilb (re)started less than the goBGP delay ago.
    pub(crate) fn gobgp_starting(&self) -> bool {
        let delay = Duration::from_nanos(self.gobgp_delay_nanos.load(Ordering::Relaxed));
        lock(&self.started).elapsed() < delay
    }

    fn set_gobgp_delay(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.gobgp_delay_nanos.store(nanos, Ordering::Relaxed);
    }

    fn bgp_snapshot(&self) -> SimBgp {
        self.state().bgp.snapshot(self.bgp_enabled())
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, state::SimState> {
        lock(&self.state)
    }

    pub(crate) fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_nanos.load(Ordering::Relaxed))
    }

    fn set_latency(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.latency_nanos.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn write_latency(&self) -> Duration {
        Duration::from_nanos(self.write_latency_nanos.load(Ordering::Relaxed))
    }

    fn set_write_latency(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.write_latency_nanos.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn rule_write_latency(&self) -> Duration {
        Duration::from_nanos(self.rule_write_latency_nanos.load(Ordering::Relaxed))
    }

    fn set_rule_write_latency(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.rule_write_latency_nanos
            .store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn count_rule_post(&self) {
        self.rule_posts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reachability(&self) -> MutexGuard<'_, endpoints::Reachability> {
        lock(&self.reachability)
    }

    pub(crate) fn count_write(&self, caller: Option<&str>) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        if let Some(caller) = caller {
            *lock(&self.writes_by_caller)
                .entry(caller.to_string())
                .or_default() += 1;
        }
    }

    fn set_fault(&self, f: Option<Fault>) {
        *lock(&self.fault) = f;
        self.fault_seen.store(0, Ordering::Relaxed);
    }

    /// Decides whether this matched API call gets an injected fault.
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    pub(crate) fn injected_fault(&self, is_write: bool) -> Option<u16> {
        let f = (*lock(&self.fault))?;
        if f.only_writes && !is_write {
            return None;
        }
        let rate = if f.rate.is_nan() {
            0.0
        } else {
            f.rate.clamp(0.0, 1.0)
        };
        let n = self.fault_seen.fetch_add(1, Ordering::Relaxed) + 1;
        let hit = ((n as f64) * rate).floor() > (((n - 1) as f64) * rate).floor();
        if hit {
            self.faults_injected.fetch_add(1, Ordering::Relaxed);
            Some(f.status)
        } else {
            None
        }
    }

    pub(crate) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn log_write(&self, write: SimWrite) {
        let mut log = lock(&self.write_log);
        if log.len() == WRITE_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(write);
    }

    pub(crate) fn write_log(&self) -> Vec<SimWrite> {
        lock(&self.write_log).iter().cloned().collect()
    }

    fn restart(&self, max_rules: usize) {
        *self.state() = state::SimState::new(max_rules);
        *lock(&self.started) = std::time::Instant::now();
        lock(&self.write_log).clear();
        self.requests.store(0, Ordering::Relaxed);
        self.fault_seen.store(0, Ordering::Relaxed);
        self.faults_injected.store(0, Ordering::Relaxed);
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn current_fault(&self) -> Option<Fault> {
        *lock(&self.fault)
    }

    fn stats(&self) -> serde_json::Value {
        let fault = self.current_fault();
        serde_json::json!({
            "requests": self.requests.load(Ordering::Relaxed),
            "rules": self.state().rule_count(),
            "maxRules": self.state().max_rules(),
            "latencyMs": u64::try_from(self.latency().as_millis()).unwrap_or(u64::MAX),
            "fault": fault,
            "faultsInjected": self.faults_injected.load(Ordering::Relaxed),
            "restarts": self.restarts.load(Ordering::Relaxed),
            "version": self.cfg.version,
            "authEnabled": self.auth_token().is_some(),
            "bgpEnabled": self.bgp_enabled(),
            "bgpOnly": self.cfg.bgp_only,
            "profile": self.profile().name(),
            "costs": self.costs.snapshot(),
        })
    }
}

/// Handler state: the admin side needs the lifecycle, held weakly so the
/// server task does not keep the simulator alive forever.
#[derive(Clone)]
pub(crate) struct AppState {
    shared: Arc<Shared>,
    sim: Weak<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    addr: SocketAddr,
    router: axum::Router,
    /// `Some`: HTTPS only, with this certificate (see [`Simulator::start_tls`]).
    tls: Option<server::Tls>,
    /// `Some` while listening. A tokio mutex: down/up are serialized and
    /// hold it across the listener shutdown so a rebind never races it.
    running: tokio::sync::Mutex<Option<server::Running>>,
}

/// Handle to a running simulator; cheap to clone.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl Simulator {
    /// Binds `addr` (port 0 picks a free port) and serves the API and admin
    /// routes; returns once the listener accepts connections.
    pub async fn start(addr: SocketAddr, cfg: SimConfig) -> std::io::Result<Simulator> {
        Simulator::start_with(addr, cfg, None).await
    }

    /// Like [`Simulator::start`], but serves HTTPS only, with the certificate chain and
    /// private key given in PEM (loxilb's `--tls`; it serves HTTPS on a port of its own,
    /// docs/loxilb-api.md#transport). Bad PEM is an `InvalidInput` error.
    pub async fn start_tls(
        addr: SocketAddr,
        cfg: SimConfig,
        cert_chain_pem: &str,
        key_pem: &str,
    ) -> std::io::Result<Simulator> {
        let tls = server::Tls::new(cert_chain_pem, key_pem)?;
        Simulator::start_with(addr, cfg, Some(tls)).await
    }

    async fn start_with(
        addr: SocketAddr,
        cfg: SimConfig,
        tls: Option<server::Tls>,
    ) -> std::io::Result<Simulator> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(cfg));
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let app = AppState {
                shared: shared.clone(),
                sim: weak.clone(),
            };
            Inner {
                shared,
                addr,
                router: routes::router(app),
                tls,
                running: tokio::sync::Mutex::new(None),
            }
        });
        let running = server::Running::spawn(listener, inner.router.clone(), inner.tls.clone());
        *inner.running.lock().await = Some(running);
        tracing::info!(%addr, "loxilb-sim listening");
        Ok(Simulator { inner })
    }

    /// `http://IP:PORT` (`https://` when started with [`Simulator::start_tls`]) without
    /// trailing slash; the API base is `url() + API_BASE`.
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.inner.addr)
    }

    /// Replaces the token every API call but `/version` needs (`None`: no authentication),
    /// as loxilb does when its manual token changes. Calls already authenticated finish.
    pub fn set_auth_token(&self, token: Option<&str>) {
        *lock(&self.inner.shared.auth_token) = token.map(str::to_string);
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Snapshot of the stored rules, ordered by internal index.
    pub fn rules(&self) -> Vec<SimRule> {
        self.inner.shared.state().snapshot()
    }

    /// How many rules forward to `ip` (a visible endpoint). Holds the state lock far shorter
    /// than [`Simulator::rules`], which copies every rule: for observers polling often.
    pub fn count_rules_with_endpoint(&self, ip: IpAddr) -> usize {
        self.inner.shared.state().count_with_endpoint(&ip)
    }

    /// Simulated loxilb restart: all state back to boot defaults (rules,
    /// HA states, goBGP's configuration and the advertisement counts, request/fault
    /// counters). Latency and fault settings, which are simulator knobs rather than loxilb
    /// state, are kept, and so is whether BGP is on (a start option).
    pub fn restart(&self) {
        self.inner.shared.restart(self.inner.shared.cfg.max_rules);
        tracing::info!("simulated restart: state wiped");
    }

    /// [`restart`](Self::restart) into a smaller (or larger) rule table, as a loxilb
    /// restarted with another size: what it held before may no longer fit.
    pub fn restart_with_max_rules(&self, max_rules: usize) {
        self.inner.shared.restart(max_rules);
        tracing::info!(max_rules, "simulated restart: state wiped, new table size");
    }

    /// Closes the listener (new connections are refused) and closes open
    /// connections (in-flight requests are answered first, bounded wait).
    /// State is kept. No-op when already down.
    pub async fn go_down(&self) {
        let mut running = self.inner.running.lock().await;
        if let Some(r) = running.take() {
            r.stop().await;
            tracing::info!(addr = %self.inner.addr, "loxilb-sim down");
        }
    }

    /// Listens again on the same address with the state kept. No-op when up.
    pub async fn come_up(&self) -> std::io::Result<()> {
        let mut running = self.inner.running.lock().await;
        if running.is_none() {
            let listener = tokio::net::TcpListener::bind(self.inner.addr).await?;
            *running = Some(server::Running::spawn(
                listener,
                self.inner.router.clone(),
                self.inner.tls.clone(),
            ));
            tracing::info!(addr = %self.inner.addr, "loxilb-sim up");
        }
        Ok(())
    }

    /// Whether the listener is currently open.
    pub async fn is_up(&self) -> bool {
        self.inner.running.lock().await.is_some()
    }

    /// How long goBGP takes to answer after loxilb's start and after every [`restart`]
    /// (`SimConfig::gobgp_delay`); counted from the last (re)start.
    ///
    /// [`restart`]: Simulator::restart
    pub fn set_gobgp_delay(&self, d: Duration) {
        self.inner.shared.set_gobgp_delay(d);
    }

    /// Delay added before every API (not admin) call is handled.
    pub fn set_latency(&self, d: Duration) {
        self.inner.shared.set_latency(d);
    }

    /// Delay added, on top of [`Simulator::set_latency`], before every write (any API call
    /// but GET) is handled.
    pub fn set_write_latency(&self, d: Duration) {
        self.inner.shared.set_write_latency(d);
    }

    /// Time every rule write (create, update, delete under `/config/loadbalancer`) takes,
    /// on top of the other latencies, rule writes being handled one at a time as loxilb
    /// does (about 1 s each on a real loxilb 0.9.8): a replay of many rules then lasts. Other
    /// writes (HA states, BGP) are not held up. It adds to the cost profile
    /// ([`Simulator::set_profile`]), which models loxilb's own shape (creates and updates
    /// waiting for a worker's tick, deletes at once).
    pub fn set_rule_write_latency(&self, d: Duration) {
        self.inner.shared.set_rule_write_latency(d);
    }

    /// Switches the cost profile (docs/loxilb-api.md#costs-and-versions), e.g. to
    /// `Profile::Loxilb098 { tick }` to change the worker's tick. Writes already waiting keep
    /// the tick they started with. Also sets goBGP's start-up delay to the profile's
    /// ([`Profile::gobgp_delay`], counted from the last (re)start);
    /// [`Simulator::set_gobgp_delay`] afterwards changes it.
    pub fn set_profile(&self, p: Profile) {
        self.inner.shared.set_profile(p);
    }

    pub fn profile(&self) -> Profile {
        self.inner.shared.profile()
    }

    /// What the writes cost since start (not reset by a restart): writes completed, requests
    /// left unanswered, identical re-POSTs, updates that changed nothing, and rule listings
    /// made while a rule write was in flight.
    pub fn costs(&self) -> SimCosts {
        self.inner.shared.costs.snapshot()
    }

    /// `POST /config/loadbalancer` calls received since start (not reset by a restart).
    pub fn rule_posts(&self) -> u64 {
        self.inner.shared.rule_posts.load(Ordering::Relaxed)
    }

    /// API calls other than GET received since start (not reset by a restart), counted on
    /// arrival: what a test reads to tell whether anybody wrote.
    pub fn writes(&self) -> u64 {
        self.inner.shared.writes.load(Ordering::Relaxed)
    }

    /// API calls other than GET received since start from one caller ([`SimWrite::caller`]:
    /// loxi-ccm's identity, else the `User-Agent`), counted on arrival like
    /// [`Simulator::writes`]: which replica of the controller wrote.
    pub fn writes_from(&self, caller: &str) -> u64 {
        lock(&self.inner.shared.writes_by_caller)
            .get(caller)
            .copied()
            .unwrap_or(0)
    }

    /// [`Simulator::writes_from`] for every caller seen.
    pub fn writes_by_caller(&self) -> std::collections::BTreeMap<String, u64> {
        lock(&self.inner.shared.writes_by_caller).clone()
    }

    /// The writes answered since start or the last restart, in order, as `METHOD path`
    /// below the API base without the query, e.g. `POST /config/cistate`: the short form of
    /// [`Simulator::write_log`].
    pub fn writes_since_restart(&self) -> Vec<String> {
        self.write_log()
            .into_iter()
            .map(|w| {
                let path = w.path.split('?').next().unwrap_or_default();
                format!("{} {path}", w.method)
            })
            .collect()
    }

    /// Makes an endpoint address unreachable for loxilb's health probes (or reachable
    /// again): with `monitor` on, its endpoints turn `inactive` once the probes give up
    /// (probe interval × retries), and `active` again once it is reachable.
    pub fn set_endpoint_reachable(&self, ip: IpAddr, reachable: bool) {
        self.inner.shared.reachability().set(ip, reachable);
    }

    /// Sets or clears fault injection (resets the deterministic counter).
    pub fn set_fault(&self, f: Option<Fault>) {
        self.inner.shared.set_fault(f);
    }

    /// Turns loxilb's BGP mode on or off (as if loxilb had been started with or without
    /// `-b`; the BGP state itself is kept). Off, every `/config/bgp` call answers 403 and
    /// rules with `bgp` are not counted for advertisement.
    pub fn set_bgp_enabled(&self, on: bool) {
        self.inner.shared.set_bgp_enabled(on);
    }

    pub fn bgp_enabled(&self) -> bool {
        self.inner.shared.bgp_enabled()
    }

    /// Everything the simulated goBGP holds (global, peers, sets, policies, assignments)
    /// and the advertisement reference counts.
    pub fn bgp(&self) -> SimBgp {
        self.inner.shared.bgp_snapshot()
    }

    /// Advertisement references per address (only addresses with at least one), keyed by
    /// the address text loxilb was given (docs/loxilb-api.md#bgp).
    pub fn bgp_advertisements(&self) -> std::collections::BTreeMap<String, u32> {
        self.inner.shared.state().bgp.advertisements()
    }

    /// References held for one address (0: not advertised).
    pub fn bgp_advertisement_count(&self, ip: &str) -> u32 {
        self.bgp_advertisements().get(ip).copied().unwrap_or(0)
    }

    /// Sets the session state goBGP reports for a peer (one of [`SESSION_STATES`], not
    /// checked) and its `updowntime` text; without one, the time counts from now. `false`
    /// when no such peer is configured.
    pub fn set_bgp_peer_state(&self, ip: &str, state: &str, updowntime: Option<&str>) -> bool {
        self.inner
            .shared
            .state()
            .bgp
            .set_peer_state(ip, state, updowntime)
            .is_some()
    }

    /// The HA state of every cluster instance, as `GET /config/cistate/all` lists them:
    /// (instance, state, vip text), sorted by instance. What a test reads to see which
    /// loxilb is `MASTER` for an instance (docs/loxilb-api.md#ha-roles).
    pub fn cluster_states(&self) -> Vec<(String, String, String)> {
        self.inner.shared.state().ci_states()
    }

    /// The state of one cluster instance (`None`: loxilb does not know it).
    pub fn cluster_state(&self, instance: &str) -> Option<String> {
        self.cluster_states()
            .into_iter()
            .find(|(name, _, _)| name == instance)
            .map(|(_, state, _)| state)
    }

    /// Time since the simulator started: the clock of [`SimWrite::accepted`] and
    /// [`SimWrite::completed`].
    pub fn uptime(&self) -> Duration {
        self.inner.shared.born.elapsed()
    }

    /// The API writes (every call but GET) answered since start or the last restart, in
    /// order, with their status (the last [`WRITE_LOG_LIMIT`]).
    pub fn write_log(&self) -> Vec<SimWrite> {
        self.inner.shared.write_log()
    }

    /// The Kubernetes metadata bodies (`POST /config/k8smeta`) received since start or the
    /// last restart, oldest first (the last [`K8S_METADATA_LIMIT`]).
    pub fn k8s_metadata_posts(&self) -> Vec<SimK8sMeta> {
        self.inner.shared.state().k8s_metadata.all()
    }

    /// API calls received since start or the last restart (admin excluded).
    pub fn request_count(&self) -> u64 {
        self.inner.shared.requests.load(Ordering::Relaxed)
    }

    /// Stops serving for good.
    pub async fn shutdown(self) {
        self.go_down().await;
    }
}
