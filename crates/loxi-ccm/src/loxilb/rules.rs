//! The rule cache: what the controller knows an instance holds (`Holdings`, its rules by key
//! and by owning Service), and the full listing that refreshes it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use loxi_domain::{Rule, RuleKey, RuleName};
use loxilb_client::ClientError;
use loxilb_client::convert::from_entry;

use super::waiters::Waiters;
use super::{Blocked, Instance};
use crate::metrics::Metrics;

/// The restart marker's state on one instance.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    /// To be placed before the next listing (probes list every rule meanwhile).
    #[default]
    NotPlaced,
    Placed,
    /// loxilb refused it (a 4xx): probes list every rule instead, for good.
    Refused,
}

/// The rules an instance holds, by key, with an index by owning Service so that applying
/// one Service's rules looks at that Service's rules only (not every rule held).
#[derive(Debug, Default)]
pub(super) struct RuleTable {
    pub(super) rules: HashMap<RuleKey, Rule>,
    /// (namespace, Service) named by a rule's name (any cluster) -> its keys.
    by_service: HashMap<(String, String), HashSet<RuleKey>>,
}

impl RuleTable {
    fn owner(rule: &Rule) -> Option<(String, String)> {
        RuleName::parse(&rule.name).map(|n| (n.namespace, n.service))
    }

    pub(super) fn from_map(rules: HashMap<RuleKey, Rule>) -> RuleTable {
        let mut table = RuleTable {
            rules: HashMap::with_capacity(rules.len()),
            by_service: HashMap::default(),
        };
        for (_, rule) in rules {
            table.insert(rule);
        }
        table
    }

    pub(super) fn insert(&mut self, rule: Rule) {
        self.remove(&rule.key);
        if let Some(owner) = Self::owner(&rule) {
            self.by_service.entry(owner).or_default().insert(rule.key);
        }
        self.rules.insert(rule.key, rule);
    }

    pub(super) fn remove(&mut self, key: &RuleKey) -> Option<Rule> {
        let rule = self.rules.remove(key)?;
        if let Some(owner) = Self::owner(&rule)
            && let Some(keys) = self.by_service.get_mut(&owner)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.by_service.remove(&owner);
            }
        }
        Some(rule)
    }

    fn len(&self) -> usize {
        self.rules.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub(super) fn get(&self, key: &RuleKey) -> Option<&Rule> {
        self.rules.get(key)
    }

    /// Rules whose name names `namespace/service`.
    pub(super) fn of_service<'a>(
        &'a self,
        namespace: &str,
        service: &str,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        self.by_service
            .get(&(namespace.to_string(), service.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|k| self.rules.get(k))
    }
}

/// What the controller knows an instance holds.
#[derive(Debug, Default)]
pub(super) struct Holdings {
    /// False until the first successful listing, and again after a transport failure.
    pub(super) known: bool,
    pub(super) rules: RuleTable,
    /// Listed rules not in `rules` (host or port-range rules, several rules on one key): they
    /// take room in loxilb's table too.
    pub(super) uncounted: usize,
    /// The capacity loxilb showed by refusing a rule (403 `rule-hwm`), until it restarts.
    pub(super) learned_capacity: Option<usize>,
    /// Rules refused for a limit, exactly as sent: not sent again unchanged until room frees.
    pub(super) refused: HashMap<RuleKey, (Rule, Blocked)>,
    /// Services waiting for room here, in the order they started waiting.
    pub(super) waiters: Waiters,
    /// New rules being created right now (their room is taken before the calls are made).
    pub(super) reserved: usize,
    /// Keys with a call under way (`Instance::apply_service` makes its calls without the
    /// lock): a listing may or may not show them yet, so they never count as lost.
    pub(super) in_flight: HashSet<RuleKey>,
    /// The restart marker on this instance (module docs).
    pub(super) marker: Marker,
    /// Counts marker placements, so that a probe's view older than the last one is ignored.
    pub(super) marker_epoch: u64,
    /// Counts the times room freed, so that a Service whose pass decided without room can
    /// tell whether room freed before it started waiting (`Holdings::wait_for_room`).
    pub(super) room_freed_count: u64,
    /// When the table was last listed (`Instance::refresh`).
    pub(super) listed_at: Option<Instant>,
    /// Keys whose last write got no answer in time: loxilb may or may not have applied it.
    /// Not written again until a listing shows what they hold (`Instance::check_unsure`).
    pub(super) unsure: HashSet<RuleKey>,
    /// Its instance left the fleet (`Instance::retire`): its rule and capacity gauges are
    /// gone and not set again.
    pub(super) retired: bool,
}

