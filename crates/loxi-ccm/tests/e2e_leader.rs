//! End to end, leadership: the built `loxi-ccm` binary, replicas of it started after the
//! `deploy/` manifests are applied to a real kube-apiserver (RBAC on), as the shipped
//! ServiceAccount: the leader fails over, a frozen leader resumed writes nothing, a promoted
//! standby brings back no Service deleted while it stood by. (Split from `e2e_binary.rs`.)

mod common;
#[path = "common/e2e_setup.rs"]
mod e2e_setup;

use std::time::{Duration, Instant};

use e2e_setup::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};

/// Two replicas of the binary with leader election, as the Deployment runs them: the leader
/// is stopped in the middle of a burst, the standby takes over; no duplicate address, no lost
/// and no orphaned rule.
#[tokio::test]
async fn leader_failover_between_two_processes() {
    let (cp, sa_kc, admin, sim) = two_process_setup("fo-a", "10.8.0.1").await;

    let start = |name: &str| {
        let port = testenv::free_port().unwrap();
        let flags = replica_flags(&sim, port);
        (spawn_named(&cp, &sa_kc, name, flags), port)
    };
    let mut replicas = vec![start("replica-a"), start("replica-b")];
    let leader = wait_for("a leader", || async {
        for (i, (_, port)) in replicas.iter().enumerate() {
            if role(*port).await.contains("(leader") {
                return Some(i);
            }
        }
        None
    })
    .await;

    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    let svc = |i: usize| one_port_service(&format!("fo{i}"));
    let published = || shown(&services);
    for i in 0..10 {
        services
            .create(&PostParams::default(), &svc(i))
            .await
            .unwrap();
    }
    wait_for("first addresses", || async {
        (published().await.len() >= 3).then_some(())
    })
    .await;
    // Stop the leader mid-burst (SIGTERM: it releases the Lease).
    let (mut old, _) = replicas.remove(leader);
    unsafe {
        libc_kill(old.0.id() as i32, 15);
    }
    let stopped = Instant::now();
    for i in 10..20 {
        services
            .create(&PostParams::default(), &svc(i))
            .await
            .unwrap();
    }
    let _ = old.0.wait();
    let all = wait_for("20 addresses after failover", || async {
        let p = published().await;
        (p.len() == 20).then_some(p)
    })
    .await;
    eprintln!(
        "standby served all 20 Services {:?} after the leader's SIGTERM",
        stopped.elapsed()
    );
    let unique: std::collections::BTreeSet<&String> = all.values().collect();
    assert_eq!(unique.len(), 20, "duplicate addresses: {all:?}");
    wait_for("exactly the 20 rules", || async {
        let ips: std::collections::BTreeSet<String> =
            sim.rules().into_iter().map(|r| r.external_ip).collect();
        (ips.len() == 20 && ips.iter().all(|ip| unique.contains(ip))).then_some(())
    })
    .await;
    // The new leader deletes as well: no orphan left.
    for i in 0..5 {
        services
            .delete(&format!("fo{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("rules of deleted Services gone", || async {
        (sim.rules().len() == 15).then_some(())
    })
    .await;
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("15 claims", || async {
        (claims.list(&Default::default()).await.ok()?.items.len() == 15).then_some(())
    })
    .await;
    for (mut child, _) in replicas {
        unsafe {
            libc_kill(child.0.id() as i32, 15);
        }
        let _ = child.0.wait();
    }
}

/// The leader is frozen (SIGSTOP) with rule writes in flight, long enough for the standby to
/// take over, serve new Services and delete old ones; once resumed (SIGCONT) the old leader
/// must not write to loxilb at all: its Lease ran out while it was frozen, and every write
/// asks the Lease before it starts, after each step that waits and when the connection
/// writes it (`loxilb_client::LoxilbClient::with_write_gate`). The writes are told apart by
/// the caller the simulator records (each replica sends its Lease identity,
/// `loxilb_client::IDENTITY_HEADER`): the new leader may go on writing meanwhile (in one CI
/// run, a count of all writes saw 22 where 21 were expected and could not say whose).
#[tokio::test]
async fn a_frozen_leader_once_resumed_writes_nothing_to_loxilb() {
    let (cp, sa_kc, admin, sim) = two_process_setup("pause-a", "10.8.2.1").await;
    let mut replicas = vec![
        start_replica(&cp, &sa_kc, &sim, "pause-1"),
        start_replica(&cp, &sa_kc, &sim, "pause-2"),
    ];
    let leader = wait_for("a leader", || async {
        for (i, (_, port)) in replicas.iter().enumerate() {
            if role(*port).await.contains("(leader") {
                return Some(i);
            }
        }
        None
    })
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    for i in 0..6 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("p{i}")))
            .await
            .unwrap();
    }
    wait_for("6 Services served", || async {
        (shown(&services).await.len() == 6 && sim.rules().len() == 6).then_some(())
    })
    .await;
    // The leader's identity, as its Lease and every loxilb call it sends name it.
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-system");
    let old_leader = lease
        .get("loxi-ccm")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a Lease holder");
    assert!(
        old_leader.starts_with(&format!("pause-{}_", leader + 1)),
        "{old_leader}"
    );
    assert!(
        sim.writes_from(&old_leader) >= 6,
        "the leader's writes carry its identity: {:?}",
        sim.writes_by_caller()
    );

    // Writes now take 1.5 s: the next Services' rule POSTs are in flight at the freeze.
    sim.set_write_latency(Duration::from_millis(1500));
    let writes_before = sim.writes();
    for i in 6..12 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("p{i}")))
            .await
            .unwrap();
    }
    wait_for("a rule write in flight", || async {
        (sim.writes() > writes_before).then_some(())
    })
    .await;
    let (frozen, _) = replicas.remove(leader);
    let (_, standby_port) = replicas[0];
    let stopped_at = sim.uptime();
    unsafe {
        libc_kill(frozen.0.id() as i32, 19); // SIGSTOP
    }
    sim.set_write_latency(Duration::ZERO);
    wait_for("the standby leads", || async {
        role(standby_port).await.contains("(leader").then_some(())
    })
    .await;
    wait_for("12 Services served by the new leader", || async {
        (shown(&services).await.len() == 12 && sim.rules().len() == 12).then_some(())
    })
    .await;
    for i in 0..6 {
        services
            .delete(&format!("p{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("the deleted Services' rules and claims gone", || async {
        let claims = claims.list(&Default::default()).await.ok()?.items.len();
        (sim.rules().len() == 6 && claims == 6).then_some(())
    })
    .await;
    // The live Services' addresses: a deleted Service may still be listed (its finalizer on
    // its way out) with the address it showed.
    let listed = services.list(&Default::default()).await.unwrap().items;
    let deleting: Vec<String> = listed
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_some())
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    if !deleting.is_empty() {
        eprintln!(
            "deleted Services still listed once their rules and claims are gone: {deleting:?}"
        );
    }
    let live: std::collections::BTreeSet<String> = shown(&services)
        .await
        .into_iter()
        .filter(|(name, _)| !deleting.contains(name))
        .map(|(_, ip)| ip)
        .collect();
    let rules_before = sim.rules();
    let writes_before = sim.writes();
    let old_writes_before = sim.writes_from(&old_leader);
    let logged_before = sim.write_log().len();

    let mut frozen = frozen;
    let resumed_at = sim.uptime();
    unsafe {
        libc_kill(frozen.0.id() as i32, 18); // SIGCONT
    }
    // It finds its Lease lost and exits (a restart brings it back as a standby).
    let exited = Instant::now();
    loop {
        if frozen.0.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            exited.elapsed() < Duration::from_secs(60),
            "the resumed old leader did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let since: Vec<String> = sim.write_log()[logged_before..]
        .iter()
        .map(|w| {
            format!(
                "{} {} {} by {} (accepted {:?}, completed {:?} after the simulator's start)",
                w.method,
                w.path,
                w.status,
                w.caller.as_deref().unwrap_or("?"),
                w.accepted,
                w.completed
            )
        })
        .collect();
    // Read before the check: on a failure its tail tells what the old leader did on resuming
    // (the control plane's directory does not outlive the run).
    let log = std::fs::read_to_string(
        cp.dir()
            .join(format!("pause-{}.log", if leader == 0 { 1 } else { 2 })),
    )
    .unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    assert_eq!(
        sim.writes_from(&old_leader),
        old_writes_before,
        "the resumed old leader {old_leader} wrote to loxilb: {since:?}; SIGSTOP {:?} and \
         SIGCONT {:?} after the simulator's start (a write accepted before SIGSTOP left before \
         the freeze); its log, last lines first:\n{}",
        stopped_at,
        resumed_at,
        tail.join("\n")
    );
    // Anybody else's (the new leader's) are only reported.
    eprintln!(
        "writes after SIGCONT: {} in all, 0 by the old leader: {since:?}",
        sim.writes() - writes_before
    );
    assert_eq!(sim.rules(), rules_before);
    let ips: std::collections::BTreeSet<String> =
        sim.rules().into_iter().map(|r| r.external_ip).collect();
    assert_eq!(ips, live, "rules for exactly the live Services");
    eprintln!(
        "old leader after SIGCONT: {} write(s) stopped by the Lease check",
        log.matches("may no longer write").count()
    );
    audit_clean(&admin, &sim).await;
}

