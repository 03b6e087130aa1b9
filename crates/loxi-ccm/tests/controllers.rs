//! Several loxi-ccm controllers in one cluster (docs/architecture.md#several-controllers-in-
//! one-cluster), against the real API server and simulators: one per load-balancer class
//! (one of them also in CCM mode), drawing on the same address pool and sharing one loxilb.
//! Each serves exactly its own Services: no address is lost or moves, no controller writes
//! another's claims or rules, every loxilb holds the rules it should, and `loxi-ccm audit`
//! is clean for both; through Service changes, deletions and restarts of each. A stopping
//! controller ends within a few seconds whatever its reconciles wait for. Records written by
//! the release before controllers had names stay the default controller's.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use loxi_ccm::ipam::claims::AddressClaim;
use loxi_domain::RuleName;
use loxilb_sim::{SimConfig, Simulator};

const OTHER_CLASS: &str = "example.com/other";
const OTHER: &str = "example-com-other";
/// Both controllers draw on this very pool: the claims decide who gets which address.
const POOL: &str = "192.0.2.0/27";

async fn sim() -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap()
}

/// Name -> first ingress IP, for every Service of the namespace showing one.
async fn addresses(w: &World) -> BTreeMap<String, String> {
    w.published().await
}

/// The owner id in each rule name on `s` (`test`, `test.example-com-other`) -> rule count.
fn owners_on(s: &Simulator) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in s.rules() {
        let owner =
            RuleName::parse(&r.name).map_or_else(|| format!("foreign {}", r.name), |n| n.cluster);
        *out.entry(owner).or_default() += 1;
    }
    out
}

/// Rule names on `s` -> the Service (name) they are for.
fn services_on(s: &Simulator, owner: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in s.rules() {
        if let Some(n) = RuleName::parse(&r.name).filter(|n| n.cluster == owner) {
            *out.entry(n.service).or_default() += 1;
        }
    }
    out
}

