//! Gateway API routes on the real API server with the upstream CRDs (standard channel) and
//! the loxilb simulator, beside `gateway_api.rs`: HTTPRoutes attached by namespace and
//! hostname with the spec's parent reasons and the listener's `attachedRoutes`; a backendRef
//! to another namespace followed only while a ReferenceGrant (v1beta1) there allows it.

mod common;

use common::gateway::{
    CONTROLLER, cond, create, create_slice, delete_gateway, delete_gateway_class, gateway_options,
    gateway_world, get, pair, resource_of, route_verdict,
};
use common::{WAIT, World, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use testenv::gateway_api::Channel;

async fn namespace(w: &World, name: &str, labels: Value) {
    let namespaces: Api<Namespace> = Api::all(w.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap(),
        )
        .await
        .unwrap();
}

async fn delete_namespace(w: &World, name: &str) {
    let namespaces: Api<Namespace> = Api::all(w.client.clone());
    let _ = namespaces.delete(name, &DeleteParams::default()).await;
}

/// A Service with one port in `ns`, and its EndpointSlice of ready `pods` on `target`.
async fn backend_in(w: &World, ns: &str, name: &str, port: i32, target: i32, pods: &[&str]) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "main", "port": port, "protocol": "TCP"}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(w.client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let ready: Vec<(&str, bool)> = pods.iter().map(|p| (*p, true)).collect();
    create_slice(
        w,
        ns,
        &format!("{name}-1"),
        name,
        ("main", target, "TCP"),
        &ready,
    )
    .await;
}

async fn class(w: &World, name: &str) {
    create(
        w,
        None,
        "GatewayClass",
        json!({"metadata": {"name": name}, "spec": {"controllerName": CONTROLLER}}),
    )
    .await;
}

/// The listener `name`'s status of the Gateway `gw`, once written for its generation.
async fn listener_status(w: &World, gw: &str, name: &str) -> Option<Value> {
    let g = get(w, Some(&w.ns), "Gateway", gw).await?;
    let generation = &g["metadata"]["generation"];
    let l = g["status"]["listeners"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == name)?
        .clone();
    l["conditions"]
        .as_array()?
        .iter()
        .all(|c| &c["observedGeneration"] == generation)
        .then_some(l)
}

#[tokio::test]
async fn http_routes_attach_by_namespace_and_hostname() {
    let w = gateway_world("gwhttp", Channel::Standard, gateway_options()).await;
    let ns = w.ns.clone();
    let allowed = format!("{ns}-allowed");
    let denied = format!("{ns}-denied");
    namespace(&w, &allowed, json!({"gw-access": "yes"})).await;
    namespace(&w, &denied, json!({})).await;
    backend_in(&w, &allowed, "web", 80, 8080, &["10.244.3.1"]).await;
    backend_in(&w, &denied, "web", 80, 8080, &["10.244.4.1"]).await;
    let class_name = format!("loxilb-http-{}", std::process::id());
    class(&w, &class_name).await;
    create(
        &w,
        Some(&ns),
        "Gateway",
        json!({
            "metadata": {"name": "gw"},
            "spec": {
                "gatewayClassName": class_name,
                "listeners": [{
                    "name": "web", "port": 80, "protocol": "HTTP", "hostname": "*.example.com",
                    "allowedRoutes": {"namespaces": {
                        "from": "Selector", "selector": {"matchLabels": {"gw-access": "yes"}}
                    }}
                }]
            }
        }),
    )
    .await;
    let route = |section: &str, hostnames: &[&str]| {
        json!({
            "parentRefs": [{"name": "gw", "namespace": ns, "sectionName": section}],
            "hostnames": hostnames,
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]
        })
    };
    let routes = [
        (&allowed, "ok", route("web", &["a.example.com"])),
        (&denied, "denied", route("web", &["a.example.com"])),
        (&allowed, "wrong-host", route("web", &["a.example.org"])),
        (&allowed, "no-listener", route("nope", &[])),
    ];
    for (route_ns, name, spec) in &routes {
        create(
            &w,
            Some(route_ns.as_str()),
            "HTTPRoute",
            json!({"metadata": {"name": name}, "spec": spec}),
        )
        .await;
    }
    let expect = [
        (
            &allowed,
            "ok",
            pair("True", "Accepted"),
            pair("True", "ResolvedRefs"),
        ),
        (
            &denied,
            "denied",
            pair("False", "NotAllowedByListeners"),
            pair("True", "ResolvedRefs"),
        ),
        (
            &allowed,
            "wrong-host",
            pair("False", "NoMatchingListenerHostname"),
            pair("True", "ResolvedRefs"),
        ),
        (
            &allowed,
            "no-listener",
            pair("False", "NoMatchingParent"),
            pair("True", "ResolvedRefs"),
        ),
    ];
    for (route_ns, name, accepted, resolved) in &expect {
        wait_for(
            &format!("HTTPRoute {route_ns}/{name}: {accepted:?} {resolved:?}"),
            WAIT,
            || async {
                (route_verdict(&w, route_ns, "HTTPRoute", name).await?
                    == (accepted.clone(), resolved.clone()))
                    .then_some(())
            },
        )
        .await;
    }
    // One route attached; the listener takes HTTPRoutes, is accepted, and is programmed
    // (its traffic goes to loxilb-ingress: docs/gateway-api.md#http).
    let l = wait_for("the listener counts one route", WAIT, || async {
        let l = listener_status(&w, "gw", "web").await?;
        (l["attachedRoutes"] == 1).then_some(l)
    })
    .await;
    assert_eq!(l["supportedKinds"][0]["kind"], "HTTPRoute");
    assert_eq!(
        cond(&l["conditions"], "Accepted"),
        Some(pair("True", "Accepted"))
    );
    wait_for("the HTTP listener programmed", WAIT, || async {
        let l = listener_status(&w, "gw", "web").await?;
        (cond(&l["conditions"], "Programmed")? == pair("True", "Programmed")).then_some(())
    })
    .await;
    // The denied namespace gains the label: its route attaches, the count follows.
    let namespaces: Api<Namespace> = Api::all(w.client.clone());
    namespaces
        .patch(
            &denied,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"gw-access": "yes"}}})),
        )
        .await
        .unwrap();
    wait_for(
        "the relabelled namespace's route attached",
        WAIT,
        || async {
            (route_verdict(&w, &denied, "HTTPRoute", "denied").await?.0 == pair("True", "Accepted"))
                .then_some(())
        },
    )
    .await;
    wait_for("the listener counts two routes", WAIT, || async {
        (listener_status(&w, "gw", "web").await?["attachedRoutes"] == 2).then_some(())
    })
    .await;

    delete_gateway(&w, &ns).await;
    delete_gateway_class(&w, &class_name).await;
    delete_namespace(&w, &allowed).await;
    delete_namespace(&w, &denied).await;
}

