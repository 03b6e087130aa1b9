//! A Service's life against a real kube-apiserver (RBAC on) and the loxilb simulator: an
//! address and rules, then cleanup on delete; class-less Services and CCM mode; a Service
//! leaving type LoadBalancer; an exhausted pool; a controller restart. (Endpoints and Nodes are
//! in `service_endpoints.rs`, loxilb faults and bad input in `service_faults.rs`.)

mod common;

use common::{CLASS, COND_ADDRESS, COND_PROGRAMMED, Options, WAIT, World, node_ports, wait_for};
use kube::api::{DeleteParams, Patch, PatchParams};

#[tokio::test]
async fn service_gets_ip_and_rules_then_cleanup_on_delete() {
    let w = World::new("lifecycle").await;
    w.add_node("node-a", "10.0.0.1").await;
    w.add_node("node-b", "10.0.0.2").await;
    // Another class's Service, created first: must be left alone.
    w.create(&World::lb_service(
        "foreign",
        Some("example.com/other"),
        &[(80, "TCP")],
    ))
    .await;
    let svc = w
        .create(&World::lb_service(
            "web",
            Some(CLASS),
            &[(80, "TCP"), (53, "UDP")],
        ))
        .await;
    let np = node_ports(&svc);

    let ip = w.wait_for_ip("web").await;
    assert!(ip.starts_with("192.0.2."), "{ip} not from the CIDR");
    let want = vec![
        (
            53u16,
            "udp".to_string(),
            vec![format!("10.0.0.1:{}", np[1]), format!("10.0.0.2:{}", np[1])],
        ),
        (
            80u16,
            "tcp".to_string(),
            vec![format!("10.0.0.1:{}", np[0]), format!("10.0.0.2:{}", np[0])],
        ),
    ];
    wait_for("both rules in the simulator", WAIT, || async {
        (w.rules_for(&ip) == want).then_some(())
    })
    .await;
    let names: Vec<String> = w.sim.rules().iter().map(|r| r.name.clone()).collect();
    assert!(
        names.contains(&format!("ccm-test_{}_web_80_tcp:llb-inst0", w.ns)),
        "{names:?}"
    );
    let svc = wait_for("Programmed=True", WAIT, || async {
        let s = w.get("web").await?;
        (World::condition(&s, COND_PROGRAMMED)?.0 == "True").then_some(s)
    })
    .await;
    assert_eq!(World::condition(&svc, COND_ADDRESS).unwrap().0, "True");
    assert!(
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"loxilb.io/loadbalancer-cleanup".to_string())
    );
    let reasons = wait_for("Normal events", WAIT, || async {
        let r = w.event_reasons("web").await;
        r.contains(&"RulesProgrammed".to_string()).then_some(r)
    })
    .await;
    assert!(
        reasons.contains(&"AddressAllocated".to_string()),
        "{reasons:?}"
    );

    // The other class's Service: no address, no finalizer, no rule.
    let foreign = w.get("foreign").await.unwrap();
    assert!(foreign.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        foreign
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(w.sim.rules().len(), 2);

    // Delete: rules gone, finalizer removed, Service gone.
    w.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("Service gone", WAIT, || async {
        w.get("web").await.is_none().then_some(())
    })
    .await;
    assert!(
        w.sim.rules().is_empty(),
        "rules left behind: {:?}",
        w.sim.rules()
    );
    w.finish().await;
}

