//! The fleet's members by source (docs/fleet.md): the loxilbs of `--loxilb-url` (fixed), the
//! ones found in the cluster (`super::discovery`), those kube-loxilb's `LoxiURL` resources
//! name (`super::loxiurl`), each with its group, and the BGP-peer-only loxilbs
//! (`--loxilb-peer-service`, docs/fleet.md#bgp-peer-only-loxilbs). Each source replaces its
//! own part; the fleet's instances (`crate::loxilb::Fleet`) are the union of the first three.
//!
//! The BGP-peer-only loxilbs answer 403 to every rule and HA call
//! (docs/loxilb-api.md#bgp-peer-only-mode), so they are kept apart from the fleet's
//! instances, where nothing that programs rules or roles can reach them; their workers give
//! them BGP settings only. Every loxilb known here is a member of the BGP mesh
//! ([`Members::mesh`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use loxi_domain::ClusterId;
use loxilb_client::{ClientConfig, ClientError, LoxilbClient};
use tracing::warn;

use crate::bgp::desired::{MeshMember, MeshRole};
use crate::leader::WriteLease;
use crate::loxilb::{Fleet as Instances, Instance, Member};

/// A loxilb client whose every write asks `lease` first, at the moment it is sent
/// (docs/architecture.md#leader-election).
pub fn gated_client(config: ClientConfig, lease: &WriteLease) -> Result<LoxilbClient, ClientError> {
    let lease = lease.clone();
    Ok(LoxilbClient::new(config)?.with_write_gate(Arc::new(move || lease.holds())))
}

/// Where a member comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// `--loxilb-url`: fixed for the life of the process.
    Configured,
    /// The loxilb Service's EndpointSlices (`super::discovery`).
    Discovered,
    /// `LoxiURL` resources (`super::loxiurl`).
    LoxiURL,
    /// The BGP-peer-only loxilbs' Service: BGP settings only, outside the fleet's instances.
    PeerOnly,
}

impl Source {
    /// Its members' part in the BGP mesh (docs/bgp.md): the discovered ones hold rules in the
    /// cluster, those of `--loxilb-url` and `LoxiURL` resources are configured, and the
    /// BGP-peer-only ones only peer.
    fn mesh_role(self) -> MeshRole {
        match self {
            Source::Configured | Source::LoxiURL => MeshRole::Configured,
            Source::Discovered => MeshRole::InCluster,
            Source::PeerOnly => MeshRole::PeerOnly,
        }
    }
}

/// What a change of one source did.
#[derive(Default)]
pub struct Changed {
    /// URLs of the loxilbs that joined.
    pub joined: Vec<String>,
    /// The loxilbs that left.
    pub left: Vec<Arc<Instance>>,
}

/// The members by source, and the instances made for them (module docs).
pub struct Members {
    /// The members of the fleet's sources (the BGP-peer-only ones are `peers`).
    by_source: Mutex<BTreeMap<Source, Vec<Member>>>,
    /// The fleet's instances: every member but the BGP-peer-only ones.
    instances: Instances,
    /// The BGP-peer-only loxilbs' instances. Replaced as a whole; readers work on a snapshot.
    peers: RwLock<Arc<Vec<Arc<Instance>>>>,
    /// Timeout, token and CA of a joining loxilb's client (the URL is set per loxilb).
    template: ClientConfig,
    /// Asked by every write of a joining loxilb's client.
    lease: WriteLease,
    cluster: ClusterId,
}

impl Members {
    /// `instances` are the configured members (`--loxilb-url`).
    pub fn new(
        instances: Instances,
        template: ClientConfig,
        lease: WriteLease,
        cluster: &ClusterId,
    ) -> Members {
        let configured = instances
            .instances()
            .iter()
            .map(|i| Member::new(i.group(), i.url()))
            .collect();
        Members {
            by_source: Mutex::new(BTreeMap::from([(Source::Configured, configured)])),
            instances,
            peers: RwLock::default(),
            template,
            lease,
            cluster: cluster.clone(),
        }
    }

    /// The fleet's instances (a cheap handle).
    pub fn instances(&self) -> &Instances {
        &self.instances
    }

    /// The BGP-peer-only loxilbs now (a snapshot).
    pub fn peer_instances(&self) -> Arc<Vec<Arc<Instance>>> {
        self.peers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A client for the loxilb at `url` whose writes ask the write Lease first.
    fn client(&self, url: &str) -> Option<LoxilbClient> {
        let mut c = self.template.clone();
        c.url = url.to_string();
        match gated_client(c, &self.lease) {
            Ok(client) => Some(client),
            Err(e) => {
                warn!(url, error = %e, "loxilb skipped");
                None
            }
        }
    }

    /// Every loxilb known now, with its part in the BGP mesh and its group.
    pub fn mesh(&self) -> Vec<MeshMember> {
        let mut out: Vec<MeshMember> = {
            let by_source = self
                .by_source
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            by_source
                .iter()
                .flat_map(|(source, members)| {
                    members
                        .iter()
                        .map(|m| MeshMember::new(&m.url, source.mesh_role()).in_group(&m.group))
                })
                .collect()
        };
        out.extend(
            self.peer_instances()
                .iter()
                .map(|i| MeshMember::new(i.url(), MeshRole::PeerOnly)),
        );
        out
    }

    /// `source` now names `members`. Those of the fleet's sources become the instances'
    /// members (`crate::loxilb::Fleet::set_members`: a new one joins not serving); the
    /// BGP-peer-only ones replace the peer instances (one already known is kept with what it
    /// was sent). `Source::Configured` is fixed: nothing changes.
    pub fn set(&self, source: Source, members: Vec<Member>) -> Changed {
        match source {
            Source::Configured => Changed::default(),
            Source::PeerOnly => self.set_peers(members.into_iter().map(|m| m.url).collect()),
            Source::Discovered | Source::LoxiURL => {
                let all: Vec<Member> = {
                    let mut by_source = self
                        .by_source
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    by_source.insert(source, members);
                    by_source.values().flatten().cloned().collect()
                };
                let changed = self.instances.set_members(&all, |url| self.client(url));
                Changed {
                    joined: changed.joined,
                    left: changed.left,
                }
            }
        }
    }

    fn set_peers(&self, urls: Vec<String>) -> Changed {
        let mut peers = self.peers.write().unwrap_or_else(PoisonError::into_inner);
        let mut changed = Changed::default();
        let mut next: Vec<Arc<Instance>> = Vec::with_capacity(urls.len());
        for url in &urls {
            if next.iter().any(|i| i.url() == url) {
                continue;
            }
            if let Some(known) = peers.iter().find(|i| i.url() == url) {
                next.push(known.clone());
                continue;
            }
            let Some(client) = self.client(url) else {
                continue;
            };
            changed.joined.push(url.clone());
            next.push(Arc::new(Instance::new(client, &self.cluster)));
        }
        changed.left = peers
            .iter()
            .filter(|o| !next.iter().any(|n| Arc::ptr_eq(n, o)))
            .cloned()
            .collect();
        *peers = Arc::new(next);
        changed
    }
}
