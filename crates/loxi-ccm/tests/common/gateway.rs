//! Helpers of the Gateway API tests (`gateway_api*.rs`): the upstream kinds as dynamic
//! objects, their conditions, backends with EndpointSlices, a world whose controller serves
//! the Gateway API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use testenv::gateway_api::Channel;

use super::{Options, WAIT, World, install_gateway_api_crds, wait_for};

pub const CONTROLLER: &str = "loxilb.io/loxilb";

pub fn resource(kind: &str) -> ApiResource {
    resource_of(kind, "v1")
}

/// A kind of the Gateway API group at `version` (ReferenceGrant is read as v1beta1).
pub fn resource_of(kind: &str, version: &str) -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: version.into(),
        api_version: format!("gateway.networking.k8s.io/{version}"),
        kind: kind.into(),
        plural: format!("{}s", kind.to_ascii_lowercase()).replace("classs", "classes"),
    }
}

pub fn api(w: &World, ns: Option<&str>, kind: &str) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(w.client.clone(), ns, &resource(kind)),
        None => Api::all_with(w.client.clone(), &resource(kind)),
    }
}

pub async fn create(w: &World, ns: Option<&str>, kind: &str, body: Value) {
    let mut body = body;
    body["apiVersion"] = json!("gateway.networking.k8s.io/v1");
    body["kind"] = json!(kind);
    let obj: DynamicObject = serde_json::from_value(body).unwrap();
    api(w, ns, kind)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("{kind} refused: {e}"));
}

/// Creates the GatewayClass `<prefix>-<pid>` of our controller and the Gateway `gw` of the
/// world's namespace with `listeners` on it; returns the class's name.
pub async fn class_and_gateway(w: &World, prefix: &str, listeners: Value) -> String {
    let class = format!("{prefix}-{}", std::process::id());
    create(
        w,
        None,
        "GatewayClass",
        json!({"metadata": {"name": class}, "spec": {"controllerName": CONTROLLER}}),
    )
    .await;
    create(
        w,
        Some(&w.ns),
        "Gateway",
        json!({
            "metadata": {"name": "gw"},
            "spec": {"gatewayClassName": class, "listeners": listeners}
        }),
    )
    .await;
    class
}

/// A `kubernetes.io/tls` Secret `name` holding `cert` and `key` as written.
pub fn tls_secret_of(name: &str, cert: &str, key: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        string_data: Some(BTreeMap::from([
            ("tls.crt".to_string(), cert.to_string()),
            ("tls.key".to_string(), key.to_string()),
        ])),
        ..Default::default()
    }
}

/// A `kubernetes.io/tls` Secret `name` with a new certificate for `host` and its key.
pub fn tls_secret(name: &str, host: &str) -> Secret {
    let ca = testenv::certs::TestCa::new("gateway-tests").unwrap();
    let c = ca.server_cert(&[host]).unwrap();
    tls_secret_of(name, &c.cert_pem, &c.key_pem)
}

pub async fn get(w: &World, ns: Option<&str>, kind: &str, name: &str) -> Option<Value> {
    api(w, ns, kind)
        .get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

/// (type, status, reason) of a condition in `conditions`.
pub fn cond(conditions: &Value, type_: &str) -> Option<(String, String)> {
    conditions.as_array()?.iter().find_map(|c| {
        (c["type"] == type_).then(|| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
    })
}

/// Our parent entry's (Accepted, ResolvedRefs) of a route, with the generations written.
pub async fn route_verdict(
    w: &World,
    ns: &str,
    kind: &str,
    name: &str,
) -> Option<((String, String), (String, String))> {
    let route = get(w, Some(ns), kind, name).await?;
    let generation = route["metadata"]["generation"].clone();
    let parent = route["status"]["parents"]
        .as_array()?
        .iter()
        .find(|p| p["controllerName"] == CONTROLLER)?
        .clone();
    let conds = &parent["conditions"];
    if conds
        .as_array()?
        .iter()
        .any(|c| c["observedGeneration"] != generation)
    {
        return None;
    }
    Some((cond(conds, "Accepted")?, cond(conds, "ResolvedRefs")?))
}

pub fn pair(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

pub fn slice(
    name: &str,
    svc: &str,
    port: (&str, i32, &str),
    eps: &[(&str, bool)],
) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": port.0, "port": port.1, "protocol": port.2}],
        "endpoints": eps.iter().map(|(ip, ready)| json!({
            "addresses": [ip], "conditions": {"ready": ready}
        })).collect::<Vec<_>>()
    }))
    .unwrap()
}

