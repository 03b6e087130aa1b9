//! Programming several loxilb instances, loxilb's limits and the published status, against
//! a real kube-apiserver and loxilb simulators.

mod common;
#[path = "common/programming_setup.rs"]
mod programming_setup;

use std::time::Duration;

use common::{CLASS, COND_ADDRESS, COND_PROGRAMMED, Options, WAIT, World, annotated, wait_for};
use kube::api::{Api, DeleteParams, ListParams};
use loxilb_sim::{Fault, SimConfig};
use programming_setup::*;

#[tokio::test]
async fn every_instance_is_programmed_and_an_outage_is_partial_then_replayed() {
    let sim2 = start_sim().await;
    let w = World::with("fleet", with_instances(&[&sim2], "30s")).await;
    w.add_node("node-a", "10.2.0.1").await;
    w.create(&World::lb_service(
        "web",
        Some(CLASS),
        &[(80, "TCP"), (53, "UDP")],
    ))
    .await;
    w.wait_for_ip("web").await;
    let want = vec!["53/udp".to_string(), "80/tcp".to_string()];
    wait_for("rules on both instances", WAIT, || async {
        (rules_of(&w.sim, &w, "web") == want && rules_of(&sim2, &w, "web") == want).then_some(())
    })
    .await;
    let msg = wait_programmed(&w, "web", "True", "Programmed").await;
    assert!(msg.contains("2/2"), "{msg}");

    // The second instance goes away: still programmed (on every reachable instance), and
    // the condition says which one is missing.
    sim2.go_down().await;
    let msg = wait_programmed(&w, "web", "True", "PartiallyProgrammed").await;
    assert!(msg.contains(&sim2.url()), "{msg}");
    assert!(!msg.contains(&w.sim.url()), "{msg}");
    // A Service created meanwhile goes to the reachable instance at once.
    w.create(&World::lb_service("late", Some(CLASS), &[(8080, "TCP")]))
        .await;
    w.wait_for_ip("late").await;
    wait_for("late on the reachable instance", WAIT, || async {
        (rules_of(&w.sim, &w, "late") == ["8080/tcp"]).then_some(())
    })
    .await;
    let msg = wait_programmed(&w, "late", "True", "PartiallyProgrammed").await;
    assert!(msg.contains(&sim2.url()), "{msg}");

    // It comes back empty (a restart while down): everything is replayed, and the
    // Services say so.
    sim2.restart();
    sim2.come_up().await.unwrap();
    wait_for(
        "rules replayed on the instance that came back",
        WAIT,
        || async {
            (rules_of(&sim2, &w, "web") == want && rules_of(&sim2, &w, "late") == ["8080/tcp"])
                .then_some(())
        },
    )
    .await;
    wait_programmed(&w, "web", "True", "Programmed").await;
    wait_programmed(&w, "late", "True", "Programmed").await;

    // Restarted between two probes (never seen down): noticed by what it holds.
    sim2.restart();
    wait_for("rules replayed after a silent restart", WAIT, || async {
        (rules_of(&sim2, &w, "web") == want && rules_of(&sim2, &w, "late") == ["8080/tcp"])
            .then_some(())
    })
    .await;
    w.finish().await;
    sim2.shutdown().await;
}

