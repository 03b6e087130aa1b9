//! The helpers of the programming tests (`programming.rs`, `programming_rules.rs`): extra
//! simulators, rule listings, waits on the Service's conditions. Included with `#[path]` by
//! the test files that use it only.

#![allow(dead_code)]

use crate::common::{COND_ADDRESS, COND_PROGRAMMED, Options, WAIT, World, wait_for};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use kube::api::{ListParams, Patch, PatchParams};
use loxi_domain::RuleName;
use loxilb_client::{ClientConfig, LoadbalanceEntry, LoxilbClient};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;

pub async fn start_sim() -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap()
}

/// Options for a controller that also programs `extra`.
pub fn with_instances(extra: &[&Simulator], drift: &'static str) -> Options {
    Options {
        drift,
        extra_args: extra
            .iter()
            .map(|s| format!("--loxilb-url={}", s.url()))
            .collect(),
        ..Options::default()
    }
}

/// Rules a simulator holds for the Service `svc` of the test's namespace, as sorted
/// "port/protocol" (by rule name: Services may share an address).
pub fn rules_of(sim: &Simulator, w: &World, svc: &str) -> Vec<String> {
    let mut v: Vec<String> = sim
        .rules()
        .into_iter()
        .filter(|r| {
            RuleName::parse(&r.name).is_some_and(|n| n.namespace == w.ns && n.service == svc)
        })
        .map(|r| format!("{}/{}", r.port, r.protocol))
        .collect();
    v.sort();
    v
}

pub fn names_on(sim: &Simulator) -> Vec<String> {
    sim.rules().into_iter().map(|r| r.name).collect()
}

/// Puts a rule on a simulator behind the controller's back, named `name`.
pub async fn post_rule(sim: &Simulator, name: &str, ip: &str, port: u16) {
    let entry: LoadbalanceEntry = serde_json::from_value(json!({
        "serviceArguments": {"externalIP": ip, "port": port, "protocol": "tcp", "name": name},
        "endpoints": [{"endpointIP": "10.9.9.9", "targetPort": 30080, "weight": 1}],
    }))
    .unwrap();
    LoxilbClient::new(ClientConfig::new(&sim.url()))
        .unwrap()
        .apply_rule(&entry)
        .await
        .unwrap();
}

/// Waits for the Programmed condition with this status and reason; returns its message.
pub async fn wait_programmed(w: &World, name: &str, status: &str, reason: &str) -> String {
    wait_for(
        &format!("{name}: Programmed={status} reason {reason}"),
        WAIT,
        || async {
            let s = w.get(name).await?;
            let (st, re, msg) = World::condition(&s, COND_PROGRAMMED)?;
            (st == status && re == reason).then_some(msg)
        },
    )
    .await
}

pub fn ingress(svc: &Service) -> Vec<LoadBalancerIngress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
}

/// How many times an Event with this reason was recorded for the Service (an Event object
/// repeated by the recorder counts as its series count).
pub async fn event_count(w: &World, name: &str, reason: &str) -> i32 {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(w.client.clone(), &w.ns);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.map_or(1, |s| s.count))
        .sum()
}

pub async fn annotate(w: &World, name: &str, key: &str, value: &str) {
    w.services
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// The secondary addresses on the simulator's SCTP rule for `vip`:`port`.
pub fn secondaries_on(w: &World, vip: &str, port: u16) -> Vec<String> {
    let mut v: Vec<String> = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == vip && r.port == port && r.protocol == "sctp")
        .map(|r| r.secondary_ips)
        .unwrap_or_default();
    v.sort();
    v
}

/// Waits for the AddressAllocated condition with this status and reason; returns its message.
pub async fn wait_address(w: &World, name: &str, status: &str, reason: &str) -> String {
    wait_for(
        &format!("{name}: AddressAllocated={status} reason {reason}"),
        WAIT,
        || async {
            let s = w.get(name).await?;
            let (st, re, msg) = World::condition(&s, COND_ADDRESS)?;
            (st == status && re == reason).then_some(msg)
        },
    )
    .await
}

/// `GET /config/loadbalancer/all` as loxilb answers it.
pub async fn raw_listing(sim: &Simulator) -> Option<(u16, String)> {
    let resp = reqwest::get(format!("{}/netlox/v1/config/loadbalancer/all", sim.url()))
        .await
        .ok()?;
    Some((resp.status().as_u16(), resp.text().await.ok()?))
}
