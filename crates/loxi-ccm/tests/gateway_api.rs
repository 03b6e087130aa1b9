//! The Gateway API (`--gateway-api`, docs/gateway-api.md) on the real API server with the
//! upstream CRDs (v1.6.3, fetched by scripts/gateway-api-crds.sh) and the loxilb simulator:
//! a Gateway with a TCP and a UDP listener, routes from two namespaces (one allowed, one
//! not), the rules and the statuses with the spec's reasons; endpoints that follow the
//! backends; the same address and the rules back after a controller restart and a loxilb
//! restart; nothing left once the Gateway is deleted.

mod common;

use common::gateway::{
    CONTROLLER, backend, cond, create, delete_gateway, delete_gateway_class, gateway_options,
    gateway_world, get, pair, programmed_address, resource, route_verdict,
};
use common::{Options, WAIT, wait_for};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::gateway_api::Channel;

#[tokio::test]
async fn gateway_with_tcp_and_udp_routes_from_two_namespaces() {
    let opts = gateway_options();
    let mut w = gateway_world("gwapi", Channel::Standard, opts.clone()).await;
    let ns = w.ns.clone();
    let other = format!("{ns}-other");
    let namespaces: Api<Namespace> = Api::all(w.client.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": other, "labels": {"gw-access": "yes"}}
            }))
            .unwrap(),
        )
        .await;

    // Backends in the Gateway's namespace: ClusterIP Services with their EndpointSlices.
    let tcp_eps = [
        ("10.244.0.1", true),
        ("10.244.0.2", true),
        ("10.244.0.3", false),
    ];
    backend(&w, "tcp-backend", ("tcp", 9000, "TCP"), 8080, &tcp_eps).await;
    let udp_eps = [("10.244.1.1", true)];
    backend(&w, "udp-backend", ("dns", 53, "UDP"), 5353, &udp_eps).await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &ns);

    let class = format!("loxilb-{}", std::process::id());
    create(
        &w,
        None,
        "GatewayClass",
        json!({
            "metadata": {"name": class},
            "spec": {"controllerName": CONTROLLER}
        }),
    )
    .await;
    create(&w, Some(&ns), "Gateway", json!({
        "metadata": {"name": "gw"},
        "spec": {
            "gatewayClassName": class,
            "listeners": [
                {"name": "tcp", "port": 8000, "protocol": "TCP"},
                {"name": "udp", "port": 5300, "protocol": "UDP", "allowedRoutes": {
                    "namespaces": {"from": "Selector", "selector": {"matchLabels": {"gw-access": "yes"}}}
                }}
            ]
        }
    }))
    .await;
    let parent = |section: &str| json!([{"name": "gw", "namespace": ns, "sectionName": section}]);
    // Allowed: a TCPRoute of the Gateway's namespace on the TCP listener (From: Same).
    create(&w, Some(&ns), "TCPRoute", json!({
        "metadata": {"name": "web"},
        "spec": {"parentRefs": parent("tcp"), "rules": [{"backendRefs": [{"name": "tcp-backend", "port": 9000}]}]}
    }))
    .await;
    // Allowed, with unusable backends: a missing Service, a kind that is not a Service.
    create(&w, Some(&ns), "TCPRoute", json!({
        "metadata": {"name": "missing"},
        "spec": {"parentRefs": parent("tcp"), "rules": [{"backendRefs": [{"name": "nothing-here", "port": 1}]}]}
    }))
    .await;
    create(
        &w,
        Some(&ns),
        "TCPRoute",
        json!({
            "metadata": {"name": "wrong-kind"},
            "spec": {"parentRefs": parent("tcp"), "rules": [{"backendRefs": [
                {"group": "example.com", "kind": "Thing", "name": "tcp-backend", "port": 9000}
            ]}]}
        }),
    )
    .await;
    // Allowed from the other namespace (its labels match the UDP listener's selector), its
    // backend across namespaces granted by a ReferenceGrant.
    create(
        &w,
        Some(&other),
        "UDPRoute",
        json!({
            "metadata": {"name": "dns"},
            "spec": {"parentRefs": parent("udp"), "rules": [{"backendRefs": [
                {"name": "udp-backend", "namespace": ns, "port": 53}
            ]}]}
        }),
    )
    .await;
    let grants =
        Api::<DynamicObject>::namespaced_with(w.client.clone(), &ns, &resource("ReferenceGrant"));
    grants
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "ReferenceGrant",
                "metadata": {"name": "udp-from-other"},
                "spec": {
                    "from": [{"group": "gateway.networking.k8s.io", "kind": "UDPRoute", "namespace": other}],
                    "to": [{"group": "", "kind": "Service"}]
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // Not allowed: a TCPRoute of the other namespace on the TCP listener (From: Same), its
    // backend in the Gateway's namespace without a grant for TCPRoutes.
    create(
        &w,
        Some(&other),
        "TCPRoute",
        json!({
            "metadata": {"name": "intruder"},
            "spec": {"parentRefs": parent("tcp"), "rules": [{"backendRefs": [
                {"name": "tcp-backend", "namespace": ns, "port": 9000}
            ]}]}
        }),
    )
    .await;

    wait_for("GatewayClass accepted", WAIT, || async {
        let c = get(&w, None, "GatewayClass", &class).await?;
        let accepted = cond(&c["status"]["conditions"], "Accepted")?;
        let version = cond(&c["status"]["conditions"], "SupportedVersion")?;
        (accepted == pair("True", "Accepted") && version.0 == "True").then_some(())
    })
    .await;
    let ip = programmed_address(&w, 3, 1).await;
    let tcp = |eps: &[&str]| {
        (
            8000u16,
            "tcp".to_string(),
            eps.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        )
    };
    let udp = (
        5300u16,
        "udp".to_string(),
        vec!["10.244.1.1:5353".to_string()],
    );
    wait_for("the Gateway's rules", WAIT, || async {
        (w.rules_for(&ip) == vec![udp.clone(), tcp(&["10.244.0.1:8080", "10.244.0.2:8080"])])
            .then_some(())
    })
    .await;
    let expect = [
        (
            ns.as_str(),
            "TCPRoute",
            "web",
            pair("True", "Accepted"),
            pair("True", "ResolvedRefs"),
        ),
        (
            ns.as_str(),
            "TCPRoute",
            "missing",
            pair("True", "Accepted"),
            pair("False", "BackendNotFound"),
        ),
        (
            ns.as_str(),
            "TCPRoute",
            "wrong-kind",
            pair("True", "Accepted"),
            pair("False", "InvalidKind"),
        ),
        (
            other.as_str(),
            "UDPRoute",
            "dns",
            pair("True", "Accepted"),
            pair("True", "ResolvedRefs"),
        ),
        (
            other.as_str(),
            "TCPRoute",
            "intruder",
            pair("False", "NotAllowedByListeners"),
            pair("False", "RefNotPermitted"),
        ),
    ];
    for (route_ns, kind, name, accepted, resolved) in &expect {
        wait_for(
            &format!("{kind} {route_ns}/{name}: {accepted:?} {resolved:?}"),
            WAIT,
            || async {
                (route_verdict(&w, route_ns, kind, name).await?
                    == (accepted.clone(), resolved.clone()))
                    .then_some(())
            },
        )
        .await;
    }
    // The refused route also gets a Warning Event naming the reason (once, in its namespace).
    wait_for("a Warning Event on the refused route", WAIT, || async {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(w.client.clone(), &other);
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("intruder")
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("NotAllowedByListeners")
            })
            .then_some(())
    })
    .await;
    // The address is a durable claim with the Gateway as its owner.
    let claims = w.claims().await;
    let claim = claims
        .iter()
        .find(|c| c.spec.address == ip)
        .expect("the Gateway's claim");
    assert_eq!(claim.spec.service.name, "gw");
    assert_eq!(claim.spec.service.role.as_deref(), Some("gateway"));

    // Backends scaled up, then down: the endpoints follow.
    let patch = |eps: &[(&str, bool)]| json!({"endpoints": eps.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect::<Vec<_>>()});
    slices
        .patch(
            "tcp-backend-1",
            &PatchParams::default(),
            &Patch::Merge(&patch(&[
                ("10.244.0.1", true),
                ("10.244.0.2", true),
                ("10.244.0.3", true),
                ("10.244.0.4", true),
            ])),
        )
        .await
        .unwrap();
    let four = [
        "10.244.0.1:8080",
        "10.244.0.2:8080",
        "10.244.0.3:8080",
        "10.244.0.4:8080",
    ];
    wait_for("scaled up", WAIT, || async {
        (w.rules_for(&ip) == vec![udp.clone(), tcp(&four)]).then_some(())
    })
    .await;
    slices
        .patch(
            "tcp-backend-1",
            &PatchParams::default(),
            &Patch::Merge(&patch(&[("10.244.0.4", true)])),
        )
        .await
        .unwrap();
    wait_for("scaled down", WAIT, || async {
        (w.rules_for(&ip) == vec![udp.clone(), tcp(&["10.244.0.4:8080"])]).then_some(())
    })
    .await;

    // A controller restart: the same address, the rules as they were.
    w.stop_controller().await;
    w.start_controller(&opts).await;
    assert_eq!(programmed_address(&w, 3, 1).await, ip);
    // A loxilb restart (its rules wiped): the rules come back on the same address.
    w.sim.restart();
    wait_for("rules back after a loxilb restart", WAIT, || async {
        (w.rules_for(&ip) == vec![udp.clone(), tcp(&["10.244.0.4:8080"])]).then_some(())
    })
    .await;
    assert_eq!(programmed_address(&w, 3, 1).await, ip);

    // The Gateway deleted: its rules and its claim go, then the Gateway itself.
    delete_gateway(&w, &ns).await;
    assert!(
        w.rules_for(&ip).is_empty(),
        "rules left: {:?}",
        w.rules_for(&ip)
    );
    wait_for("claim gone", WAIT, || async {
        (!w.claims().await.iter().any(|c| c.spec.address == ip)).then_some(())
    })
    .await;
    // Our entries leave the routes' status once their Gateway is gone.
    wait_for("route status cleared", WAIT, || async {
        let route = get(&w, Some(&ns), "TCPRoute", "web").await?;
        let ours = route["status"]["parents"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["controllerName"] == CONTROLLER));
        (!ours).then_some(())
    })
    .await;
    delete_gateway_class(&w, &class).await;
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
}