/// Creates in `ns` the EndpointSlice [`slice`] describes.
pub async fn create_slice(
    w: &World,
    ns: &str,
    name: &str,
    svc: &str,
    port: (&str, i32, &str),
    eps: &[(&str, bool)],
) {
    Api::<EndpointSlice>::namespaced(w.client.clone(), ns)
        .create(&PostParams::default(), &slice(name, svc, port, eps))
        .await
        .unwrap();
}

/// Deletes the Gateway `gw` of `ns` and waits until it is gone (its finalizer released).
pub async fn delete_gateway(w: &World, ns: &str) {
    api(w, Some(ns), "Gateway")
        .delete("gw", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("Gateway gone", WAIT, || async {
        get(w, Some(ns), "Gateway", "gw")
            .await
            .is_none()
            .then_some(())
    })
    .await;
}

/// Deletes the GatewayClass `name`, if it is there (a test's last clean-up).
pub async fn delete_gateway_class(w: &World, name: &str) {
    let _ = api(w, None, "GatewayClass")
        .delete(name, &DeleteParams::default())
        .await;
}

pub async fn backend_service(w: &World, name: &str, port: (&str, i32, &str)) {
    let svc = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": port.0, "port": port.1, "protocol": port.2}]}
    }))
    .unwrap();
    w.services
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// A backend in the world's namespace: the Service `name` on `port` and its EndpointSlice
/// `<name>-1` of `eps` on the port `target`.
pub async fn backend(
    w: &World,
    name: &str,
    port: (&str, i32, &str),
    target: i32,
    eps: &[(&str, bool)],
) {
    backend_service(w, name, port).await;
    let slice_name = format!("{name}-1");
    create_slice(w, &w.ns, &slice_name, name, (port.0, target, port.2), eps).await;
}

/// The Gateway's address once it shows one and is Programmed with both listeners counted.
pub async fn programmed_address(w: &World, tcp_routes: i64, udp_routes: i64) -> String {
    wait_for("the Gateway programmed", WAIT, || async {
        let gw = get(w, Some(&w.ns), "Gateway", "gw").await?;
        let status = &gw["status"];
        let generation = &gw["metadata"]["generation"];
        let conds = status["conditions"].as_array()?;
        if conds.iter().any(|c| &c["observedGeneration"] != generation) {
            return None;
        }
        if cond(&status["conditions"], "Programmed")? != pair("True", "Programmed")
            || cond(&status["conditions"], "Accepted")? != pair("True", "Accepted")
        {
            return None;
        }
        let listeners = status["listeners"].as_array()?;
        let attached = |name: &str| {
            listeners
                .iter()
                .find(|l| l["name"] == name)
                .and_then(|l| l["attachedRoutes"].as_i64())
        };
        if attached("tcp")? != tcp_routes || attached("udp")? != udp_routes {
            return None;
        }
        for l in listeners {
            for t in ["Accepted", "ResolvedRefs", "Programmed"] {
                if cond(&l["conditions"], t)?.0 != "True" {
                    return None;
                }
            }
            if cond(&l["conditions"], "Conflicted")? != pair("False", "NoConflicts") {
                return None;
            }
        }
        status["addresses"][0]["value"].as_str().map(String::from)
    })
    .await
}

/// A world whose controller serves the Gateway API, with the CRDs of `channel` installed
/// (while this test holds the binary's lock) before that controller starts.
pub async fn gateway_world(name: &str, channel: Channel, opts: Options) -> World {
    let plain = Options {
        extra_args: Vec::new(),
        ..opts.clone()
    };
    let mut w = World::with(name, plain).await;
    install_gateway_api_crds(&w.client, channel).await;
    w.stop_controller().await;
    w.start_controller(&opts).await;
    w
}

pub fn gateway_options() -> Options {
    Options {
        // The Gateway controller's resync is the drift interval: a loxilb restart is
        // repaired within it.
        drift: "2s",
        extra_args: vec![
            "--gatewayAPI".into(),
            format!("--loxilbGatewayClass={CONTROLLER}"),
        ],
        ..Options::default()
    }
}
