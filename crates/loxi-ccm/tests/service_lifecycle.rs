//! The controller against a real kube-apiserver (RBAC on) and the loxilb simulator.

mod common;

use common::{CLASS, Options, WAIT, World, wait_for};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use loxilb_sim::Fault;

const COND_ADDRESS: &str = "loxilb.io/AddressAllocated";
const COND_PROGRAMMED: &str = "loxilb.io/Programmed";

fn node_ports(svc: &k8s_openapi::api::core::v1::Service) -> Vec<i32> {
    svc.spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.node_port.expect("nodePort assigned by the API server"))
        .collect()
}

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
async fn node_changes_move_endpoints() {
    let w = World::new("nodes").await;
    w.add_node("node-a", "10.0.1.1").await;
    let svc = w
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let np = node_ports(&svc)[0];
    let ip = w.wait_for_ip("web").await;
    let eps = |list: &[&str]| -> Vec<(u16, String, Vec<String>)> {
        vec![(
            80,
            "tcp".into(),
            list.iter().map(|i| format!("{i}:{np}")).collect(),
        )]
    };
    wait_for("one endpoint", WAIT, || async {
        (w.rules_for(&ip) == eps(&["10.0.1.1"])).then_some(())
    })
    .await;
    w.add_node("node-b", "10.0.1.2").await;
    wait_for("new node added", WAIT, || async {
        (w.rules_for(&ip) == eps(&["10.0.1.1", "10.0.1.2"])).then_some(())
    })
    .await;
    w.set_node_status("node-a", "10.0.1.1", false).await;
    wait_for("not-ready node removed", WAIT, || async {
        (w.rules_for(&ip) == eps(&["10.0.1.2"])).then_some(())
    })
    .await;
    // Excluded by label.
    w.nodes
        .patch(
            "node-b",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata":{"labels":{
                "node.kubernetes.io/exclude-from-external-load-balancers": "true"}}})),
        )
        .await
        .unwrap();
    w.set_node_status("node-a", "10.0.1.1", true).await;
    wait_for("excluded node removed, ready node back", WAIT, || async {
        (w.rules_for(&ip) == eps(&["10.0.1.1"])).then_some(())
    })
    .await;
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