#[tokio::test]
async fn classless_services_need_ccm_mode_and_get_the_standard_finalizer() {
    let w = World::with(
        "ccm",
        Options {
            ccm_mode: true,
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.0.2.1").await;
    w.create(&World::lb_service("plain", None, &[(443, "TCP")]))
        .await;
    let ip = w.wait_for_ip("plain").await;
    let svc = w.get("plain").await.unwrap();
    assert!(
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"service.kubernetes.io/load-balancer-cleanup".to_string())
    );
    wait_for("rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;

    // Type changed away from LoadBalancer: rule removed, status cleared, finalizer gone.
    w.services
        .patch(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec":{"type":"ClusterIP"}})),
        )
        .await
        .unwrap();
    wait_for("cleanup after type change", WAIT, || async {
        let s = w.get("plain").await?;
        let no_fin = s.metadata.finalizers.clone().unwrap_or_default().is_empty();
        let no_ip = s
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_none_or(|i| i.is_empty());
        (no_fin && no_ip && w.sim.rules().is_empty()).then_some(())
    })
    .await;
    w.finish().await;
}

/// What a Service that stopped being a load balancer must look like once cleaned up: no
/// finalizer, no address shown, no claim, no rule.
async fn wait_cleaned_up(w: &World, name: &str, ip: &str) {
    wait_for(
        "cleanup of a Service that left LoadBalancer",
        WAIT,
        || async {
            let s = w.get(name).await?;
            let no_fin = s.metadata.finalizers.clone().unwrap_or_default().is_empty();
            let no_ip = s
                .status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_none_or(|i| i.is_empty());
            let no_claim = w.claims().await.iter().all(|c| c.spec.address != ip);
            (no_fin && no_ip && no_claim && w.rules_for(ip).is_empty()).then_some(())
        },
    )
    .await;
}

// The Service watch only sees type LoadBalancer (field selector): a type change arrives as a
// deletion of a Service that still exists, with our finalizer.
#[tokio::test]
async fn a_service_leaving_load_balancer_is_cleaned_up_live_and_after_a_restart() {
    // No drift check or claim collection within the test: the watch path alone must do it.
    let opts = Options {
        drift: "10m",
        ..Options::default()
    };
    let mut w = World::with("departure", opts.clone()).await;
    w.add_node("node-a", "10.0.4.1").await;
    // Live: the controller sees the type change.
    let live_ip = w.serve_one_port("live", 80).await;
    let to_cluster_ip = Patch::Merge(serde_json::json!({"spec":{"type":"ClusterIP"}}));
    w.services
        .patch("live", &PatchParams::default(), &to_cluster_ip)
        .await
        .unwrap();
    wait_cleaned_up(&w, "live", &live_ip).await;

    // While no controller runs: found by the sweep after the new one's first listing.
    let offline_ip = w.serve_one_port("offline", 80).await;
    w.stop_controller().await;
    w.services
        .patch("offline", &PatchParams::default(), &to_cluster_ip)
        .await
        .unwrap();
    w.start_controller(&opts).await;
    wait_cleaned_up(&w, "offline", &offline_ip).await;

    // Out and straight back in: served again, with an address and its rule.
    w.services
        .patch("live", &PatchParams::default(), &to_lb_of_class())
        .await
        .unwrap();
    let back = w.wait_for_ip("live").await;
    w.services
        .patch("live", &PatchParams::default(), &to_cluster_ip)
        .await
        .unwrap();
    w.services
        .patch("live", &PatchParams::default(), &to_lb_of_class())
        .await
        .unwrap();
    wait_for(
        "served again after leaving and coming back",
        WAIT,
        || async {
            let s = w.get("live").await?;
            let ip = s.status?.load_balancer?.ingress?.first()?.ip.clone()?;
            let fin = s.metadata.finalizers.unwrap_or_default();
            (fin.iter().any(|f| f == "loxilb.io/loadbalancer-cleanup")
                && w.rules_for(&ip).len() == 1
                && w.claims().await.iter().any(|c| c.spec.address == ip))
            .then_some(())
        },
    )
    .await;
    let _ = back;
    w.finish().await;
}

fn to_lb_of_class() -> Patch<serde_json::Value> {
    Patch::Merge(serde_json::json!({"spec":{"type":"LoadBalancer","loadBalancerClass":CLASS}}))
}

#[tokio::test]
async fn classless_services_are_ignored_without_ccm_mode() {
    let w = World::new("noccm").await;
    w.add_node("node-a", "10.0.3.1").await;
    w.create(&World::lb_service("plain", None, &[(80, "TCP")]))
        .await;
    // Barrier: a Service of our class gets served, so the controller has seen both.
    w.create(&World::lb_service("ours", Some(CLASS), &[(80, "TCP")]))
        .await;
    w.wait_for_ip("ours").await;
    let plain = w.get("plain").await.unwrap();
    assert!(plain.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        plain
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_none()
    );
    w.finish().await;
}

#[tokio::test]
async fn exhausted_pool_waits_then_gets_freed_address() {
    let w = World::with(
        "exhaust",
        Options {
            cidr: "192.0.2.8/30".into(), // two usable addresses
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.0.7.1").await;
    for name in ["a", "b"] {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
        w.wait_for_ip(name).await;
    }
    let ip_a = w.wait_for_ip("a").await;
    w.create(&World::lb_service("c", Some(CLASS), &[(80, "TCP")]))
        .await;
    wait_for("PoolExhausted condition", WAIT, || async {
        let s = w.get("c").await?;
        (World::condition(&s, COND_ADDRESS)?.1 == "PoolExhausted").then_some(())
    })
    .await;
    w.services
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let ip_c = w.wait_for_ip("c").await;
    assert_eq!(ip_c, ip_a, "c gets the address a freed");
    w.finish().await;
}

#[tokio::test]
async fn controller_restart_keeps_every_address() {
    let mut w = World::new("ctrlrestart").await;
    w.add_node("node-a", "10.0.8.1").await;
    let mut before = Vec::new();
    for i in 0..5 {
        let name = format!("svc{i}");
        w.create(&World::lb_service(&name, Some(CLASS), &[(80, "TCP")]))
            .await;
    }
    for i in 0..5 {
        before.push(w.wait_for_ip(&format!("svc{i}")).await);
    }
    w.stop_controller().await;
    // Free the lowest address while no controller runs: a naive allocator would hand it to
    // the next Service and could reshuffle; ours rebuilds from what Services show.
    w.services
        .delete("svc0", &DeleteParams::default())
        .await
        .unwrap();
    w.start_controller(&Options::default()).await;
    wait_for("svc0 cleaned up by the new controller", WAIT, || async {
        w.get("svc0").await.is_none().then_some(())
    })
    .await;
    w.create(&World::lb_service("late", Some(CLASS), &[(80, "TCP")]))
        .await;
    let late = w.wait_for_ip("late").await;
    for (i, ip) in before.iter().enumerate().skip(1) {
        assert_eq!(&w.wait_for_ip(&format!("svc{i}")).await, ip);
    }
    assert!(!before[1..].contains(&late), "{late} duplicated");
    wait_for("4 + 1 rules", WAIT, || async {
        (w.sim.rules().len() == 5).then_some(())
    })
    .await;
    w.finish().await;
}
