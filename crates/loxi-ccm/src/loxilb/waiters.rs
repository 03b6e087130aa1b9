//! The Services waiting for room on one instance (module docs of `loxilb`): kept in the
//! instance's rule book (`rules::Holdings`), woken when room frees (`limits`).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::{Requeue, RuleOwner};

/// How long room that frees is kept for the Services that waited for it, in their order,
/// after they were woken: long enough for their passes to come round, short enough that a
/// waiter whose Service went away unnoticed holds nobody back for long.
pub(super) const TURN_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Services waiting for room on one instance, first come, first served: when room frees,
/// every waiter is woken (in the order it started waiting), and for a while the room goes to
/// the waiters in that order (each one whose rules fit in what is left), before any Service
/// behind them or new.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    next: u64,
    order: BTreeMap<u64, RuleOwner>,
    by_service: HashMap<RuleOwner, Waiter>,
    /// Until then, room is kept for the waiters woken last.
    turns_until: Option<Instant>,
}

#[derive(Debug)]
struct Waiter {
    /// Its place in the queue, kept while it waits (also across wake-ups).
    seq: u64,
    /// New rules it needs here.
    need: usize,
    requeue: Requeue,
}

impl Waiters {
    /// `svc` waits for room for `need` rules (keeping its place if it already waits).
    pub(super) fn wait(&mut self, svc: RuleOwner, need: usize, requeue: Requeue) {
        if let Some(w) = self.by_service.get_mut(&svc) {
            w.need = need;
            w.requeue = requeue;
            return;
        }
        let seq = self.next;
        self.next += 1;
        self.order.insert(seq, svc.clone());
        self.by_service.insert(svc, Waiter { seq, need, requeue });
    }

    /// `svc` no longer waits (served, gone, or wants nothing new).
    pub(super) fn done(&mut self, svc: &RuleOwner) {
        if let Some(w) = self.by_service.remove(svc) {
            self.order.remove(&w.seq);
        }
    }

    pub(super) fn wake_all(&mut self, now: Instant) {
        for svc in self.order.values() {
            if let Some(w) = self.by_service.get(svc) {
                w.requeue.send(svc);
            }
        }
        if !self.order.is_empty() {
            self.turns_until = Some(now + TURN_HOLD);
        }
    }

    /// Of `free` rules of room, how many are kept for waiters ahead of `svc` (all waiters,
    /// for a Service that does not wait): each one in order whose need fits in what is left,
    /// while their turn lasts.
    pub(super) fn kept_ahead(&self, svc: &RuleOwner, free: usize, now: Instant) -> usize {
        if self.turns_until.is_none_or(|until| now >= until) {
            return 0;
        }
        let mine = self.by_service.get(svc).map(|w| w.seq);
        let mut kept = 0;
        for (seq, other) in &self.order {
            if Some(*seq) == mine {
                break;
            }
            let need = self.by_service.get(other).map_or(0, |w| w.need);
            if kept + need <= free {
                kept += need;
            }
        }
        kept
    }
}
