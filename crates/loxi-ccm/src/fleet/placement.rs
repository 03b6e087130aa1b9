//! The placement book: which group of loxilbs a Service goes to
//! (docs/fleet.md#groups-and-placement). The group its `loxilb.io/zoneselect` names, else,
//! with several groups, the one with the most room (`loxi_domain::placement`), recorded in
//! that annotation with the finalizer so that it never moves. A Service no group has room for
//! waits, and is re-queued when a Service leaves.
//!
//! Room is counted in rules of the Services placed on each group (a book filled from the
//! Services' recorded groups at the first decision, then kept as Services are placed and
//! leave): decisions are serialized, so Services created together never overfill a group.
//! Rules of other owners on a loxilb are not counted here; the loxilb subsystem's own
//! capacity check still holds a Service back if they fill a table (`crate::loxilb`,
//! `CapacityExceeded`).
//!
//! The book works on plain entries (a key, a uid, a group, a count of rules); what a Service
//! is made of (its annotation, its ports) is read by the `service` subsystem
//! (crates/loxi-ccm/src/service/placing.rs).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::sync::Arc;

use loxi_domain::placement::{GroupRoom, PlacementError, parse_group, place};

use crate::loxilb::Group;
use crate::metrics::Metrics;

/// The placement book and the Services waiting for room: a cheap handle, clones share them.
/// `K` names a Service (the controller uses its `ObjectRef`).
pub struct Placement<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Placement<K> {
    fn clone(&self) -> Self {
        Placement {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    /// The default group (`--zone`).
    default_group: String,
    metrics: Metrics,
    /// Behind an async lock held for a whole decision, so decisions are serialized.
    book: tokio::sync::Mutex<Book<K>>,
    /// Services that found no group with room.
    waiting: std::sync::Mutex<HashSet<K>>,
}

/// Every Service placed on a group as this process knows it, and each group's use. Filled
/// at the first decision, then kept as Services are placed, seen with their group, or leave,
/// so that a decision costs no pass over every Service.
struct Book<K> {
    filled: bool,
    placed: HashMap<K, Entry<K>>,
    used: BTreeMap<String, usize>,
}

/// One Service placed on a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<K> {
    pub key: K,
    pub uid: String,
    pub group: String,
    /// The rules it needs on each loxilb of its group.
    pub rules: usize,
}

/// A Service asking where it goes.
#[derive(Debug, Clone)]
pub struct Request<K> {
    pub key: K,
    pub uid: String,
    /// The group recorded on it (`loxilb.io/zoneselect`), if any.
    pub recorded: Option<String>,
    /// It carries our finalizer, so it was served before: without a recorded group its
    /// rules are on the default group, where it stays.
    pub already_ours: bool,
    /// The rules it needs on each loxilb of its group.
    pub rules: usize,
}

/// A group as a decision sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNow {
    pub name: String,
    /// Rules each of its loxilbs holds at most.
    pub capacity: usize,
    /// One of its loxilbs answers and serves: a new Service placed there is programmed now.
    pub serving: bool,
}

impl GroupNow {
    /// The groups of the fleet now.
    pub fn of(groups: &[Group]) -> Vec<GroupNow> {
        groups
            .iter()
            .map(|g| GroupNow {
                name: g.name.clone(),
                capacity: g.capacity(),
                serving: g.instances.iter().any(|i| i.is_serving() && i.is_healthy()),
            })
            .collect()
    }
}

/// Where a Service goes, as the reconcile needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub group: String,
    /// The group is new for this Service and is to be recorded on it.
    pub record: bool,
}

impl<K: Clone + Eq + Hash> Book<K> {
    fn note(&mut self, entry: Entry<K>) {
        self.forget(&entry.key);
        *self.used.entry(entry.group.clone()).or_default() += entry.rules;
        self.placed.insert(entry.key.clone(), entry);
    }

    fn forget(&mut self, key: &K) {
        if let Some(old) = self.placed.remove(key)
            && let Some(n) = self.used.get_mut(&old.group)
        {
            *n = n.saturating_sub(old.rules);
        }
    }
}

impl<K: Clone + Eq + Hash> Placement<K> {
    pub fn new(default_group: &str, metrics: Metrics) -> Placement<K> {
        Placement {
            inner: Arc::new(Inner {
                default_group: default_group.to_string(),
                metrics,
                book: tokio::sync::Mutex::new(Book {
                    filled: false,
                    placed: HashMap::new(),
                    used: BTreeMap::new(),
                }),
                waiting: std::sync::Mutex::default(),
            }),
        }
    }

