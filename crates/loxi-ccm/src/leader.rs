//! Leader election on a `coordination.k8s.io/v1` Lease, so only one replica programs loxilb.
//!
//! No election crate supports kube 5, and the algorithm is small, so it lives here. It follows
//! client-go's `leaderelection` package:
//!
//! * Every write is a compare-and-swap: CREATE (fails with 409 if the Lease exists) or REPLACE
//!   carrying the `resourceVersion` we read (fails with 409 if anyone wrote in between). Two
//!   contenders can therefore never both succeed in taking the same record.
//! * Expiry is judged on OUR clock only: a record held by someone else is considered expired
//!   once its `resourceVersion` has not changed for `leaseDurationSeconds` since we first saw
//!   it. The holder's `renewTime` is never compared with our clock, so clock skew between
//!   replicas cannot make a live lease look expired.
//! * The leader gives up (publishes `false`) once `renew_deadline` has passed since it *sent*
//!   its last successful write. Others can only take over `lease_duration` after they *saw*
//!   that write, which is later, and `renew_deadline < lease_duration`: the old leader has
//!   stopped acting before anyone else starts.
//!
//! The decision itself is the pure [`decide`]; [`LeaderElector::run`] does the I/O around it.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::pin;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// Where the Lease lives, who we are, and the timing (client-go's defaults: 15s / 10s / 2s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (see [`default_identity`]): two replicas with the same identity
    /// would both believe they hold the Lease.
    pub identity: String,
    /// How long others wait, after the record last changed, before taking the Lease over.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal. Must be shorter than
    /// `lease_duration` (enforced by [`LeaderElector::new`]).
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew, and before retrying an API error.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// `namespace/name` with the default timing.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// `$POD_NAME` (downward API), else the hostname, plus a random suffix: a restarted process
/// must not inherit its predecessor's leadership, so the suffix differs on every start.
pub fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "loxi-ccm".to_string());
    // RandomState is seeded randomly per process: enough uniqueness without a rand crate.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{base}_{:08x}", h.finish() as u32)
}

/// The part of a Lease record that [`decide`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `None` when the Lease is free (never held, or released).
    pub holder: Option<String>,
    /// The record's `leaseDurationSeconds` (or ours when it has none).
    pub lease_duration: Duration,
}

impl LeaseRecord {
    pub fn from_lease(lease: &Lease, default_duration: Duration) -> LeaseRecord {
        let spec = lease.spec.as_ref();
        LeaseRecord {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .filter(|&s| s > 0)
                .map(|s| Duration::from_secs(s as u64))
                .unwrap_or(default_duration),
        }
    }
}

/// What to do after reading the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No Lease: CREATE it.
    Create,
    /// Free, expired or (still) naming us while we are not leading: REPLACE it with us.
    Acquire,
    /// We lead and the record says so: REPLACE it with a new renewTime.
    Renew,
    /// Someone else holds a live Lease.
    Wait,
    /// We believed we led but the record says otherwise: stop acting as leader now.
    StepDown,
}

/// The election rule. `first_seen` is when we first read this version of the record (our
/// clock), `leading` whether we currently act as leader.
pub fn decide(
    record: Option<&LeaseRecord>,
    first_seen: Instant,
    now: Instant,
    identity: &str,
    leading: bool,
) -> Decision {
    let Some(record) = record else {
        // Deleted under us: whoever recreates it first wins, and that must go through CREATE.
        return if leading {
            Decision::StepDown
        } else {
            Decision::Create
        };
    };
    match record.holder.as_deref() {
        Some(holder) if holder == identity => {
            if leading {
                Decision::Renew
            } else {
                // Nobody else holds it (e.g. our last renewal landed after we had given up):
                // taking it back is safe because the REPLACE is conditional.
                Decision::Acquire
            }
        }
        // Released or taken by someone else while we thought we led.
        _ if leading => Decision::StepDown,
        // Released: the holder stepped down before clearing it, no need to wait.
        None => Decision::Acquire,
        Some(_) => {
            if now.saturating_duration_since(first_seen) >= record.lease_duration {
                Decision::Acquire
            } else {
                Decision::Wait
            }
        }
    }
}