/// A standby started while Services existed, which then saw them deleted by the leader, is
/// promoted: it must only ever clean up, never claim or program a Service that is gone (its
/// reconciles queued at start-up hold the old objects while they wait for leadership).
#[tokio::test]
async fn a_promoted_standby_never_brings_back_services_deleted_while_it_stood_by() {
    let (cp, sa_kc, admin, sim) = two_process_setup("promo-a", "10.8.3.1").await;
    let (mut first, first_port) = start_replica(&cp, &sa_kc, &sim, "promo-1");
    wait_for("a leader", || async {
        role(first_port).await.contains("(leader").then_some(())
    })
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    for i in 0..4 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("q{i}")))
            .await
            .unwrap();
    }
    wait_for("4 Services served", || async {
        (shown(&services).await.len() == 4 && sim.rules().len() == 4).then_some(())
    })
    .await;
    let (_second, second_port) = start_replica(&cp, &sa_kc, &sim, "promo-2");
    wait_for("a synced standby", || async {
        role(second_port).await.contains("(standby").then_some(())
    })
    .await;
    for i in 0..4 {
        services
            .delete(&format!("q{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("all gone", || async {
        let gone = !services
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with('q'))
            });
        let claims = claims.list(&Default::default()).await.ok()?.items.len();
        (gone && claims == 0 && sim.rules().is_empty()).then_some(())
    })
    .await;
    unsafe {
        libc_kill(first.0.id() as i32, 15);
    }
    let _ = first.0.wait();
    wait_for("the standby leads", || async {
        role(second_port).await.contains("(leader").then_some(())
    })
    .await;
    // A Service created after the promotion is served after the reconciles queued before it.
    services
        .create(&PostParams::default(), &one_port_service("q9"))
        .await
        .unwrap();
    let ip = wait_for("q9 served", || async {
        let ip = shown(&services).await.get("q9").cloned()?;
        sim.rules()
            .iter()
            .any(|r| r.external_ip == ip)
            .then_some(ip)
    })
    .await;
    let claimed: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.spec.service.name)
        .collect();
    assert_eq!(
        claimed,
        vec!["q9".to_string()],
        "claims for deleted Services"
    );
    let ips: Vec<String> = sim.rules().into_iter().map(|r| r.external_ip).collect();
    assert_eq!(ips, vec![ip], "rules for deleted Services");
    audit_clean(&admin, &sim).await;
}
