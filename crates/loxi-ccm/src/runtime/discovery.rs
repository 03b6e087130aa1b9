//! Discovery of the loxilbs running in the cluster (docs/fleet.md#discovery): without
//! `--loxilb-url`, the fleet is the ready addresses of the EndpointSlices of one Service
//! (kube-loxilb's `loxilb-lb-service` by default), followed by a watch, so a loxilb that
//! starts or goes is noticed as the EndpointSlice controller writes it, not at a poll.
//!
//! A loxilb that appears joins *not serving*: the health loop probes it, gives it its roles,
//! BGP and every rule (the replay of a loxilb seen for the first time), and only then do
//! Services' passes program it and count it in their status. One that leaves is dropped with
//! what the controller knew of it.
//!
//! With BGP on, the loxilbs of a second Service (kube-loxilb's `loxilb-peer-service`) run in
//! BGP-peer-only mode (docs/fleet.md#bgp-peer-only-loxilbs): they answer 403 to every rule and
//! HA call (docs/loxilb-api.md#bgp-peer-only-mode), so they are kept apart from the fleet,
//! where nothing that programs rules or roles can reach them; the health loop gives them BGP
//! settings only. Every loxilb known here is a member of the BGP mesh ([`Members::mesh`]).
//!
//! Which loxilbs a Service's EndpointSlices name, and in which group, is decided in
//! `crate::config::sources` (`loxi-ccm check` and `audit` read the same).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use loxilb_client::{ClientConfig, LoxilbClient};
use tracing::{info, warn};

use super::Shared;
use crate::bgp::desired::{MeshMember, MeshRole};
use crate::config::Discovery;
use crate::loxilb::{Instance, Member};

/// Where fleet members come from, besides `--loxilb-url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The loxilb Service's EndpointSlices.
    Discovered,
    /// `LoxiURL` resources (`runtime::loxiurl`).
    Resources,
}

/// The fleet's members by source: the configured URLs (fixed), the discovered loxilbs and
/// the `LoxiURL` resources' URLs, each with its group. Each source replaces its own part; the
/// fleet is the union.
pub struct Members {
    configured: Vec<Member>,
    by_source: std::sync::Mutex<std::collections::BTreeMap<Source, Vec<Member>>>,
    /// Timeout, token and CA of a joining loxilb's client (the URL is set per loxilb).
    template: ClientConfig,
    /// The BGP-peer-only loxilbs (`--loxilb-peer-service`), outside the fleet (module docs).
    /// Replaced as a whole; readers work on a snapshot.
    peers: std::sync::RwLock<Arc<Vec<Arc<Instance>>>>,
}

impl Members {
    pub fn new(configured: Vec<Member>, template: ClientConfig) -> Members {
        Members {
            configured,
            by_source: std::sync::Mutex::default(),
            template,
            peers: std::sync::RwLock::default(),
        }
    }

    /// A client for the loxilb at `url` whose writes ask the write Lease first.
    fn client(&self, shared: &Shared, url: &str) -> Option<LoxilbClient> {
        let mut c = self.template.clone();
        c.url = url.to_string();
        let lease = shared.service.gate.write_lease().clone();
        match LoxilbClient::new(c) {
            Ok(client) => Some(client.with_write_gate(Arc::new(move || lease.holds()))),
            Err(e) => {
                warn!(url, error = %e, "loxilb skipped");
                None
            }
        }
    }

