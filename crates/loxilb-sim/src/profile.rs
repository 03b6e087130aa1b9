//! Cost profiles: how long the simulated loxilb takes over rule writes
//! (docs/loxilb-api.md#costs-and-versions).
//!
//! The default, [`Profile::Instant`], answers every call at once, for fast tests. With
//! [`Profile::Loxilb098`] rule writes cost what they cost on loxilb 0.9.8 since its change of
//! 2026-03-04: one lock for rule POSTs, each create or update holding it until the next tick
//! of a datapath worker, deletes at once, a write timeout after which a request is applied
//! but not answered, and goBGP answering only some ticks after the start. Every duration
//! scales with the tick, so that tests can run the same shape faster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How the simulated loxilb spends time on rule writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// Every call is answered as soon as it is handled (loxilbs before 2026-03-04 answer rule
    /// writes in milliseconds). The default.
    #[default]
    Instant,
    /// loxilb 0.9.8 since its change of 2026-03-04: rule POSTs take one lock; a create or an
    /// update holds it until the next tick of the datapath worker (every `tick`, 1 s on
    /// loxilb); a POST that changes nothing (409) answers once it has the lock; deletes and
    /// GETs take no lock; a request older than [`Profile::WRITE_TIMEOUT_TICKS`] ticks is
    /// applied but not answered; goBGP answers [`Profile::GOBGP_START_TICKS`] ticks after
    /// the start.
    Loxilb098 {
        /// The worker's period: 1 s on loxilb ([`Profile::LOXILB_098_TICK`]); shorter in
        /// tests, everything else in the profile scaling with it. Never zero.
        tick: Duration,
    },
}

impl Profile {
    /// The name of [`Profile::Instant`] (`--profile`, `PUT /admin/profile`).
    pub const INSTANT: &'static str = "instant";
    /// The name of [`Profile::Loxilb098`].
    pub const LOXILB_098: &'static str = "loxilb-0.9.8";
    /// Every name [`Profile::named`] knows.
    pub const NAMES: [&'static str; 2] = [Profile::INSTANT, Profile::LOXILB_098];
    /// loxilb's datapath worker wakes once a second.
    pub const LOXILB_098_TICK: Duration = Duration::from_secs(1);
    /// loxilb's REST write timeout (60 s) in ticks: a request waiting longer is applied but
    /// never answered. Scaled with the tick, so that a test with a short tick reaches it.
    pub const WRITE_TIMEOUT_TICKS: u32 = 60;
    /// goBGP answers about 9 s after loxilb's API (docs/loxilb-api.md#bgp), in ticks.
    pub const GOBGP_START_TICKS: u32 = 9;

    /// loxilb 0.9.8 with its real tick (1 s).
    pub fn loxilb_098() -> Profile {
        Profile::Loxilb098 {
            tick: Profile::LOXILB_098_TICK,
        }
    }

    /// The profile called `name` (one of [`Profile::NAMES`]); `tick` is used by the profiles
    /// that have one. `None` for an unknown name or a zero tick.
    pub fn named(name: &str, tick: Duration) -> Option<Profile> {
        match name {
            Profile::INSTANT => Some(Profile::Instant),
            Profile::LOXILB_098 if !tick.is_zero() => Some(Profile::Loxilb098 { tick }),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Profile::Instant => Profile::INSTANT,
            Profile::Loxilb098 { .. } => Profile::LOXILB_098,
        }
    }

    /// The datapath worker's period; `None` without a worker (instant).
    pub fn tick(&self) -> Option<Duration> {
        match self {
            Profile::Instant => None,
            Profile::Loxilb098 { tick } => Some(*tick),
        }
    }

    /// How long a request may wait before it is applied but no longer answered.
    pub fn write_timeout(&self) -> Option<Duration> {
        self.tick().map(|t| t * Profile::WRITE_TIMEOUT_TICKS)
    }

    /// How long after a (re)start goBGP answers (zero: at once).
    pub fn gobgp_delay(&self) -> Duration {
        self.tick()
            .map_or(Duration::ZERO, |t| t * Profile::GOBGP_START_TICKS)
    }
}

/// Marks the answer to a rule POST that changed a rule: under a profile with a worker it
/// waits for the worker's next tick before it is sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AwaitsWorker;

/// The worker's next tick after `now`, ticks counted from `epoch`: its number and instant.
/// A write that gets the lock on a tick waits for the following one, as loxilb's does.
pub(crate) fn next_tick(epoch: Instant, tick: Duration, now: Instant) -> (u64, Instant) {
    let period = tick.as_nanos().max(1);
    let n = now.saturating_duration_since(epoch).as_nanos() / period + 1;
    let at =
        u64::try_from(n * period).map_or(now + tick, |nanos| epoch + Duration::from_nanos(nanos));
    (u64::try_from(n).unwrap_or(u64::MAX), at)
}

/// What writes cost the simulated loxilb, counted since start (not reset by restarts): what
/// a benchmark reads to compute throughput and wasted work ([`crate::Simulator::costs`],
/// `GET /admin/costs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimCosts {
    /// API writes (every call but GET) handled to the end, answered or not.
    pub writes_completed: u64,
    /// Requests applied but not answered: they waited longer than the profile's write
    /// timeout ([`Profile::write_timeout`]).
    pub unanswered: u64,
    /// Rule POSTs answered 409 `lbrule-exists`: identical re-POSTs (they still waited for
    /// the lock).
    pub identical_reposts: u64,
    /// Rule POSTs answered 200 as an update that changed nothing loxilb holds, e.g. the
    /// re-POST of a rule that lost an endpoint (docs/loxilb-api.md#updates): a full update
    /// (a tick under a profile with a worker) for nothing.
    pub noop_updates: u64,
    /// `GET /config/loadbalancer/all` calls handled while a rule write was in flight: on
    /// loxilb 0.9.8 they can crash it (docs/loxilb-api.md#costs-and-versions), so a test
    /// can assert a controller never does it.
    pub listings_during_writes: u64,
}

