//! The write window of one loxilb, shared by every task that writes to it: each rule write
//! waits for its turn here (`loxi_domain::write_window` decides; this wraps it for tasks).
//!
//! A write whose sender stops waiting (its reconcile was dropped) leaves the queue; a turn
//! granted but not used gives its room back.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use loxi_domain::RuleKey;
use loxi_domain::write_window::{
    Grant, Position, Ticket, Urgency, WindowSettings, WriteKind, WriteWindow,
};
use tokio::sync::oneshot;

/// How the window names the Service a write is for (`namespace/name`).
pub(super) fn owner_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// What a waiting write learns when its turn comes.
enum Turned {
    Send,
    Superseded,
}

struct Inner {
    window: WriteWindow,
    waiters: HashMap<Ticket, oneshot::Sender<Turned>>,
    /// Waiting writes by the Service that sent them (`namespace/name`): for its status.
    by_owner: HashMap<String, BTreeSet<Ticket>>,
    owners: HashMap<Ticket, String>,
    /// While a whole-instance pass (a replay, a drift repair) runs: the Services whose own
    /// pass took their part of it over ([`Window::take_over`]). `None` when none runs.
    taken_over: Option<HashSet<String>>,
}

impl Inner {
    /// Hands out every decision the window can make now.
    fn dispatch(&mut self) {
        while let Some(grant) = self.window.decide() {
            let (ticket, turned) = match grant {
                Grant::Send(t) => (t, Turned::Send),
                Grant::Superseded(t) => (t, Turned::Superseded),
            };
            self.forget_owner(ticket);
            let sent = self
                .waiters
                .remove(&ticket)
                .is_some_and(|tx| tx.send(turned).is_ok());
            if !sent && matches!(grant, Grant::Send(_)) {
                // Its sender is gone: the room goes to the next one.
                self.window.unsent();
            }
        }
    }

    fn forget_owner(&mut self, ticket: Ticket) {
        if let Some(owner) = self.owners.remove(&ticket)
            && let Some(set) = self.by_owner.get_mut(&owner)
        {
            set.remove(&ticket);
            if set.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }
}

/// The window of one loxilb (module docs).
pub struct Window {
    inner: Mutex<Inner>,
    /// Told whenever a write in flight ends: a listing waits for none to be left.
    write_ended: tokio::sync::Notify,
}

/// A listing of loxilb's rules under way ([`Window::listing`]): no write is sent until it is
/// dropped.
pub struct Listing<'a> {
    window: &'a Window,
}

impl Drop for Listing<'_> {
    fn drop(&mut self) {
        let mut inner = self.window.lock();
        inner.window.pause(false);
        inner.dispatch();
    }
}

/// A write's turn: it may be sent now. Tell the window how it went with
/// [`Turn::answered`]; dropped unused, the room goes back.
pub struct Turn<'a> {
    window: &'a Window,
    in_flight_at_send: usize,
    sent_at: Instant,
    reported: bool,
}

impl Turn<'_> {
    /// The write ended (answered, refused, or timed out) after the time since the turn.
    pub fn answered(mut self, kind: WriteKind) {
        let took = self.sent_at.elapsed();
        self.reported = true;
        let mut inner = self.window.lock();
        inner.window.answered(kind, took, self.in_flight_at_send);
        inner.dispatch();
        drop(inner);
        self.window.write_ended.notify_waiters();
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.reported {
            let mut inner = self.window.lock();
            inner.window.unsent();
            inner.dispatch();
            drop(inner);
            self.window.write_ended.notify_waiters();
        }
    }
}

/// Takes a waiting write out of the queue when its sender stops waiting.
struct Waiting<'a> {
    window: &'a Window,
    ticket: Option<Ticket>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.ticket {
            let mut inner = self.window.lock();
            inner.waiters.remove(&t);
            inner.forget_owner(t);
            inner.window.withdraw(t);
            inner.dispatch();
        }
    }
}

/// What the window shows: for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub depth: usize,
    pub oldest: Option<Duration>,
    pub in_flight: usize,
    pub limit: usize,
    pub superseded: u64,
    /// What one write costs at that loxilb, as learnt so far.
    pub per_write: Option<Duration>,
}

impl Window {
    pub fn new(settings: WindowSettings) -> Window {
        Window {
            inner: Mutex::new(Inner {
                window: WriteWindow::new(settings),
                waiters: HashMap::new(),
                by_owner: HashMap::new(),
                owners: HashMap::new(),
                taken_over: None,
            }),
            write_ended: tokio::sync::Notify::new(),
        }
    }