#[tokio::test]
async fn drift_deletes_owned_orphans_and_never_foreign_rules() {
    let sim2 = start_sim().await;
    let w = World::with("drift", with_instances(&[&sim2], "1s")).await;
    w.add_node("node-a", "10.2.1.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    w.wait_for_ip("web").await;
    wait_for("rules on both instances", WAIT, || async {
        (rules_of(&w.sim, &w, "web").len() == 1 && rules_of(&sim2, &w, "web").len() == 1)
            .then_some(())
    })
    .await;

    let ghost = format!("ccm-test_{}_ghost_80_tcp:llb-inst0", w.ns);
    let foreign = [
        // kube-loxilb's naming, a hand-made rule, another cluster's, and this cluster's
        // rule of a namespace this controller does not watch.
        "default_other:llb-inst0".to_string(),
        "made-by-hand".to_string(),
        format!("ccm-othercluster_{}_ghost_81_tcp:llb-inst0", w.ns),
        "ccm-test_elsewhere_svc_82_tcp:llb-inst0".to_string(),
    ];
    for (i, name) in foreign.iter().enumerate() {
        post_rule(&sim2, name, "198.51.100.9", 1000 + i as u16).await;
    }
    post_rule(&sim2, &ghost, "198.51.100.10", 80).await;
    post_rule(&w.sim, &ghost, "198.51.100.10", 80).await;
    wait_for("the orphan deleted from both instances", WAIT, || async {
        (!names_on(&sim2).contains(&ghost) && !names_on(&w.sim).contains(&ghost)).then_some(())
    })
    .await;
    let left = names_on(&sim2);
    for name in &foreign {
        assert!(left.contains(name), "{name} was deleted: {left:?}");
    }
    assert_eq!(rules_of(&sim2, &w, "web"), ["80/tcp"]);
    assert_eq!(rules_of(&w.sim, &w, "web"), ["80/tcp"]);
    w.finish().await;
    sim2.shutdown().await;
}

#[tokio::test]
async fn capacity_is_reported_once_and_programmed_when_room_frees() {
    // loxilb with room for 3 rules: the controller (configured for loxilb's 2048) learns
    // the real size from the first refusal.
    let w = World::with_sim(
        "capacity",
        Options::default(),
        SimConfig {
            max_rules: 3,
            ..SimConfig::default()
        },
    )
    .await;
    w.add_node("node-a", "10.2.2.1").await;
    w.create(&World::lb_service(
        "first",
        Some(CLASS),
        &[(80, "TCP"), (81, "TCP")],
    ))
    .await;
    wait_programmed(&w, "first", "True", "Programmed").await;
    w.create(&World::lb_service(
        "second",
        Some(CLASS),
        &[(80, "TCP"), (81, "TCP")],
    ))
    .await;
    let msg = wait_programmed(&w, "second", "False", "CapacityExceeded").await;
    assert!(msg.contains(&w.sim.url()), "{msg}");
    // Never half-programmed: the rule that fitted was taken back; and with its rules on no
    // loxilb, its claimed address is not shown (users read it as ready).
    assert!(rules_of(&w.sim, &w, "second").is_empty());
    assert!(ingress(&w.get("second").await.unwrap()).is_empty());

    // A Service that fits is not held up by the one that does not.
    w.create(&World::lb_service("small", Some(CLASS), &[(90, "TCP")]))
        .await;
    wait_programmed(&w, "small", "True", "Programmed").await;
    assert_eq!(w.sim.rules().len(), 3);

    // Reconciling the blocked Service again (each new value of a retention it cannot parse
    // is one pass, seen in its address condition, which names the value) sends nothing and
    // publishes no new Warning.
    for value in ["soon", "later", "never", "whenever"] {
        annotate(&w, "second", "loxilb.io/retain-address", value).await;
        wait_for(&format!("a pass that read {value}"), WAIT, || async {
            let s = w.get("second").await?;
            let (_, _, message) = World::condition(&s, "loxilb.io/AddressAllocated")?;
            message.contains(value).then_some(())
        })
        .await;
    }
    wait_programmed(&w, "second", "False", "CapacityExceeded").await;
    let warnings = event_count(&w, "second", "CapacityExceeded").await;
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} CapacityExceeded events"
    );
    assert_eq!(w.sim.rules().len(), 3);

    // Room frees: the waiting Service is woken and programmed.
    w.services
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    wait_programmed(&w, "second", "True", "Programmed").await;
    assert_eq!(rules_of(&w.sim, &w, "second"), ["80/tcp", "81/tcp"]);
    w.wait_for_ip("second").await;
    w.finish().await;
}

