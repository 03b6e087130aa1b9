//! The helpers of the fault matrix (`fault_matrix.rs`, `fault_matrix_addresses.rs`): the
//! load, its seed and size, the waits on a converged, clean world. Included with `#[path]` by
//! the test files that use it only.

#![allow(dead_code)]

use std::time::Duration;

use crate::common::load::Load;
use crate::common::{Options, World};
use k8s_openapi::api::core::v1::Service;
use kube::api::ListParams;
use loxilb_sim::SimConfig;

/// How long loxilb stays down at least: 10 s, a third of the 30 s the issue names (the
/// 30 s outage is `programming.rs`'s test); enough for the controller's retries to back off
/// and its health loop to see the instance down.
pub const DOWN: Duration = Duration::from_secs(10);

/// Generous: the machine is shared, and a settle includes the controller's backoff.
pub const SETTLE: Duration = Duration::from_secs(120);

pub fn services() -> usize {
    std::env::var("LOXI_FAULT_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

pub fn seed() -> u64 {
    std::env::var("LOXI_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// Drift checks (and claim collection) every 2 s, so that repairs behind the controller's
/// back are quick.
pub fn opts() -> Options {
    Options {
        drift: "2s",
        ..Options::default()
    }
}

/// A world with two Ready Nodes, `services()` Services served and a clean audit.
pub async fn loaded(name: &str, opts: &Options, sim: SimConfig) -> (World, Load) {
    let world = World::with_sim(name, opts.clone(), sim).await;
    world.add_node(&format!("{name}-n1"), "10.0.0.1").await;
    world.add_node(&format!("{name}-n2"), "10.0.0.2").await;
    let mut load = Load::new(name, seed());
    load.create(&world, services()).await;
    let took = world.settle_programmed(opts, SETTLE).await;
    eprintln!("{name}: {} Services served in {took:?}", services());
    (world, load)
}

pub fn report(fault: &str, took: Duration) {
    eprintln!("RECOVERY {fault}: {:.1}s", took.as_secs_f64());
}

pub fn round() -> usize {
    (services() / 4).max(2)
}

pub fn condition_is(svc: &Service, type_: &str, status: &str, reason: &str) -> bool {
    World::condition(svc, type_).is_some_and(|c| c.0 == status && c.1 == reason)
}

pub fn programmed(svc: &Service) -> bool {
    svc.metadata.deletion_timestamp.is_none()
        && World::condition(svc, "loxilb.io/Programmed").is_some_and(|c| c.0 == "True")
}

/// The namespace's Services not being deleted; `None` when the list fails (a wait retries).
pub async fn live_services(world: &World) -> Option<Vec<Service>> {
    let list = world.services.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .collect(),
    )
}

pub fn shows_address(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}