/// Claim name -> (controller, resourceVersion, owners) for the test namespace's claims.
async fn claim_records(w: &World) -> BTreeMap<String, (Option<String>, String, Vec<String>)> {
    w.claims()
        .await
        .into_iter()
        .map(|c| {
            let owners = c.owners().iter().map(|o| o.name.clone()).collect();
            (
                c.metadata.name.clone().unwrap_or_default(),
                (
                    c.spec.controller.clone(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                    owners,
                ),
            )
        })
        .collect()
}

fn class_of(svc: &Service) -> Option<String> {
    svc.spec.as_ref()?.load_balancer_class.clone()
}

/// Every Service of the namespace shows an address and `Programmed=True`, and both
/// controllers' audits are clean.
async fn settle_both(w: &World, a: &Options, b: &Options) {
    w.settle_programmed(a, Duration::from_secs(90)).await;
    let findings = w.audit(b).await;
    assert!(
        findings.clean(),
        "audit of the other controller:\n{findings}"
    );
}

#[tokio::test]
async fn two_controllers_serve_their_own_services_and_never_touch_each_other() {
    let shared = sim().await;
    let theirs = sim().await;
    // Controller A: the default class, in CCM mode (class-less Services too), on its own
    // loxilb (the world's) and the shared one.
    let a_opts = Options {
        cidr: POOL.into(),
        ccm_mode: true,
        extra_args: vec![format!("--loxilb-url={}", shared.url())],
        ..Options::default()
    };
    let mut w = World::with("controllers", a_opts.clone()).await;
    w.add_node("node-1", "10.0.0.1").await;
    // Controller B: another class, the same pool, its own loxilb and the shared one.
    let b_opts = Options {
        cidr: POOL.into(),
        discovery: true,
        extra_args: vec![
            format!("--load-balancer-class={OTHER_CLASS}"),
            format!("--loxilb-url={}", theirs.url()),
            format!("--loxilb-url={}", shared.url()),
        ],
        ..Options::default()
    };
    let mut b = Some(w.spawn_controller(&b_opts));

    // Ports chosen so that sharing by ports would put Services of both classes on one
    // address if controllers could join each other's claims.
    let mine = [
        ("a1", Some(CLASS), 80),
        ("a2", Some(CLASS), 443),
        ("a3", Some(CLASS), 80),
        ("a4", None, 8080),
        ("a5", None, 80),
    ];
    let others = [("b1", 443), ("b2", 8443), ("b3", 80), ("b4", 9090)];
    for (name, class, port) in mine {
        w.create(&World::lb_service(name, class, &[(port, "TCP")]))
            .await;
    }
    for (name, port) in others {
        w.create(&World::lb_service(
            name,
            Some(OTHER_CLASS),
            &[(port, "TCP")],
        ))
        .await;
    }
    settle_both(&w, &a_opts, &b_opts).await;
    let first = addresses(&w).await;
    assert_eq!(first.len(), 9, "{first:?}");

    // No address is shown by Services of both controllers, and every claim is its
    // controller's.
    let services = w.services.list(&ListParams::default()).await.unwrap().items;
    let by_name: BTreeMap<String, Service> = services
        .into_iter()
        .map(|s| (s.metadata.name.clone().unwrap(), s))
        .collect();
    let mut holders: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for (name, ip) in &first {
        let other = class_of(&by_name[name]).as_deref() == Some(OTHER_CLASS);
        let entry = holders.entry(ip).or_default();
        if other {
            entry.1 = true;
        } else {
            entry.0 = true;
        }
    }
    assert!(
        holders.values().all(|(a, b)| !(*a && *b)),
        "an address shown by Services of both controllers: {first:?}"
    );
    for (claim, (controller, _, owners)) in claim_records(&w).await {
        let other = owners.iter().all(|o| o.starts_with('b'));
        let mine = owners.iter().all(|o| o.starts_with('a'));
        assert!(other || mine, "claim {claim} mixes controllers: {owners:?}");
        let expected = other.then(|| OTHER.to_string());
        assert_eq!(controller, expected, "claim {claim} of {owners:?}");
    }
    // Each loxilb holds exactly its controllers' rules, the shared one both sets.
    let a_owner = "test";
    let b_owner = format!("test.{OTHER}");
    assert_eq!(
        owners_on(&w.sim),
        BTreeMap::from([(a_owner.to_string(), 5)])
    );
    assert_eq!(owners_on(&theirs), BTreeMap::from([(b_owner.clone(), 4)]));
    assert_eq!(
        owners_on(&shared),
        BTreeMap::from([(a_owner.to_string(), 5), (b_owner.clone(), 4)])
    );

    // A restart of each, with nothing changed: neither writes a claim (its own are current,
    // the other's are never touched).
    let before = claim_records(&w).await;
    w.stop_controller().await;
    w.start_controller(&a_opts).await;
    settle_both(&w, &a_opts, &b_opts).await;
    if let Some((tx, handle)) = b.take() {
        let _ = tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
    }
    b = Some(w.spawn_controller(&b_opts));
    settle_both(&w, &a_opts, &b_opts).await;
    assert_eq!(
        claim_records(&w).await,
        before,
        "claims written by a restart"
    );
    assert_eq!(addresses(&w).await, first);

    // Changes on both sides, with a restart of each while they are under way.
    let ports = |port: i32| serde_json::json!({"spec": {"ports": [{"name": "tcp", "port": port, "protocol": "TCP"}]}});
    w.services
        .patch("a2", &PatchParams::default(), &Patch::Merge(&ports(8443)))
        .await
        .unwrap();
    w.services
        .delete("a3", &DeleteParams::default())
        .await
        .unwrap();
    w.services
        .delete("b2", &DeleteParams::default())
        .await
        .unwrap();
    w.stop_controller().await;
    w.services
        .patch("b1", &PatchParams::default(), &Patch::Merge(&ports(9443)))
        .await
        .unwrap();
    w.create(&World::lb_service("a6", Some(CLASS), &[(443, "TCP")]))
        .await;
    w.create(&World::lb_service("b5", Some(OTHER_CLASS), &[(80, "TCP")]))
        .await;
    w.start_controller(&a_opts).await;
    if let Some((tx, handle)) = b.take() {
        let _ = tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
    }
    w.create(&World::lb_service("b6", Some(OTHER_CLASS), &[(443, "TCP")]))
        .await;
    b = Some(w.spawn_controller(&b_opts));
    wait_for("a3 and b2 gone", Duration::from_secs(60), || async {
        (w.get("a3").await.is_none() && w.get("b2").await.is_none()).then_some(())
    })
    .await;
    settle_both(&w, &a_opts, &b_opts).await;

    // Nobody that stayed lost or moved its address.
    let last = addresses(&w).await;
    for (name, ip) in &first {
        if name == "a3" || name == "b2" {
            continue;
        }
        assert_eq!(
            last.get(name),
            Some(ip),
            "{name} moved: {first:?} -> {last:?}"
        );
    }
    assert_eq!(last.len(), 10, "{last:?}");
    // Rules: exactly the live Services', each on its controller's loxilbs.
    let a_services: BTreeMap<String, usize> = ["a1", "a2", "a4", "a5", "a6"]
        .iter()
        .map(|n| (n.to_string(), 1))
        .collect();
    let b_services: BTreeMap<String, usize> = ["b1", "b3", "b4", "b5", "b6"]
        .iter()
        .map(|n| (n.to_string(), 1))
        .collect();
    assert_eq!(services_on(&w.sim, a_owner), a_services);
    assert_eq!(services_on(&shared, a_owner), a_services);
    assert_eq!(services_on(&shared, &b_owner), b_services);
    assert_eq!(services_on(&theirs, &b_owner), b_services);
    assert!(services_on(&w.sim, &b_owner).is_empty());
    assert!(services_on(&theirs, a_owner).is_empty());

    if let Some((tx, handle)) = b.take() {
        let _ = tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
    }
    w.finish().await;
}

/// The upgrade: claims and rules as the release before controller names wrote them (no
/// `controller` on the claim, `ccm-<cluster>_` rule names) are the default controller's; a
/// controller of another class started next to it leaves them alone, and nothing moves.
#[tokio::test]
async fn records_of_the_previous_release_stay_the_default_controllers() {
    let shared = sim().await;
    let a_opts = Options {
        cidr: POOL.into(),
        extra_args: vec![format!("--loxilb-url={}", shared.url())],
        ..Options::default()
    };
    let mut w = World::with("controllers-upgrade", a_opts.clone()).await;
    w.add_node("node-1", "10.0.0.1").await;
    for (name, port) in [("old1", 80), ("old2", 443), ("old3", 80)] {
        w.create(&World::lb_service(name, Some(CLASS), &[(port, "TCP")]))
            .await;
    }
    w.settle_programmed(&a_opts, Duration::from_secs(60)).await;
    let first = addresses(&w).await;
    // What this release wrote for the default controller is what the previous one wrote:
    // claims without a controller, rules named after the cluster alone.
    let claims = w.claims().await;
    assert!(!claims.is_empty());
    for c in &claims {
        assert_eq!(c.spec.controller, None, "{:?}", c.spec);
        let raw = serde_json::to_value(&c.spec).unwrap();
        assert!(raw.get("controller").is_none(), "{raw}");
    }
    for r in shared.rules() {
        assert!(r.name.starts_with("ccm-test_"), "{}", r.name);
    }
    // Stop it; write the claims back exactly as the previous release's would read (the
    // schema has no `controller` there), then start it again with another controller
    // beside it on the same loxilb and pool.
    w.stop_controller().await;
    let api: Api<AddressClaim> = Api::all(w.client.clone());
    for c in &claims {
        let name = c.metadata.name.clone().unwrap();
        let patch = serde_json::json!({"spec": {"controller": null}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let before = claim_records(&w).await;
    let writes_before = shared.write_log().len();
    let b_opts = Options {
        cidr: POOL.into(),
        discovery: true,
        extra_args: vec![
            format!("--load-balancer-class={OTHER_CLASS}"),
            format!("--loxilb-url={}", shared.url()),
        ],
        ..Options::default()
    };
    let b = w.spawn_controller(&b_opts);
    w.start_controller(&a_opts).await;
    w.create(&World::lb_service(
        "new-b",
        Some(OTHER_CLASS),
        &[(443, "TCP")],
    ))
    .await;
    settle_both(&w, &a_opts, &b_opts).await;
    let last = addresses(&w).await;
    for (name, ip) in &first {
        assert_eq!(last.get(name), Some(ip), "{name} moved");
    }
    assert!(
        !first.values().any(|ip| Some(ip) == last.get("new-b")),
        "the other controller took an address of the previous release's: {last:?}"
    );
    let after = claim_records(&w).await;
    for (name, record) in &before {
        assert_eq!(after.get(name), Some(record), "claim {name} was written");
    }
    // The only writes to the shared loxilb since: the other controller's rule and the
    // restart markers.
    let owners = owners_on(&shared);
    assert_eq!(owners.get("test"), Some(&3), "{owners:?}");
    assert_eq!(owners.get(&format!("test.{OTHER}")), Some(&1), "{owners:?}");
    let rule_writes: Vec<String> = shared
        .write_log()
        .iter()
        .skip(writes_before)
        .map(|w| format!("{w:?}"))
        .filter(|w| w.contains("loadbalancer"))
        .collect();
    assert!(
        rule_writes.len() <= 1,
        "writes to the previous release's rules: {rule_writes:#?}"
    );
    let _ = b.0.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), b.1).await;
    w.finish().await;
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// SIGTERM while every reconcile waits on a loxilb that takes its writes but never answers
/// them: the process still ends within a few seconds.
#[tokio::test]
async fn sigterm_ends_the_process_while_reconciles_wait() {
    let opts = Options {
        leader_elect: false,
        // One claim per Service: what the test waits for below.
        extra_args: vec!["--set-unique-ip".into()],
        ..Options::default()
    };
    let mut w = World::with("controllers-sigterm", opts.clone()).await;
    w.stop_controller().await;
    w.add_node("node-1", "10.0.0.1").await;
    w.sim.set_write_latency(Duration::from_secs(120));
    let log = std::env::temp_dir().join(format!("loxi-ccm-sigterm-{}.log", std::process::id()));
    let mut ccm = w.spawn_process(&opts, &log);
    for i in 0..6 {
        w.create(&World::lb_service(
            &format!("s{i}"),
            Some(CLASS),
            &[(80 + i, "TCP")],
        ))
        .await;
    }
    // Reconciles are under way: addresses are claimed, and writes reached loxilb and hang
    // there (the restart marker's, which the rules' wait behind).
    wait_for(
        "claims of the Services",
        Duration::from_secs(60),
        || async { (w.claims().await.len() >= 6).then_some(()) },
    )
    .await;
    wait_for(
        "writes waiting at loxilb",
        Duration::from_secs(60),
        || async { (w.sim.writes() >= 1).then_some(()) },
    )
    .await;
    let started = Instant::now();
    unsafe {
        libc_kill(ccm.pid() as i32, 15);
    }
    let status = loop {
        if let Some(s) = ccm.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "loxi-ccm still running 60 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    eprintln!("loxi-ccm exited {status} {took:?} after SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        took < Duration::from_secs(8),
        "SIGTERM took {took:?}; log:\n{text}"
    );
    w.sim.set_write_latency(Duration::ZERO);
    w.finish().await;
}
