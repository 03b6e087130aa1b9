//! The fleet's members: the instances by group, and their joining and leaving.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loxi_domain::ClusterId;
use loxilb_client::LoxilbClient;

use super::{DEFAULT_CAPACITY, DEFAULT_PARALLEL_CALLS, DEFAULT_WRITE_WINDOW, Instance, RuleOwner};

/// The loxilb instances: the configured ones, or those discovery follows
/// (docs/fleet.md#discovery). A cheap handle: clones share the same members.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<FleetInner>,
}

struct FleetInner {
    /// Replaced as a whole when members join or leave; readers work on a snapshot.
    members: std::sync::RwLock<Arc<Vec<Arc<Instance>>>>,
    cluster: ClusterId,
    capacity: AtomicUsize,
    parallel_calls: AtomicUsize,
    write_window: AtomicUsize,
    /// `--loxilb-gone-after`, in milliseconds, for the instances there and those that join.
    gone_after_ms: std::sync::atomic::AtomicU64,
    /// `--appendEPs`, for the instances there and those that join.
    append_endpoints: std::sync::atomic::AtomicBool,
}

/// One loxilb of the fleet as its sources name it: its group and its API URL.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    pub group: String,
    pub url: String,
}

impl Member {
    pub fn new(group: &str, url: &str) -> Member {
        Member {
            group: group.to_string(),
            url: url.to_string(),
        }
    }
}

/// One group of the fleet now: its name and its instances.
#[derive(Clone)]
pub struct Group {
    pub name: String,
    pub instances: Vec<Arc<Instance>>,
}

impl Group {
    /// Rules each of its loxilbs holds at most: the smallest table among them.
    pub fn capacity(&self) -> usize {
        self.instances
            .iter()
            .map(|i| i.capacity())
            .min()
            .unwrap_or(0)
    }
}

/// What [`Fleet::set_members`] changed: URLs that joined, and the instances that left.
#[derive(Default)]
pub struct MembersChanged {
    pub joined: Vec<String>,
    pub left: Vec<Arc<Instance>>,
}

impl Fleet {
    /// One group (the default one) of instances.
    pub fn new(clients: Vec<LoxilbClient>, cluster: &ClusterId) -> Fleet {
        let grouped = clients
            .into_iter()
            .map(|c| (loxi_domain::roles::DEFAULT_ZONE.to_string(), c))
            .collect();
        Fleet::with_capacity(grouped, DEFAULT_CAPACITY, cluster)
    }