/// Remembers when the current version of the record was first seen (our clock).
#[derive(Debug, Default)]
struct FirstSeen {
    current: Option<(String, Instant)>,
}

impl FirstSeen {
    /// `version` identifies the record (its resourceVersion, which every write changes).
    fn observe(&mut self, version: &str, now: Instant) -> Instant {
        match &self.current {
            Some((v, at)) if v == version => *at,
            _ => {
                self.current = Some((version.to_string(), now));
                now
            }
        }
    }

    fn forget(&mut self) {
        self.current = None;
    }
}

/// Whether this replica may write right now, judged at the moment of asking on the local
/// monotonic clock against the renew deadline of its last successful Lease write.
///
/// The published flag ([`LeaderElector::subscribe`]) is not enough before a write: a process
/// that was frozen (SIGSTOP, a stalled VM) past its deadline and then resumed runs whatever
/// task the scheduler picks first, and a reconcile that was waiting on a loxilb answer may
/// send its next call before the elector's task has stepped down. Asking this guard right
/// before each call closes that window: the clock has moved on even if no task has.
#[derive(Clone, Debug)]
pub struct WriteLease {
    until: Option<std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>>,
}

impl WriteLease {
    /// Without leader election: this replica always writes.
    pub fn always() -> WriteLease {
        WriteLease { until: None }
    }

    fn elected() -> WriteLease {
        WriteLease {
            until: Some(Default::default()),
        }
    }

    /// True while the renew deadline of the last successful Lease write lies ahead.
    pub fn holds(&self) -> bool {
        let Some(until) = &self.until else {
            return true;
        };
        until
            .lock()
            .map(|u| u.is_some_and(|u| std::time::Instant::now() < u))
            .unwrap_or(false)
    }

    fn set(&self, until: Option<std::time::Instant>) {
        if let Some(cell) = &self.until
            && let Ok(mut u) = cell.lock()
        {
            *u = until;
        }
    }
}

/// What every writer of the controller asks: whether this replica may act now. Ready means
/// it leads, its stores are synced and its address index is rebuilt (nothing is allocated or
/// programmed before: `docs/architecture.md#invariants`); the write Lease is
/// asked again right before each write.
pub struct Gate {
    ready_tx: watch::Sender<bool>,
    ready_rx: watch::Receiver<bool>,
    leader_rx: watch::Receiver<bool>,
    write_lease: WriteLease,
}

impl Gate {
    pub fn new(leader_rx: watch::Receiver<bool>, write_lease: WriteLease) -> Gate {
        let (ready_tx, ready_rx) = watch::channel(false);
        Gate {
            ready_tx,
            ready_rx,
            leader_rx,
            write_lease,
        }
    }

    /// Waits until this replica is ready.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready_rx.clone();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_ready(&self) -> bool {
        *self.ready_rx.borrow()
    }

    pub fn set_ready(&self) {
        let _ = self.ready_tx.send(true);
    }

    /// Whether the Lease is held at this very moment ([`WriteLease::holds`]).
    pub fn holds_lease(&self) -> bool {
        self.write_lease.holds()
    }

    pub fn write_lease(&self) -> &WriteLease {
        &self.write_lease
    }

    /// True while this replica holds the leader Lease (as the elector last decided).
    pub fn leader(&self) -> watch::Receiver<bool> {
        self.leader_rx.clone()
    }
}

/// Runs the election for one replica; see the module docs.
pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    tx: watch::Sender<bool>,
    lease: WriteLease,
}

