//! The fault matrix (docs/RELIABILITY.md), its address and object faults: claims and pools
//! changed under the controller, watches cut or lagging, objects rewritten or deleted by
//! hand, each while Services are created, changed and deleted; then the auditor must report
//! no violation once the controller has converged, and every test prints
//! `RECOVERY <fault>: <time>`. (Split from `fault_matrix.rs`, which keeps loxilb's, the
//! controller's and the API server's faults; the load is `LOXI_FAULT_SERVICES` as there.)

mod common;
#[path = "common/fault_setup.rs"]
mod fault_setup;

use std::time::Instant;

use common::hold::{self, Hold};
use common::load::Load;
use common::proxy::CutProxy;
use common::{Options, World, control_plane, wait_for};
use fault_setup::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::ipam::address_pools::AddressPool;
use loxi_ccm::ipam::claims::AddressClaim;
use loxilb_client::{ClientConfig, LoxilbClient};
use loxilb_sim::SimConfig;
use serde_json::json;

/// The soak's last bug (docs/RELIABILITY.md#soak): a shared claim deleted while the
/// controller's claim watch is away after an API server restart, and re-created by one
/// sharer whose ports changed meanwhile (its create succeeds: the claim is gone). The watch
/// comes back with a re-list (its resourceVersion is older than the new API server's watch
/// cache), so no `Delete` event tells the other sharers; the re-created claim lists only the
/// one sharer. Every other sharer must claim the address it shows again. Before the fix they
/// kept showing it with no claim behind it (`unbacked-status`) for good.
///
/// The claim watch's answers are held back (`common::hold`) from the restart until the claim
/// was re-created, so that the controller's claim store is still the one from before the
/// deletion, as it was in the soak; everything else talks to the API server as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_claim_recreated_while_the_claim_watch_relists() {
    let opts = opts();
    let hold = Hold::new(hold::claim_watch);
    let mut world = World::with("fm-relist", opts.clone()).await;
    world.stop_controller().await;
    world.controller = Some(world.spawn_controller_with(hold.client().await, &opts));
    world.add_node("fm-relist-n1", "10.0.0.1").await;
    world.add_node("fm-relist-n2", "10.0.0.2").await;
    let mut load = Load::new("fm-relist", seed());
    load.create(&world, services()).await;
    world.settle_programmed(&opts, SETTLE).await;
    let claims: Api<AddressClaim> = Api::all(world.client.clone());
    let shared = world
        .claims()
        .await
        .into_iter()
        .max_by_key(|c| c.owners().len())
        .unwrap();
    let name = shared.metadata.name.clone().unwrap();
    let owners = shared.owners().len();
    assert!(owners > 3, "a widely shared address: {owners} owners");
    // A sharer on a port of its own (the odd Services of `common::load`).
    let mover = shared
        .owners()
        .into_iter()
        .find(|o| {
            o.ports
                .as_ref()
                .is_some_and(|p| p.iter().all(|p| p != "80/TCP"))
        })
        .unwrap()
        .name
        .clone();

    hold.hold();
    let restart = Instant::now();
    control_plane().restart_apiserver().await.unwrap();
    eprintln!("fm-relist: API server back in {:?}", restart.elapsed());
    claims
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let svc = world.get(&mover).await.unwrap();
    let port = svc.spec.unwrap().ports.unwrap()[0].port;
    world
        .services
        .patch(
            &mover,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"name": "p0", "port": port + 10_000, "protocol": "TCP"}]}})),
        )
        .await
        .unwrap();
    wait_for(
        "the moved sharer re-creates the claim on its own",
        SETTLE,
        || async {
            let c = claims.get_opt(&name).await.ok()??;
            (c.owners().iter().any(|o| o.name == mover)).then_some(c.owners().len())
        },
    )
    .await;
    hold.release();
    let released = Instant::now();
    let took = world.settle_programmed(&opts, SETTLE).await;
    let relisted = claims.get(&name).await.unwrap();
    eprintln!(
        "fm-relist: claim {name} had {owners} owners, now {} (the watch released {:?} ago)",
        relisted.owners().len(),
        released.elapsed()
    );
    report("shared claim re-created during a claim re-list", took);
    world.finish().await;
}