#[tokio::test]
async fn ingress_has_ip_mode_and_ports_and_the_hostname_form_survives_a_restart() {
    let mut w = World::new("ingress").await;
    w.add_node("node-a", "10.2.4.1").await;
    w.create(&World::lb_service(
        "web",
        Some(CLASS),
        &[(80, "TCP"), (53, "UDP")],
    ))
    .await;
    let mut nat = World::lb_service("nat", Some(CLASS), &[(443, "TCP")]);
    nat.metadata.annotations = Some([("loxilb.io/lbmode".into(), "fullnat".into())].into());
    w.create(&nat).await;
    let ip = w.wait_for_ip("web").await;
    let web = w.get("web").await.unwrap();
    let entry = &ingress(&web)[0];
    assert_eq!(
        entry.ip_mode.as_deref(),
        Some("VIP"),
        "DNAT: kube-proxy may serve it"
    );
    let ports: Vec<(i32, String)> = entry
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.port, p.protocol.clone()))
        .collect();
    assert_eq!(ports, [(80, "TCP".into()), (53, "UDP".into())]);
    wait_for("fullnat published as Proxy", WAIT, || async {
        let s = w.get("nat").await?;
        (ingress(&s).first()?.ip_mode.as_deref() == Some("Proxy")).then_some(())
    })
    .await;

    // kube-loxilb's hostname form, on request.
    annotate(&w, "web", "loxilb.io/ingress-mode", "hostname").await;
    let host = format!("llb-{ip}");
    wait_for("hostname form", WAIT, || async {
        let s = w.get("web").await?;
        let e = ingress(&s);
        (e.len() == 1 && e[0].hostname.as_deref() == Some(host.as_str()) && e[0].ip.is_none())
            .then_some(())
    })
    .await;
    let rules_before = w.sim.rules();

    // A new controller reads the hostname back as the Service's address.
    w.stop_controller().await;
    w.start_controller(&Options::default()).await;
    w.create(&World::lb_service("late", Some(CLASS), &[(80, "TCP")]))
        .await;
    let late = w.wait_for_ip("late").await;
    assert_ne!(late, ip, "the hostname's address was handed out again");
    let web = wait_for("web still Programmed on its address", WAIT, || async {
        let s = w.get("web").await?;
        let (_, _, msg) = World::condition(&s, COND_ADDRESS)?;
        (msg.contains(&ip) && World::condition(&s, COND_PROGRAMMED)?.0 == "True").then_some(s)
    })
    .await;
    assert_eq!(ingress(&web)[0].hostname.as_deref(), Some(host.as_str()));
    for r in &rules_before {
        assert!(w.sim.rules().contains(r), "{r:?} changed");
    }
    let claims: Vec<String> = w
        .claims()
        .await
        .iter()
        .map(|c| c.spec.address.clone())
        .collect();
    assert!(claims.contains(&ip), "{claims:?}");

    // A bad value is reported like any bad annotation; the address stays published.
    annotate(&w, "web", "loxilb.io/ingress-mode", "magic").await;
    let msg = wait_programmed(&w, "web", "False", "InvalidAnnotation").await;
    assert!(msg.contains("loxilb.io/ingress-mode"), "{msg}");
    let web = w.get("web").await.unwrap();
    assert_eq!(ingress(&web)[0].hostname.as_deref(), Some(host.as_str()));
    w.finish().await;
}

#[tokio::test]
async fn deletion_waits_for_every_instance_that_may_hold_its_rules() {
    let sim2 = start_sim().await;
    let w = World::with("finalizer", with_instances(&[&sim2], "30s")).await;
    w.add_node("node-a", "10.2.5.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    w.wait_for_ip("web").await;
    wait_for("rules on both instances", WAIT, || async {
        (rules_of(&w.sim, &w, "web").len() == 1 && rules_of(&sim2, &w, "web").len() == 1)
            .then_some(())
    })
    .await;

    // A reachable instance that fails the delete holds the finalizer. (The second instance
    // is away from the start: a reachable one would lose the rule at once, before the
    // cleanup, service::teardown.)
    sim2.go_down().await;
    w.sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));
    w.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the failed cleanup reported", WAIT, || async {
        (event_count(&w, "web", "LoxilbServerError").await > 0).then_some(())
    })
    .await;
    assert!(w.get("web").await.is_some(), "finalizer released too early");

    // So does an unreachable instance that may still hold the rule (a slow or briefly
    // unreachable loxilb is not a gone one): once the reachable one is clean, the Service
    // stays, with one Warning naming the other, until that one answers and loses the rule.
    w.sim.set_fault(None);
    wait_for("the reachable instance clean", WAIT, || async {
        rules_of(&w.sim, &w, "web").is_empty().then_some(())
    })
    .await;
    let message = wait_for(
        "a Warning naming the unreachable instance",
        WAIT,
        || async {
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(w.client.clone(), &w.ns);
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                        && e.reason.as_deref() == Some("LoxilbUnavailable")
                })
                .and_then(|e| e.note)
        },
    )
    .await;
    assert!(message.contains(&sim2.url()), "{message}");
    assert!(
        w.get("web").await.is_some(),
        "released while its rule may remain"
    );
    assert_eq!(rules_of(&sim2, &w, "web").len(), 1, "state kept while down");
    sim2.come_up().await.unwrap();
    wait_for(
        "the rule removed once the instance is back",
        WAIT,
        || async { rules_of(&sim2, &w, "web").is_empty().then_some(()) },
    )
    .await;
    wait_for("Service gone", WAIT, || async {
        w.get("web").await.is_none().then_some(())
    })
    .await;
    w.finish().await;
    sim2.shutdown().await;
}

