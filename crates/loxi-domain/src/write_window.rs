//! The write window of one loxilb: how many rule writes may be in flight to it at once, and
//! which waiting write goes next.
//!
//! A loxilb 0.9.8 applies rule creates and updates one at a time, each taking up to a second
//! (docs/loxilb-api.md#what-writes-cost): writes sent in parallel only queue inside loxilb,
//! where a write's latency is the number of writes ahead of it. With more in flight than the
//! call timeout covers, writes time out although loxilb applies them later. The window
//! therefore keeps `in flight × time per write` below a budget (a fraction of the call
//! timeout), learning the time per write from the answers; a fast loxilb (or the simulator's
//! instant profile) opens it up to the configured maximum.
//!
//! Waiting writes go out by urgency, then in arrival order: what restores service first
//! (docs/architecture.md#write-order). A write may join an earlier waiting one of the same
//! urgency (the caller passes the same Service's): it then goes right after it, so that the
//! rules of one Service land together rather than between other Services' writes. A waiting write for a rule that a newer write for the
//! same rule has superseded is never sent.
//!
//! Pure: the caller passes the times; no clock, no I/O.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::RuleKey;

/// Why a write is sent, most urgent first (the order waiting writes go out in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Urgency {
    /// Restores service: an endpoint whose Node or Pod is gone or not ready taken out, a new
    /// Service's first rules, a deleted Service's rules taken away.
    Restore,
    /// Any other change of a Service's rules (endpoints added, settings changed).
    Change,
    /// A restarted or new loxilb's replay, a drift repair.
    Replay,
    /// Rules nobody wants any more (orphans).
    Cleanup,
}

impl Urgency {
    /// The label of the metric series.
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::Restore => "restore",
            Urgency::Change => "change",
            Urgency::Replay => "replay",
            Urgency::Cleanup => "cleanup",
        }
    }
}

/// What kind of write: loxilb's costs differ (a DELETE does not wait for its datapath).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// POST of a rule: a create or an in-place update.
    Post,
    Delete,
}

/// The window's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSettings {
    /// Never more in flight than this.
    pub max: usize,
    /// `in flight × time per write` stays below this (a fraction of the call timeout).
    pub budget: Duration,
}

impl WindowSettings {
    /// A window for a call timeout: the writes in flight may take half of it.
    pub fn for_timeout(max: usize, timeout: Duration) -> WindowSettings {
        WindowSettings {
            max: max.max(1),
            budget: timeout / 2,
        }
    }
}

/// A waiting write's place in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket {
    urgency: Urgency,
    /// The arrival of the first write of its group (its own, unless it joined one).
    group: u64,
    seq: u64,
}

impl Ticket {
    pub fn urgency(&self) -> Urgency {
        self.urgency
    }
}

#[derive(Debug, Clone)]
struct Waiting {
    key: Option<RuleKey>,
    since: Instant,
}

/// What the window decided for a waiting write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Send it now.
    Send(Ticket),
    /// A newer write for the same rule came after it: drop it, unsent.
    Superseded(Ticket),
}

/// Where a waiting write stands: for a Service that says it is queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Writes that go before it: in flight, and waiting ahead of it.
    pub ahead: usize,
    /// When it could be sent at the time per write learnt so far (`None`: nothing learnt).
    pub estimate: Option<Duration>,
}

/// The window of one loxilb (module docs).
#[derive(Debug)]
pub struct WriteWindow {
    settings: WindowSettings,
    in_flight: usize,
    /// The limit in force: grows by one per answered write up to what the budget allows,
    /// shrinks at once when writes get slower.
    limit: usize,
    waiting: BTreeMap<Ticket, Waiting>,
    /// The newest waiting write of each rule.
    newest: HashMap<RuleKey, Ticket>,
    /// Waiting writes a newer one superseded: dropped at the next decision.
    stale: Vec<Ticket>,
    next_seq: u64,
    /// What one POST costs at loxilb (its own time, not the queue's), smoothed.
    per_post: Option<Duration>,
    per_delete: Option<Duration>,
    sent: u64,
    superseded: u64,
    /// While a listing of loxilb's rules runs, nothing is sent (superseded writes are still
    /// dropped): a listing during writes can crash loxilb 0.9.8.
    paused: bool,
}