impl LeaderElector {
    /// A `renew_deadline` not shorter than `lease_duration` would let two replicas lead at
    /// once; it is lowered to two thirds of `lease_duration` (with a warning) rather than
    /// trusted. A zero `retry_period` would spin; it becomes 100 ms.
    pub fn new(client: kube::Client, mut cfg: LeaseConfig) -> LeaderElector {
        if cfg.renew_deadline >= cfg.lease_duration {
            let fixed = cfg.lease_duration * 2 / 3;
            warn!(
                renew_deadline = ?cfg.renew_deadline,
                lease_duration = ?cfg.lease_duration,
                using = ?fixed,
                "leader election: renew deadline must be shorter than the lease duration"
            );
            cfg.renew_deadline = fixed;
        }
        if cfg.retry_period.is_zero() {
            cfg.retry_period = Duration::from_millis(100);
        }
        LeaderElector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            tx: watch::Sender::new(false),
            lease: WriteLease::elected(),
        }
    }

    /// The guard every write asks right before it is sent ([`WriteLease`]).
    pub fn write_lease(&self) -> WriteLease {
        self.lease.clone()
    }

    /// `true` while this replica leads. It turns `false` before leadership can pass to anyone
    /// else, so work guarded by it never overlaps another replica's.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Campaigns and renews until `shutdown` resolves; then, if it may hold the Lease, stops
    /// leading (publishes `false`) and releases the Lease so a standby takes over at once.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = pin!(shutdown);
        let mut st = State {
            api: self.api,
            cfg: self.cfg,
            tx: self.tx,
            lease: self.lease,
            seen: FirstSeen::default(),
            leading_since_write: None,
            may_hold: false,
        };
        info!(
            lease = %format!("{}/{}", st.cfg.namespace, st.cfg.name),
            identity = %st.cfg.identity,
            "leader election started"
        );
        loop {
            // One attempt, abandoned if we are shutting down or our renew deadline passes
            // while it hangs.
            let deadline = st.renew_deadline();
            let event = tokio::select! {
                biased;
                () = &mut shutdown => Event::Shutdown,
                () = sleep_until(deadline) => Event::Deadline,
                () = st.attempt() => Event::Done,
            };
            match event {
                Event::Shutdown => break,
                Event::Deadline => st.step_down("renew deadline passed without a renewal"),
                Event::Done => {}
            }
            // The pause before the next attempt; the deadline is re-read since the attempt
            // may just have renewed.
            let deadline = st.renew_deadline();
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = sleep_until(deadline) => {
                    st.step_down("renew deadline passed without a renewal")
                }
                () = tokio::time::sleep(st.cfg.retry_period) => {}
            }
        }
        st.release().await;
    }
}

enum Event {
    Shutdown,
    Deadline,
    Done,
}

/// Sleeps until `deadline`, forever if there is none.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

struct State {
    api: Api<Lease>,
    cfg: LeaseConfig,
    tx: watch::Sender<bool>,
    lease: WriteLease,
    seen: FirstSeen,
    /// While leading: when the last successful write was *sent* (the server may have applied
    /// it any time after that, so the deadline counts from there).
    leading_since_write: Option<Instant>,
    /// The Lease may name us (we lead, or a write naming us may have landed unnoticed), so
    /// shutdown must try to release it.
    may_hold: bool,
}

impl State {
    fn renew_deadline(&self) -> Option<Instant> {
        self.leading_since_write
            .map(|sent| sent + self.cfg.renew_deadline)
    }

    fn leading(&self) -> bool {
        self.leading_since_write.is_some()
    }

    fn step_down(&mut self, reason: &str) {
        // Publish first: whatever the leader does must stop before anyone can take over.
        self.lease.set(None);
        self.tx.send_replace(false);
        if self.leading_since_write.take().is_some() {
            info!(identity = %self.cfg.identity, reason, "lost leadership");
        }
    }

    fn lead(&mut self, sent: Instant) {
        self.lease
            .set(Some((sent + self.cfg.renew_deadline).into_std()));
        if self.leading_since_write.replace(sent).is_none() {
            info!(identity = %self.cfg.identity, "became leader");
        }
        self.tx.send_replace(true);
    }