    /// The group of `req` among `groups` (module docs). `placed` lists the Services placed
    /// already (with a recorded group, or served before groups existed: the default group);
    /// it is called once, at the first decision among several groups.
    pub async fn place(
        &self,
        req: Request<K>,
        groups: &[GroupNow],
        placed: impl FnOnce() -> Vec<Entry<K>>,
    ) -> Result<Placed, PlacementError> {
        let default_group = &self.inner.default_group;
        let names: Vec<GroupRoom> = groups
            .iter()
            .map(|g| GroupRoom {
                name: g.name.clone(),
                capacity: g.capacity,
                used: 0,
            })
            .collect();
        let only_default =
            names.is_empty() || (names.len() == 1 && names[0].name == *default_group);
        let entry = |group: &str| Entry {
            key: req.key.clone(),
            uid: req.uid.clone(),
            group: group.to_string(),
            rules: req.rules,
        };
        if let Some(value) = &req.recorded {
            let group = match parse_group(value, &names) {
                Ok(group) => group,
                // Served already, on a group whose loxilbs are not known right now (at
                // start-up, before discovery or the LoxiURL resources are listed; or all
                // gone): it stays where it is, and reports its loxilbs unavailable.
                Err(PlacementError::UnknownGroup { value, .. }) if req.already_ours => value,
                Err(e) => return Err(e),
            };
            self.done_waiting(&req.key);
            if !only_default {
                let mut book = self.inner.book.lock().await;
                if book.filled {
                    book.note(entry(&group));
                }
            }
            return Ok(Placed {
                group,
                record: false,
            });
        }
        if only_default {
            // One group, the default one (or none yet): nothing to choose or record.
            return Ok(Placed {
                group: default_group.clone(),
                record: false,
            });
        }
        let mut book = self.inner.book.lock().await;
        if !book.filled {
            for e in placed() {
                book.note(e);
            }
            book.filled = true;
        }
        if req.already_ours {
            // Served before it had a group: where its rules are, the default group (or the
            // only group there is).
            let group = if names.len() == 1 {
                names[0].name.clone()
            } else {
                default_group.clone()
            };
            book.note(entry(&group));
            return Ok(Placed {
                group,
                record: true,
            });
        }
        if let Some(e) = book.placed.get(&req.key)
            && e.uid == req.uid
            && names.iter().any(|g| g.name == e.group)
        {
            // Placed by an earlier pass whose patch failed or is not in the store yet.
            return Ok(Placed {
                group: e.group.clone(),
                record: true,
            });
        }
        // A new Service goes only to a group that can program it now: one with a loxilb
        // that answers and serves (not all down, not only joining).
        let rooms: Vec<GroupRoom> = names
            .into_iter()
            .zip(groups)
            .filter(|(_, g)| g.serving)
            .map(|(g, _)| GroupRoom {
                used: book.used.get(&g.name).copied().unwrap_or(0),
                ..g
            })
            .collect();
        let decided = place(&rooms, req.rules);
        if let Ok(group) = &decided {
            book.note(entry(group));
        }
        for (group, used) in &book.used {
            self.inner.metrics.set_group_placed_rules(group, *used);
        }
        drop(book);
        match decided {
            Ok(group) => {
                self.done_waiting(&req.key);
                Ok(Placed {
                    group,
                    record: true,
                })
            }
            Err(e) => {
                self.lock_waiting().insert(req.key);
                Err(e)
            }
        }
    }

    /// Rules of the Services placed on each group, as the book counts them (empty until the
    /// first decision among several groups).
    pub async fn placed_rules(&self) -> BTreeMap<String, usize> {
        self.inner.book.lock().await.used.clone()
    }

    /// `key` left (deleted, or no longer ours): its rules no longer count. Returns the
    /// Services that were waiting for room, to try again (room may have freed); they wait no
    /// longer until they are refused again.
    pub async fn left(&self, key: &K) -> Vec<K> {
        self.inner.book.lock().await.forget(key);
        std::mem::take(&mut *self.lock_waiting())
            .into_iter()
            .collect()
    }

    fn done_waiting(&self, key: &K) {
        self.lock_waiting().remove(key);
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashSet<K>> {
        self.inner
            .waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
