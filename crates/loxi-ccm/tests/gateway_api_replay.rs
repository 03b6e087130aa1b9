//! A Gateway's rules in a loxilb's replay (docs/gateway-api.md#rules): a wiped loxilb and a
//! loxilb that joins the group get the Gateway's listener rules from their worker's replay,
//! with the Gateway untouched and the Gateway controller's resync (`--drift-interval`) far
//! away, on the real API server with discovered simulators.

mod common;

use common::gateway::{
    backend_service, class_and_gateway, cond, create, gateway_options, gateway_world, get, pair,
    slice,
};
use common::{Options, WAIT, World, host_address, wait_for};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;
use testenv::gateway_api::Channel;

/// The rules of `sim` on `ip`: (port, protocol, sorted endpoints).
fn rules_on(sim: &Simulator, ip: &str) -> Vec<(u16, String, Vec<String>)> {
    let mut rules: Vec<_> = sim
        .rules()
        .into_iter()
        .filter(|r| r.external_ip == ip)
        .map(|r| {
            let mut eps: Vec<String> = r
                .endpoints
                .iter()
                .map(|e| format!("{}:{}", e.ip, e.target_port))
                .collect();
            eps.sort();
            (r.port, r.protocol.clone(), eps)
        })
        .collect();
    rules.sort();
    rules
}

#[tokio::test]
async fn a_wiped_or_joining_loxilb_gets_the_gateway_rules_from_its_replay() {
    let host = host_address();
    let a = Simulator::start((host, 0).into(), SimConfig::default())
        .await
        .unwrap();
    let b = Simulator::start((host, 0).into(), SimConfig::default())
        .await
        .unwrap();
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        // The Gateway controller's resync is the drift interval: far beyond the waits below,
        // so only the replay can bring the rules back.
        drift: "1h",
        discovery: true,
        admin_port: Some(admin_port),
        ..gateway_options()
    };
    let w = gateway_world("gwreplay", Channel::Standard, opts).await;
    let ns = w.ns.clone();
    let svc = "loxilb-lb-service";
    let host = host.to_string();
    w.set_loxilb_slice(svc, "loxilb-a", &host, a.addr().port(), true)
        .await;

    backend_service(&w, "backend", ("tcp", 9000, "TCP")).await;
    Api::<EndpointSlice>::namespaced(w.client.clone(), &ns)
        .create(
            &PostParams::default(),
            &slice(
                "backend-1",
                "backend",
                ("tcp", 8080, "TCP"),
                &[("10.244.3.1", true), ("10.244.3.2", true)],
            ),
        )
        .await
        .unwrap();
    class_and_gateway(
        &w,
        "loxilb-replay",
        json!([
            {"name": "tcp", "port": 7000, "protocol": "TCP"}
        ]),
    )
    .await;
    create(
        &w,
        Some(&ns),
        "TCPRoute",
        json!({
            "metadata": {"name": "web"},
            "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "tcp"}],
                "rules": [{"backendRefs": [{"name": "backend", "port": 9000}]}]
            }
        }),
    )
    .await;
    let ip = wait_for("the Gateway programmed", WAIT, || async {
        let gw = get(&w, Some(&ns), "Gateway", "gw").await?;
        (cond(&gw["status"]["conditions"], "Programmed")? == pair("True", "Programmed"))
            .then_some(())?;
        gw["status"]["addresses"][0]["value"]
            .as_str()
            .map(String::from)
    })
    .await;
    let want = vec![(
        7000u16,
        "tcp".to_string(),
        vec!["10.244.3.1:8080".to_string(), "10.244.3.2:8080".to_string()],
    )];
    wait_for("the Gateway's rule on a", WAIT, || async {
        (rules_on(&a, &ip) == want).then_some(())
    })
    .await;

    // a restarts with its rules wiped: its worker's replay puts the Gateway's rule back.
    a.restart();
    assert!(rules_on(&a, &ip).is_empty(), "the restart wiped the rule");
    wait_for(
        "the Gateway's rule back on a after its restart",
        WAIT,
        || async { (rules_on(&a, &ip) == want).then_some(()) },
    )
    .await;

    // b joins the group: its loxilb Pod turns ready while its API does not answer yet (the
    // EndpointSlice's change, which the Gateway controller also watches, passes while b
    // cannot take rules), then b answers: its replay programs it with the Gateway's rule
    // before it serves, with no change in the cluster to start a Gateway pass.
    assert!(rules_on(&b, &ip).is_empty());
    b.go_down().await;
    w.set_loxilb_slice(svc, "loxilb-b", &host, b.addr().port(), true)
        .await;
    let b_down = format!("instance=\"{}\"", b.url());
    wait_for("b found and seen down", WAIT, || async {
        let text = World::metrics_text(admin_port).await?;
        text.lines()
            .any(|l| {
                l.starts_with("loxi_ccm_loxilb_up{") && l.contains(&b_down) && l.ends_with(" 0")
            })
            .then_some(())
    })
    .await;
    b.come_up().await.unwrap();
    wait_for("the Gateway's rule on the joining b", WAIT, || async {
        (rules_on(&b, &ip) == want).then_some(())
    })
    .await;
    assert_eq!(rules_on(&a, &ip), want);
}