    /// Bounds a request when not leading (when leading, the renew deadline bounds it).
    async fn call<T>(
        &self,
        fut: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>, tokio::time::error::Elapsed> {
        tokio::time::timeout(self.cfg.renew_deadline, fut).await
    }

    /// Reads the Lease and acts on [`decide`]. Errors are logged; the caller retries after
    /// the retry period.
    async fn attempt(&mut self) {
        let lease = match self.call(self.api.get_opt(&self.cfg.name)).await {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                warn!(error = %e, "leader election: reading the lease failed");
                return;
            }
            Err(_) => {
                warn!("leader election: reading the lease timed out");
                return;
            }
        };
        let now = Instant::now();
        let record = lease
            .as_ref()
            .map(|l| LeaseRecord::from_lease(l, self.cfg.lease_duration));
        let first_seen = match &lease {
            Some(l) => {
                let version = l.metadata.resource_version.as_deref().unwrap_or_default();
                self.seen.observe(version, now)
            }
            None => {
                self.seen.forget();
                now
            }
        };
        let holder = record.as_ref().and_then(|r| r.holder.clone());
        if holder.as_deref() != Some(self.cfg.identity.as_str()) && !self.leading() {
            // Read confirms the Lease does not name us (and we have no write in flight).
            self.may_hold = false;
        }
        match decide(
            record.as_ref(),
            first_seen,
            now,
            &self.cfg.identity,
            self.leading(),
        ) {
            Decision::Wait => {
                debug!(
                    holder = holder.as_deref().unwrap_or_default(),
                    "lease held by another replica"
                );
            }
            Decision::StepDown => {
                let reason = match &holder {
                    Some(h) => format!("lease now held by {h}"),
                    None if lease.is_some() => "lease was released".to_string(),
                    None => "lease was deleted".to_string(),
                };
                self.step_down(&reason);
            }
            Decision::Create => self.create().await,
            Decision::Acquire => {
                if let Some(lease) = lease {
                    self.write(lease, true).await;
                }
            }
            Decision::Renew => {
                if let Some(lease) = lease {
                    self.write(lease, false).await;
                }
            }
        }
    }

    fn duration_seconds(&self) -> i32 {
        // Rounded up: others wait at least as long as we promise to renew within.
        i32::try_from(self.cfg.lease_duration.as_millis().div_ceil(1000))
            .unwrap_or(i32::MAX)
            .max(1)
    }

    async fn create(&mut self) {
        let now = MicroTime(Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.cfg.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        let sent = Instant::now();
        self.may_hold = true;
        match self
            .call(self.api.create(&PostParams::default(), &lease))
            .await
        {
            Ok(Ok(_)) => self.lead(sent),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                self.may_hold = false;
                debug!("lease created by another replica first");
            }
            Ok(Err(e)) => warn!(error = %e, "leader election: creating the lease failed"),
            Err(_) => warn!("leader election: creating the lease timed out"),
        }
    }

