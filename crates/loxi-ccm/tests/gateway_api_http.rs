//! HTTP and HTTPS listeners, kube-loxilb's way (docs/gateway-api.md#http), on the real API
//! server with the upstream CRDs and the loxilb simulator: the Gateway's LoadBalancer
//! Service `<gateway>-ingress-service` in front of the loxilb-ingress pods, an Ingress of
//! class `loxilb` per attached HTTPRoute (hosts, paths, backends, the HTTPS listener's
//! Secret), the listeners' rules to the loxilb-ingress pods, certificate references across
//! namespaces only with a ReferenceGrant; the Ingress goes with its route, the Service with
//! its Gateway.

mod common;

use common::gateway::{
    api, class_and_gateway, cond, create, gateway_options, gateway_world, get, pair, resource_of,
    tls_secret, tls_secret_of,
};
use common::{WAIT, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};
use testenv::gateway_api::Channel;

async fn listener(w: &common::World, name: &str) -> Option<Value> {
    let g = get(w, Some(&w.ns), "Gateway", "gw").await?;
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

/// The loxilb-ingress pod 10.244.9.1 behind the Gateway `gw`'s ingress Service, as the
/// EndpointSlice controller would list it, on `ports` (the Service port's name, the pod's
/// port).
async fn ingress_pod(w: &common::World, ports: &[(&str, i32)]) {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(name, port)| json!({"name": name, "port": port, "protocol": "TCP"}))
        .collect();
    Api::<EndpointSlice>::namespaced(w.client.clone(), &w.ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "gw-ingress-service-1",
                             "labels": {"kubernetes.io/service-name": "gw-ingress-service"}},
                "addressType": "IPv4",
                "ports": ports,
                "endpoints": [{"addresses": ["10.244.9.1"], "conditions": {"ready": true}}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn http_and_https_listeners_become_an_ingress_service_and_ingresses() {
    let opts = gateway_options();
    let w = gateway_world("gwhttp", Channel::Standard, opts).await;
    let ns = w.ns.clone();
    let other = format!("{ns}-certs");
    let namespaces: Api<Namespace> = Api::all(w.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}})).unwrap(),
        )
        .await
        .unwrap();
    // Real certificates: a Secret whose data is no certificate and key is refused.
    Api::<Secret>::namespaced(w.client.clone(), &ns)
        .create(
            &PostParams::default(),
            &tls_secret("tls-cert", "secure.example.com"),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(w.client.clone(), &other)
        .create(
            &PostParams::default(),
            &tls_secret("shared-cert", "shared.example.com"),
        )
        .await
        .unwrap();
    // The route's backend, and the loxilb-ingress pod behind the Gateway's ingress Service
    // (its EndpointSlice as the EndpointSlice controller would write it).
    w.services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    ingress_pod(&w, &[("http-80", 80), ("https-443", 443)]).await;
    let class = class_and_gateway(
        &w,
        "loxilb-http",
        json!([
            {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com"},
            {"name": "https", "port": 443, "protocol": "HTTPS",
             "hostname": "secure.example.com",
             "tls": {"mode": "Terminate", "certificateRefs": [{"name": "tls-cert"}]}},
            {"name": "https-other", "port": 8443, "protocol": "HTTPS",
             "tls": {"certificateRefs": [{"name": "shared-cert", "namespace": other}]}}
        ]),
    )
    .await;
    create(
        &w,
        Some(&ns),
        "HTTPRoute",
        json!({
            "metadata": {"name": "shop"},
            "spec": {
                "parentRefs": [
                    {"name": "gw", "sectionName": "http"},
                    {"name": "gw", "sectionName": "https"}
                ],
                "hostnames": ["shop.example.com", "secure.example.com"],
                "rules": [{
                    "matches": [
                        {"path": {"type": "PathPrefix", "value": "/api"}},
                        {"path": {"type": "Exact", "value": "/health"}}
                    ],
                    "backendRefs": [{"name": "web", "port": 8080}]
                }]
            }
        }),
    )
    .await;

    // The Gateway's address, once programmed.
    let ip = wait_for("the Gateway programmed", WAIT, || async {
        let gw = get(&w, Some(&ns), "Gateway", "gw").await?;
        (cond(&gw["status"]["conditions"], "Programmed")? == pair("True", "Programmed"))
            .then_some(())?;
        gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(String::from)
    })
    .await;
    // HTTP and HTTPS listeners are programmed; the one whose Secret is in another
    // namespace without a grant is not, and says why.
    for name in ["http", "https"] {
        wait_for(&format!("listener {name} programmed"), WAIT, || async {
            let l = listener(&w, name).await?;
            (cond(&l["conditions"], "Programmed")? == pair("True", "Programmed")
                && cond(&l["conditions"], "ResolvedRefs")? == pair("True", "ResolvedRefs")
                && l["attachedRoutes"] == 1)
                .then_some(())
        })
        .await;
    }
    wait_for("https-other refused its Secret", WAIT, || async {
        let l = listener(&w, "https-other").await?;
        (cond(&l["conditions"], "ResolvedRefs")? == pair("False", "RefNotPermitted")
            && cond(&l["conditions"], "Programmed")?.0 == "False")
            .then_some(())
    })
    .await;

    // The ingress Service: kube-loxilb's name and selector, the listeners' ports to
    // loxilb-ingress' 80 and 443, the Gateway's address, owned by the Gateway.
    let svc = wait_for("the ingress Service", WAIT, || async {
        let svc = w.services.get_opt("gw-ingress-service").await.ok()??;
        let shown = svc
            .status
            .as_ref()?
            .load_balancer
            .as_ref()?
            .ingress
            .as_ref()?;
        (shown.first()?.ip.as_deref() == Some(ip.as_str())).then_some(svc)
    })
    .await;
    let spec = svc.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    assert_eq!(spec.load_balancer_ip.as_deref(), Some(ip.as_str()));
    assert_eq!(
        spec.selector.unwrap().get("app").map(String::as_str),
        Some("loxilb-ingress")
    );
    let ports: Vec<(String, i32, String)> = spec
        .ports
        .unwrap()
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port,
                format!("{:?}", p.target_port),
            )
        })
        .collect();
    assert_eq!(
        ports,
        vec![
            ("http-80".into(), 80, "Some(Int(80))".into()),
            ("https-443".into(), 443, "Some(Int(443))".into()),
            ("https-8443".into(), 8443, "Some(Int(443))".into()),
        ]
    );
    let owner = &svc.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Gateway", "gw")
    );

    // The listeners' rules go to the loxilb-ingress pod.
    wait_for("the HTTP and HTTPS rules", WAIT, || async {
        let rules = w.rules_for(&ip);
        (rules.contains(&(80, "tcp".into(), vec!["10.244.9.1:80".into()]))
            && rules.contains(&(443, "tcp".into(), vec!["10.244.9.1:443".into()])))
        .then_some(())
    })
    .await;

    // The route's Ingress: class loxilb, the hosts both listeners allow, its paths and
    // backend, the HTTPS listener's Secret, owned by the route.
    let ingresses: Api<Ingress> = Api::namespaced(w.client.clone(), &ns);
    let ing = wait_for("the route's Ingress", WAIT, || async {
        ingresses.get_opt("shop").await.ok()?
    })
    .await;
    let spec = ing.spec.clone().unwrap();
    assert_eq!(spec.ingress_class_name.as_deref(), Some("loxilb"));
    let rules = spec.rules.unwrap();
    let mut hosts: Vec<String> = rules.iter().filter_map(|r| r.host.clone()).collect();
    hosts.sort();
    assert_eq!(hosts, vec!["secure.example.com", "shop.example.com"]);
    let paths: Vec<(String, String, String, i32)> = rules[0]
        .http
        .as_ref()
        .unwrap()
        .paths
        .iter()
        .map(|p| {
            let b = p.backend.service.as_ref().unwrap();
            (
                p.path.clone().unwrap(),
                p.path_type.clone(),
                b.name.clone(),
                b.port.as_ref().unwrap().number.unwrap(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        vec![
            ("/api".into(), "Prefix".into(), "web".into(), 8080),
            ("/health".into(), "Exact".into(), "web".into(), 8080),
        ]
    );
    let tls = spec.tls.unwrap();
    assert_eq!(tls.len(), 1);
    assert_eq!(tls[0].secret_name.as_deref(), Some("tls-cert"));
    assert_eq!(tls[0].hosts, Some(vec!["secure.example.com".to_string()]));
    let owner = &ing.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("HTTPRoute", "shop")
    );
    assert_eq!(
        ing.metadata.annotations.as_ref().unwrap()["parent-http-route"],
        "shop"
    );

    // A ReferenceGrant in the Secret's namespace lets the Gateway's listener use it.
    let grants = Api::<DynamicObject>::namespaced_with(
        w.client.clone(),
        &other,
        &resource_of("ReferenceGrant", "v1beta1"),
    );
    grants
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "gateway.networking.k8s.io/v1beta1",
                "kind": "ReferenceGrant",
                "metadata": {"name": "certs-for-gateways"},
                "spec": {
                    "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": ns}],
                    "to": [{"group": "", "kind": "Secret"}]
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    wait_for("https-other resolved once granted", WAIT, || async {
        let l = listener(&w, "https-other").await?;
        (cond(&l["conditions"], "ResolvedRefs")? == pair("True", "ResolvedRefs")).then_some(())
    })
    .await;

    // The route deleted: its Ingress goes.
    api(&w, Some(&ns), "HTTPRoute")
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the Ingress gone with its route", WAIT, || async {
        ingresses
            .get_opt("shop")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // The Gateway deleted: its ingress Service and rules go.
    api(&w, Some(&ns), "Gateway")
        .delete("gw", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the ingress Service gone with its Gateway",
        WAIT,
        || async {
            let svc: Option<Service> = w.services.get_opt("gw-ingress-service").await.ok()?;
            (svc.is_none() && w.rules_for(&ip).is_empty()).then_some(())
        },
    )
    .await;
    let _ = api(&w, None, "GatewayClass")
        .delete(&class, &DeleteParams::default())
        .await;
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
}