/// Weight of a new sample in the smoothed time per write.
const SMOOTHING: f64 = 0.3;

impl WriteWindow {
    pub fn new(settings: WindowSettings) -> WriteWindow {
        WriteWindow {
            settings,
            in_flight: 0,
            // One at a time until loxilb's first answer says what a write costs.
            limit: 1,
            waiting: BTreeMap::new(),
            newest: HashMap::new(),
            stale: Vec::new(),
            next_seq: 0,
            per_post: None,
            per_delete: None,
            sent: 0,
            superseded: 0,
            paused: false,
        }
    }

    /// Holds every write back (`true`) while a listing runs, or lets them go again.
    pub fn pause(&mut self, paused: bool) {
        self.paused = paused;
    }

    pub fn settings(&self) -> WindowSettings {
        self.settings
    }

    /// New bounds (the configuration changed); the limit follows at the next answer.
    pub fn set_settings(&mut self, settings: WindowSettings) {
        self.settings = settings;
        self.limit = self.limit.min(settings.max.max(1));
    }

    /// A write to send (`key`: the rule it writes, when it writes one): its ticket. It
    /// supersedes the waiting write of the same rule, if any.
    pub fn enqueue(&mut self, key: Option<RuleKey>, urgency: Urgency, now: Instant) -> Ticket {
        self.enqueue_joining(key, urgency, now, None)
    }

