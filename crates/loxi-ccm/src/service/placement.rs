//! Which group of loxilbs a Service goes to (docs/fleet.md#groups-and-placement): the group
//! its `loxilb.io/zoneselect` names, else, with several groups, the one with the most room
//! (`loxi_domain::placement`), recorded in that annotation with the finalizer so that it never
//! moves. A Service no group has room for waits, with a condition saying so, and is re-queued
//! when a Service leaves.
//!
//! Room is counted in rules of the Services placed on each group (a book filled from the
//! store's recorded groups at the first decision, then kept as Services are placed and
//! leave): decisions are serialized, so Services created together never overfill a group. Rules of other owners on a loxilb are not counted here; the loxilb
//! subsystem's own capacity check still holds a Service back if they fill a table
//! (`crate::loxilb`, `CapacityExceeded`).

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::placement::{GroupRoom, PlacementError, parse_group, place};

use super::context::{Context, recorded_group};

/// The placement book and the Services waiting for room.
#[derive(Default)]
pub struct Placement {
    /// Behind an async lock held for a whole decision, so decisions are serialized.
    book: tokio::sync::Mutex<Book>,
    /// Services that found no group with room.
    waiting: std::sync::Mutex<HashSet<ObjectRef<Service>>>,
}

/// Every Service placed on a group as this process knows it, and each group's use. Filled
/// from the store at the first decision, then kept as Services are placed, seen with their
/// group, or leave, so that a decision costs no pass over every Service.
#[derive(Default)]
struct Book {
    filled: bool,
    placed: HashMap<ObjectRef<Service>, Entry>,
    used: BTreeMap<String, usize>,
}

struct Entry {
    uid: String,
    group: String,
    rules: usize,
}

impl Book {
    fn note(&mut self, key: ObjectRef<Service>, uid: String, group: &str, rules: usize) {
        self.forget(&key);
        *self.used.entry(group.to_string()).or_default() += rules;
        self.placed.insert(
            key,
            Entry {
                uid,
                group: group.to_string(),
                rules,
            },
        );
    }

    fn forget(&mut self, key: &ObjectRef<Service>) {
        if let Some(old) = self.placed.remove(key)
            && let Some(n) = self.used.get_mut(&old.group)
        {
            *n = n.saturating_sub(old.rules);
        }
    }

    /// The Services of the store placed on a group: with a recorded group, or served before
    /// groups existed (the default group).
    fn fill(&mut self, ctx: &Context) {
        for other in ctx.inputs.services.state() {
            if !ctx.selection.serves(&other) || other.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let group = match recorded_group(&other) {
                Some(g) => g.to_string(),
                None if !ctx.selection.our_finalizers(&other).is_empty() => {
                    ctx.settings.zone.clone()
                }
                None => continue,
            };
            self.note(
                ObjectRef::from_obj(&*other),
                other.uid().unwrap_or_default(),
                &group,
                rules_needed(&other),
            );
        }
        self.filled = true;
    }
}

/// Where a Service goes, as the reconcile needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub group: String,
    /// The group is new for this Service and is to be recorded on it.
    pub record: bool,
}