/// A listing younger than this is current enough for a whole-instance pass (`converge_all`):
/// a new leader's first Service pass lists every loxilb, and its replay follows at once.
pub(super) const FRESH_LISTING: std::time::Duration = std::time::Duration::from_secs(2);

impl Holdings {
    pub(super) fn held(&self) -> usize {
        self.rules.len() + self.uncounted
    }

    /// Held plus being created: what a capacity check must count.
    pub(super) fn taken(&self) -> usize {
        self.held() + self.reserved
    }
}

impl Instance {
    /// Number of rules the instance is known to hold (all owners).
    pub async fn rule_count(&self) -> usize {
        self.holdings.lock().await.held()
    }

    pub(super) async fn list(
        &self,
        metrics: &Metrics,
    ) -> Result<(HashMap<RuleKey, Rule>, usize), ClientError> {
        let started = Instant::now();
        let result = self.client.list_rules_map(|e| from_entry(&e)).await;
        metrics.loxilb_call(self.url(), "list", started.elapsed(), result.as_ref().err());
        let listing = result?;
        let listed = listing.items.len() + listing.skipped;
        let rules: HashMap<RuleKey, Rule> = listing.items.into_iter().map(|r| (r.key, r)).collect();
        let uncounted = listed.saturating_sub(rules.len());
        Ok((rules, uncounted))
    }

    /// Lists the instance unless what it holds is known; a failed listing is noted
    /// (a transport error takes the instance for down until it answers again).
    pub(super) async fn ensure_listed(
        &self,
        h: &mut Holdings,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        if h.known {
            return Ok(());
        }
        let result = self.refresh(h, metrics).await;
        self.note_failure(h, &result);
        result
    }

    pub(super) async fn refresh(
        &self,
        h: &mut Holdings,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        // Before the listing: a restart after it then always shows as a missing marker.
        self.place_marker(h, metrics).await?;
        let before = h.known.then(|| h.held());
        // The old table goes before the listing arrives (with 2,000 rules, both at once were
        // a few MB of the drift check's memory peak); until the listing is in, nothing is
        // known.
        h.known = false;
        h.rules = RuleTable::default();
        // The whole window: no write of ours runs while loxilb lists (`Window::listing`).
        let listing = self.window.listing().await;
        let listed = self.list(metrics).await;
        drop(listing);
        let (rules, uncounted) = listed?;
        h.rules = RuleTable::from_map(rules);
        h.uncounted = uncounted;
        h.known = true;
        h.listed_at = Some(Instant::now());
        // What our unanswered writes did is in the listing.
        h.unsure.clear();
        if before.is_some_and(|b| h.held() < b) {
            // Deleted by someone else, or a restart: room for those waiting.
            h.room_freed();
        }
        self.report_table(h, metrics);
        Ok(())
    }

    /// Its rule count and capacity as metrics. Set under the table's lock, so that nothing
    /// is set once it left the fleet (`retire`).
    pub(super) fn report_table(&self, h: &Holdings, metrics: &Metrics) {
        if h.retired {
            return;
        }
        metrics.set_rules(self.url(), h.held());
        metrics.set_capacity(self.url(), self.effective_capacity(h));
    }

    /// It left the fleet (`crate::fleet::Fleet::set_source`, after its worker stopped):
    /// no HA role is posted to it any more, and a Service's pass still under way there
    /// sets none of its gauges, which the fleet forgets next.
    pub async fn retire(&self) {
        self.roles.lock().await.left = true;
        self.holdings.lock().await.retired = true;
    }
}