/// The live counters behind [`SimCosts`], plus the rule writes in flight.
#[derive(Debug, Default)]
pub(crate) struct CostCounters {
    writes_completed: AtomicU64,
    unanswered: AtomicU64,
    identical_reposts: AtomicU64,
    noop_updates: AtomicU64,
    listings_during_writes: AtomicU64,
    rule_writes_in_flight: AtomicU64,
}

impl CostCounters {
    pub(crate) fn snapshot(&self) -> SimCosts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SimCosts {
            writes_completed: get(&self.writes_completed),
            unanswered: get(&self.unanswered),
            identical_reposts: get(&self.identical_reposts),
            noop_updates: get(&self.noop_updates),
            listings_during_writes: get(&self.listings_during_writes),
        }
    }

    pub(crate) fn write_completed(&self, answered: bool) {
        self.writes_completed.fetch_add(1, Ordering::Relaxed);
        if !answered {
            self.unanswered.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn identical_repost(&self) {
        self.identical_reposts.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn noop_update(&self) {
        self.noop_updates.fetch_add(1, Ordering::Relaxed);
    }

    /// A rule listing is being handled: counted when a rule write is in flight.
    pub(crate) fn listing(&self) {
        if self.rule_writes_in_flight.load(Ordering::Relaxed) > 0 {
            self.listings_during_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A rule write is in flight until the guard is dropped.
    pub(crate) fn rule_write(&self) -> InFlight<'_> {
        self.rule_writes_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(&self.rule_writes_in_flight)
    }
}

/// A rule write in flight ([`CostCounters::rule_write`]).
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_tick_is_strictly_after_now() {
        let epoch = Instant::now();
        let tick = Duration::from_millis(100);
        assert_eq!(next_tick(epoch, tick, epoch), (1, epoch + tick));
        let (n, at) = next_tick(epoch, tick, epoch + Duration::from_millis(250));
        assert_eq!((n, at), (3, epoch + Duration::from_millis(300)));
        // On a tick: the following one.
        let (n, _) = next_tick(epoch, tick, epoch + Duration::from_millis(300));
        assert_eq!(n, 4);
    }

    #[test]
    fn names_and_scaling() {
        let p = Profile::named("loxilb-0.9.8", Duration::from_millis(100)).unwrap();
        assert_eq!(p.name(), Profile::LOXILB_098);
        assert_eq!(p.write_timeout(), Some(Duration::from_secs(6)));
        assert_eq!(p.gobgp_delay(), Duration::from_millis(900));
        assert_eq!(
            Profile::loxilb_098().write_timeout(),
            Some(Duration::from_secs(60))
        );
        assert_eq!(Profile::named("loxilb-0.9.8", Duration::ZERO), None);
        assert_eq!(
            Profile::named("instant", Duration::ZERO),
            Some(Profile::Instant)
        );
        assert_eq!(Profile::Instant.gobgp_delay(), Duration::ZERO);
        assert_eq!(Profile::named("0.9.7", Duration::from_secs(1)), None);
    }
}
