//! Where a Service's traffic goes, against a real kube-apiserver (RBAC on) and the loxilb
//! simulator: Node changes, EndpointSlices (`externalTrafficPolicy: Local`, pod-network mode),
//! more than 32 Nodes, Nodes present at start-up, Multus networks.

mod common;

use common::{CLASS, Options, WAIT, World, node_ports, wait_for};
use kube::api::{Patch, PatchParams};

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