/// The only loxilb is down for 30 s while the cluster changes: a new Service claims its
/// address but shows none while no loxilb holds its rules, and says loxilb is unavailable
/// (one Warning); a deleted Service is kept (its rule may remain there) until loxilb answers,
/// a new Node appears. The controller keeps running; when loxilb is back (with its old state) every
/// difference is repaired: the new rule created, the deleted Service's rules removed, the
/// endpoints updated.
#[tokio::test]
async fn loxilb_down_for_thirty_seconds_then_back() {
    let w = World::new("outage").await;
    w.add_node("n1", "10.0.0.1").await;
    w.create(&World::lb_service("keep", Some(CLASS), &[(80, "TCP")]))
        .await;
    w.create(&World::lb_service("gone", Some(CLASS), &[(81, "TCP")]))
        .await;
    w.wait_for_ip("keep").await;
    w.wait_for_ip("gone").await;
    wait_programmed(&w, "keep", "True", "Programmed").await;
    wait_programmed(&w, "gone", "True", "Programmed").await;

    w.sim.go_down().await;
    let down_since = std::time::Instant::now();
    w.create(&World::lb_service("new", Some(CLASS), &[(82, "TCP")]))
        .await;
    let msg = wait_programmed(&w, "new", "False", "LoxilbUnavailable").await;
    assert!(msg.contains(&w.sim.url()), "{msg}");
    let shown = w
        .get("new")
        .await
        .and_then(|s| s.status?.load_balancer?.ingress);
    assert!(
        shown.unwrap_or_default().is_empty(),
        "no address before its rules are on a loxilb"
    );
    w.services
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    // Its rule may remain on the unreachable loxilb: its address and finalizer stay (one
    // Warning says why) until loxilb answers again.
    wait_for("a Warning that its rule may remain", WAIT, || async {
        (event_count(&w, "gone", "LoxilbUnavailable").await > 0).then_some(())
    })
    .await;
    w.add_node("n2", "10.0.0.2").await;
    // The outage itself is the scenario: it lasts 30 s whatever the controller does.
    let rest = Duration::from_secs(30).saturating_sub(down_since.elapsed());
    tokio::time::sleep(rest).await;
    assert_eq!(
        event_count(&w, "new", "LoxilbUnavailable").await,
        1,
        "one Warning for the episode, not one per retry"
    );
    let (_, handle) = w.controller.as_ref().expect("controller");
    assert!(!handle.is_finished(), "the controller kept running");
    let gone = w
        .get("gone")
        .await
        .expect("kept while loxilb may hold its rule");
    assert!(gone.metadata.deletion_timestamp.is_some());

    w.sim.come_up().await.unwrap();
    wait_for("gone deleted once its rule left loxilb", WAIT, || async {
        w.get("gone").await.is_none().then_some(())
    })
    .await;
    wait_for("every difference repaired", WAIT, || async {
        let keep_eps = w
            .sim
            .rules()
            .into_iter()
            .find(|r| r.port == 80)
            .map(|r| r.endpoints.len());
        (rules_of(&w.sim, &w, "gone").is_empty()
            && rules_of(&w.sim, &w, "new") == ["82/tcp"]
            && keep_eps == Some(2))
        .then_some(())
    })
    .await;
    wait_programmed(&w, "new", "True", "Programmed").await;
    wait_programmed(&w, "keep", "True", "Programmed").await;
    let new_ip = w.wait_for_ip("new").await;
    assert!(w.rules_for(&new_ip).iter().any(|(port, _, _)| *port == 82));
    w.finish().await;
}

