//! loxilb's limits (module docs of `loxilb`): the capacity in force, the prediction of a
//! Service's new rules against it and the source-range index, refusals remembered, and the
//! Services waiting for room.

use std::sync::atomic::Ordering;
use std::time::Instant;

use loxi_domain::{Action, Rule};
use loxilb_client::ClientError;

use super::rules::Holdings;
use super::{ApplyReport, Blocked, Instance, MAX_ALLOWED_SOURCES_INDEX, Requeue, RuleOwner};

impl Holdings {
    /// Room freed (a rule deleted, a restart): limits hit before may pass now.
    pub(super) fn room_freed(&mut self) {
        self.refused.clear();
        self.room_freed_count += 1;
        self.waiters.wake_all(Instant::now());
    }

    /// `svc` was held back by a limit in a pass that decided when room had freed
    /// `freed_before` times: it waits for room, and is re-queued at once when room freed
    /// since that decision. A pass lets go of the lock for its calls, and room freed
    /// meanwhile woke the waiters of that moment, which did not include `svc` yet: without
    /// this it would wait for a wake-up that already went (found by the fault matrix, a
    /// full loxilb: docs/RELIABILITY.md).
    pub(super) fn wait_for_room(
        &mut self,
        svc: RuleOwner,
        need: usize,
        requeue: &Requeue,
        freed_before: u64,
    ) {
        self.waiters.wait(svc.clone(), need, requeue.clone());
        if self.room_freed_count != freed_before {
            requeue.send(&svc);
        }
    }
}

/// New rules a held-back Service needs (0 when no capacity limit held it back).
pub(super) fn rules_needed(report: &ApplyReport) -> usize {
    report
        .blocked
        .iter()
        .map(|b| match b {
            Blocked::Capacity { new, .. } => *new,
            Blocked::SourceRanges { .. } => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The in-place updates and re-creations, minus those loxilb refused exactly so for a limit
/// since room last freed (reported in `report` instead of being sent again).
pub(super) fn without_refused(
    h: &Holdings,
    changes: Vec<Action>,
    report: &mut ApplyReport,
) -> Vec<(Action, bool)> {
    changes
        .into_iter()
        .filter(|a| match a {
            Action::Update(r) | Action::Recreate(r) => match h.refused.get(&r.key) {
                Some((sent, why)) if sent == r => {
                    report.blocked.push(why.clone());
                    false
                }
                _ => true,
            },
            _ => false,
        })
        .map(|a| {
            let stored_bgp = match &a {
                Action::Update(r) | Action::Recreate(r) => {
                    h.rules.get(&r.key).is_some_and(|held| held.bgp)
                }
                _ => false,
            };
            (a, stored_bgp)
        })
        .collect()
}

/// Which limit a loxilb refusal is, if any, read from loxilb's raw error text
/// (docs/loxilb-api.md#handler-errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Limit {
    Capacity,
    SourceRanges,
}

pub(super) fn limit_of(e: &ClientError) -> Option<Limit> {
    match e {
        // 403 also means "BGP disabled" or "BGP only mode": only the rule table counts here.
        ClientError::Capacity { message, .. } if message.to_ascii_lowercase().contains("hwm") => {
            Some(Limit::Capacity)
        }
        // Our source ranges are always valid CIDRs (the planner parses them), so this is the
        // index limit, not a malformed prefix.
        ClientError::Rejected { message, .. }
            if message.to_ascii_lowercase().contains("rule-allowed-src") =>
        {
            Some(Limit::SourceRanges)
        }
        _ => None,
    }
}

impl Instance {
    /// The configured rule-table size.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
    }

    /// The capacity in force: configured, or lower when loxilb showed it.
    pub(super) fn effective_capacity(&self, h: &Holdings) -> usize {
        h.learned_capacity
            .map_or(self.capacity(), |l| l.min(self.capacity()))
    }

    /// Whether a Service's new rules would hit a limit; nothing is sent then.
    /// Whether `group` (one Service's new rules) may be created now; `kept` rules of room
    /// are promised to Services that waited longer (`Waiters`).
    pub(super) fn check_limits(
        &self,
        h: &Holdings,
        group: &[Rule],
        kept: usize,
    ) -> Option<Blocked> {
        // Rules other Services are creating right now, or are promised, count as held.
        let held = h.taken() + kept;
        let capacity = self.effective_capacity(h);
        if held + group.len() > capacity {
            return Some(Blocked::Capacity {
                held,
                new: group.len(),
                capacity,
                refused: false,
            });
        }
        for (i, rule) in group.iter().enumerate() {
            if let Some((sent, why)) = h.refused.get(&rule.key)
                && sent == rule
            {
                return Some(why.clone());
            }
            let index = held + i + 1;
            if !rule.allowed_sources.is_empty() && index > MAX_ALLOWED_SOURCES_INDEX {
                return Some(Blocked::SourceRanges {
                    key: rule.key,
                    index: Some(index),
                });
            }
        }
        None
    }
}