// A drift check lists loxilb while a Service's own pass may have writes under way: it must
// leave those rules to that pass instead of sending the same change again.
#[tokio::test]
async fn a_drift_check_leaves_rules_with_writes_under_way_alone() {
    let opts = Options {
        drift: "200ms",
        ..Options::default()
    };
    let w = World::with("inflight", opts).await;
    w.add_node("node-a", "10.0.5.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rule with one endpoint", WAIT, || async {
        (w.rules_for(&ip).first()?.2.len() == 1).then_some(())
    })
    .await;
    // Writes now take 2 s while listings stay fast: about ten drift checks see the old rule
    // while the reconcile's update is on its way.
    w.sim.set_write_latency(std::time::Duration::from_secs(2));
    let posts = w.sim.rule_posts();
    w.add_node("node-b", "10.0.5.2").await;
    wait_for("rule with both endpoints", WAIT, || async {
        (w.rules_for(&ip).first()?.2.len() == 2).then_some(())
    })
    .await;
    // A few more drift checks (health probes and drift listings are all counted).
    let seen = w.sim.request_count();
    wait_for("more drift checks", WAIT, || async {
        (w.sim.request_count() >= seen + 10).then_some(())
    })
    .await;
    w.sim.set_write_latency(std::time::Duration::ZERO);
    assert_eq!(
        w.sim.rule_posts() - posts,
        1,
        "one update for one endpoint change, not one per drift check"
    );
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
async fn loxilb_restart_and_outage_are_repaired() {
    let w = World::new("restart").await;
    w.add_node("node-a", "10.0.4.1").await;
    w.create(&World::lb_service(
        "web",
        Some(CLASS),
        &[(80, "TCP"), (81, "TCP")],
    ))
    .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rules", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    // Restart = wipe, faster than anything else happens: the controller notices the loss.
    w.sim.restart();
    assert!(w.sim.rules().is_empty());
    wait_for("rules replayed after restart", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    // Down, wiped, up: replayed when it comes back.
    w.sim.go_down().await;
    w.sim.restart();
    w.sim.come_up().await.unwrap();
    wait_for("rules replayed after outage", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn loxilb_errors_are_reported_and_retried() {
    let w = World::new("faults").await;
    w.add_node("node-a", "10.0.5.1").await;
    w.sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let svc = wait_for("Programmed=False with the loxilb error", WAIT, || async {
        let s = w.get("web").await?;
        let (status, reason, _) = World::condition(&s, COND_PROGRAMMED)?;
        (status == "False" && reason == "LoxilbServerError").then_some(s)
    })
    .await;
    // The address is still allocated and shown.
    assert!(svc.status.unwrap().load_balancer.unwrap().ingress.is_some());
    w.sim.set_fault(None);
    wait_for("Programmed=True after loxilb recovers", WAIT, || async {
        let s = w.get("web").await?;
        (World::condition(&s, COND_PROGRAMMED)?.0 == "True").then_some(())
    })
    .await;
    assert_eq!(w.sim.rules().len(), 1);
    w.finish().await;
}

#[tokio::test]
async fn bad_annotation_is_reported_and_keeps_existing_rules() {
    let w = World::new("badann").await;
    w.add_node("node-a", "10.0.6.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;
    let before = w.sim.rules();
    w.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata":{"annotations":{"loxilb.io/lbmode":"fastest"}}}),
            ),
        )
        .await
        .unwrap();
    let (_, reason, message) = wait_for("InvalidAnnotation condition", WAIT, || async {
        let s = w.get("web").await?;
        let c = World::condition(&s, COND_PROGRAMMED)?;
        (c.1 == "InvalidAnnotation").then_some(c)
    })
    .await;
    assert_eq!(reason, "InvalidAnnotation");
    assert!(
        message.contains("loxilb.io/lbmode") && message.contains("fastest"),
        "{message}"
    );
    wait_for("Warning event", WAIT, || async {
        w.event_reasons("web")
            .await
            .contains(&"InvalidAnnotation".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(w.sim.rules(), before, "existing rule must stay as it was");
    // The same IP is still shown.
    assert_eq!(w.wait_for_ip("web").await, ip);
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

#[tokio::test]
async fn endpoint_slices_drive_local_policy_and_pod_network_mode() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, PostParams};

    // Source ranges as the rules' allowedSources (the `enforce` setting; the default
    // `firewall` is tested in source_ranges.rs).
    let enforce = Options {
        extra_args: vec!["--source-ranges=enforce".into()],
        ..Options::default()
    };
    let w = World::with("slices", enforce).await;
    w.add_node("node-a", "10.0.9.1").await;
    w.add_node("node-b", "10.0.9.2").await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &w.ns);
    let slice = |name: &str, svc: &str, port: (&str, i32), eps: &[(&str, &str, bool)]| {
        serde_json::from_value::<EndpointSlice>(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "ports": [{"name": port.0, "port": port.1, "protocol": "TCP"}],
            "endpoints": eps.iter().map(|(ip, node, ready)| serde_json::json!({
                "addresses": [ip], "nodeName": node, "conditions": {"ready": ready}
            })).collect::<Vec<_>>()
        }))
        .unwrap()
    };

    // externalTrafficPolicy: Local -> only nodes with a ready endpoint, NodePort target.
    let mut local = World::lb_service("local", Some(CLASS), &[(80, "TCP")]);
    local.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
    let local = w.create(&local).await;
    let np = node_ports(&local)[0];
    slices
        .create(
            &PostParams::default(),
            &slice(
                "local-1",
                "local",
                ("tcp-80", 8080),
                &[("10.244.1.5", "node-a", true)],
            ),
        )
        .await
        .unwrap();
    let ip = w.wait_for_ip("local").await;
    wait_for("Local: only node-a", WAIT, || async {
        (w.rules_for(&ip) == vec![(80, "tcp".to_string(), vec![format!("10.0.9.1:{np}")])])
            .then_some(())
    })
    .await;
    slices
        .replace("local-1", &PostParams::default(), &{
            let mut s = slice(
                "local-1",
                "local",
                ("tcp-80", 8080),
                &[
                    ("10.244.1.5", "node-a", false),
                    ("10.244.2.6", "node-b", true),
                ],
            );
            s.metadata.resource_version = slices
                .get("local-1")
                .await
                .unwrap()
                .metadata
                .resource_version;
            s
        })
        .await
        .unwrap();
    wait_for("Local: endpoint moved to node-b", WAIT, || async {
        (w.rules_for(&ip) == vec![(80, "tcp".to_string(), vec![format!("10.0.9.2:{np}")])])
            .then_some(())
    })
    .await;

    // Pod-network mode: ready pod IPs and the target port, source ranges as allowedSources.
    let mut pods = World::lb_service("pods", Some(CLASS), &[(80, "TCP")]);
    pods.metadata.annotations =
        Some([("loxilb.io/usepodnetwork".to_string(), "yes".to_string())].into());
    pods.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
    w.create(&pods).await;
    slices
        .create(
            &PostParams::default(),
            &slice(
                "pods-1",
                "pods",
                ("tcp-80", 8080),
                &[
                    ("10.244.1.7", "node-a", true),
                    ("10.244.2.8", "node-b", false),
                ],
            ),
        )
        .await
        .unwrap();
    let pip = w.wait_for_ip("pods").await;
    wait_for("pod endpoints with target port", WAIT, || async {
        (w.rules_for(&pip) == vec![(80, "tcp".to_string(), vec!["10.244.1.7:8080".to_string()])])
            .then_some(())
    })
    .await;
    let rule = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == pip)
        .unwrap();
    assert_eq!(rule.allowed_sources, vec!["203.0.113.0/24".to_string()]);
    w.finish().await;
}

#[tokio::test]
async fn more_than_32_nodes_use_a_stable_subset_and_say_so() {
    let admin_port = testenv::free_port().unwrap();
    let w = World::with(
        "many",
        Options {
            admin_port: Some(admin_port),
            ..Options::default()
        },
    )
    .await;
    for i in 1..=40 {
        w.add_node(&format!("n{i:02}"), &format!("10.2.0.{i}"))
            .await;
    }
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    let (status, reason, message) = wait_for("EndpointsComplete=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/EndpointsComplete").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "EndpointLimit")
    );
    assert!(message.contains("stable subset"), "{message}");
    let first = wait_for("32 endpoints", WAIT, || async {
        let r = w.rules_for(&ip);
        (r.len() == 1 && r[0].2.len() == 32).then_some(r[0].2.clone())
    })
    .await;
    // A node of the subset leaves: exactly one member is replaced (rendezvous hashing), the
    // other 31 stay where they are.
    let gone = first[0].clone();
    let gone_ip = gone.split(':').next().unwrap().to_string();
    let node = format!(
        "n{:02}",
        gone_ip.rsplit('.').next().unwrap().parse::<u8>().unwrap()
    );
    w.nodes.delete(&node, &Default::default()).await.unwrap();
    let second = wait_for("the subset without the deleted node", WAIT, || async {
        let r = w.rules_for(&ip);
        (r.len() == 1 && r[0].2.len() == 32 && !r[0].2.contains(&gone)).then_some(r[0].2.clone())
    })
    .await;
    let kept = second.iter().filter(|e| first.contains(e)).count();
    assert_eq!(kept, 31, "one member replaced: {first:?} -> {second:?}");
    assert!(first.iter().all(|e| e.starts_with("10.2.0.")));
    // A node outside the subset leaves: one candidate fewer is left out, the subset stays.
    wait_for("7 candidates left out", WAIT, || async {
        (World::metric(admin_port, "loxi_ccm_endpoints_dropped").await? == 7.0).then_some(())
    })
    .await;
    let outside = (1..=40)
        .map(|i| format!("10.2.0.{i}"))
        .find(|ip| ip != &gone_ip && !second.iter().any(|e| e.starts_with(&format!("{ip}:"))))
        .unwrap();
    let name = format!(
        "n{:02}",
        outside.rsplit('.').next().unwrap().parse::<u32>().unwrap()
    );
    w.nodes.delete(&name, &Default::default()).await.unwrap();
    wait_for(
        "6 left out after a node outside the subset left",
        WAIT,
        || async {
            (World::metric(admin_port, "loxi_ccm_endpoints_dropped").await? == 6.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        w.rules_for(&ip)[0].2,
        second,
        "subset changed though a node outside it left"
    );
    w.finish().await;
}

/// Nodes that were there when the controller started, and never changed since, are followed
/// as closely as new ones: deleted, made unready, excluded by label, each reflected in the
/// rules by the Node event (the drift check is 10 minutes away), and the last eligible Node
/// gone turns Programmed False with a Warning.
#[tokio::test]
async fn nodes_present_at_start_up_are_followed_by_their_events() {
    let opts = Options {
        drift: "10m",
        ..Options::default()
    };
    let mut w = World::with("nodesatstart", opts.clone()).await;
    w.stop_controller().await;
    for (name, ip) in [
        ("start-a", "10.4.0.1"),
        ("start-b", "10.4.0.2"),
        ("start-c", "10.4.0.3"),
        ("start-d", "10.4.0.4"),
    ] {
        w.add_node(name, ip).await;
    }
    let svc = w
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let node_port = svc.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
    w.start_controller(&opts).await;
    let ip = w.wait_for_ip("web").await;
    let endpoints =
        |ips: &[&str]| -> Vec<String> { ips.iter().map(|i| format!("{i}:{node_port}")).collect() };
    let wait_endpoints = |what: &'static str, want: Vec<String>| {
        let w = &w;
        let ip = ip.clone();
        async move {
            let started = std::time::Instant::now();
            wait_for(what, WAIT, || async {
                let r = w.rules_for(&ip);
                (r.len() == 1 && r[0].2 == want).then_some(())
            })
            .await;
            eprintln!("{what}: in the rules after {:?}", started.elapsed());
        }
    };
    wait_endpoints(
        "all four nodes",
        endpoints(&["10.4.0.1", "10.4.0.2", "10.4.0.3", "10.4.0.4"]),
    )
    .await;

    w.nodes
        .delete("start-a", &Default::default())
        .await
        .unwrap();
    wait_endpoints(
        "deleted node out",
        endpoints(&["10.4.0.2", "10.4.0.3", "10.4.0.4"]),
    )
    .await;
    w.set_node_status("start-b", "10.4.0.2", false).await;
    wait_endpoints("unready node out", endpoints(&["10.4.0.3", "10.4.0.4"])).await;
    w.nodes
        .patch(
            "start-c",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "node.kubernetes.io/exclude-from-external-load-balancers": ""
            }}})),
        )
        .await
        .unwrap();
    wait_endpoints("excluded node out", endpoints(&["10.4.0.4"])).await;

    // The last eligible Node goes: nothing to forward to.
    let started = std::time::Instant::now();
    w.nodes
        .delete("start-d", &Default::default())
        .await
        .unwrap();
    let (_, reason, _) = wait_for("Programmed=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/Programmed").filter(|c| c.0 == "False")
    })
    .await;
    eprintln!("no eligible node: reported after {:?}", started.elapsed());
    assert_eq!(reason, "NoEndpoints");
    wait_for("a Warning NoEndpoints", WAIT, || async {
        w.event_reasons("web")
            .await
            .contains(&"NoEndpoints".to_string())
            .then_some(())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn multus_networks_replace_pod_ips() {
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, PostParams};

    let w = World::with(
        "multus",
        Options {
            extra_args: vec!["--multus".into()],
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.0.10.1").await;
    // No controller-manager runs here: the namespace's default ServiceAccount is made by hand.
    let sas: Api<ServiceAccount> = Api::namespaced(w.client.clone(), &w.ns);
    let _ = sas
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await;
    let pods: Api<Pod> = Api::namespaced(w.client.clone(), &w.ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": {"name": "amf-0", "annotations": {
                "k8s.v1.cni.cncf.io/network-status":
                    r#"[{"name":"kindnet","ips":["10.244.1.9"],"default":true},{"name":"core/n2net","interface":"net1","ips":["192.168.50.7"]}]"#
            }},
            "spec": {"containers": [{"name": "c", "image": "example"}]}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let mut svc = World::lb_service("amf", Some(CLASS), &[(38412, "TCP")]);
    svc.metadata.annotations = Some(
        [
            ("loxilb.io/usepodnetwork".to_string(), "yes".to_string()),
            (
                "loxilb.io/multus-nets".to_string(),
                "core/n2net".to_string(),
            ),
        ]
        .into(),
    );
    w.create(&svc).await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &w.ns);
    slices
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "amf-1", "labels": {"kubernetes.io/service-name": "amf"}},
                "addressType": "IPv4",
                "ports": [{"name": "tcp-38412", "port": 38412, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["10.244.1.9"], "nodeName": "node-a",
                               "conditions": {"ready": true},
                               "targetRef": {"kind": "Pod", "namespace": w.ns, "name": "amf-0"}}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let ip = w.wait_for_ip("amf").await;
    wait_for("the pod's Multus address as endpoint", WAIT, || async {
        (w.rules_for(&ip)
            == vec![(
                38412,
                "tcp".to_string(),
                vec!["192.168.50.7:38412".to_string()],
            )])
        .then_some(())
    })
    .await;
    w.finish().await;
}

/// The same Event about the same object is counted (`series`), not created again, whatever
/// the Service's version; another note is another Event; one deleted in the API server is
/// created anew.
#[tokio::test]
async fn a_repeated_event_is_one_event_with_a_count() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource;
    use kube::api::{Api, ListParams};
    use kube::runtime::events::{Event, EventType, Reporter};
    use loxi_ccm::k8s::events::EventRecorder;

    let w = World::new("events").await;
    // Of a class the controller does not serve: the Events listed below are the test's own,
    // never the controller's (AddressAllocated, ...) for the same Service.
    let svc = w
        .create(&World::lb_service(
            "web",
            Some("example.com/not-ours"),
            &[(80, "TCP")],
        ))
        .await;
    let dropped = prometheus_client::metrics::counter::Counter::<u64>::default();
    let recorder = EventRecorder::new(
        w.client.clone(),
        Reporter {
            controller: "loxi-ccm".into(),
            instance: None,
        },
        dropped.clone(),
    );
    let warn = |note: &str| Event {
        type_: EventType::Warning,
        reason: "PoolExhausted".into(),
        note: Some(note.into()),
        action: "Allocate".into(),
        secondary: None,
    };
    let events: Api<K8sEvent> = Api::namespaced(w.client.clone(), &w.ns);
    let ours = || async {
        let mut list: Vec<K8sEvent> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
            .collect();
        list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        list
    };
    let count = |e: &K8sEvent| e.series.as_ref().map_or(1, |s| s.count);
    let publish = |note: &'static str, svc: &k8s_openapi::api::core::v1::Service| {
        let reference = svc.object_ref(&());
        let event = warn(note);
        let recorder = &recorder;
        // Queued: written by the recorder's task, in order; flush waits for it.
        async move {
            recorder.publish(event, reference);
            assert!(recorder.flush(WAIT).await, "event not written");
        }
    };

    publish("pool full", &svc).await;
    // A later version of the Service: still the same Event.
    let newer = w
        .services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .unwrap();
    assert_ne!(
        newer.metadata.resource_version,
        svc.metadata.resource_version
    );
    publish("pool full", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(count(&list[0]), 2);
    assert_eq!(recorder.cached(), 1);

    publish("pool gone", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 2, "{list:?}");

    // Deleted behind the recorder's back (or expired): published anew.
    for e in &list {
        events
            .delete(
                e.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    publish("pool full", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(count(&list[0]), 1);
    assert_eq!(list[0].note.as_deref(), Some("pool full"));
    assert_eq!(dropped.get(), 0);
    w.finish().await;
}

/// A bad address annotation added to a served Service: it keeps its address (status, claim)
/// and its rules, and the AddressAllocated condition says what is wrong until it is fixed.
#[tokio::test]
async fn a_bad_address_annotation_keeps_the_served_address() {
    let w = World::new("badaddrann").await;
    w.add_node("node-a", "10.5.0.1").await;
    let ip = w.serve_one_port("web", 80).await;
    let rules = w.rules_for(&ip);
    for (annotation, value) in [
        ("loxilb.io/staticIP", "not-an-ip"),
        ("loxilb.io/ipam", "ipv5"),
    ] {
        w.services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    "loxilb.io/staticIP": null, "loxilb.io/ipam": null, annotation: value
                }}})),
            )
            .await
            .unwrap();
        let s = wait_for("AddressAllocated=False", WAIT, || async {
            let s = w.get("web").await?;
            World::condition(&s, "loxilb.io/AddressAllocated")
                .filter(|c| c.0 == "False" && c.2.contains(value))
                .map(|_| s)
        })
        .await;
        let (_, reason, message) = World::condition(&s, "loxilb.io/AddressAllocated").unwrap();
        assert_eq!(reason, "InvalidAnnotation");
        assert!(
            message.contains(annotation) && message.contains(&ip),
            "{message}"
        );
        assert_eq!(
            w.published().await.get("web"),
            Some(&ip),
            "address unpublished"
        );
        let programmed = World::condition(&s, "loxilb.io/Programmed").unwrap();
        assert_eq!(programmed.0, "True", "{programmed:?}");
        assert_eq!(w.rules_for(&ip), rules);
        assert_eq!(w.claims().await.len(), 1);
    }
    w.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "loxilb.io/ipam": null
            }}})),
        )
        .await
        .unwrap();
    wait_for("AddressAllocated=True again", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/AddressAllocated").filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(w.published().await.get("web"), Some(&ip));
    w.finish().await;
}

