//! kube-loxilb's features of issue 28, against a real kube-apiserver (RBAC on) and the loxilb
//! simulator: `loxilb.io/useExternalEndpoint` on a selector-less Service with a hand-made
//! EndpointSlice, `--privateCIDR` (the rules' `privateIP`), and the `loxilb.io/mtls-*`
//! annotations refused on the Service (loxilb's rule API has no mTLS fields).

mod common;

use common::{CLASS, COND_PROGRAMMED, Options, WAIT, World, annotated, wait_for};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};

/// A hand-made slice for `svc`: addresses outside the cluster, no node, no conditions.
fn slice(name: &str, svc: &str, port: (&str, i32), addresses: &[&str]) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": port.0, "port": port.1, "protocol": "TCP"}],
        "endpoints": addresses.iter().map(|ip| serde_json::json!({"addresses": [ip]}))
            .collect::<Vec<_>>()
    }))
    .unwrap()
}

fn private_ip_of(w: &World, vip: &str) -> Option<Option<String>> {
    w.sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == vip)
        .map(|r| r.private_ip)
}

#[tokio::test]
async fn external_endpoints_private_address_and_refused_mtls() {
    let opts = Options {
        extra_args: vec!["--privateCIDR=10.10.0.1/24".into()],
        ..Options::default()
    };
    let w = World::with("kubeloxilb28", opts).await;
    w.add_node("node-a", "10.0.28.1").await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &w.ns);

    // A selector-less Service whose slice points outside the cluster, with its own port.
    let mut ext = annotated(
        World::lb_service("ext", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/useExternalEndpoint", "yes")],
    );
    ext.spec.as_mut().unwrap().selector = None;
    w.create(&ext).await;
    slices
        .create(
            &PostParams::default(),
            &slice(
                "ext-manual",
                "ext",
                ("tcp-80", 8443),
                &["198.51.100.7", "198.51.100.8"],
            ),
        )
        .await
        .unwrap();
    let ip = w.wait_for_ip("ext").await;
    let want = |eps: &[&str]| {
        vec![(
            80,
            "tcp".to_string(),
            eps.iter().map(|e| format!("{e}:8443")).collect::<Vec<_>>(),
        )]
    };
    wait_for("the slice's addresses and port", WAIT, || async {
        (w.rules_for(&ip) == want(&["198.51.100.7", "198.51.100.8"])).then_some(())
    })
    .await;
    // --privateCIDR: the address written in the CIDR.
    assert_eq!(private_ip_of(&w, &ip), Some(Some("10.10.0.1".to_string())));
    // The slice changes: the rule follows.
    let mut edited = slice("ext-manual", "ext", ("tcp-80", 8443), &["198.51.100.8"]);
    edited.metadata.resource_version = slices
        .get("ext-manual")
        .await
        .unwrap()
        .metadata
        .resource_version;
    slices
        .replace("ext-manual", &PostParams::default(), &edited)
        .await
        .unwrap();
    wait_for("one address left", WAIT, || async {
        (w.rules_for(&ip) == want(&["198.51.100.8"])).then_some(())
    })
    .await;

    // A Service naming its address gets no private address.
    let fixed = annotated(
        World::lb_service("fixed", Some(CLASS), &[(81, "TCP")]),
        &[("loxilb.io/staticIP", "192.0.2.50")],
    );
    w.create(&fixed).await;
    let fixed_ip = w.wait_for_ip("fixed").await;
    assert_eq!(fixed_ip, "192.0.2.50");
    let private = wait_for("the rule of fixed", WAIT, || async {
        private_ip_of(&w, &fixed_ip)
    })
    .await;
    assert_eq!(private, None);

    // mTLS asked for: refused on the Service by name, never programmed.
    let secure = annotated(
        World::lb_service("secure", Some(CLASS), &[(443, "TCP")]),
        &[
            ("loxilb.io/mtls-frontend-mode", "required"),
            ("loxilb.io/mtls-frontend-secret", "client-ca"),
        ],
    );
    w.create(&secure).await;
    let message = wait_for("secure: Programmed=False", WAIT, || async {
        let s = w.get("secure").await?;
        let (status, reason, message) = World::condition(&s, COND_PROGRAMMED)?;
        (status == "False" && reason == "InvalidAnnotation").then_some(message)
    })
    .await;
    assert!(
        message.contains("loxilb.io/mtls-frontend-mode") && message.contains("mTLS"),
        "{message}"
    );
    wait_for("a Warning naming it", WAIT, || async {
        w.event_reasons("secure")
            .await
            .contains(&"InvalidAnnotation".to_string())
            .then_some(())
    })
    .await;
    assert!(
        w.sim.rules().iter().all(|r| !r.name.contains("_secure_")),
        "{:?}",
        w.sim.rules()
    );
    // The others carry on.
    assert_eq!(w.rules_for(&ip), want(&["198.51.100.8"]));
    w.finish().await;
}
