//! The loxilb fleet as a whole (docs/fleet.md): its members by source (`members`: the
//! configured loxilbs, the discovered ones (`discovery`), those of `LoxiURL` resources
//! (`loxiurl`) and the BGP-peer-only ones), the groups and the placement book
//! (`placement`), the HA roles and their record (`roles`), the fleet record (`record`), one
//! worker per loxilb that probes it, replays it and keeps its BGP in step (`workers`), and
//! the health tick that follows them (`health`).
//!
//! Its state is behind the [`Fleet`] handle; the rest of the controller reaches it through
//! that handle's methods: the sources call [`Fleet::set_source`], the Service reconcile asks
//! the placement book ([`Fleet::placement`]) and reads the instances ([`Fleet::instances`]),
//! and learns from [`Fleet::replans`] when every Service should be planned again.
//! Everything runs without an API server too (crates/loxi-ccm/tests/fleet_alone.rs): the
//! records are kept through `record::Record`, the rules of a replay come from the caller
//! (`workers::Replay`), and only the followers of the sources watch the cluster.

pub mod discovery;
mod health;
pub mod loxiurl;
pub mod members;
pub mod placement;
pub mod record;
pub mod roles;
pub mod workers;

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::ClusterId;
use loxilb_client::ClientConfig;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::info;

pub use members::Source;

use self::members::Members;
use self::placement::Placement;
use self::record::{FleetRecord, Record};
use self::roles::Roles;
use self::workers::{Replay, Workers};
use crate::bgp::Bgp;
use crate::leader::Gate;
use crate::loxilb::{Fleet as Instances, Instance, Member};
use crate::metrics::Metrics;

/// What the fleet is made with.
pub struct Settings {
    pub cluster: ClusterId,
    pub metrics: Metrics,
    /// How often each loxilb is probed and the health tick runs (`--health-interval`).
    pub interval: Duration,
    /// The default group (`--zone`).
    pub zone: String,
    /// HA instances per group (`--num-zone-instances`).
    pub zone_instances: u16,
    /// Timeout, token and CA of a joining loxilb's client (the URL is set per loxilb).
    pub template: ClientConfig,
    /// `None`: BGP off.
    pub bgp: Option<Arc<Bgp>>,
    /// `None`: no HA roles (`--set-roles` unset).
    pub roles: Option<Arc<Roles>>,
    /// Where the fleet record is kept (`record`).
    pub record: Arc<dyn Record>,
}

/// The fleet's handle: a cheap clone, every clone the same fleet.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    members: Members,
    placement: Placement<ObjectRef<Service>>,
    record: FleetRecord,
    gate: Arc<Gate>,
    /// Counts the changes after which every served Service is planned again (a loxilb left,
    /// one changed state, the `LoxiURL` pools changed).
    replans: watch::Sender<u64>,
    /// The workers of [`Fleet::start`] while they run: a loxilb that leaves has its worker
    /// stopped there ([`Fleet::depart`]).
    workers: Mutex<Weak<Workers>>,
}

impl Fleet {
    /// The fleet of `configured` (the instances of `--loxilb-url`); the other sources add
    /// theirs with [`Fleet::set_source`]. Loxilb writes of joining loxilbs ask `gate`'s
    /// write Lease; nothing is decided or written before `gate` is ready.
    pub fn new(settings: Settings, configured: Instances, gate: Arc<Gate>) -> Fleet {
        let members = Members::new(
            configured,
            settings.template.clone(),
            gate.write_lease().clone(),
            &settings.cluster,
        );
        Fleet {
            inner: Arc::new(Inner {
                placement: Placement::new(&settings.zone, settings.metrics.clone()),
                record: FleetRecord::new(settings.record.clone()),
                members,
                settings,
                gate,
                replans: watch::Sender::new(0),
                workers: Mutex::default(),
            }),
        }
    }

    /// The fleet's instances now (every member but the BGP-peer-only loxilbs).
    pub fn instances(&self) -> Instances {
        self.inner.members.instances().clone()
    }

    /// The placement book (a cheap handle).
    pub fn placement(&self) -> Placement<ObjectRef<Service>> {
        self.inner.placement.clone()
    }

    /// The BGP-peer-only loxilbs now (a snapshot).
    pub fn peer_instances(&self) -> Arc<Vec<Arc<crate::loxilb::Instance>>> {
        self.inner.members.peer_instances()
    }

    /// Changes after which every served Service should be planned again: its conditions
    /// name the unreachable loxilbs and count the serving ones, and, with BGP on, a pool's
    /// advertisement decides its rules' flag.
    pub fn replans(&self) -> watch::Receiver<u64> {
        self.inner.replans.subscribe()
    }