/// The 30-minute soak's violation of 2026-11-26 (docs/RELIABILITY.md#soak): a Service whose
/// port changed twice while the controller's claim store lagged (the claim watch away) found
/// in the store the claim from before a sharer joined, listing it as it is now. The
/// controller took that old claim's owners as the truth: the sharer left its index and moved
/// to another address while the real claim still listed it there, blocking its port for
/// good. A store claim that disagrees with the index is now checked against the API server:
/// the Service that changed is the one that moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_changed_twice_while_the_claim_store_lags() {
    let opts = opts();
    let hold = Hold::new(hold::claim_watch);
    let mut world = World::with("fm-lag", opts.clone()).await;
    world.stop_controller().await;
    world.controller = Some(world.spawn_controller_with(hold.client().await, &opts));
    world.add_node("fm-lag-n1", "10.0.0.1").await;
    world
        .create(&World::lb_service(
            "first",
            Some(common::CLASS),
            &[(80, "TCP")],
        ))
        .await;
    let address = world.wait_for_ip("first").await;
    world.settle_programmed(&opts, SETTLE).await;
    let claims: Api<AddressClaim> = Api::all(world.client.clone());
    let set_port = |name: &'static str, port: i32| set_only_port(&world.services, name, port);
    let recorded = |port: i32| claim_recording(&claims, &address, port);

    // From here the controller's claim store keeps the claim as it is now: first, port 80.
    hold.hold();
    control_plane().restart_apiserver().await.unwrap();
    set_port("first", 10080).await;
    wait_for("the claim records first on 10080", SETTLE, || {
        recorded(10080)
    })
    .await;
    world
        .create(&World::lb_service(
            "second",
            Some(common::CLASS),
            &[(80, "TCP")],
        ))
        .await;
    assert_eq!(
        world.wait_for_ip("second").await,
        address,
        "second shares first's address (first is on 10080 now)"
    );
    wait_for("the claim records second on 80", SETTLE, || async {
        let c = recorded(80).await?;
        c.owners().iter().any(|o| o.name == "second").then_some(())
    })
    .await;
    // first back on 80: its store claim (held back) lists it so, without second.
    set_port("first", 80).await;
    wait_for("first moves off the shared address", SETTLE, || async {
        let ip = world.published().await.get("first").cloned()?;
        (ip != address).then_some(())
    })
    .await;
    hold.release();
    let took = world.settle_programmed(&opts, SETTLE).await;
    let published = world.published().await;
    assert_eq!(published.get("second"), Some(&address), "second stays");
    for claim in world.claims().await {
        for owner in claim.owners() {
            assert_eq!(
                published.get(&owner.name),
                Some(&claim.spec.address),
                "{} is listed on the claim of {} but shows another address",
                owner.name,
                claim.spec.address
            );
        }
    }
    report("ports changed twice while the claim store lags", took);
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_connections_cut() {
    let opts = opts();
    let proxy = CutProxy::to_control_plane().await;
    let mut world = World::with("fm-cut", opts.clone()).await;
    // The controller talks to the API server through the proxy.
    world.stop_controller().await;
    world.controller = Some(world.spawn_controller_with(proxy.client().await, &opts));
    world.add_node("fm-cut-n1", "10.0.0.1").await;
    let mut load = Load::new("fm-cut", seed());
    load.create(&world, services()).await;
    world.settle_programmed(&opts, SETTLE).await;
    for _ in 0..3 {
        // The controller has connected again since the last cut (its watches back off
        // after an error, and a quick churn round can end before they are back).
        wait_for(
            "the controller's connections through the proxy",
            SETTLE,
            || async { (proxy.open() > 0).then_some(()) },
        )
        .await;
        proxy.cut();
        load.churn(&world, round()).await;
    }
    report(
        "watch connections cut (3x)",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}

/// `watch_connections_cut`'s rare failure, made certain: a claim watch that resumes after a
/// broken connection (from its last resourceVersion: no re-list, no `InitDone`) delivers
/// the claim versions it missed only then. A Service whose ports change and change back
/// meanwhile has its second pass read the claim of before the first change, which lists it
/// as it is: the pass writes nothing and the claim keeps the first change. The claim event
/// that arrives late must give the Service a pass that writes the claim again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_changed_back_while_the_claim_watch_resumes() {
    let opts = opts();
    let proxy = CutProxy::to_control_plane().await;
    let hold = Hold::new(hold::claim_watch);
    let mut world = World::with("fm-resume", opts.clone()).await;
    world.stop_controller().await;
    world.controller =
        Some(world.spawn_controller_with(hold.client_with(proxy.config().await), &opts));
    world.add_node("fm-resume-n1", "10.0.0.1").await;
    let address = world.serve_one_port("svc", 1080).await;
    world.settle_programmed(&opts, SETTLE).await;
    let claims: Api<AddressClaim> = Api::all(world.client.clone());
    let recorded = |port: i32| claim_recording(&claims, &address, port);
    let set_port = |port: i32| set_only_port(&world.services, "svc", port);
    let ruled = |port: u16| {
        let world = &world;
        let address = address.clone();
        async move {
            world
                .rules_for(&address)
                .iter()
                .any(|r| r.0 == port)
                .then_some(())
        }
    };

    // The claim watch breaks and its resumption waits: the claim store stays at 1080.
    hold.hold();
    assert!(
        proxy.cut() > 0,
        "the controller's watches go through the proxy"
    );
    set_port(11080).await;
    wait_for("the claim records 11080", SETTLE, || recorded(11080)).await;
    set_port(1080).await;
    // The pass of the change back has run: the rule is on 1080 again.
    wait_for("the rule back on 1080", SETTLE, || ruled(1080)).await;
    hold.release();
    let started = Instant::now();
    wait_for("the claim records 1080 again", SETTLE, || recorded(1080)).await;
    report(
        "ports changed back while the claim watch resumes",
        started.elapsed(),
    );
    world.settle_programmed(&opts, SETTLE).await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_actor_rewrites_service_status() {
    let opts = opts();
    let (world, mut load) = loaded("fm-status", &opts, SimConfig::default()).await;
    let victims: Vec<String> = load.live.iter().take(5).cloned().collect();
    for (i, name) in victims.iter().enumerate() {
        world
            .services
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": format!("203.0.113.{}", i + 1)}]}}})),
            )
            .await
            .unwrap();
    }
    load.churn(&world, round()).await;
    report(
        "foreign actor rewrites status",
        world.settle_programmed(&opts, SETTLE).await,
    );
    for name in &victims {
        if let Some(svc) = world.get(name).await {
            let ip = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
                .ip
                .clone()
                .unwrap();
            assert!(!ip.starts_with("203.0.113."), "{name} still shows {ip}");
        }
    }
    world.finish().await;
}