/// An address whose AddressClaim the API server refuses (here a ValidatingAdmissionPolicy)
/// is reported on the Service and never programmed: not by its reconcile, not by the drift
/// check, not by the replay after loxilb restarted empty.
#[tokio::test]
async fn an_address_whose_claim_is_refused_is_reported_and_never_programmed() {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::discovery::ApiResource;

    let admin_port = testenv::free_port().unwrap();
    let w = World::with(
        "claimrefused",
        Options {
            drift: "1s",
            admin_port: Some(admin_port),
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.6.0.1").await;
    let refused = "192.0.2.77";
    let policy_name = format!("refuse-{}", w.ns);
    let policy = |kind: &str, plural: &str, spec: serde_json::Value| {
        let ar = ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": policy_name},
            "spec": spec,
        }))
        .unwrap();
        (Api::<DynamicObject>::all_with(w.client.clone(), &ar), obj)
    };
    let (policies, p) = policy(
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        serde_json::json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["ipam.loxilb.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["addressclaims"]
            }]},
            "validations": [{
                "expression": format!("object.spec.address != '{refused}'"),
                "message": format!("{refused} is kept out of every pool by policy")
            }]
        }),
    );
    policies.create(&PostParams::default(), &p).await.unwrap();
    let (bindings, b) = policy(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        serde_json::json!({"policyName": policy_name, "validationActions": ["Deny"]}),
    );
    bindings.create(&PostParams::default(), &b).await.unwrap();
    // The API server enforces a new policy after a moment: until a dry run is refused.
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(w.client.clone());
    let probe: loxi_ccm::ipam::claims::AddressClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1", "kind": "AddressClaim",
        "metadata": {"name": refused},
        "spec": {"address": refused, "service": {"namespace": w.ns, "name": "web"}}
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for("the policy in force", WAIT, || async {
        claims.create(&dry_run, &probe).await.is_err().then_some(())
    })
    .await;

    w.create(&common::annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/staticIP", refused)],
    ))
    .await;
    let (_, reason, message) = wait_for("AddressAllocated=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/AddressAllocated").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "AddressClaimRefused", "{message}");
    assert!(message.contains("kept out of every pool"), "{message}");
    wait_for("a Warning AddressClaimRefused", WAIT, || async {
        w.event_reasons("web")
            .await
            .contains(&"AddressClaimRefused".to_string())
            .then_some(())
    })
    .await;
    // Drift checks (every second) and a replay after loxilb restarted empty come and go.
    let lists = || World::metric_sum(admin_port, "loxi_ccm_loxilb_calls_total", &["op=\"list\""]);
    let before = lists().await.unwrap_or(0.0);
    wait_for("two more listings", WAIT, || async {
        (lists().await? >= before + 2.0).then_some(())
    })
    .await;
    w.sim.restart();
    let before = lists().await.unwrap_or(0.0);
    wait_for("the replay and a drift check", WAIT, || async {
        (lists().await? >= before + 2.0).then_some(())
    })
    .await;
    assert!(
        w.rules_for(refused).is_empty(),
        "an unclaimed address programmed"
    );
    assert!(w.claims().await.is_empty());
    assert_eq!(w.published().await.get("web"), None);
    let _ = bindings.delete(&policy_name, &Default::default()).await;
    let _ = policies.delete(&policy_name, &Default::default()).await;
    w.finish().await;
}

/// A huge multi-byte annotation value: the condition message and the Warning's note are cut
/// by bytes at a character boundary (the API server takes the Event), the value is quoted
/// once and shown cut with its size.
#[tokio::test]
async fn huge_annotation_values_give_bounded_messages_and_their_warning() {
    let w = World::new("hugeann").await;
    w.add_node("node-a", "10.5.1.1").await;
    let value = "é".repeat(20_000); // 40,000 bytes
    w.create(&common::annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/lbmode", &value)],
    ))
    .await;
    let (_, reason, message) = wait_for("Programmed=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/Programmed").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "InvalidAnnotation");
    assert!(message.len() <= 4096, "{} bytes", message.len());
    assert_eq!(
        message.matches("(40000 bytes)").count(),
        1,
        "the value shown once, cut: {message}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(w.client.clone(), &w.ns);
    let note = wait_for("the Warning", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidAnnotation"))
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.len() <= 1024, "{} bytes", note.len());
    w.finish().await;
}
