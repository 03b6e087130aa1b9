//! Health: the liveness probe, the restart marker it reads (module docs of `loxilb`), and
//! what a failed call says about the instance.

use std::sync::atomic::Ordering;
use std::time::Instant;

use loxi_domain::{ClusterId, RuleName};
use loxilb_client::ClientError;
use tracing::{debug, info, warn};

use super::rules::{Holdings, Marker, RuleTable};
use super::{Instance, Probe, is_transport};
use crate::metrics::Metrics;

/// How long a loxilb stays unreachable before it counts as gone for good, unless
/// `--loxilb-gone-after` says otherwise (`Instance::gone_after`): until then a
/// deleted Service whose rules it may hold keeps its address and finalizer (an address
/// released while an old rule for it may still forward could go to another Service); after
/// that they are released, and the loxilb, should it come back, loses the Service's rules as
/// orphans in its replay (docs/architecture.md#writing-to-a-slow-loxilb). Long enough for a
/// loxilb's restart or its node's reboot. A loxilb that leaves the fleet (its URL, Pod or
/// `LoxiURL` removed) is gone at once.
pub const GONE_FOR_GOOD_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

impl Instance {
    /// Records whether it answers: when it stopped answering is kept while it does not.
    fn note_down(&self, down: bool) {
        let mut since = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
        match (down, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, _) => *since = None,
            (true, Some(_)) => {}
        }
    }

    /// How long it has been unreachable (`None`: it answers, or was never probed).
    pub fn down_for(&self) -> Option<std::time::Duration> {
        self.down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|t| t.elapsed())
    }

    /// Whether it may still hold rules of `namespace/service` although it does not answer:
    /// its table, as last listed, holds some (or it was never listed), and it is not gone
    /// for good ([`Instance::gone_after`]). A pass holding its table counts as "may".
    pub fn may_still_hold(&self, namespace: &str, service: &str) -> bool {
        if self.is_healthy() || self.down_for().is_some_and(|d| d >= self.gone_after()) {
            return false;
        }
        match self.holdings.try_lock() {
            Ok(h) => {
                h.listed_at.is_none() || h.rules.of_service(namespace, service).next().is_some()
            }
            Err(_) => true,
        }
    }

    /// Not known to be down: reachable at the last probe, or not probed yet.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::SeqCst) || !self.probed.load(Ordering::SeqCst)
    }

    /// The refused certificate that keeps it down, if that is why (see `tls_refusal`).
    pub fn tls_refusal(&self) -> Option<String> {
        self.tls_refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Remembers why the last call that reached (or failed to reach) it ended as it did.
    fn note_reach(&self, result: Result<(), &ClientError>) {
        let refusal = match result {
            Err(e @ ClientError::Tls { .. }) => Some(e.to_string()),
            // Any other answer or failure: the certificate was not the problem this time.
            _ => None,
        };
        *self.tls_refusal.lock().unwrap_or_else(|e| e.into_inner()) = refusal;
    }

    /// Records a liveness result; returns true on a down -> up transition.
    pub fn set_healthy(&self, up: bool) -> bool {
        self.probed.store(true, Ordering::SeqCst);
        self.note_down(!up);
        let was = self.healthy.swap(up, Ordering::SeqCst);
        up && !was
    }

    /// Liveness probe (`GET /version`, docs/loxilb-api.md#liveness) and, while up, a check that the
    /// instance still holds what we believe: a loxilb that restarted between two probes
    /// answers as if nothing happened, but comes back empty
    /// (docs/loxilb-api.md#detecting-a-restart).
    pub async fn probe(&self, cluster: &ClusterId, metrics: &Metrics) -> Probe {
        let window = self.window.view();
        metrics.set_write_queue(self.url(), window.depth, window.oldest, window.limit);
        // One attempt while it cannot be reached: a loxilb that hangs is seen down after one
        // timeout. One that answers with an error is alive: asked again as any call is.
        let answer = match self.client.probe_version().await {
            Err(e) if !e.is_transport() => self.client.version().await,
            answer => answer,
        };
        self.note_reach(answer.as_ref().map(|_| ()));
        let up = answer.is_ok();
        metrics.set_up(self.url(), up);
        let first = !self.probed.swap(true, Ordering::SeqCst);
        self.note_down(!up);
        let was = self.healthy.swap(up, Ordering::SeqCst);
        let unannounced = self.down_unannounced.swap(false, Ordering::SeqCst);
        if let Err(error) = answer {
            if was || unannounced {
                // The reason matters: a refused certificate needs the operator, an outage not.
                warn!(
                    instance = self.url(),
                    %error,
                    "loxilb unreachable: Services are partially programmed until it is back"
                );
                return Probe::WentDown;
            }
            return Probe::Down;
        }
        if !was {
            let mut h = self.holdings.lock().await;
            // A first probe after a Service's pass of this process listed it and placed the
            // marker (a new leader's reconciles start at once): that listing is what a
            // replay needs, nothing is listed or placed twice.
            let fresh = first && h.known && h.marker != Marker::NotPlaced;
            if !fresh {
                // Whatever it held may be gone, and it may run with another configuration:
                // list before trusting anything, and let waiting Services try again.
                h.known = false;
                h.learned_capacity = None;
                // A loxilb that was away may have restarted and lost the marker with
                // everything else: placed again before the replay's listing, or the first
                // probe after the replay would find it missing and replay a second time. (A
                // refusal stands.)
                if h.marker == Marker::Placed {
                    h.marker = Marker::NotPlaced;
                }
            }
            h.room_freed();
            if !first {
                // Back after being away: it may have restarted empty. (At the controller's
                // start nothing is held back: nothing was written there yet.)
                self.hold_passes();
            }
            info!(instance = self.url(), "loxilb reachable: replaying rules");
            metrics.replayed(self.url(), "came_back");
            return Probe::CameBack;
        }
        // A pass holds the table (a replay of thousands of rules may take minutes on a real
        // loxilb): its calls notice a restart themselves, and the probe stays on time.
        let Ok(mut h) = self.holdings.try_lock() else {
            return Probe::Up;
        };
        if !h.known {
            return Probe::Up;
        }
        if !h.unsure.is_empty() && self.window.idle() {
            // Writes that got no answer in time: read back now that none of ours is queued
            // at loxilb (a listing while it writes can crash it: docs/loxilb-api.md).
            debug!(
                instance = self.url(),
                unsure = h.unsure.len(),
                "reading back unanswered writes"
            );
            if let Err(e) = self.refresh(&mut h, metrics).await {
                debug!(instance = self.url(), error = %e, "read-back failed; the next probe tries again");
            }
            return Probe::Up;
        }
        // Nothing of ours to lose, nothing to look for (SNAT rules count: an Egress-only
        // loxilb's restart is replayed at once, not at the next drift check).
        if h.rules.is_empty() && !self.holds_snat.load(Ordering::Relaxed) {
            return Probe::Up;
        }
        let missing = if h.marker == Marker::Placed {
            // The cheap check: read without the lock, so no worker waits for it.
            let epoch = h.marker_epoch;
            drop(h);
            let started = Instant::now();
            let states = self.client.cluster_states().await;
            metrics.loxilb_call(
                self.url(),
                "cistate",
                started.elapsed(),
                states.as_ref().err(),
            );
            h = self.holdings.lock().await;
            let Ok(states) = states else {
                // The next probe (or the next apply) decides whether it is down.
                return Probe::Up;
            };
            if h.marker_epoch != epoch
                || !h.known
                || states.iter().any(|s| s.instance == self.marker.instance)
            {
                return Probe::Up;
            }
            // Restarted: everything of ours is gone, whatever the cache says.
            h.known = false;
            h.marker = Marker::NotPlaced;
            h.rules
                .rules
                .iter()
                .filter(|(k, r)| {
                    !h.in_flight.contains(k) && RuleName::is_owned_by(&r.name, cluster)
                })
                .count()
        } else {
            if !self.window.idle() {
                // Not while our writes are queued there (module docs of `window`).
                return Probe::Up;
            }
            let Ok((listed, uncounted)) = self.list(metrics).await else {
                // The next probe (or the next apply) decides whether it is down.
                return Probe::Up;
            };
            let before = h.held();
            // Only our rules count: other owners delete theirs as they please.
            let missing = h
                .rules
                .rules
                .iter()
                .filter(|(k, r)| {
                    !listed.contains_key(k)
                        && !h.in_flight.contains(k)
                        && RuleName::is_owned_by(&r.name, cluster)
                })
                .count();
            h.rules = RuleTable::from_map(listed);
            h.uncounted = uncounted;
            self.report_table(&h, metrics);
            if missing == 0 {
                if h.held() < before {
                    h.room_freed();
                }
                return Probe::Up;
            }
            missing
        };
        warn!(
            instance = self.url(),
            missing, "loxilb lost rules (restart?): replaying"
        );
        h.learned_capacity = None;
        h.room_freed();
        self.hold_passes();
        metrics.replayed(self.url(), "lost_rules");
        Probe::LostRules { missing }
    }

    /// Places the restart marker (module docs) if it is not there yet. Only a transport
    /// failure is an error; a refusal switches this instance to listing probes.
    pub(super) async fn place_marker(
        &self,
        h: &mut Holdings,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        if h.marker != Marker::NotPlaced {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.client.set_cluster_state(&self.marker).await;
        metrics.loxilb_call(
            self.url(),
            "cistate",
            started.elapsed(),
            result.as_ref().err(),
        );
        match result {
            Ok(()) => {
                h.marker = Marker::Placed;
                h.marker_epoch += 1;
                Ok(())
            }
            Err(e) if is_transport(&e) => Err(e),
            Err(e) if e.is_retryable() => {
                // A passing server error: tried again before the next listing, and probes
                // list every rule until then.
                debug!(instance = self.url(), error = %e, "restart marker not placed yet");
                Ok(())
            }
            Err(e) => {
                warn!(
                    instance = self.url(),
                    error = %e,
                    "loxilb refused the restart marker (POST /config/cistate): \
                     each probe lists every rule instead"
                );
                h.marker = Marker::Refused;
                Ok(())
            }
        }
    }

    pub(super) fn note_failure<T>(&self, h: &mut Holdings, result: &Result<T, ClientError>) {
        if let Err(e) = result
            && is_transport(e)
        {
            self.note_reach(Err(e));
            // We no longer know what it holds (it may come back empty): list before next use.
            h.known = false;
            self.probed.store(true, Ordering::SeqCst);
            self.note_down(true);
            if self.healthy.swap(false, Ordering::SeqCst) {
                self.down_unannounced.store(true, Ordering::SeqCst);
            }
        }
    }
}