/// The shipped RBAC (deploy/ and deploy/optional/gateway-api-rbac.yaml, as `kubectl apply`
/// takes them) is all the Gateway controller needs: it runs with the shipped
/// ServiceAccount's token, here on the experimental channel's CRDs (their v1 kinds).
#[tokio::test]
async fn the_shipped_rbac_serves_a_gateway_on_the_experimental_channel() {
    let opts = Options {
        leader_elect: false,
        ..gateway_options()
    };
    let mut w = gateway_world("gwrbac", Channel::Experimental, opts.clone()).await;
    let cp = common::control_plane();
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for file in [
        deploy.clone(),
        deploy.join("optional/gateway-api-rbac.yaml"),
    ] {
        common::kubectl_apply_strict(cp, &file);
    }
    let sa_kc = common::shipped_service_account_kubeconfig(cp, "gateway-sa.kubeconfig");
    let sa_client = cp.client_for_kubeconfig(&sa_kc).await.unwrap();
    w.stop_controller().await;
    w.controller = Some(w.spawn_controller_with(sa_client, &opts));

    let ns = w.ns.clone();
    let echo_eps = [("10.244.2.1", true)];
    backend(&w, "echo", ("tcp", 7000, "TCP"), 7007, &echo_eps).await;
    let class = format!("loxilb-rbac-{}", std::process::id());
    create(
        &w,
        None,
        "GatewayClass",
        json!({"metadata": {"name": class}, "spec": {"controllerName": CONTROLLER}}),
    )
    .await;
    create(
        &w,
        Some(&ns),
        "Gateway",
        json!({
            "metadata": {"name": "gw"},
            "spec": {
                "gatewayClassName": class,
                "listeners": [
                    {"name": "tcp", "port": 7000, "protocol": "TCP"},
                    {"name": "udp", "port": 7001, "protocol": "UDP"}
                ]
            }
        }),
    )
    .await;
    create(
        &w,
        Some(&ns),
        "TCPRoute",
        json!({
            "metadata": {"name": "echo"},
            "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "tcp"}],
                "rules": [{"backendRefs": [{"name": "echo", "port": 7000}]}]
            }
        }),
    )
    .await;
    let ip = programmed_address(&w, 1, 0).await;
    let want = vec![(
        7000u16,
        "tcp".to_string(),
        vec!["10.244.2.1:7007".to_string()],
    )];
    wait_for("the rule", WAIT, || async {
        (w.rules_for(&ip) == want).then_some(())
    })
    .await;
    wait_for("the route accepted", WAIT, || async {
        (route_verdict(&w, &ns, "TCPRoute", "echo").await?
            == (pair("True", "Accepted"), pair("True", "ResolvedRefs")))
            .then_some(())
    })
    .await;
    delete_gateway(&w, &ns).await;
    assert!(w.rules_for(&ip).is_empty());
    delete_gateway_class(&w, &class).await;
}