    /// Takes the whole window for a listing of loxilb's rules: holds every new write back and
    /// waits for those in flight to end (a listing during writes can crash loxilb 0.9.8,
    /// docs/loxilb-api.md#what-writes-cost). Callers list only while the window is idle, so
    /// this waits at most for the writes sent since.
    pub async fn listing(&self) -> Listing<'_> {
        self.lock().window.pause(true);
        // Before waiting: dropped while waiting, the guard lets the writes go again.
        let listing = Listing { window: self };
        loop {
            let ended = self.write_ended.notified();
            let mut ended = std::pin::pin!(ended);
            ended.as_mut().enable();
            if self.lock().window.in_flight() == 0 {
                return listing;
            }
            ended.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_settings(&self, settings: WindowSettings) {
        let mut inner = self.lock();
        inner.window.set_settings(settings);
        inner.dispatch();
    }

    /// Waits for the turn of a write (of the rule `key`, for the Service `owner`):
    /// `None` when a newer write of the same rule superseded it (not to be sent).
    pub async fn turn(
        &self,
        key: Option<RuleKey>,
        owner: Option<&str>,
        urgency: Urgency,
    ) -> Option<Turn<'_>> {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut inner = self.lock();
            if urgency >= Urgency::Replay
                && let (Some(o), Some(taken)) = (owner, &inner.taken_over)
                && taken.contains(o)
            {
                // The Service's own pass writes its rules now, from what it wants now.
                inner.window.count_superseded();
                return None;
            }
            // After the Service's waiting write, if it has one: its rules land together.
            let join = owner
                .and_then(|o| inner.by_owner.get(o))
                .and_then(|tickets| tickets.iter().find(|t| t.urgency() == urgency).copied());
            let ticket = inner
                .window
                .enqueue_joining(key, urgency, Instant::now(), join);
            inner.waiters.insert(ticket, tx);
            if let Some(o) = owner {
                inner.owners.insert(ticket, o.to_string());
                inner
                    .by_owner
                    .entry(o.to_string())
                    .or_default()
                    .insert(ticket);
            }
            inner.dispatch();
            ticket
        };
        let mut waiting = Waiting {
            window: self,
            ticket: Some(ticket),
        };
        let turned = rx.await;
        waiting.ticket = None;
        match turned {
            Ok(Turned::Send) => {
                let in_flight_at_send = self.lock().window.in_flight();
                Some(Turn {
                    window: self,
                    in_flight_at_send,
                    sent_at: Instant::now(),
                    reported: false,
                })
            }
            // The sender of the decision cannot go away while the window lives.
            Ok(Turned::Superseded) | Err(_) => None,
        }
    }

    /// Drops the Service's waiting writes unsent (it is being deleted: they would only cost
    /// loxilb time, and its rules are taken away anyway).
    pub fn drop_owner(&self, owner: &str) {
        let mut inner = self.lock();
        let tickets: Vec<Ticket> = inner
            .by_owner
            .get(owner)
            .map(|t| t.iter().copied().collect())
            .unwrap_or_default();
        for t in tickets {
            inner.window.drop_waiting(t);
        }
        inner.dispatch();
    }

    /// A whole-instance pass starts (`true`) or ended (`false`): while it runs, a Service's
    /// own pass may take its part over ([`Window::take_over`]).
    pub fn whole_pass(&self, running: bool) {
        self.lock().taken_over = running.then(HashSet::new);
    }

    /// A Service's own pass takes its part of the running whole-instance pass over: that
    /// pass's waiting writes for it are dropped unsent, and its later ones are never sent
    /// (the Service's pass decides from what it wants now, with its own urgency, ahead of
    /// the replay). False when no whole-instance pass runs.
    pub fn take_over(&self, owner: &str) -> bool {
        let mut inner = self.lock();
        let Some(taken) = inner.taken_over.as_mut() else {
            return false;
        };
        taken.insert(owner.to_string());
        let tickets: Vec<Ticket> = inner
            .by_owner
            .get(owner)
            .map(|t| {
                t.iter()
                    .filter(|t| t.urgency() >= Urgency::Replay)
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for t in tickets {
            inner.window.drop_waiting(t);
        }
        inner.dispatch();
        true
    }

    /// Where the Service's first waiting write stands (`None`: it has none waiting).
    pub fn queued(&self, owner: &str) -> Option<Position> {
        let inner = self.lock();
        let first = *inner.by_owner.get(owner)?.iter().next()?;
        inner.window.position(first)
    }

    /// The Services with writes waiting, each with where its first one stands, the nearest
    /// first; at most `n` of them.
    pub fn waiting_owners(&self, n: usize) -> Vec<(String, Position)> {
        let inner = self.lock();
        let mut owners: Vec<(String, Position)> = inner
            .by_owner
            .iter()
            .filter_map(|(owner, tickets)| {
                let first = *tickets.iter().next()?;
                Some((owner.clone(), inner.window.position(first)?))
            })
            .collect();
        owners.sort_by(|a, b| a.1.ahead.cmp(&b.1.ahead).then_with(|| a.0.cmp(&b.0)));
        owners.truncate(n);
        owners
    }

    pub fn view(&self) -> WindowView {
        let inner = self.lock();
        let w = &inner.window;
        WindowView {
            depth: w.depth(),
            oldest: w.oldest(Instant::now()),
            in_flight: w.in_flight(),
            limit: w.limit(),
            superseded: w.superseded(),
            per_write: w.per_write(),
        }
    }

    /// No write waits or is in flight: a listing now sees what our writes did (and a
    /// loxilb that lists while it writes can fail: docs/loxilb-api.md#what-writes-cost).
    pub fn idle(&self) -> bool {
        let inner = self.lock();
        inner.window.depth() == 0 && inner.window.in_flight() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::Protocol;
    use std::sync::Arc;

    fn key(port: u16) -> RuleKey {
        RuleKey {
            ip: "192.0.2.1".parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        }
    }

    #[tokio::test]
    async fn a_dropped_waiter_leaves_the_queue_and_an_unused_turn_gives_its_room_back() {
        let w = Arc::new(Window::new(WindowSettings::for_timeout(
            4,
            Duration::from_secs(5),
        )));
        let first = w.turn(Some(key(1)), Some("ns/a"), Urgency::Change).await;
        assert!(first.is_some());
        // The window holds one until an answer: the next waits.
        let w2 = w.clone();
        let waiting = tokio::spawn(async move {
            w2.turn(Some(key(2)), Some("ns/b"), Urgency::Change)
                .await
                .is_some()
        });
        tokio::time::timeout(Duration::from_secs(5), async {
            while w.queued("ns/b").is_none() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert_eq!(w.queued("ns/b").map(|p| p.ahead), Some(1));
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(w.view().depth, 0);
        drop(first);
        assert_eq!(w.view().in_flight, 0);
        assert!(w.idle());
    }

    #[tokio::test]
    async fn a_listing_waits_for_writes_in_flight_and_holds_new_ones_back() {
        let w = Arc::new(Window::new(WindowSettings::for_timeout(
            4,
            Duration::from_secs(5),
        )));
        let in_flight = w.turn(Some(key(1)), None, Urgency::Change).await.unwrap();
        let w1 = w.clone();
        let listing = tokio::spawn(async move {
            let held = w1.listing().await;
            // Held while it lists: a write asked for now waits.
            let w2 = w1.clone();
            let next = tokio::spawn(async move {
                w2.turn(Some(key(2)), None, Urgency::Restore)
                    .await
                    .map(|t| t.answered(WriteKind::Post))
                    .is_some()
            });
            tokio::time::timeout(Duration::from_secs(5), async {
                while w1.view().depth == 0 {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap();
            assert_eq!(w1.view().in_flight, 0, "sent during the listing");
            drop(held);
            next.await.unwrap()
        });
        tokio::task::yield_now().await;
        assert!(!listing.is_finished(), "listed while a write was in flight");
        in_flight.answered(WriteKind::Post);
        assert!(listing.await.unwrap(), "sent once the listing is done");
        assert!(w.idle());
    }

    #[tokio::test]
    async fn a_superseded_write_is_told_not_to_send() {
        let w = Arc::new(Window::new(WindowSettings::for_timeout(
            1,
            Duration::from_secs(5),
        )));
        let busy = w.turn(Some(key(9)), None, Urgency::Change).await.unwrap();
        let w1 = w.clone();
        let old =
            tokio::spawn(
                async move { w1.turn(Some(key(1)), None, Urgency::Change).await.is_some() },
            );
        tokio::time::timeout(Duration::from_secs(5), async {
            while w.view().depth == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        let w2 = w.clone();
        let new =
            tokio::spawn(
                async move { w2.turn(Some(key(1)), None, Urgency::Change).await.is_some() },
            );
        assert!(!old.await.unwrap(), "the older write is dropped");
        busy.answered(WriteKind::Post);
        assert!(new.await.unwrap(), "the newer one is sent");
        assert_eq!(w.view().superseded, 1);
    }
}