    /// REPLACE conditioned on the resourceVersion we read (it is in `lease.metadata`).
    async fn write(&mut self, mut lease: Lease, acquiring: bool) {
        let now = MicroTime(Timestamp::now());
        let identity = self.cfg.identity.clone();
        let duration = self.duration_seconds();
        let spec = lease.spec.get_or_insert_with(Default::default);
        if acquiring {
            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(identity);
        spec.lease_duration_seconds = Some(duration);
        spec.renew_time = Some(now);
        let sent = Instant::now();
        self.may_hold = true;
        match self
            .call(
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease),
            )
            .await
        {
            Ok(Ok(_)) => self.lead(sent),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                if self.leading() {
                    self.step_down("lease changed by another writer (conflict on renew)");
                } else {
                    debug!("lease taken by another replica first");
                }
            }
            // Outcome unknown: if leading, the renew deadline decides; else retry later.
            Ok(Err(e)) => warn!(error = %e, acquiring, "leader election: writing the lease failed"),
            Err(_) => warn!(acquiring, "leader election: writing the lease timed out"),
        }
    }

    /// Stops leading, then clears the holder (conditionally, only if it is still us) so a
    /// standby need not wait for the Lease to expire.
    async fn release(&mut self) {
        self.step_down("shutting down");
        if !self.may_hold {
            return;
        }
        let result = self
            .call(async {
                let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
                    return Ok(false);
                };
                let spec = lease.spec.get_or_insert_with(Default::default);
                if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
                    return Ok(false);
                }
                let now = MicroTime(Timestamp::now());
                // As client-go: no holder, and a 1s duration for readers that ignore holders.
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                spec.acquire_time = Some(now.clone());
                spec.renew_time = Some(now);
                self.api
                    .replace(&self.cfg.name, &PostParams::default(), &lease)
                    .await?;
                Ok(true)
            })
            .await;
        match result {
            Ok(Ok(true)) => info!(identity = %self.cfg.identity, "released lease"),
            Ok(Ok(false)) => debug!("lease not ours at shutdown: nothing to release"),
            // A conflict means someone else wrote it: it is not ours to release any more.
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                debug!("lease changed while releasing: not ours any more")
            }
            Ok(Err(e)) => warn!(error = %e, "leader election: releasing the lease failed"),
            Err(_) => warn!("leader election: releasing the lease timed out"),
        }
        self.may_hold = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const LEASE: Duration = Duration::from_secs(15);

    fn held_by(h: &str) -> LeaseRecord {
        LeaseRecord {
            holder: Some(h.to_string()),
            lease_duration: LEASE,
        }
    }

    fn released() -> LeaseRecord {
        LeaseRecord {
            holder: None,
            lease_duration: Duration::from_secs(1),
        }
    }

    #[test]
    fn absent_lease_is_created_unless_we_led() {
        let t = Instant::now();
        assert_eq!(decide(None, t, t, ME, false), Decision::Create);
        assert_eq!(decide(None, t, t, ME, true), Decision::StepDown);
    }

    #[test]
    fn live_lease_of_another_is_left_alone_until_unchanged_for_its_duration() {
        let seen = Instant::now();
        let r = held_by("other");
        assert_eq!(decide(Some(&r), seen, seen, ME, false), Decision::Wait);
        let almost = seen + LEASE - Duration::from_millis(1);
        assert_eq!(decide(Some(&r), seen, almost, ME, false), Decision::Wait);
        assert_eq!(
            decide(Some(&r), seen, seen + LEASE, ME, false),
            Decision::Acquire
        );
    }

    #[test]
    fn expiry_uses_the_records_duration() {
        let seen = Instant::now();
        let r = LeaseRecord {
            holder: Some("other".into()),
            lease_duration: Duration::from_secs(2),
        };
        let later = seen + Duration::from_secs(2);
        assert_eq!(decide(Some(&r), seen, later, ME, false), Decision::Acquire);
    }

    #[test]
    fn released_lease_is_taken_at_once() {
        let t = Instant::now();
        assert_eq!(
            decide(Some(&released()), t, t, ME, false),
            Decision::Acquire
        );
    }

    #[test]
    fn leader_renews_its_own_lease() {
        let t = Instant::now();
        // Even long after first seeing it: our own record never "expires" for us.
        let later = t + LEASE * 10;
        assert_eq!(
            decide(Some(&held_by(ME)), t, later, ME, true),
            Decision::Renew
        );
    }

    #[test]
    fn leader_steps_down_when_the_record_names_someone_else_or_nobody() {
        let t = Instant::now();
        assert_eq!(
            decide(Some(&held_by("other")), t, t, ME, true),
            Decision::StepDown
        );
        assert_eq!(
            decide(Some(&released()), t, t, ME, true),
            Decision::StepDown
        );
    }

    #[test]
    fn record_naming_us_while_not_leading_is_retaken() {
        let t = Instant::now();
        assert_eq!(
            decide(Some(&held_by(ME)), t, t, ME, false),
            Decision::Acquire
        );
    }

    #[test]
    fn first_seen_resets_only_when_the_version_changes() {
        let t0 = Instant::now();
        let mut seen = FirstSeen::default();
        assert_eq!(seen.observe("1", t0), t0);
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(
            seen.observe("1", t1),
            t0,
            "same version: keep the first sighting"
        );
        assert_eq!(seen.observe("2", t1), t1, "renewed: the clock restarts");
        seen.forget();
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(seen.observe("2", t2), t2);
    }

    #[test]
    fn record_reads_holder_and_duration() {
        let mut lease = Lease::default();
        assert_eq!(
            LeaseRecord::from_lease(&lease, LEASE),
            LeaseRecord {
                holder: None,
                lease_duration: LEASE
            }
        );
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(3),
            ..Default::default()
        });
        let r = LeaseRecord::from_lease(&lease, LEASE);
        assert_eq!(r.holder, None, "an empty holder means released");
        assert_eq!(r.lease_duration, Duration::from_secs(3));
    }

    #[test]
    fn identity_has_a_random_suffix() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        assert!(a.contains('_'));
    }
}