    /// The BGP-peer-only loxilbs now (a snapshot).
    pub fn peer_instances(&self) -> Arc<Vec<Arc<Instance>>> {
        self.peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The BGP-peer-only loxilbs are now those at `urls`: one already known is kept with
    /// what it was sent; a new one gets its BGP settings at the next health tick; one no
    /// longer listed is dropped, and the next tick removes it from the others' neighbours.
    pub fn set_peers(&self, shared: &Shared, urls: Vec<String>) {
        let mut peers = self
            .peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next: Vec<Arc<Instance>> = Vec::with_capacity(urls.len());
        for url in &urls {
            if next.iter().any(|i| i.url() == url) {
                continue;
            }
            if let Some(known) = peers.iter().find(|i| i.url() == url) {
                next.push(known.clone());
                continue;
            }
            let Some(client) = self.client(shared, url) else {
                continue;
            };
            info!(instance = %url, "BGP-peer-only loxilb joining (BGP settings only)");
            next.push(Arc::new(Instance::new(client, &shared.service.cluster)));
        }
        for old in peers
            .iter()
            .filter(|o| !next.iter().any(|n| Arc::ptr_eq(n, o)))
        {
            info!(
                instance = old.url(),
                "BGP-peer-only loxilb left: removed from the others' neighbours"
            );
            // It held no HA role; its `up` gauge goes with it.
            shared.service.report.metrics.forget_loxilb(old.url(), &[]);
        }
        *peers = Arc::new(next);
    }

    /// Every loxilb known now, with its part in the BGP mesh (docs/bgp.md) and its group: the
    /// discovered ones hold rules in the cluster, those of `--loxilb-url` and `LoxiURL`
    /// resources are configured, and the BGP-peer-only ones only peer.
    pub fn mesh(&self) -> Vec<MeshMember> {
        let mut out: Vec<MeshMember> = self
            .configured
            .iter()
            .map(|m| MeshMember::new(&m.url, MeshRole::Configured).in_group(&m.group))
            .collect();
        {
            let by_source = self
                .by_source
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (source, members) in by_source.iter() {
                let role = match source {
                    Source::Discovered => MeshRole::InCluster,
                    Source::Resources => MeshRole::Configured,
                };
                out.extend(
                    members
                        .iter()
                        .map(|m| MeshMember::new(&m.url, role).in_group(&m.group)),
                );
            }
        }
        out.extend(
            self.peer_instances()
                .iter()
                .map(|i| MeshMember::new(i.url(), MeshRole::PeerOnly)),
        );
        out
    }

    /// `source` now names `members`: the fleet's members follow (`Fleet::set_members`).
    pub fn set_grouped(&self, shared: &Arc<Shared>, source: Source, members: Vec<Member>) {
        let all: Vec<Member> = {
            let mut by_source = self
                .by_source
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            by_source.insert(source, members);
            self.configured
                .iter()
                .chain(by_source.values().flatten())
                .cloned()
                .collect()
        };
        let ctx = &shared.service;
        let changed = ctx.fleet.set_members(&all, |url| self.client(shared, url));
        for url in &changed.joined {
            info!(instance = %url, ?source, "loxilb joining (programmed before it serves)");
        }
        let left = !changed.left.is_empty();
        for inst in changed.left {
            info!(instance = inst.url(), "loxilb left the fleet: dropped");
            // It may still run (a Pod no longer ready): the roles it held move to the others
            // at the next tick, so it must not go on answering as MASTER. Then its gauges go.
            let shared = shared.clone();
            tokio::spawn(async move {
                let metrics = &shared.service.report.metrics;
                if let Some(roles) = &shared.roles {
                    roles.step_down(&inst, metrics).await;
                }
                let ha = shared.service.settings.instances_of(inst.group());
                metrics.forget_loxilb(inst.url(), &ha);
            });
        }
        if left {
            // Programmed conditions count the instances.
            ctx.requeue_all_served();
        }
    }
}

/// Follows the loxilb Service's EndpointSlices and keeps the fleet's members in step, each
/// in the default group or, with `--loxilb-discovery-zones`, its topology zone's.
pub async fn follow(shared: Arc<Shared>, discovery: Discovery) {
    follow_slices(&shared, &discovery, |slices| {
        let members = discovery
            .loxilbs(
                slices.iter().map(|s| s.as_ref()),
                &shared.service.settings.zone,
            )
            .into_iter()
            .map(|(url, group)| Member::new(&group, &url))
            .collect();
        shared
            .members
            .set_grouped(&shared, Source::Discovered, members);
    })
    .await;
}

/// Follows the BGP-peer-only loxilbs' Service (`--loxilb-peer-service`) and keeps them in
/// step (module docs).
pub async fn follow_peers(shared: Arc<Shared>, discovery: Discovery) {
    follow_slices(&shared, &discovery, |slices| {
        let urls = discovery
            .loxilbs(slices.iter().map(|s| s.as_ref()), "")
            .into_iter()
            .map(|(url, _)| url)
            .collect();
        shared.members.set_peers(&shared, urls);
    })
    .await;
}

/// Watches the EndpointSlices of `discovery`'s Service; `found` gets them all after every
/// change.
async fn follow_slices(
    shared: &Shared,
    discovery: &Discovery,
    found: impl Fn(Vec<Arc<EndpointSlice>>),
) {
    let api = discovery.slices_api(&shared.service.kube);
    let selector = discovery.selector();
    let (store, writer) = reflector::store::<EndpointSlice>();
    let events = reflector(
        writer,
        watcher(api, watcher::Config::default().labels(&selector)),
    )
    .default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_) | watcher::Event::Init) => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(service = %discovery.service, error = %e, "watching the loxilb Service's EndpointSlices");
                continue;
            }
        }
        found(store.state());
    }
}