impl Placement {
    /// The group of `svc` (module docs). `already_ours`: it carries our finalizer, so it was
    /// served before; without a recorded group its rules are on the default group, where it
    /// stays.
    pub async fn place(
        &self,
        svc: &Service,
        ctx: &Context,
        already_ours: bool,
    ) -> Result<Placed, PlacementError> {
        let settings = &ctx.settings;
        let groups = ctx.fleet.groups();
        let names: Vec<GroupRoom> = groups
            .iter()
            .map(|g| GroupRoom {
                name: g.name.clone(),
                capacity: g.capacity(),
                used: 0,
            })
            .collect();
        let only_default = names.is_empty() || (names.len() == 1 && names[0].name == settings.zone);
        let key = ObjectRef::from_obj(svc);
        let uid = svc.uid().unwrap_or_default();
        if let Some(value) = recorded_group(svc) {
            let group = match parse_group(value, &names) {
                Ok(group) => group,
                // Served already, on a group whose loxilbs are not known right now (at
                // start-up, before discovery or the LoxiURL resources are listed; or all
                // gone): it stays where it is, and reports its loxilbs unavailable.
                Err(PlacementError::UnknownGroup { value, .. }) if already_ours => value,
                Err(e) => return Err(e),
            };
            self.done_waiting(svc);
            if !only_default {
                let mut book = self.book.lock().await;
                if book.filled {
                    book.note(key, uid, &group, rules_needed(svc));
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
                group: settings.zone.clone(),
                record: false,
            });
        }
        let mut book = self.book.lock().await;
        if !book.filled {
            book.fill(ctx);
        }
        if already_ours {
            // Served before it had a group: where its rules are, the default group (or the
            // only group there is).
            let group = if names.len() == 1 {
                names[0].name.clone()
            } else {
                settings.zone.clone()
            };
            book.note(key, uid, &group, rules_needed(svc));
            return Ok(Placed {
                group,
                record: true,
            });
        }
        if let Some(entry) = book.placed.get(&key)
            && entry.uid == uid
            && names.iter().any(|g| g.name == entry.group)
        {
            // Placed by an earlier pass whose patch failed or is not in the store yet.
            return Ok(Placed {
                group: entry.group.clone(),
                record: true,
            });
        }
        // A new Service goes only to a group that can program it now: one with a loxilb
        // that answers and serves (not all down, not only joining).
        let rooms: Vec<GroupRoom> = names
            .into_iter()
            .zip(&groups)
            .filter(|(_, g)| g.instances.iter().any(|i| i.is_serving() && i.is_healthy()))
            .map(|(g, _)| GroupRoom {
                used: book.used.get(&g.name).copied().unwrap_or(0),
                ..g
            })
            .collect();
        let needed = rules_needed(svc);
        let decided = place(&rooms, needed);
        if let Ok(group) = &decided {
            book.note(key.clone(), uid, group, needed);
        }
        for (group, used) in &book.used {
            ctx.report.metrics.set_group_placed_rules(group, *used);
        }
        drop(book);
        match decided {
            Ok(group) => {
                self.done_waiting(svc);
                Ok(Placed {
                    group,
                    record: true,
                })
            }
            Err(e) => {
                self.lock_waiting().insert(key);
                Err(e)
            }
        }
    }

    /// Rules of the Services placed on each group, as the book counts them (empty until the
    /// first decision among several groups).
    pub async fn placed_rules(&self) -> BTreeMap<String, usize> {
        self.book.lock().await.used.clone()
    }

    /// `svc` left (deleted, or no longer ours): its rules no longer count, and the Services
    /// waiting for room are re-queued, since room may have freed.
    pub async fn service_left(&self, svc: &Service, ctx: &Context) {
        self.book.lock().await.forget(&ObjectRef::from_obj(svc));
        let waiting = std::mem::take(&mut *self.lock_waiting());
        for key in waiting {
            let _ = ctx.requeue.send(key);
        }
    }

    fn done_waiting(&self, svc: &Service) {
        self.lock_waiting().remove(&ObjectRef::from_obj(svc));
    }

    fn lock_waiting(&self) -> std::sync::MutexGuard<'_, HashSet<ObjectRef<Service>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The rules a Service needs on its group's loxilbs: one per port (TCP, UDP, SCTP) and
/// address family it asks for. Counted from the spec, before it has an address.
pub fn rules_needed(svc: &Service) -> usize {
    let ports = crate::ipam::service_ports(svc).len().max(1);
    let spec = svc.spec.as_ref();
    let dual = spec
        .and_then(|s| s.ip_family_policy.as_deref())
        .is_some_and(|p| p == "RequireDualStack" || p == "PreferDualStack")
        && spec
            .and_then(|s| s.ip_families.as_ref())
            .is_some_and(|f| f.len() > 1);
    ports * if dual { 2 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(ports: &[(i32, &str)], policy: Option<&str>, families: &[&str]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, proto)| ServicePort {
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ip_family_policy: policy.map(str::to_string),
                ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn one_rule_per_port_and_family() {
        assert_eq!(
            rules_needed(&svc(&[(80, "TCP"), (443, "TCP")], None, &["IPv4"])),
            2
        );
        assert_eq!(
            rules_needed(&svc(
                &[(80, "TCP"), (53, "UDP")],
                Some("RequireDualStack"),
                &["IPv4", "IPv6"]
            )),
            4
        );
        assert_eq!(
            rules_needed(&svc(&[(80, "TCP")], Some("SingleStack"), &["IPv6"])),
            1
        );
        assert_eq!(rules_needed(&svc(&[], None, &[])), 1);
    }
}
