//! Discovery of the loxilbs running in the cluster (docs/fleet.md#discovery): without
//! `--loxilb-url`, the fleet is the ready addresses of the EndpointSlices of one Service
//! (kube-loxilb's `loxilb-lb-service` by default), followed by a watch, so a loxilb that
//! starts or goes is noticed as the EndpointSlice controller writes it, not at a poll.
//!
//! A loxilb that appears joins *not serving*: its worker probes it, gives it its roles, BGP
//! and every rule (the replay of a loxilb seen for the first time), and only then do
//! Services' passes program it and count it in their status. One that leaves is dropped with
//! what the controller knew of it ([`Fleet::set_source`]).
//!
//! With BGP on, the loxilbs of a second Service (kube-loxilb's `loxilb-peer-service`) run in
//! BGP-peer-only mode (docs/fleet.md#bgp-peer-only-loxilbs): they are members of their own
//! source, `Source::PeerOnly`, kept apart from the fleet's instances (`super::members`).
//!
//! Which loxilbs a Service's EndpointSlices name, and in which group, is decided in
//! `crate::config::sources` (`loxi-ccm check` and `audit` read the same).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tracing::warn;

use super::{Fleet, Source};
use crate::config::Discovery;
use crate::loxilb::Member;

/// Follows the loxilb Service's EndpointSlices and keeps the fleet's members in step, each
/// in the default group (`zone`) or, with `--loxilb-discovery-zones`, its topology zone's.
pub async fn follow(fleet: Fleet, kube: kube::Client, discovery: Discovery, zone: String) {
    follow_slices(&kube, &discovery, |slices| {
        let members = discovery
            .loxilbs(slices.iter().map(|s| s.as_ref()), &zone)
            .into_iter()
            .map(|(url, group)| Member::new(&group, &url))
            .collect();
        fleet.set_source(Source::Discovered, members);
    })
    .await;
}

/// Follows the BGP-peer-only loxilbs' Service (`--loxilb-peer-service`) and keeps them in
/// step (module docs).
pub async fn follow_peers(fleet: Fleet, kube: kube::Client, discovery: Discovery) {
    follow_slices(&kube, &discovery, |slices| {
        let members = discovery
            .loxilbs(slices.iter().map(|s| s.as_ref()), "")
            .into_iter()
            .map(|(url, group)| Member::new(&group, &url))
            .collect();
        fleet.set_source(Source::PeerOnly, members);
    })
    .await;
}

/// Watches the EndpointSlices of `discovery`'s Service; `found` gets them all after every
/// change.
async fn follow_slices(
    kube: &kube::Client,
    discovery: &Discovery,
    found: impl Fn(Vec<Arc<EndpointSlice>>),
) {
    let api = discovery.slices_api(kube);
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