/// Makes `port`/TCP the only port of the Service `name`.
async fn set_only_port(services: &Api<Service>, name: &str, port: i32) {
    services
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"ports": [{"name": "p0", "port": port, "protocol": "TCP"}]}}),
            ),
        )
        .await
        .unwrap();
}

/// The claim of `address`, read from the API server, when it records an owner on
/// `port`/TCP.
async fn claim_recording(
    claims: &Api<AddressClaim>,
    address: &str,
    port: i32,
) -> Option<AddressClaim> {
    let c = claims.get_opt(address).await.ok()??;
    serde_json::to_string(&c.spec)
        .ok()?
        .contains(&format!("\"{port}/TCP\""))
        .then_some(c)
}

async fn create_pool(client: &kube::Client, name: &str, addresses: &[&str]) -> Api<AddressPool> {
    let pools: Api<AddressPool> = Api::all(client.clone());
    let pool: AddressPool = serde_json::from_value(json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1",
        "kind": "AddressPool",
        "metadata": {"name": name},
        "spec": {"addresses": addresses, "avoidBuggyIPs": false}
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    pools
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_shrunk_under_allocated_addresses() {
    // The flag pool is far away; an AddressPool (used first) serves the Services.
    let opts = Options {
        cidr: "198.18.0.0/24".into(),
        ..opts()
    };
    let world = World::with("fm-shrink", opts.clone()).await;
    let pool_name = format!("{}-pool", world.ns);
    let pools = create_pool(&world.client, &pool_name, &["192.0.2.0/24"]).await;
    world.add_node("fm-shrink-n1", "10.0.0.1").await;
    let mut load = Load::new("fm-shrink", seed());
    load.create(&world, services()).await;
    world.settle_programmed(&opts, SETTLE).await;
    // Shrink to the upper half: the addresses handed out (lowest first) now lie outside.
    pools
        .patch(
            &pool_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"addresses": ["192.0.2.128/25"]}})),
        )
        .await
        .unwrap();
    load.churn(&world, round()).await;
    report(
        "pool shrunk under allocated addresses",
        world.settle_programmed(&opts, SETTLE).await,
    );
    let findings = world.audit(&opts).await;
    assert!(
        findings
            .notes
            .iter()
            .any(|n| n.contains("no longer holds it")),
        "the kept addresses are noted: {findings}"
    );
    let _ = pools.delete(&pool_name, &DeleteParams::default()).await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_exhausted() {
    // Four addresses; Services on port 80 each need one of their own.
    let opts = Options {
        cidr: "198.18.0.0/24".into(),
        ..opts()
    };
    let world = World::with("fm-exhaust", opts.clone()).await;
    let pool_name = format!("{}-pool", world.ns);
    let pools = create_pool(&world.client, &pool_name, &["192.0.2.64-192.0.2.67"]).await;
    // The flag pool is used only when named: disable auto-assignment from it by selecting
    // the resource pool on every Service.
    world.add_node("fm-exhaust-n1", "10.0.0.1").await;
    let mut names = Vec::new();
    for i in 0..6 {
        let mut svc = World::lb_service(&format!("x{i}"), Some(common::CLASS), &[(80, "TCP")]);
        svc.metadata.annotations =
            Some([("loxilb.io/poolSelect".to_string(), pool_name.clone())].into());
        world.create(&svc).await;
        names.push(format!("x{i}"));
    }
    let waiting = |s: &Service| {
        programmed(s) || condition_is(s, "loxilb.io/AddressAllocated", "False", "PoolExhausted")
    };
    world.settle(&opts, SETTLE, waiting).await;
    assert_eq!(world.published().await.len(), 4, "four addresses");
    // Two leave: the two waiting get theirs.
    let served: Vec<String> = world.published().await.into_keys().take(2).collect();
    for name in &served {
        world
            .services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    report(
        "pool exhausted",
        world.settle_programmed(&opts, SETTLE).await,
    );
    assert_eq!(world.published().await.len(), 4);
    let _ = pools.delete(&pool_name, &DeleteParams::default()).await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_deleted_by_hand() {
    let opts = opts();
    let (world, mut load) = loaded("fm-claim", &opts, SimConfig::default()).await;
    let claims: Api<AddressClaim> = Api::all(world.client.clone());
    let victims: Vec<String> = world
        .claims()
        .await
        .into_iter()
        .take(5)
        .filter_map(|c| c.metadata.name)
        .collect();
    for name in &victims {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
    }
    load.churn(&world, round()).await;
    report(
        "claim deleted by hand",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_deleted_by_hand() {
    let opts = opts();
    let (world, mut load) = loaded("fm-rule", &opts, SimConfig::default()).await;
    let loxilb = LoxilbClient::new(ClientConfig::new(&world.sim.url())).unwrap();
    let before = world.sim.rules().len();
    for r in world.sim.rules().into_iter().take(5) {
        loxilb
            .delete_rule(&r.external_ip, r.port, &r.protocol, false)
            .await
            .unwrap();
    }
    assert_eq!(world.sim.rules().len(), before - 5);
    let started = Instant::now();
    wait_for("the drift check puts the rules back", SETTLE, || async {
        (world.sim.rules().len() == before).then_some(())
    })
    .await;
    eprintln!("fm-rule: rules back in {:?}", started.elapsed());
    load.churn(&world, round()).await;
    report(
        "rule deleted by hand",
        world.settle_programmed(&opts, SETTLE).await,
    );
    world.finish().await;
}
