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

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use loxilb_client::{ClientConfig, LoxilbClient};
use tracing::{info, warn};

use super::Shared;
use crate::bgp::desired::{MeshMember, MeshRole};
use crate::config::Discovery;
use crate::loxilb::{Instance, Member};

/// The label the EndpointSlice controller puts on a Service's slices.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The API port of a slice's loxilbs: the slice's port numbered `default` when it lists one,
/// else its only port, else `default`.
fn api_port(slice: &EndpointSlice, default: u16) -> u16 {
    let ports: Vec<u16> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.and_then(|n| u16::try_from(n).ok()))
        .collect();
    match ports.as_slice() {
        [only] if !ports.contains(&default) => *only,
        _ => default,
    }
}

/// One ready loxilb of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    pub address: IpAddr,
    /// Its API port.
    pub port: u16,
    /// The topology zone the EndpointSlice gives it (its Node's), if any.
    pub zone: Option<String>,
}

/// The ready loxilbs of `slices` (an endpoint without a `ready` condition counts as ready,
/// as Kubernetes defines it), sorted, without duplicates.
pub fn ready_loxilbs<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    default_port: u16,
) -> Vec<Found> {
    let mut out = BTreeSet::new();
    for slice in slices {
        let port = api_port(slice, default_port);
        for ep in slice.endpoints.iter().flatten() {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready {
                continue;
            }
            out.extend(
                ep.addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .map(|address| Found {
                        address,
                        port,
                        zone: ep.zone.clone(),
                    }),
            );
        }
    }
    out.into_iter().collect()
}

/// The group of loxilbs named after topology zone `zone` (`--loxilb-discovery-zones`): the
/// zone lower-cased, other characters than letters, digits and `-` made `-`, at most 50
/// characters (`us-east-1a` stays, `Zone_A` becomes `zone-a`); `None` when nothing is left.
pub fn zone_group(zone: &str) -> Option<String> {
    let mapped: String = zone
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cut: String = mapped.trim_matches('-').chars().take(50).collect();
    let name = cut.trim_matches('-').to_string();
    loxi_domain::placement::is_group_name(&name).then_some(name)
}

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
    let by_zone = discovery.by_zone;
    follow_slices(&shared, &discovery, |found| {
        let members = found
            .into_iter()
            .map(|(url, zone)| {
                let group = zone
                    .filter(|_| by_zone)
                    .and_then(|z| zone_group(&z))
                    .unwrap_or_else(|| shared.service.settings.zone.clone());
                Member::new(&group, &url)
            })
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
    follow_slices(&shared, &discovery, |found| {
        let urls = found.into_iter().map(|(url, _)| url).collect();
        shared.members.set_peers(&shared, urls);
    })
    .await;
}

/// Watches the EndpointSlices of `discovery`'s Service; `found` gets the URLs of its ready
/// loxilbs, each with its topology zone, after every change.
async fn follow_slices(
    shared: &Shared,
    discovery: &Discovery,
    found: impl Fn(Vec<(String, Option<String>)>),
) {
    let ctx = &shared.service;
    let api: Api<EndpointSlice> = match &discovery.namespace {
        Some(ns) => Api::namespaced(ctx.kube.clone(), ns),
        None => Api::all(ctx.kube.clone()),
    };
    let selector = format!("{SERVICE_NAME_LABEL}={}", discovery.service);
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
        let slices = store.state();
        let loxilbs = ready_loxilbs(slices.iter().map(|s| s.as_ref()), discovery.port)
            .into_iter()
            .map(|f| (discovery.url(&f.address, f.port), f.zone))
            .collect();
        found(loxilbs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn ep(addr: &str, ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![addr.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_ready_addresses_count() {
        let a = EndpointSlice {
            endpoints: Some(vec![
                ep("10.0.0.2", Some(true)),
                ep("10.0.0.1", None),
                ep("10.0.0.3", Some(false)),
            ]),
            ..Default::default()
        };
        let b = EndpointSlice {
            endpoints: Some(vec![ep("10.0.0.2", Some(true)), ep("fd00::1", Some(true))]),
            ..Default::default()
        };
        let got: Vec<String> = ready_loxilbs([&a, &b].into_iter(), 11111)
            .iter()
            .map(|f| format!("{} {}", f.address, f.port))
            .collect();
        assert_eq!(got, ["10.0.0.1 11111", "10.0.0.2 11111", "fd00::1 11111"]);
    }

    #[test]
    fn topology_zones_name_groups() {
        assert_eq!(zone_group("us-east-1a").as_deref(), Some("us-east-1a"));
        assert_eq!(zone_group(" Zone_A ").as_deref(), Some("zone-a"));
        assert_eq!(zone_group("rack/7").as_deref(), Some("rack-7"));
        assert_eq!(zone_group("--").as_deref(), None);
        assert_eq!(zone_group("").as_deref(), None);
        assert_eq!(zone_group(&"z".repeat(80)).unwrap().len(), 50);
        let ep = Endpoint {
            zone: Some("rack1".into()),
            ..ep("10.0.0.1", Some(true))
        };
        let slice = EndpointSlice {
            endpoints: Some(vec![ep]),
            ..Default::default()
        };
        let found = ready_loxilbs([&slice].into_iter(), 11111);
        assert_eq!(found[0].zone.as_deref(), Some("rack1"));
    }

    #[test]
    fn the_api_port_comes_from_the_slice() {
        let with_ports = |ports: &[i32]| EndpointSlice {
            ports: Some(
                ports
                    .iter()
                    .map(|p| EndpointPort {
                        port: Some(*p),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        assert_eq!(api_port(&with_ports(&[]), 11111), 11111);
        assert_eq!(api_port(&with_ports(&[20000]), 11111), 20000);
        assert_eq!(api_port(&with_ports(&[179, 11111]), 11111), 11111);
        assert_eq!(api_port(&with_ports(&[179, 20000]), 11111), 11111);
    }
}