    /// [`WriteWindow::enqueue`], going right after the waiting write `join` (and the writes
    /// that joined it) when that one has the same urgency and still waits.
    pub fn enqueue_joining(
        &mut self,
        key: Option<RuleKey>,
        urgency: Urgency,
        now: Instant,
        join: Option<Ticket>,
    ) -> Ticket {
        let group = join
            .filter(|j| j.urgency == urgency && self.waiting.contains_key(j))
            .map_or(self.next_seq, |j| j.group);
        let ticket = Ticket {
            urgency,
            group,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        if let Some(k) = key
            && let Some(before) = self.newest.insert(k, ticket)
        {
            self.stale.push(before);
        }
        self.waiting.insert(ticket, Waiting { key, since: now });
        ticket
    }

    /// A waiting write given up by its sender (it no longer wants it sent).
    pub fn withdraw(&mut self, ticket: Ticket) {
        if let Some(w) = self.waiting.remove(&ticket) {
            self.forget_newest(w.key, ticket);
        }
    }

    /// A waiting write no longer wanted (its Service is being deleted): dropped unsent at
    /// the next decision, as a superseded one.
    pub fn drop_waiting(&mut self, ticket: Ticket) {
        let Some(key) = self.waiting.get(&ticket).map(|w| w.key) else {
            return;
        };
        self.forget_newest(key, ticket);
        self.stale.push(ticket);
    }

    fn forget_newest(&mut self, key: Option<RuleKey>, ticket: Ticket) {
        if let Some(k) = key
            && self.newest.get(&k) == Some(&ticket)
        {
            self.newest.remove(&k);
        }
    }

    /// The next decision, when there is one to make now: a superseded write is always
    /// dropped at once; a write is sent while the window has room.
    pub fn decide(&mut self) -> Option<Grant> {
        // Superseded writes go first, whatever room there is: they cost nothing.
        while let Some(t) = self.stale.pop() {
            if self.waiting.remove(&t).is_some() {
                self.superseded += 1;
                return Some(Grant::Superseded(t));
            }
        }
        if self.paused || self.in_flight >= self.limit {
            return None;
        }
        let (&ticket, _) = self.waiting.iter().next()?;
        let w = self.waiting.remove(&ticket).expect("just seen");
        self.forget_newest(w.key, ticket);
        self.in_flight += 1;
        self.sent += 1;
        Some(Grant::Send(ticket))
    }

    /// A granted write that its sender no longer sends (cancelled before the call).
    pub fn unsent(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A sent write ended after `took`, with `in_flight_at_send` writes in flight when it was
    /// sent (itself included); `timed_out`: no answer within the call timeout (what it cost
    /// is at least `took`).
    pub fn answered(&mut self, kind: WriteKind, took: Duration, in_flight_at_send: usize) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // A serial loxilb answers the n-th of n writes sent together after n writes' time.
        let own = took / u32::try_from(in_flight_at_send.max(1)).unwrap_or(u32::MAX);
        let slot = match kind {
            WriteKind::Post => &mut self.per_post,
            WriteKind::Delete => &mut self.per_delete,
        };
        *slot = Some(match *slot {
            None => own,
            Some(before) => before.mul_f64(1.0 - SMOOTHING) + own.mul_f64(SMOOTHING),
        });
        let allowed = self.allowed();
        self.limit = if allowed < self.limit {
            allowed
        } else {
            (self.limit + 1).min(allowed)
        };
    }

    /// How many writes the budget allows in flight at the time per write learnt so far.
    fn allowed(&self) -> usize {
        let Some(per_write) = self.per_write() else {
            return 1;
        };
        if per_write.is_zero() {
            return self.settings.max;
        }
        let n = self.settings.budget.as_nanos() / per_write.as_nanos();
        usize::try_from(n)
            .unwrap_or(usize::MAX)
            .clamp(1, self.settings.max)
    }

    /// The time one write takes at loxilb: a POST's when known (the costly kind).
    pub fn per_write(&self) -> Option<Duration> {
        self.per_post.or(self.per_delete)
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Writes waiting to be sent.
    pub fn depth(&self) -> usize {
        self.waiting.len()
    }

    /// How long the oldest waiting write has waited.
    pub fn oldest(&self, now: Instant) -> Option<Duration> {
        self.waiting
            .values()
            .map(|w| now.saturating_duration_since(w.since))
            .max()
    }

    /// Writes sent so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// A write not even queued because a newer one of its rules is already decided on (a
    /// Service's own pass took its part of a replay over): counted as superseded.
    pub fn count_superseded(&mut self) {
        self.superseded += 1;
    }

    /// Waiting writes dropped because a newer one for the same rule came.
    pub fn superseded(&self) -> u64 {
        self.superseded
    }

    /// Where the waiting write `ticket` stands; `None` once it left the queue.
    pub fn position(&self, ticket: Ticket) -> Option<Position> {
        self.waiting.get(&ticket)?;
        let ahead = self.in_flight + self.waiting.range(..ticket).count();
        let estimate = self.per_write().map(|p| {
            let rounds = u32::try_from(ahead + 1).unwrap_or(u32::MAX);
            p.saturating_mul(rounds)
        });
        Some(Position { ahead, estimate })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Protocol;

    #[test]
    fn a_joining_write_goes_right_after_the_one_it_joins() {
        let now = Instant::now();
        let mut w = WriteWindow::new(WindowSettings::for_timeout(1, Duration::from_secs(5)));
        let busy = w.enqueue(Some(key(9)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Send(busy)));
        let a1 = w.enqueue(Some(key(1)), Urgency::Change, now);
        let b = w.enqueue(Some(key(2)), Urgency::Change, now);
        let a2 = w.enqueue_joining(Some(key(3)), Urgency::Change, now, Some(a1));
        // Another urgency does not join: it keeps its own place.
        let a3 = w.enqueue_joining(Some(key(4)), Urgency::Restore, now, Some(a1));
        let mut order = Vec::new();
        for _ in 0..4 {
            w.answered(WriteKind::Post, Duration::from_millis(10), 1);
            match w.decide() {
                Some(Grant::Send(t)) => order.push(t),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(order, [a3, a1, a2, b]);
    }

    #[test]
    fn a_pause_holds_every_write_back_but_still_drops_superseded_ones() {
        let now = Instant::now();
        let mut w = WriteWindow::new(WindowSettings::for_timeout(4, Duration::from_secs(5)));
        w.pause(true);
        let old = w.enqueue(Some(key(1)), Urgency::Change, now);
        w.enqueue(Some(key(1)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Superseded(old)));
        assert_eq!(w.decide(), None, "nothing sent while paused");
        w.pause(false);
        assert!(matches!(w.decide(), Some(Grant::Send(_))));
    }

    fn key(port: u16) -> RuleKey {
        RuleKey {
            ip: "192.0.2.1".parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    fn window(max: usize) -> WriteWindow {
        WriteWindow::new(WindowSettings::for_timeout(max, Duration::from_secs(5)))
    }

    fn sends(w: &mut WriteWindow) -> Vec<Ticket> {
        let mut out = Vec::new();
        while let Some(g) = w.decide() {
            if let Grant::Send(t) = g {
                out.push(t);
            }
        }
        out
    }

    #[test]
    fn one_write_at_a_time_until_loxilb_answers() {
        let mut w = window(16);
        let now = Instant::now();
        for p in 0..4 {
            w.enqueue(Some(key(p)), Urgency::Change, now);
        }
        assert_eq!(sends(&mut w).len(), 1);
        assert_eq!(w.depth(), 3);
    }

    #[test]
    fn a_fast_loxilb_opens_the_window_one_answer_at_a_time_up_to_the_maximum() {
        let mut w = window(4);
        let now = Instant::now();
        for p in 0..20 {
            w.enqueue(Some(key(p)), Urgency::Change, now);
        }
        let mut limits = Vec::new();
        while w.depth() > 0 || w.in_flight() > 0 {
            let sent = sends(&mut w).len();
            for _ in 0..sent.max(w.in_flight()) {
                let n = w.in_flight();
                if n == 0 {
                    break;
                }
                w.answered(WriteKind::Post, Duration::from_millis(1), n);
            }
            limits.push(w.limit());
        }
        assert_eq!(limits.first(), Some(&2));
        assert_eq!(w.limit(), 4, "never above the maximum: {limits:?}");
    }

    #[test]
    fn a_serial_one_second_loxilb_gets_what_the_budget_allows() {
        // 5 s timeout: 2.5 s of writes in flight, 1 s each.
        let mut w = window(16);
        for _ in 0..10 {
            // Three sent together answered after 1, 2 and 3 s: 1 s each.
            w.in_flight = 3;
            w.answered(WriteKind::Post, Duration::from_secs(1), 1);
            w.answered(WriteKind::Post, Duration::from_secs(2), 2);
            w.answered(WriteKind::Post, Duration::from_secs(3), 3);
        }
        assert_eq!(w.limit(), 2);
        assert_eq!(w.per_write(), Some(Duration::from_secs(1)));
    }

    #[test]
    fn slower_answers_shrink_the_window_at_once() {
        let mut w = window(16);
        for _ in 0..20 {
            w.in_flight = 1;
            w.answered(WriteKind::Post, Duration::from_millis(10), 1);
        }
        assert_eq!(w.limit(), 16);
        // A timeout at 5 s with 4 in flight: 1.25 s each, smoothed.
        for _ in 0..8 {
            w.in_flight = 1;
            w.answered(WriteKind::Post, Duration::from_secs(5), 4);
        }
        assert!(w.limit() <= 2, "{}", w.limit());
    }

    #[test]
    fn deletes_do_not_make_posts_look_cheap() {
        let mut w = window(16);
        w.in_flight = 1;
        w.answered(WriteKind::Post, Duration::from_secs(1), 1);
        for _ in 0..50 {
            w.in_flight = 1;
            w.answered(WriteKind::Delete, Duration::from_millis(1), 1);
        }
        assert_eq!(w.per_write(), Some(Duration::from_secs(1)));
        assert_eq!(w.limit(), 2);
    }

    #[test]
    fn the_most_urgent_goes_first_then_in_arrival_order() {
        let mut w = window(1);
        w.per_post = Some(Duration::ZERO);
        w.limit = 1;
        let now = Instant::now();
        let cleanup = w.enqueue(Some(key(1)), Urgency::Cleanup, now);
        let replay = w.enqueue(Some(key(2)), Urgency::Replay, now);
        let change_a = w.enqueue(Some(key(3)), Urgency::Change, now);
        let restore = w.enqueue(Some(key(4)), Urgency::Restore, now);
        let change_b = w.enqueue(Some(key(5)), Urgency::Change, now);
        let mut order = Vec::new();
        while let Some(Grant::Send(t)) = w.decide() {
            order.push(t);
            w.answered(WriteKind::Post, Duration::ZERO, 1);
        }
        assert_eq!(order, vec![restore, change_a, change_b, replay, cleanup]);
    }

    #[test]
    fn a_newer_write_of_a_rule_supersedes_the_waiting_one() {
        let mut w = window(1);
        let now = Instant::now();
        let busy = w.enqueue(Some(key(9)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Send(busy)));
        let old = w.enqueue(Some(key(1)), Urgency::Change, now);
        let other = w.enqueue(Some(key(2)), Urgency::Change, now);
        let new = w.enqueue(Some(key(1)), Urgency::Replay, now);
        // Dropped at once, although the window is full.
        assert_eq!(w.decide(), Some(Grant::Superseded(old)));
        assert_eq!(w.decide(), None);
        w.answered(WriteKind::Post, Duration::ZERO, 1);
        assert_eq!(w.decide(), Some(Grant::Send(other)));
        w.answered(WriteKind::Post, Duration::ZERO, 1);
        assert_eq!(w.decide(), Some(Grant::Send(new)));
        assert_eq!(w.superseded(), 1);
        assert_eq!(w.sent(), 3);
    }

    #[test]
    fn a_write_in_flight_is_not_superseded_and_a_withdrawn_one_leaves_no_trace() {
        let mut w = window(2);
        let now = Instant::now();
        let first = w.enqueue(Some(key(1)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Send(first)));
        let second = w.enqueue(Some(key(1)), Urgency::Change, now);
        w.answered(WriteKind::Post, Duration::ZERO, 1);
        assert_eq!(w.decide(), Some(Grant::Send(second)));
        let third = w.enqueue(Some(key(2)), Urgency::Change, now);
        w.withdraw(third);
        assert_eq!(w.depth(), 0);
        assert_eq!(w.decide(), None);
        assert_eq!(w.superseded(), 0);
    }

    #[test]
    fn a_dropped_waiting_write_is_never_sent() {
        let mut w = window(1);
        let now = Instant::now();
        let busy = w.enqueue(Some(key(9)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Send(busy)));
        let unwanted = w.enqueue(Some(key(1)), Urgency::Restore, now);
        let other = w.enqueue(Some(key(2)), Urgency::Change, now);
        w.drop_waiting(unwanted);
        assert_eq!(w.decide(), Some(Grant::Superseded(unwanted)));
        w.answered(WriteKind::Post, Duration::ZERO, 1);
        assert_eq!(w.decide(), Some(Grant::Send(other)));
        // A later write of the same rule is not affected.
        let again = w.enqueue(Some(key(1)), Urgency::Change, now);
        w.answered(WriteKind::Post, Duration::ZERO, 1);
        assert_eq!(w.decide(), Some(Grant::Send(again)));
    }

    #[test]
    fn a_waiting_write_knows_what_is_ahead_of_it() {
        let mut w = window(1);
        let now = Instant::now();
        let a = w.enqueue(Some(key(1)), Urgency::Change, now);
        assert_eq!(w.decide(), Some(Grant::Send(a)));
        let b = w.enqueue(Some(key(2)), Urgency::Change, now);
        let c = w.enqueue(Some(key(3)), Urgency::Change, now + Duration::from_secs(1));
        assert_eq!(
            w.position(c),
            Some(Position {
                ahead: 2,
                estimate: None
            })
        );
        w.per_post = Some(Duration::from_secs(1));
        assert_eq!(
            w.position(b).unwrap().estimate,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            w.oldest(now + Duration::from_secs(3)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(w.position(a), None);
    }
}