    /// Instances (each with its group) whose rule tables hold `capacity` rules (loxilb's is
    /// 2048 unless built otherwise).
    pub fn with_capacity(
        clients: Vec<(String, LoxilbClient)>,
        capacity: usize,
        cluster: &ClusterId,
    ) -> Fleet {
        let fleet = Fleet {
            inner: Arc::new(FleetInner {
                members: std::sync::RwLock::new(Arc::new(
                    clients
                        .into_iter()
                        .map(|(group, c)| Arc::new(Instance::new(c, cluster).in_group(&group)))
                        .collect(),
                )),
                cluster: cluster.clone(),
                capacity: AtomicUsize::new(capacity.max(1)),
                parallel_calls: AtomicUsize::new(DEFAULT_PARALLEL_CALLS),
                write_window: AtomicUsize::new(DEFAULT_WRITE_WINDOW),
                gone_after_ms: std::sync::atomic::AtomicU64::new(
                    u64::try_from(super::probe::GONE_FOR_GOOD_AFTER.as_millis())
                        .unwrap_or(u64::MAX),
                ),
                append_endpoints: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        fleet.set_capacity(capacity);
        fleet
    }

    /// The instances now (a snapshot: members that join or leave later are not in it).
    pub fn instances(&self) -> Arc<Vec<Arc<Instance>>> {
        self.inner
            .members
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The groups now, by name, each with its instances (a snapshot).
    pub fn groups(&self) -> Vec<Group> {
        let mut groups: BTreeMap<String, Vec<Arc<Instance>>> = BTreeMap::new();
        for inst in self.instances().iter() {
            groups
                .entry(inst.group().to_string())
                .or_default()
                .push(inst.clone());
        }
        groups
            .into_iter()
            .map(|(name, instances)| Group { name, instances })
            .collect()
    }

    /// Makes the members the loxilbs `members` names (discovery, `LoxiURL`): an instance
    /// already known (same URL, same group) is kept with everything it holds; a new one
    /// joins *not serving* (Services' passes skip it) until its first replay has programmed
    /// it completely; one no longer listed is dropped. A URL listed twice counts once (its
    /// first group). `client` makes the client of a new URL (`None`: skipped, it said why).
    pub fn set_members(
        &self,
        wanted: &[Member],
        client: impl Fn(&str) -> Option<LoxilbClient>,
    ) -> MembersChanged {
        let mut members = self
            .inner
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut changed = MembersChanged::default();
        let mut next: Vec<Arc<Instance>> = Vec::with_capacity(wanted.len());
        for Member { group, url } in wanted {
            if next.iter().any(|i| i.url() == url) {
                continue;
            }
            if let Some(known) = members
                .iter()
                .find(|i| i.url() == url && i.group() == group)
            {
                next.push(known.clone());
                continue;
            }
            let Some(c) = client(url) else { continue };
            let inst = Instance::new(c, &self.inner.cluster).in_group(group);
            inst.serving.store(false, Ordering::SeqCst);
            inst.set_capacity(self.inner.capacity.load(Ordering::Relaxed));
            inst.parallel_calls.store(
                self.inner.parallel_calls.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
            inst.set_write_window(self.inner.write_window.load(Ordering::Relaxed));
            inst.set_gone_after(std::time::Duration::from_millis(
                self.inner.gone_after_ms.load(Ordering::Relaxed),
            ));
            inst.set_append_endpoints(self.inner.append_endpoints.load(Ordering::Relaxed));
            changed.joined.push(url.clone());
            next.push(Arc::new(inst));
        }
        for old in members.iter() {
            if !next.iter().any(|i| Arc::ptr_eq(i, old)) {
                changed.left.push(old.clone());
            }
        }
        if !changed.joined.is_empty() || !changed.left.is_empty() {
            *members = Arc::new(next);
        }
        changed
    }

    /// Sets how many Services' new rules a replay or drift repair sends at once to one
    /// instance (the controller uses its `--concurrency`).
    pub fn set_parallel_calls(&self, parallel: usize) {
        self.inner
            .parallel_calls
            .store(parallel.max(1), Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.parallel_calls
                .store(parallel.max(1), Ordering::Relaxed);
        }
    }

    /// Sets the most rule writes in flight to one instance (`--loxilb-write-window`), for
    /// the instances there and those that join.
    pub fn set_write_window(&self, max: usize) {
        self.inner.write_window.store(max.max(1), Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.set_write_window(max);
        }
    }

    /// Sets how long an instance may stay unreachable before it counts as gone for good
    /// (`--loxilb-gone-after`), for the instances there and those that join.
    pub fn set_gone_after(&self, after: std::time::Duration) {
        self.inner.gone_after_ms.store(
            u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        for inst in self.instances().iter() {
            inst.set_gone_after(after);
        }
    }

    /// `--appendEPs`: rules shared with other controllers (`shared.rs`), on every instance
    /// and on those that join.
    pub fn set_append_endpoints(&self, on: bool) {
        self.inner.append_endpoints.store(on, Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.set_append_endpoints(on);
        }
    }

    /// Sets every instance's rule-table size.
    pub fn set_capacity(&self, capacity: usize) {
        self.inner
            .capacity
            .store(capacity.max(1), Ordering::Relaxed);
        for inst in self.instances().iter() {
            inst.set_capacity(capacity);
        }
    }

    /// `svc` is gone: it waits for room nowhere.
    pub async fn forget_waiter(&self, svc: &RuleOwner) {
        for inst in self.instances().iter() {
            inst.holdings.lock().await.waiters.done(svc);
        }
    }
}
