//! The fault matrix (docs/RELIABILITY.md): each fault injected while Services are created,
//! changed and deleted, then the auditor (`loxi-ccm audit`'s checks) must report no violation
//! once the controller has converged. Every test prints `RECOVERY <fault>: <time>`, the time
//! from the end of the fault to a clean audit with every Service served.
//!
//! Load: `LOXI_FAULT_SERVICES` Services per test (default 40, so that the whole file stays
//! within a few minutes of CI on a shared 2-core machine), churned in rounds of a quarter of
//! that; `controller_restart_mid_burst` creates 5 times as many (200 by default) in one burst.

mod common;
#[path = "common/fault_setup.rs"]
mod fault_setup;

use std::time::{Duration, Instant};

use common::load::{Load, Rng};
use common::{Options, World, control_plane, wait_for};
use fault_setup::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, PostParams};
use loxilb_sim::{Fault, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loxilb_down_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-down", &opts, SimConfig::default()).await;
    world.sim.go_down().await;
    let down_at = Instant::now();
    load.churn(&world, round()).await;
    // Down for at least `DOWN` (the retries back off meanwhile) and until every Service holds
    // an address: those that showed one keep it, the new ones claim theirs without loxilb
    // but show none (their rules wait for it) and report loxilb unavailable.
    let waiting = |s: &Service| {
        !shows_address(s)
            && condition_is(s, "loxilb.io/AddressAllocated", "True", "Allocated")
            && condition_is(s, "loxilb.io/Programmed", "False", "LoxilbUnavailable")
    };
    wait_for("addresses claimed while loxilb is down", SETTLE, || async {
        let live = live_services(&world).await?;
        (down_at.elapsed() >= DOWN
            && live.iter().all(|s| shows_address(s) || waiting(s))
            && live.iter().any(waiting))
        .then_some(())
    })
    .await;
    eprintln!("fm-down: loxilb down for {:?}", down_at.elapsed());
    world.sim.come_up().await.unwrap();
    report("loxilb down", world.settle_programmed(&opts, SETTLE).await);
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loxilb_restarted_empty_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-restart", &opts, SimConfig::default()).await;
    world.sim.restart();
    assert!(world.sim.rules().is_empty());
    load.churn(&world, round()).await;
    report(
        "loxilb restarted empty",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loxilb_half_5xx_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-5xx", &opts, SimConfig::default()).await;
    world.sim.set_fault(Some(Fault {
        status: 500,
        rate: 0.5,
        only_writes: false,
    }));
    load.churn(&world, round()).await;
    // Served through the errors (retries and backoff), before the fault is lifted.
    let started = Instant::now();
    wait_for(
        "every Service programmed under 50 % 5xx",
        SETTLE,
        || async {
            let list = world.services.list(&ListParams::default()).await.ok()?;
            list.items.iter().all(programmed).then_some(())
        },
    )
    .await;
    eprintln!(
        "fm-5xx: programmed under 50 % 5xx in {:?}",
        started.elapsed()
    );
    world.sim.set_fault(None);
    report(
        "loxilb 50% 5xx",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}

/// Two loxilbs holding the same rules: the second is down for `DOWN` and comes back empty (a
/// reboot) while the first answers 50 % 5xx, all under churn. Every Service stays served by
/// the first (`PartiallyProgrammed` naming the second) and the second gets every rule back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_loxilbs_one_rebooted_the_other_failing_under_load() {
    let second = loxilb_sim::Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let opts = Options {
        extra_args: vec![format!("--loxilb-url={}", second.url())],
        ..opts()
    };
    let (world, mut load) = loaded("fm-two", &opts, SimConfig::default()).await;
    assert_eq!(second.rules().len(), world.sim.rules().len());
    second.go_down().await;
    let down_at = Instant::now();
    world.sim.set_fault(Some(Fault {
        status: 500,
        rate: 0.5,
        only_writes: false,
    }));
    load.churn(&world, round()).await;
    wait_for(
        "every Service served by the first loxilb while the second is down",
        SETTLE,
        || async {
            let live = live_services(&world).await?;
            (down_at.elapsed() >= DOWN
                && live.iter().all(programmed)
                && live.iter().any(|s| {
                    condition_is(s, "loxilb.io/Programmed", "True", "PartiallyProgrammed")
                }))
            .then_some(())
        },
    )
    .await;
    eprintln!("fm-two: second loxilb down for {:?}", down_at.elapsed());
    second.restart();
    second.come_up().await.unwrap();
    load.churn(&world, round()).await;
    world.sim.set_fault(None);
    report(
        "one of two loxilbs rebooted, the other 50% 5xx",
        world.settle_programmed(&opts, SETTLE).await,
    );
    assert_eq!(second.rules().len(), world.sim.rules().len());
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loxilb_2s_latency_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-latency", &opts, SimConfig::default()).await;
    world.sim.set_latency(Duration::from_secs(2));
    load.churn(&world, round()).await;
    // Converges with the latency on (the audit's own listing waits 2 s too).
    report(
        "loxilb 2 s latency",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.sim.set_latency(Duration::ZERO);
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loxilb_full_under_load() {
    let opts = opts();
    let n = services();
    // Room for three quarters of the Services' rules.
    let capacity = n * 3 / 4;
    let world = World::with_sim(
        "fm-full",
        opts.clone(),
        SimConfig {
            max_rules: capacity,
            ..SimConfig::default()
        },
    )
    .await;
    world.add_node("fm-full-n1", "10.0.0.1").await;
    let mut load = Load::new("fm-full", seed());
    load.create(&world, n).await;
    // The ones without room say so (CapacityExceeded); the audit accepts that as reported.
    let full = |s: &Service| {
        programmed(s) || condition_is(s, "loxilb.io/Programmed", "False", "CapacityExceeded")
    };
    world.settle(&opts, SETTLE, full).await;
    assert_eq!(world.sim.rules().len(), capacity, "loxilb full");
    let findings = world.audit(&opts).await;
    assert!(
        findings
            .notes
            .iter()
            .any(|n| n.contains("CapacityExceeded")),
        "{findings}"
    );
    // Room frees: the waiting Services are served.
    load.delete(&world, n - capacity).await;
    report("loxilb full", world.settle_programmed(&opts, SETTLE).await);
    world.finish().await;
}

/// `kill -9` of the controller's process, 20 times at random moments of its work (between
/// claim, rule and status writes: SIGKILL runs no shutdown path), each time started again at
/// once. Without leader election, so that the next process starts at once instead of waiting
/// for the dead one's Lease to expire (`e2e_binary.rs` covers failover with a Lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_killed_at_random_points() {
    let opts = Options {
        leader_elect: false,
        ..opts()
    };
    let (mut world, mut load) = loaded("fm-kill", &opts, SimConfig::default()).await;
    // From here on the controller is the binary, so that it can be killed with SIGKILL.
    world.stop_controller().await;
    let log = control_plane().dir().join("fm-kill-controller.log");
    let _ = std::fs::remove_file(&log);
    eprintln!("fm-kill: controller log in {}", log.display());
    let mut controller = world.spawn_process(&opts, &log);
    let mut rng = Rng::new(seed());
    for rep in 0..20 {
        load.create(&world, 3).await;
        load.change(&world, 2).await;
        load.delete(&world, 1).await;
        // A random moment of the controller's work on the changes above (a process needs
        // ~0.2-0.5 s to start and sync its caches, hence the longer range than in-process).
        tokio::time::sleep(rng.duration(Duration::from_millis(1200))).await;
        controller.kill();
        controller = world.spawn_process(&opts, &log);
        if rep % 5 == 4 {
            let took = world.settle_programmed(&opts, SETTLE).await;
            eprintln!("fm-kill: clean after kill {} in {took:?}", rep + 1);
        }
    }
    report(
        "controller killed with SIGKILL at random points (20x)",
        world.settle_programmed(&opts, SETTLE).await,
    );
    drop(controller);
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_mid_burst() {
    // Half the burst needs an address of its own (port 80): more than a /24 holds with
    // `LOXI_FAULT_SERVICES=200` (1,000 Services).
    let opts = Options {
        cidr: "198.18.0.0/21".into(),
        ..opts()
    };
    let mut world = World::with("fm-burst", opts.clone()).await;
    world.add_node("fm-burst-n1", "10.0.0.1").await;
    let n = services() * 5;
    let started = Instant::now();
    let creator = {
        let client = world.client.clone();
        let ns = world.ns.clone();
        tokio::spawn(async move {
            let api: Api<Service> = Api::namespaced(client, &ns);
            for i in 0..n {
                let svc = common::load::service("fm-burst", i, false);
                api.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
    };
    // Restart once a third of the burst is served.
    wait_for("a third of the burst served", SETTLE, || async {
        let list = world.services.list(&ListParams::default()).await.ok()?;
        (list.items.iter().filter(|s| programmed(s)).count() >= n / 3).then_some(())
    })
    .await;
    world.stop_controller().await;
    world.start_controller(&opts).await;
    let restarted = Instant::now();
    creator.await.unwrap();
    let took = world.settle_programmed(&opts, SETTLE).await;
    eprintln!(
        "fm-burst: {n} Services served and audited clean {:?} after the burst began",
        started.elapsed()
    );
    report(
        "controller restart mid-burst",
        restarted.elapsed().max(took),
    );
    assert_eq!(world.published().await.len(), n);
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-apiserver", &opts, SimConfig::default()).await;
    load.churn(&world, round()).await;
    let restart = Instant::now();
    control_plane().restart_apiserver().await.unwrap();
    eprintln!("fm-apiserver: API server back in {:?}", restart.elapsed());
    load.churn(&world, round()).await;
    report(
        "kube-apiserver restart",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_under_load() {
    let opts = opts();
    let (world, mut load) = loaded("fm-etcd", &opts, SimConfig::default()).await;
    load.churn(&world, round()).await;
    let restart = Instant::now();
    control_plane().restart_etcd().await.unwrap();
    eprintln!(
        "fm-etcd: etcd restarted, API server ready again in {:?}",
        restart.elapsed()
    );
    load.churn(&world, round()).await;
    report("etcd restart", world.settle_programmed(&opts, SETTLE).await);
    world.finish().await;
}

/// Requests kube-apiserver refused with 429 so far: its own count, from its `/metrics`
/// (`apiserver_request_total` by code; the max-in-flight filter records what it refuses
/// there).
async fn refused_with_429(client: &kube::Client) -> u64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("code=\"429\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A client for the controller as a ServiceAccount bound to cluster-admin: kube-apiserver's
/// max-in-flight limits never throttle `system:masters` (the tests' admin), so a throttled
/// controller must be someone else.
async fn service_account_client(world: &World, name: &str) -> kube::Client {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    use kube::api::ObjectMeta;
    let sas: Api<ServiceAccount> = Api::namespaced(world.client.clone(), &world.ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(world.client.clone());
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{}-{name}", world.ns)),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(world.ns.clone()),
            ..Default::default()
        }]),
    };
    let _ = bindings.create(&PostParams::default(), &binding).await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let path = control_plane().dir().join(format!("{name}.kubeconfig"));
    control_plane().write_kubeconfig(&path, &token).unwrap();
    // The controller's own client stack (its retry policy is what meets the 429s).
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    loxi_ccm::k8s::api::from_config(config, loxi_ccm::k8s::api::RateLimit::NONE).unwrap()
}

/// Lifts the throttling if the test fails midway, so that the tests after it in this binary
/// meet an API server without limits.
struct Unthrottle;

impl Drop for Unthrottle {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = std::thread::spawn(|| {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(control_plane().restart_apiserver())
            })
            .join();
        }
    }
}

/// API throttling: kube-apiserver started again with room for one request at a time
/// (`--max-requests-inflight=1`, `--max-mutating-requests-inflight=1`; API Priority and
/// Fairness is off in testenv, so these limits are what protects it), which answers every
/// request beyond that with 429 and `Retry-After: 1`. The controller (a ServiceAccount:
/// `system:masters` is never throttled, with its own client stack) waits as told and tries
/// again a few times (`k8s::api`'s bounded retry), then its reconcile retries with backoff;
/// every Service must be served and the audit clean with the throttling still on. The
/// limits are lifted afterwards (another restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_throttling_under_load() {
    let opts = opts();
    let mut world = World::with("fm-429", opts.clone()).await;
    world.stop_controller().await;
    let client = service_account_client(&world, "throttled-controller").await;
    world.controller = Some(world.spawn_controller_with(client, &opts));
    world.add_node("fm-429-n1", "10.0.0.1").await;
    world.add_node("fm-429-n2", "10.0.0.2").await;
    let mut load = Load::new("fm-429", seed());
    load.create(&world, services()).await;
    world.settle_programmed(&opts, SETTLE).await;
    let _unthrottle = Unthrottle;
    control_plane()
        .restart_apiserver_with(&[
            "--max-requests-inflight=1",
            "--max-mutating-requests-inflight=1",
        ])
        .await
        .unwrap();
    // The restart itself is another fault of the matrix: settled before the throttled round.
    world.settle_programmed(&opts, SETTLE).await;
    let before = refused_with_429(&world.client).await;
    load.churn(&world, round()).await;
    let took = world.settle_programmed(&opts, SETTLE).await;
    let refused = refused_with_429(&world.client).await - before;
    eprintln!("fm-429: {refused} requests answered 429 during the throttled round");
    assert!(refused > 0, "the API server throttled nothing");
    control_plane().restart_apiserver().await.unwrap();
    report("API throttling (429, Retry-After)", took);
    world.settle_programmed(&opts, SETTLE).await;
    world.finish().await;
}