    fn replan(&self) {
        self.inner.replans.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// `source` now names `members`: a loxilb that joins is programmed before it serves (its
    /// worker replays it at the next health tick); one that leaves is dropped with what the
    /// controller knew of it ([`Fleet::depart`]), and every Service is planned again (their
    /// conditions count the instances). A BGP-peer-only loxilb that leaves is removed from
    /// the others' neighbours at the next tick.
    pub fn set_source(&self, source: Source, members: Vec<Member>) {
        let changed = self.inner.members.set(source, members);
        let peer_only = source == Source::PeerOnly;
        for url in &changed.joined {
            if peer_only {
                info!(instance = %url, "BGP-peer-only loxilb joining (BGP settings only)");
            } else {
                info!(instance = %url, ?source, "loxilb joining (programmed before it serves)");
            }
        }
        let left = !changed.left.is_empty();
        for inst in changed.left {
            if peer_only {
                info!(
                    instance = inst.url(),
                    "BGP-peer-only loxilb left: removed from the others' neighbours"
                );
            } else {
                info!(instance = inst.url(), "loxilb left the fleet: dropped");
            }
            tokio::spawn(self.clone().depart(inst, peer_only));
        }
        if left && !peer_only {
            self.replan();
        }
    }

    /// A loxilb that left, in this order: its worker stopped (and waited for: no probe,
    /// replay or post of it finishes later), told `BACKUP` for the roles it held (it may
    /// still run: a Pod no longer ready; the roles move to the others at the next tick),
    /// retired (nothing posts roles to it or sets its gauges any more), and then its gauges
    /// (BGP sessions included) forgotten, which therefore stay forgotten.
    async fn depart(self, inst: Arc<Instance>, peer_only: bool) {
        let workers = self
            .inner
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade();
        if let Some(workers) = workers {
            workers.stop_worker(&inst).await;
        }
        let settings = &self.inner.settings;
        if let Some(roles) = &settings.roles {
            roles.step_down(&inst, &settings.metrics).await;
        }
        inst.retire().await;
        // The same URL may have joined again (another group, or the BGP-peer-only source):
        // that member's worker sets those gauges now.
        let members = self.inner.members.instances().instances();
        let peers = self.inner.members.peer_instances();
        let now = members
            .iter()
            .map(|i| (Some(i.group()), i.url()))
            .chain(peers.iter().map(|i| (None, i.url())));
        let group = (!peer_only).then(|| inst.group());
        let forget = Forget::of(inst.url(), group, settings.zone_instances, now);
        if forget.instance {
            settings.metrics.forget_loxilb(inst.url());
            if let Some(bgp) = &settings.bgp {
                bgp.loxilb_left(inst.url());
            }
        }
        settings
            .metrics
            .forget_ha_roles(inst.url(), &forget.ha_instances);
    }

    /// Starts the workers (each loxilb's replay made by `replay`), the health tick and, with
    /// HA roles, the role decisions; they run until the returned value is dropped.
    pub fn start(&self, replay: Replay) -> Running {
        let settings = &self.inner.settings;
        let workers = Workers::new(workers::Settings {
            cluster: settings.cluster.clone(),
            metrics: settings.metrics.clone(),
            interval: settings.interval,
            bgp: settings.bgp.clone(),
            roles: settings.roles.clone(),
            replay,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(health::run(self.clone(), workers.clone()));
        if let Some(roles) = &settings.roles {
            let reach = workers.clone();
            tasks.spawn(roles.clone().run(
                self.instances(),
                workers.changes(),
                move || reach.bgp_reach(),
                self.inner.gate.clone(),
                settings.metrics.clone(),
                settings.interval,
            ));
        }
        *self
            .inner
            .workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&workers);
        Running {
            workers,
            _tasks: tasks,
        }
    }
}

/// The gauges of a loxilb that left to forget (`Metrics::forget_loxilb`,
/// `Metrics::forget_ha_roles`).
#[derive(Debug, PartialEq, Eq)]
struct Forget {
    /// Those of its URL (up, rules, capacity, write window).
    instance: bool,
    /// Its role series for these HA instances.
    ha_instances: Vec<String>,
}

impl Forget {
    /// For the loxilb at `url` that left `group` (`None`: a BGP-peer-only one, which holds
    /// no HA role), with the members now as (group, URL) (`None`: BGP-peer-only). The gauges
    /// of its URL stay when the URL is a member again (it moved to another group in the same
    /// change, or joined again since): that member sets them. Its role series in `group`
    /// stay only when the URL is a member of `group` again.
    fn of<'a>(
        url: &str,
        group: Option<&str>,
        zone_instances: u16,
        now: impl Iterator<Item = (Option<&'a str>, &'a str)>,
    ) -> Forget {
        let mut instance = true;
        let mut ha = true;
        for (g, _) in now.filter(|(_, u)| *u == url) {
            instance = false;
            ha &= g != group;
        }
        let ha_instances = match group {
            Some(group) if ha => loxi_domain::roles::instance_names(group, zone_instances),
            _ => Vec::new(),
        };
        Forget {
            instance,
            ha_instances,
        }
    }
}

/// The fleet's workers and loops, stopped when dropped: a stopped controller must not keep
/// probing, replaying or repairing from frozen stores.
pub struct Running {
    workers: Arc<Workers>,
    _tasks: JoinSet<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.workers.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::Forget;

    #[test]
    fn a_loxilb_that_left_has_only_the_gauges_no_member_sets_now_forgotten() {
        let ha = |g: &str| loxi_domain::roles::instance_names(g, 2);
        let of = |group, now: &[(Option<&'static str>, &'static str)]| {
            Forget::of("http://a", group, 2, now.iter().copied())
        };
        let other = (Some("llb"), "http://b");
        // Gone for good: every gauge of it.
        assert_eq!(
            of(Some("llb"), &[other]),
            Forget {
                instance: true,
                ha_instances: ha("llb")
            }
        );
        // Moved to another group: its URL's gauges stay (the new member sets them), its
        // roles in the group it left go.
        assert_eq!(
            of(Some("llb"), &[other, (Some("east"), "http://a")]),
            Forget {
                instance: false,
                ha_instances: ha("llb")
            }
        );
        // Back in the same group already: nothing goes.
        assert_eq!(
            of(Some("llb"), &[(Some("llb"), "http://a")]),
            Forget {
                instance: false,
                ha_instances: vec![]
            }
        );
        // Now BGP-peer-only: no role there, so its old roles go.
        assert_eq!(
            of(Some("llb"), &[(None, "http://a")]),
            Forget {
                instance: false,
                ha_instances: ha("llb")
            }
        );
        // A BGP-peer-only loxilb held no role.
        assert_eq!(
            of(None, &[other]),
            Forget {
                instance: true,
                ha_instances: vec![]
            }
        );
    }
}