/// An HTTPS listener whose Secret is missing, or holds no certificate and key (the
/// upstream conformance suite's malformed Secret), is `ResolvedRefs=False`,
/// `InvalidCertificateRef` and not programmed, with a Warning Event, and gets no rule; the
/// Gateway's other listener carries on; the Secret mended, the listener resolves and gets
/// its rule.
#[tokio::test]
async fn https_listeners_with_a_missing_or_malformed_certificate_are_invalid() {
    let w = gateway_world("gwcert", Channel::Standard, gateway_options()).await;
    let ns = w.ns.clone();
    let secrets: Api<Secret> = Api::namespaced(w.client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("good", "good.example.com"),
        )
        .await
        .unwrap();
    // "Hello world" as both certificate and key, as the conformance suite writes it.
    secrets
        .create(
            &PostParams::default(),
            &tls_secret_of("malformed", "Hello world\n", "Hello world\n"),
        )
        .await
        .unwrap();
    let https = |name: &str, port: u16, secret: &str| {
        json!({"name": name, "port": port, "protocol": "HTTPS",
               "tls": {"mode": "Terminate", "certificateRefs": [{"name": secret}]}})
    };
    // The loxilb-ingress pod behind the Gateway's ingress Service, on every listener's port.
    ingress_pod(
        &w,
        &[("https-443", 443), ("https-8443", 443), ("https-9443", 443)],
    )
    .await;
    let class = class_and_gateway(
        &w,
        "loxilb-cert",
        json!([
            https("good", 443, "good"),
            https("malformed", 8443, "malformed"),
            https("missing", 9443, "absent"),
        ]),
    )
    .await;
    wait_for("the good listener resolved", WAIT, || async {
        let l = listener(&w, "good").await?;
        (cond(&l["conditions"], "ResolvedRefs")? == pair("True", "ResolvedRefs")).then_some(())
    })
    .await;
    for (name, says) in [
        ("malformed", "Secret {ns}/malformed cannot serve TLS"),
        ("missing", "Secret {ns}/absent does not exist"),
    ] {
        let says = says.replace("{ns}", &ns);
        let l = wait_for(&format!("listener {name} refused"), WAIT, || async {
            let l = listener(&w, name).await?;
            (cond(&l["conditions"], "ResolvedRefs")? == pair("False", "InvalidCertificateRef")
                && cond(&l["conditions"], "Programmed")? == pair("False", "Invalid"))
            .then_some(l)
        })
        .await;
        let message = l["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "ResolvedRefs")
            .unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains(&says), "{message}");
    }
    wait_for("a Warning Event on the Gateway", WAIT, || async {
        w.event_reasons("gw")
            .await
            .iter()
            .any(|r| r == "InvalidCertificateRef")
            .then_some(())
    })
    .await;
    // Only the served listener has a rule: none for those whose certificates do not resolve.
    let ip = wait_for("the Gateway's address", WAIT, || async {
        let gw = get(&w, Some(&ns), "Gateway", "gw").await?;
        gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(String::from)
    })
    .await;
    let rule = |port: u16| (port, "tcp".to_string(), vec!["10.244.9.1:443".to_string()]);
    let rules = wait_for("the good listener's rule", WAIT, || async {
        let rules = w.rules_for(&ip);
        rules.contains(&rule(443)).then_some(rules)
    })
    .await;
    assert_eq!(rules, vec![rule(443)]);
    // The Secret mended: its listener resolves.
    secrets
        .delete("malformed", &DeleteParams::default())
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("malformed", "mended.example.com"),
        )
        .await
        .unwrap();
    wait_for("the mended listener resolved", WAIT, || async {
        let l = listener(&w, "malformed").await?;
        (cond(&l["conditions"], "ResolvedRefs")? == pair("True", "ResolvedRefs")).then_some(())
    })
    .await;
    wait_for("the mended listener's rule", WAIT, || async {
        let mut rules = w.rules_for(&ip);
        rules.sort();
        (rules == vec![rule(443), rule(8443)]).then_some(())
    })
    .await;
    let _ = api(&w, None, "GatewayClass")
        .delete(&class, &DeleteParams::default())
        .await;
}