/// Services waiting for room on a full loxilb are programmed in the order they started
/// waiting, whatever order their reconciles come round in.
#[tokio::test]
async fn services_waiting_for_capacity_are_served_in_the_order_they_waited() {
    let w = World::with_sim(
        "capacityorder",
        Options::default(),
        SimConfig {
            max_rules: 3,
            ..SimConfig::default()
        },
    )
    .await;
    w.add_node("node-a", "10.2.5.1").await;
    for name in ["full0", "full1", "full2"] {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
        wait_programmed(&w, name, "True", "Programmed").await;
    }
    for name in ["wait-c", "wait-a", "wait-b"] {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
        wait_programmed(&w, name, "False", "CapacityExceeded").await;
    }
    for (freed, next, still) in [
        ("full0", "wait-c", ["wait-a", "wait-b"]),
        ("full1", "wait-a", ["wait-b", "wait-b"]),
    ] {
        w.services
            .delete(freed, &DeleteParams::default())
            .await
            .unwrap();
        wait_programmed(&w, next, "True", "Programmed").await;
        for name in still {
            let s = w.get(name).await.unwrap();
            let (status, reason, _) = World::condition(&s, COND_PROGRAMMED).unwrap();
            assert_eq!(
                (status.as_str(), reason.as_str()),
                ("False", "CapacityExceeded"),
                "{name} served before {next}, which waited longer"
            );
        }
        assert_eq!(w.sim.rules().len(), 3);
    }
    w.finish().await;
}

/// What a live loxilb answers must not make the drift check loop: endpoints stored in
/// loxilb's own order, a removed endpoint kept hidden (every later re-POST of the rule
/// answers 200), and monitored endpoints turning `inactive` are all "converged".
#[tokio::test]
async fn the_drift_check_stays_quiet_on_loxilbs_real_answers() {
    let admin_port = testenv::free_port().unwrap();
    let w = World::with(
        "driftquiet",
        Options {
            drift: "1s",
            admin_port: Some(admin_port),
            ..Options::default()
        },
    )
    .await;
    // Addresses whose numeric order differs from loxilb's (last octet first).
    for (name, ip) in [
        ("quiet-a", "10.2.6.3"),
        ("quiet-b", "10.2.7.2"),
        ("quiet-c", "10.2.8.1"),
    ] {
        w.add_node(name, ip).await;
    }
    w.create(&annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[
            ("loxilb.io/liveness", "yes"),
            ("loxilb.io/probetimeout", "1"),
            ("loxilb.io/proberetries", "1"),
        ],
    ))
    .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("three endpoints", WAIT, || async {
        let r = w.rules_for(&ip);
        (r.len() == 1 && r[0].2.len() == 3).then_some(())
    })
    .await;
    // A removed endpoint stays hidden in loxilb's rule.
    w.nodes
        .delete("quiet-b", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("two endpoints", WAIT, || async {
        let r = w.rules_for(&ip);
        (r.len() == 1 && r[0].2.len() == 2).then_some(())
    })
    .await;
    // A monitored endpoint loxilb's probes give up on.
    w.sim
        .set_endpoint_reachable("10.2.8.1".parse().unwrap(), false);
    wait_for("an inactive endpoint", WAIT, || async {
        let (_, v) = raw_listing(&w.sim).await?;
        v.contains("inactive").then_some(())
    })
    .await;
    let lists = || World::metric_sum(admin_port, "loxi_ccm_loxilb_calls_total", &["op=\"list\""]);
    let writes = w.sim.writes();
    let before = lists().await.unwrap_or(0.0);
    wait_for("three drift checks", WAIT, || async {
        (lists().await? >= before + 3.0).then_some(())
    })
    .await;
    assert_eq!(
        w.sim.writes(),
        writes,
        "the drift check re-sent a converged rule"
    );
    w.finish().await;
}
