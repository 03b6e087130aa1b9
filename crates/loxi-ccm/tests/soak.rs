//! The soak (docs/RELIABILITY.md#soak): the `loxi-ccm` binary under continuous churn with a
//! random fault from the matrix in every round; after each round, once everything is served
//! again (a quiet point), the auditor must report no violation. The controller's resident
//! memory (VmRSS) is sampled at every quiet point and must stay flat.
//!
//! Two tests: `soak_with_random_faults_stays_clean` is the CI version (120 s), and
//! `soak_long` (ignored: `cargo test -p loxi-ccm --test soak -- --ignored`) the 30-minute
//! run of docs/RELIABILITY.md. `LOXI_SOAK_SECS` sets the duration of either; `LOXI_SOAK_SEED`
//! replays a run (as far as timing allows). The controller is never killed here (its memory
//! is what is watched; `fault_matrix.rs` kills it), and watch connections are cut by the API
//! server restarts.

mod common;

use std::time::{Duration, Instant};

use common::load::{Load, Rng};
use common::{Options, World, control_plane};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use loxi_ccm::ipam::claims::AddressClaim;
use loxilb_client::{ClientConfig, LoxilbClient};
use loxilb_sim::Fault;
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(180);

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy)]
enum Injected {
    LoxilbDown,
    LoxilbRestarted,
    Loxilb5xx,
    LoxilbLatency,
    RuleDeleted,
    ClaimDeleted,
    StatusRewritten,
    ApiServerRestarted,
}

const FAULTS: [Injected; 8] = [
    Injected::LoxilbDown,
    Injected::LoxilbRestarted,
    Injected::Loxilb5xx,
    Injected::LoxilbLatency,
    Injected::RuleDeleted,
    Injected::ClaimDeleted,
    Injected::StatusRewritten,
    Injected::ApiServerRestarted,
];

/// The CI version: 2 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_random_faults_stays_clean() {
    soak(secs_or(120)).await;
}

/// The long run (30 minutes by default), not part of CI.
#[ignore = "30 minutes; run with -- --ignored"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_long() {
    soak(secs_or(1800)).await;
}

/// `LOXI_SOAK_SECS`, else `default`.
fn secs_or(default: u64) -> u64 {
    std::env::var("LOXI_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn soak(secs: u64) {
    let seed: u64 = std::env::var("LOXI_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let opts = Options {
        drift: "2s",
        ..Options::default()
    };
    let mut world = World::with("soak", opts.clone()).await;
    // The binary instead of the in-process controller: its memory is measured alone.
    world.stop_controller().await;
    let log = control_plane().dir().join("soak-controller.log");
    // Kept after the run (the control plane's directory outlives the test process).
    eprintln!("soak: controller log in {}", log.display());
    let _ = std::fs::remove_file(&log);
    // Restarted when it gives up a lost leadership, as in a cluster (an API server restart
    // that outlasts the Lease's renew deadline on a loaded machine ends the leader on purpose).
    let controller = world.spawn_supervised(&opts, &log);
    let pid = controller.pid();
    world.add_node("soak-n1", "10.0.0.1").await;
    world.add_node("soak-n2", "10.0.0.2").await;
    let mut load = Load::new("soak", seed);
    let mut rng = Rng::new(seed ^ 0x5eed);
    load.create(&world, 30).await;
    world.settle_programmed(&opts, SETTLE).await;
    let mut rss_start = rss_kib(pid);
    let mut pid = pid;
    let loxilb = LoxilbClient::new(ClientConfig::new(&world.sim.url())).unwrap();
    let claims: Api<AddressClaim> = Api::all(world.client.clone());

    let started = Instant::now();
    let mut rounds = 0;
    let mut worst = Duration::ZERO;
    let mut rss_max = rss_start;
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    while started.elapsed() < Duration::from_secs(secs) {
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        *seen.entry(format!("{fault:?}")).or_default() += 1;
        match fault {
            Injected::LoxilbDown => {
                world.sim.go_down().await;
                load.churn(&world, 6).await;
                world.sim.come_up().await.unwrap();
            }
            Injected::LoxilbRestarted => {
                world.sim.restart();
                load.churn(&world, 6).await;
            }
            Injected::Loxilb5xx => {
                world.sim.set_fault(Some(Fault {
                    status: 500,
                    rate: 0.5,
                    only_writes: false,
                }));
                load.churn(&world, 6).await;
                tokio::time::sleep(rng.duration(Duration::from_secs(2))).await;
                world.sim.set_fault(None);
            }
            Injected::LoxilbLatency => {
                world.sim.set_latency(Duration::from_secs(2));
                load.churn(&world, 6).await;
                tokio::time::sleep(rng.duration(Duration::from_secs(3))).await;
                world.sim.set_latency(Duration::ZERO);
            }
            Injected::RuleDeleted => {
                load.churn(&world, 6).await;
                for r in world.sim.rules().into_iter().take(3) {
                    let _ = loxilb
                        .delete_rule(&r.external_ip, r.port, &r.protocol, false)
                        .await;
                }
            }
            Injected::ClaimDeleted => {
                load.churn(&world, 6).await;
                for c in world.claims().await.into_iter().take(2) {
                    let _ = claims
                        .delete(
                            &c.metadata.name.unwrap_or_default(),
                            &DeleteParams::default(),
                        )
                        .await;
                }
            }
            Injected::StatusRewritten => {
                load.churn(&world, 6).await;
                if let Some(name) = load.live.iter().next().cloned() {
                    let _ = world
                        .services
                        .patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.77"}]}}})),
                        )
                        .await;
                }
            }
            Injected::ApiServerRestarted => {
                load.churn(&world, 6).await;
                control_plane().restart_apiserver().await.unwrap();
            }
        }
        // Keep the population around 30-60 Services.
        if load.live.len() > 60 {
            let extra = load.live.len() - 40;
            load.delete(&world, extra).await;
        }
        let took = world.settle_programmed(&opts, SETTLE).await;
        worst = worst.max(took);
        rounds += 1;
        if controller.pid() != pid {
            // Restarted after a lost leadership: memory is measured from the new process.
            pid = controller.pid();
            rss_start = rss_kib(pid);
            rss_max = rss_start;
        }
        let rss = rss_kib(pid);
        rss_max = rss_max.max(rss);
        eprintln!(
            "soak round {rounds} ({fault:?}): clean after {took:?}, {} Services, RSS {} KiB",
            load.live.len(),
            rss
        );
        assert!(
            controller.other_exit().is_none(),
            "the controller exited ({:?}); log in {}",
            controller.other_exit(),
            log.display()
        );
    }
    let rss_end = rss_kib(pid);
    eprintln!(
        "SOAK {secs}s seed {seed}: {rounds} quiet points, 0 violations, worst recovery {worst:?}, \
         faults {seen:?}, controller RSS start {rss_start} KiB, end {rss_end} KiB, max {rss_max} KiB, \
         {} restart(s) after a lost leadership",
        controller.restarts()
    );
    assert!(rounds > 0);
    // Flat: no growth beyond noise (allocator caches, a larger population at the end).
    assert!(
        rss_end < rss_start + rss_start / 2 + 8 * 1024,
        "RSS grew from {rss_start} KiB to {rss_end} KiB"
    );
    drop(controller);
    world.finish().await;
}