#[tokio::test]
async fn a_backend_of_another_namespace_needs_a_reference_grant() {
    let w = gateway_world("gwgrant", Channel::Standard, gateway_options()).await;
    let ns = w.ns.clone();
    let db = format!("{ns}-db");
    namespace(&w, &db, json!({})).await;
    backend_in(&w, &db, "pg", 5432, 15432, &["10.244.5.1", "10.244.5.2"]).await;
    let class_name = format!("loxilb-grant-{}", std::process::id());
    class(&w, &class_name).await;
    create(
        &w,
        Some(&ns),
        "Gateway",
        json!({
            "metadata": {"name": "gw"},
            "spec": {
                "gatewayClassName": class_name,
                "listeners": [{"name": "pg", "port": 5432, "protocol": "TCP"}]
            }
        }),
    )
    .await;
    create(
        &w,
        Some(&ns),
        "TCPRoute",
        json!({
            "metadata": {"name": "pg"},
            "spec": {
                "parentRefs": [{"name": "gw"}],
                "rules": [{"backendRefs": [{"name": "pg", "namespace": db, "port": 5432}]}]
            }
        }),
    )
    .await;
    let ip = wait_for("the Gateway's address", WAIT, || async {
        let g = get(&w, Some(&ns), "Gateway", "gw").await?;
        g["status"]["addresses"][0]["value"]
            .as_str()
            .map(String::from)
    })
    .await;
    let not_permitted = (pair("True", "Accepted"), pair("False", "RefNotPermitted"));
    wait_for("RefNotPermitted without a grant", WAIT, || async {
        (route_verdict(&w, &ns, "TCPRoute", "pg").await? == not_permitted).then_some(())
    })
    .await;
    // The status is written after the pass applied the rules: the ungranted backend gave
    // the listener no endpoint, so no rule.
    assert!(w.rules_for(&ip).is_empty(), "rules: {:?}", w.rules_for(&ip));

    let grants = Api::<DynamicObject>::namespaced_with(
        w.client.clone(),
        &db,
        &resource_of("ReferenceGrant", "v1beta1"),
    );
    let grant: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": "routes-of-app"},
        "spec": {
            "from": [{"group": "gateway.networking.k8s.io", "kind": "TCPRoute", "namespace": ns}],
            "to": [{"group": "", "kind": "Service", "name": "pg"}]
        }
    }))
    .unwrap();
    grants.create(&PostParams::default(), &grant).await.unwrap();
    let rule = vec![(
        5432u16,
        "tcp".to_string(),
        vec![
            "10.244.5.1:15432".to_string(),
            "10.244.5.2:15432".to_string(),
        ],
    )];
    wait_for(
        "the granted backend's endpoints in the rule",
        WAIT,
        || async { (w.rules_for(&ip) == rule).then_some(()) },
    )
    .await;
    wait_for("ResolvedRefs once granted", WAIT, || async {
        (route_verdict(&w, &ns, "TCPRoute", "pg").await?
            == (pair("True", "Accepted"), pair("True", "ResolvedRefs")))
            .then_some(())
    })
    .await;
    // The grant withdrawn: not permitted again, the endpoints leave the rule.
    grants
        .delete("routes-of-app", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("RefNotPermitted once the grant is gone", WAIT, || async {
        (route_verdict(&w, &ns, "TCPRoute", "pg").await? == not_permitted).then_some(())
    })
    .await;
    wait_for("the rule gone with its endpoints", WAIT, || async {
        w.rules_for(&ip).is_empty().then_some(())
    })
    .await;

    delete_gateway(&w, &ns).await;
    delete_gateway_class(&w, &class_name).await;
    delete_namespace(&w, &db).await;
}
