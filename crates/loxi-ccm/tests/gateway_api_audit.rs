//! `loxi-ccm audit` with `--gatewayAPI` (docs/gateway-api.md): a programmed Gateway audits
//! clean; with the controller stopped, a Gateway rule deleted by hand, endpoints gone stale
//! (the backend scaled), a rule under the Gateways' owner id for a Gateway that never existed
//! and a Gateway claim whose Gateway is gone are each reported, with the objects involved.
//! Real API server with the upstream CRDs, the loxilb simulator.

mod common;

use std::time::Duration;

use common::gateway::{
    backend_service, class_and_gateway, cond, create, gateway_options, gateway_world, get, pair,
    slice,
};
use common::{WAIT, assert_found, wait_for};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};
use loxi_ccm::audit::Kind;
use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy, claim_name};
use loxilb_client::{ClientConfig, LoxilbClient};
use serde_json::json;
use testenv::gateway_api::Channel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_claims_and_rules_are_audited() {
    let opts = gateway_options();
    let mut w = gateway_world("gwaudit", Channel::Standard, opts.clone()).await;
    let ns = w.ns.clone();
    backend_service(&w, "tcp-backend", ("tcp", 9000, "TCP")).await;
    backend_service(&w, "udp-backend", ("dns", 53, "UDP")).await;
    let slices: Api<EndpointSlice> = Api::namespaced(w.client.clone(), &ns);
    slices
        .create(
            &PostParams::default(),
            &slice(
                "tcp-backend-1",
                "tcp-backend",
                ("tcp", 8080, "TCP"),
                &[("10.244.5.1", true), ("10.244.5.2", true)],
            ),
        )
        .await
        .unwrap();
    slices
        .create(
            &PostParams::default(),
            &slice(
                "udp-backend-1",
                "udp-backend",
                ("dns", 5353, "UDP"),
                &[("10.244.6.1", true)],
            ),
        )
        .await
        .unwrap();
    class_and_gateway(
        &w,
        "loxilb-audit",
        json!([
            {"name": "tcp", "port": 7100, "protocol": "TCP"},
            {"name": "udp", "port": 5300, "protocol": "UDP"}
        ]),
    )
    .await;
    for (kind, name, section, backend, port) in [
        ("TCPRoute", "web", "tcp", "tcp-backend", 9000),
        ("UDPRoute", "dns", "udp", "udp-backend", 53),
    ] {
        create(
            &w,
            Some(&ns),
            kind,
            json!({
                "metadata": {"name": name},
                "spec": {
                    "parentRefs": [{"name": "gw", "sectionName": section}],
                    "rules": [{"backendRefs": [{"name": backend, "port": port}]}]
                }
            }),
        )
        .await;
    }
    let ip = wait_for("the Gateway programmed", WAIT, || async {
        let gw = get(&w, Some(&ns), "Gateway", "gw").await?;
        (cond(&gw["status"]["conditions"], "Programmed")? == pair("True", "Programmed"))
            .then_some(())?;
        gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(String::from)
    })
    .await;
    wait_for("both rules", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    // Converged: the audit (with --gatewayAPI) finds nothing, and it did look at the rules.
    let clean = wait_for("a clean audit", Duration::from_secs(60), || async {
        let f = w.audit(&opts).await;
        f.clean().then_some(f)
    })
    .await;
    assert_eq!(clean.rules, 2, "{}", clean.summary());

    // Plant with the controller stopped, so nothing repairs.
    w.stop_controller().await;
    let loxilb = LoxilbClient::new(ClientConfig::new(&w.sim.url())).unwrap();
    // 1. The UDP listener's rule deleted by hand.
    loxilb.delete_rule(&ip, 5300, "udp", false).await.unwrap();
    // 2. The TCP backend scaled: the rule's endpoints are stale.
    slices
        .patch(
            "tcp-backend-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [
                {"addresses": ["10.244.5.1"], "conditions": {"ready": true}},
                {"addresses": ["10.244.5.3"], "conditions": {"ready": true}}
            ]})),
        )
        .await
        .unwrap();
    // 3. A rule under the Gateways' owner id for a Gateway that never existed.
    let mut orphan = loxilb
        .list_rules()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.service_arguments.port == 7100)
        .unwrap();
    orphan.service_arguments.external_ip = "192.0.2.210".into();
    orphan.service_arguments.port = 7200;
    orphan.service_arguments.name = format!("ccm-test.gateway_{ns}_ghostgw_7200_tcp:llb-inst0");
    loxilb.apply_rule(&orphan).await.unwrap();
    // 4. A Gateway claim whose Gateway is gone.
    let gone = ClaimedBy {
        namespace: ns.clone(),
        name: "ghostgw".into(),
        uid: "gone-gw-uid".into(),
        role: Some("gateway".into()),
        ..ClaimedBy::default()
    };
    Api::<AddressClaim>::all(w.client.clone())
        .create(
            &PostParams::default(),
            &AddressClaim::new(
                &claim_name(&"192.0.2.211".parse().unwrap()),
                AddressClaimSpec {
                    address: "192.0.2.211".into(),
                    pool: "default".into(),
                    service: gone,
                    shared_with: Vec::new(),
                    retain_until: None,
                    controller: None,
                },
            ),
        )
        .await
        .unwrap();

    let found = w.audit(&opts).await;
    assert_found(
        &found,
        Kind::Rules,
        &[&format!("Gateway {ns}/gw has no rule for {ip}:5300/udp")],
    );
    assert_found(
        &found,
        Kind::Rules,
        &[
            &format!("Gateway {ns}/gw's rule for {ip}:7100/tcp"),
            "endpoints",
            "10.244.5.3",
        ],
    );
    assert_found(
        &found,
        Kind::OwnedOrphan,
        &["192.0.2.210:7200/tcp", &format!("Gateway {ns}/ghostgw")],
    );
    assert_found(
        &found,
        Kind::OwnerlessClaim,
        &[
            "192.0.2.211",
            "gone-gw-uid",
            &format!("Gateway {ns}/ghostgw"),
        ],
    );
    // The controller back: it repairs what it owns (rules), and only the planted claim and
    // the ghost's rule, which it never made, stay reported.
    w.start_controller(&opts).await;
    wait_for("the Gateway's rules repaired", WAIT, || async {
        let f = w.audit(&opts).await;
        (f.of_kind(Kind::Rules).is_empty()).then_some(())
    })
    .await;
}
