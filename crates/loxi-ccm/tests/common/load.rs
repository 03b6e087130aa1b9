//! Load for the fault matrix and the soak: Services created, changed and deleted in bursts,
//! with a seeded generator so a failing run can be replayed (the seed is printed).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};

use super::{CLASS, World};

/// Requests in flight at once while creating, changing or deleting.
const PARALLEL: usize = 8;

/// A small xorshift generator: deterministic, no dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A duration in `0..max`.
    pub fn duration(&mut self, max: Duration) -> Duration {
        Duration::from_millis(self.below(max.as_millis().max(1) as u64))
    }
}

/// The Services a test made and still has.
pub struct Load {
    pub prefix: String,
    pub next: usize,
    pub live: BTreeSet<String>,
    pub rng: Rng,
}

/// The Service named `prefix-i`: port 80 for even `i` (each needs an address of its own),
/// a port of its own for odd `i` (these share addresses, as kube-loxilb would place them).
pub fn service(prefix: &str, i: usize, bump: bool) -> Service {
    let port = if i.is_multiple_of(2) {
        80
    } else {
        1000 + i as i32
    };
    let port = if bump { port + 10_000 } else { port };
    World::lb_service(&format!("{prefix}-{i}"), Some(CLASS), &[(port, "TCP")])
}

impl Load {
    pub fn new(prefix: &str, seed: u64) -> Load {
        eprintln!("load {prefix}: seed {seed}");
        Load {
            prefix: prefix.to_string(),
            next: 0,
            live: BTreeSet::new(),
            rng: Rng::new(seed),
        }
    }

    /// Creates `n` Services (without waiting for them to be served).
    pub async fn create(&mut self, world: &World, n: usize) {
        let first = self.next;
        self.next += n;
        let prefix = self.prefix.clone();
        let results: Vec<String> = futures::stream::iter(first..first + n)
            .map(|i| {
                let svc = service(&prefix, i, false);
                let prefix = prefix.clone();
                async move {
                    world.create(&svc).await;
                    format!("{prefix}-{i}")
                }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        self.live.extend(results);
    }

    fn pick(&mut self, n: usize) -> Vec<String> {
        let mut all: Vec<String> = self.live.iter().cloned().collect();
        let mut out = Vec::new();
        while out.len() < n && !all.is_empty() {
            let i = self.rng.below(all.len() as u64) as usize;
            out.push(all.swap_remove(i));
        }
        out
    }

    /// Changes the port of `n` random Services (their rules move to the new port).
    pub async fn change(&mut self, world: &World, n: usize) {
        let names = self.pick(n);
        let prefix = self.prefix.clone();
        futures::stream::iter(names)
            .map(|name| {
                let i: usize = name
                    .strip_prefix(&format!("{prefix}-"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let prefix = prefix.clone();
                async move {
                    let Some(current) = world.get(&name).await else {
                        return;
                    };
                    let now = current
                        .spec
                        .as_ref()
                        .and_then(|s| s.ports.as_ref())
                        .and_then(|p| p.first())
                        .map(|p| p.port)
                        .unwrap_or(0);
                    let bumped = now < 10_000;
                    let mut spec = service(&prefix, i, bumped).spec.unwrap();
                    spec.selector = None;
                    let patch = serde_json::json!({"spec": {"ports": spec.ports}});
                    // A conflict or a vanished Service is the churn's own business: retried
                    // by the next round.
                    let _ = world
                        .services
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<()>>()
            .await;
    }

    /// Deletes `n` random Services.
    pub async fn delete(&mut self, world: &World, n: usize) {
        let names = self.pick(n);
        for name in &names {
            self.live.remove(name);
        }
        futures::stream::iter(names)
            .map(|name| async move {
                let _ = world.services.delete(&name, &DeleteParams::default()).await;
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<()>>()
            .await;
    }

    /// One round of churn: `n` creations, `n` changes, `n / 2` deletions.
    pub async fn churn(&mut self, world: &World, n: usize) {
        self.create(world, n).await;
        self.change(world, n).await;
        self.delete(world, n / 2).await;
    }
}
