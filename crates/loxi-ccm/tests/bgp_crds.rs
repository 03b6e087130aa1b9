//! kube-loxilb's four BGP resources (`--bgp-crds`) against the real API server and the
//! simulator with BGP on: kube-loxilb's example manifests (written out here from its
//! documented fields) apply unchanged, reach loxilb and are removed from it on delete; a peer's
//! session state shows in the status and the metric; bad input is refused by the API server
//! naming the field, and by the controller's own checks (objects stored before the rules)
//! without losing what was configured.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{GroupVersionKind, Resource};
use loxi_ccm::bgp::crds::{
    BGPPeerService, BGPPolicyApplyService, BGPPolicyDefinedSetsService, BGPPolicyDefinitionService,
    BgpStatus,
};
use loxilb_sim::SimConfig;
use serde_json::{Value, json};

fn bgp_sim() -> SimConfig {
    SimConfig {
        bgp: true,
        ..SimConfig::default()
    }
}

fn options(admin_port: Option<u16>) -> Options {
    Options {
        admin_port,
        extra_args: vec![
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.254:65001".into(),
            "--bgp-crds".into(),
        ],
        ..Options::default()
    }
}

/// The dynamic API of the kind of `manifest` (its plural from our CRD types).
fn api_of(client: &kube::Client, manifest: &Value) -> Api<DynamicObject> {
    let kind = manifest["kind"].as_str().unwrap();
    let plural = match kind {
        "BGPPeerService" => BGPPeerService::plural(&()),
        "BGPPolicyDefinedSetsService" => BGPPolicyDefinedSetsService::plural(&()),
        "BGPPolicyDefinitionService" => BGPPolicyDefinitionService::plural(&()),
        "BGPPolicyApplyService" => BGPPolicyApplyService::plural(&()),
        other => panic!("unknown kind {other}"),
    };
    let (group, version) = manifest["apiVersion"]
        .as_str()
        .unwrap()
        .split_once('/')
        .unwrap();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, plural.as_ref()),
    )
}

/// Creates `manifest` (YAML as kube-loxilb ships it) unchanged. The resources are
/// cluster-scoped: one a failed test left behind is deleted first (the running controller
/// removes its finalizer).
async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<(), kube::Error> {
    let manifest: Value = serde_saphyr::from_str(yaml).unwrap();
    let object: DynamicObject = serde_json::from_value(manifest.clone()).unwrap();
    let api = api_of(client, &manifest);
    match api.create(&PostParams::default(), &object).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            delete_yaml(client, yaml).await;
            wait_for("a leftover resource gone", WAIT, || async {
                gone(client, yaml).await.then_some(())
            })
            .await;
            api.create(&PostParams::default(), &object).await.map(drop)
        }
        other => other.map(drop),
    }
}

async fn status_of(client: &kube::Client, yaml: &str) -> Option<BgpStatus> {
    let manifest: Value = serde_saphyr::from_str(yaml).unwrap();
    let name = manifest["metadata"]["name"].as_str().unwrap();
    let object = api_of(client, &manifest).get_opt(name).await.ok()??;
    serde_json::from_value(object.data.get("status")?.clone()).ok()
}

fn condition<'a>(status: &'a BgpStatus, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

async fn delete_yaml(client: &kube::Client, yaml: &str) {
    let manifest: Value = serde_saphyr::from_str(yaml).unwrap();
    let name = manifest["metadata"]["name"].as_str().unwrap();
    let _ = api_of(client, &manifest)
        .delete(name, &DeleteParams::default())
        .await;
}

async fn gone(client: &kube::Client, yaml: &str) -> bool {
    let manifest: Value = serde_saphyr::from_str(yaml).unwrap();
    let name = manifest["metadata"]["name"].as_str().unwrap();
    matches!(api_of(client, &manifest).get_opt(name).await, Ok(None))
}

// kube-loxilb's examples (manifest/crds/bgp-peer.yaml, bgp-policy-defined-sets.yaml,
// bgp-policy-definition.yaml, bgp-policy-apply.yaml), written out from their fields; the sets
// the example policy refers to (ps1, ns2) in the same form.
const PEER: &str = r#"
apiVersion: "bgppeer.loxilb.io/v1"
kind: BGPPeerService
metadata:
  name: bgp-peer-test
spec:
  ipAddress: 123.123.123.2
  remoteAs: 65123
  remotePort: 179
"#;
const PREFIX_SET: &str = r#"
apiVersion: bgppolicydefinedsets.loxilb.io/v1
kind: BGPPolicyDefinedSetsService
metadata:
  name: policy-prefix
spec:
  name: "ps2"
  definedType: "prefix"
  prefixList:
    - ipPrefix: "192.168.0.0/16"
      masklengthRange: "16..24"
"#;
const PREFIX_SET_PS1: &str = r#"
apiVersion: bgppolicydefinedsets.loxilb.io/v1
kind: BGPPolicyDefinedSetsService
metadata:
  name: policy-prefix-ps1
spec:
  name: "ps1"
  definedType: "prefix"
  prefixList:
    - ipPrefix: "10.0.0.0/8"
      masklengthRange: "24..32"
"#;
const NEIGHBOR_SET: &str = r#"
apiVersion: bgppolicydefinedsets.loxilb.io/v1
kind: BGPPolicyDefinedSetsService
metadata:
  name: policy-neighbor
spec:
  name: "ns2"
  definedType: "neighbor"
  List:
    - "123.123.123.2/32"
"#;
const DEFINITION: &str = r#"
apiVersion: bgppolicydefinition.loxilb.io/v1
kind: BGPPolicyDefinitionService
metadata:
  name: my-custom-resource
spec:
  name: poltest
  statements:
  - name: statement
    conditions:
      matchPrefixSet:
        matchSetOption: any
        prefixSet: ps1
      matchNeighborSet:
        matchSetOption: any
        neighborSet: ns2
    actions:
      routeDisposition: accept-route
"#;
/// kube-loxilb's example applies to a neighbour, which loxilb refuses (its peers have no
/// per-peer policies): it reaches loxilb and the refusal shows in `Programmed`.
const APPLY_EXAMPLE: &str = r#"
apiVersion: bgppolicyapply.loxilb.io/v1
kind: BGPPolicyApplyService
metadata:
  name: policy-apply
spec:
  ipAddress: "10.10.10.254"
  policyType: "import"
  policies:
  - "poltest6"
  routeAction: "accept"
"#;
/// The same for goBGP's global RIB, which loxilb takes.
const APPLY_GLOBAL: &str = r#"
apiVersion: bgppolicyapply.loxilb.io/v1
kind: BGPPolicyApplyService
metadata:
  name: policy-apply-global
spec:
  ipAddress: "global"
  policyType: "import"
  policies:
  - "poltest"
  routeAction: "accept"
"#;

/// Every example reaches loxilb (the example application is refused there, as by loxilb, and
/// says so), and everything is removed from loxilb when the resources are deleted.
#[tokio::test]
async fn kube_loxilb_examples_reach_loxilb_and_are_removed_on_delete() {
    let w = World::with_sim("bgpcrds", options(None), bgp_sim()).await;
    let all = [
        PEER,
        PREFIX_SET,
        PREFIX_SET_PS1,
        NEIGHBOR_SET,
        DEFINITION,
        APPLY_EXAMPLE,
        APPLY_GLOBAL,
    ];
    for yaml in all {
        apply_yaml(&w.client, yaml).await.unwrap();
    }
    wait_for("everything on loxilb", WAIT, || async {
        let bgp = w.sim.bgp();
        let peers: Vec<&str> = bgp.neighbors.iter().map(|n| n.ip.as_str()).collect();
        let sets: Vec<(&str, &str)> = bgp
            .defined_sets
            .iter()
            .map(|s| (s.kind.as_str(), s.name.as_str()))
            .collect();
        let policy = bgp.policies.iter().any(|p| p.name == "poltest");
        let applied = bgp
            .assignments
            .iter()
            .any(|a| a.target == "global" && a.direction == "import" && a.policies == ["poltest"]);
        (peers == ["123.123.123.2", "192.0.2.254"]
            && sets == [("neighbor", "ns2"), ("prefix", "ps1"), ("prefix", "ps2")]
            && policy
            && applied)
            .then_some(())
    })
    .await;
    for yaml in [
        PEER,
        PREFIX_SET,
        PREFIX_SET_PS1,
        NEIGHBOR_SET,
        DEFINITION,
        APPLY_GLOBAL,
    ] {
        wait_for("Accepted and Programmed", WAIT, || async {
            let s = status_of(&w.client, yaml).await?;
            (condition(&s, "Accepted")?.0 == "True" && condition(&s, "Programmed")?.0 == "True")
                .then_some(())
        })
        .await;
    }
    let refused = wait_for(
        "the example application refused by loxilb",
        WAIT,
        || async {
            let s = status_of(&w.client, APPLY_EXAMPLE).await?;
            let (status, reason, message) = condition(&s, "Programmed")?;
            (status == "False" && reason == "LoxilbRefused").then(|| message.to_string())
        },
    )
    .await;
    assert!(refused.contains(&w.sim.url()), "{refused}");
    assert!(refused.contains("10.10.10.254"), "{refused}");

    for yaml in all {
        delete_yaml(&w.client, yaml).await;
    }
    wait_for("everything removed from loxilb", WAIT, || async {
        let bgp = w.sim.bgp();
        let peers: Vec<&str> = bgp.neighbors.iter().map(|n| n.ip.as_str()).collect();
        (peers == ["192.0.2.254"]
            && bgp.defined_sets.is_empty()
            && !bgp.policies.iter().any(|p| p.name == "poltest")
            && bgp.assignments.iter().all(|a| a.policies.is_empty()))
        .then_some(())
    })
    .await;
    for yaml in all {
        wait_for("the resource gone (finalizer removed)", WAIT, || async {
            gone(&w.client, yaml).await.then_some(())
        })
        .await;
    }
    w.finish().await;
}

/// A session state set in the simulator shows in the peer's status and the metric within 2 s;
/// leaving ESTABLISHED makes a Warning Event on the resource.
#[tokio::test]
async fn a_session_state_shows_in_the_status_and_the_metric_within_2s() {
    let admin_port = testenv::free_port().unwrap();
    let w = World::with_sim("bgpsession", options(Some(admin_port)), bgp_sim()).await;
    apply_yaml(&w.client, PEER).await.unwrap();
    wait_for("the peer programmed", WAIT, || async {
        let s = status_of(&w.client, PEER).await?;
        (condition(&s, "Programmed")?.0 == "True" && s.state.as_deref() == Some("ACTIVE"))
            .then_some(())
    })
    .await;
    assert!(
        w.sim
            .set_bgp_peer_state("123.123.123.2", "ESTABLISHED", None)
    );
    let started = Instant::now();
    wait_for("ESTABLISHED in the status and the metric", WAIT, || async {
        let s = status_of(&w.client, PEER).await?;
        let metric = World::metric_sum(
            admin_port,
            "loxi_ccm_bgp_sessions",
            &["peer=\"123.123.123.2\"", "state=\"ESTABLISHED\""],
        )
        .await?;
        (s.state.as_deref() == Some("ESTABLISHED")
            && s.sessions.len() == 1
            && s.sessions[0].loxilb == w.sim.url()
            && !s.sessions[0].since.is_empty()
            && metric == 1.0)
            .then_some(())
    })
    .await;
    let took = started.elapsed();
    println!("session state in the status and the metric after {took:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");

    // kubectl shows the address, the AS and the state.
    let cp = control_plane();
    let out = std::process::Command::new(cp.k8s_bin_dir().join("kubectl"))
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .args(["get", "bgppeerservices", "bgp-peer-test"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header[..4], ["NAME", "PEER", "AS", "STATE"], "{table}");
    assert!(
        table.contains("123.123.123.2") && table.contains("65123") && table.contains("ESTABLISHED"),
        "{table}"
    );

    assert!(w.sim.set_bgp_peer_state("123.123.123.2", "IDLE", None));
    wait_for("the session drop counted and an Event", WAIT, || async {
        let drops = World::metric_sum(
            admin_port,
            "loxi_ccm_bgp_session_drops_total",
            &["peer=\"123.123.123.2\"", "state=\"IDLE\""],
        )
        .await?;
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(w.client.clone(), "default");
        let event = events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some("BGPSessionDown")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bgp-peer-test")
            });
        (drops == 1.0 && event).then_some(())
    })
    .await;
    delete_yaml(&w.client, PEER).await;
    wait_for("the peer removed", WAIT, || async {
        gone(&w.client, PEER).await.then_some(())
    })
    .await;
    w.finish().await;
}

/// `(field, message)` of each cause of a 422.
async fn refusal(client: &kube::Client, yaml: &str) -> Vec<(String, String)> {
    match apply_yaml(client, yaml).await {
        Ok(()) => panic!("accepted:\n{yaml}"),
        Err(kube::Error::Api(status)) if status.code == 422 => status
            .details
            .map(|d| d.causes)
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.field, c.message))
            .collect(),
        Err(e) => panic!("unexpected answer {e:?}"),
    }
}

/// Bad input is refused at apply time naming the field; the same input stored before the
/// rules existed (straight into etcd) is refused by the controller naming the field, in
/// `Accepted`, and what the resource configured before stays on loxilb.
#[tokio::test]
async fn invalid_input_is_refused_naming_the_field_and_nothing_configured_is_lost() {
    let w = World::with_sim("bgpinvalid", options(None), bgp_sim()).await;
    let causes = refusal(&w.client, &PEER.replace("remoteAs: 65123", "remoteAs: 0")).await;
    assert!(
        causes.iter().any(|(f, _)| f == "spec.remoteAs"),
        "{causes:?}"
    );
    let causes = refusal(&w.client, &PREFIX_SET.replace("16..24", "24-32")).await;
    assert!(
        causes
            .iter()
            .any(|(f, _)| f == "spec.prefixList[0].masklengthRange"),
        "{causes:?}"
    );
    let causes = refusal(
        &w.client,
        &DEFINITION.replace("    actions:\n      routeDisposition: accept-route\n", ""),
    )
    .await;
    assert!(
        causes
            .iter()
            .any(|(f, m)| f == "spec.statements[0].actions" && m.contains("Required")),
        "{causes:?}"
    );
    let causes = refusal(&w.client, &PEER.replace("123.123.123.2", "1.2.3.4:abc")).await;
    assert!(
        causes.iter().any(|(f, _)| f == "spec.ipAddress"),
        "{causes:?}"
    );

    // A valid peer and set, programmed.
    apply_yaml(&w.client, PEER).await.unwrap();
    apply_yaml(&w.client, PREFIX_SET).await.unwrap();
    wait_for("the peer and the set on loxilb", WAIT, || async {
        let bgp = w.sim.bgp();
        (bgp.neighbors.iter().any(|n| n.ip == "123.123.123.2")
            && bgp.defined_sets.iter().any(|s| s.name == "ps2"))
        .then_some(())
    })
    .await;
    // Rewritten behind the API server's back (as written before the rules existed).
    let peers: Api<BGPPeerService> = Api::all(w.client.clone());
    let sets: Api<BGPPolicyDefinedSetsService> = Api::all(w.client.clone());
    let peer = peers.get("bgp-peer-test").await.unwrap();
    let set = sets.get("policy-prefix").await.unwrap();
    let stored = |meta: &kube::api::ObjectMeta, api_version: &str, kind: &str, spec: Value| {
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": meta.name,
                "uid": meta.uid,
                "creationTimestamp": meta.creation_timestamp,
                "generation": meta.generation.unwrap_or(1) + 1,
                "finalizers": meta.finalizers,
            },
            "spec": spec,
        })
    };
    store_in_etcd(
        "bgppeer.loxilb.io/bgppeerservices/bgp-peer-test",
        &stored(
            &peer.metadata,
            "bgppeer.loxilb.io/v1",
            "BGPPeerService",
            json!({"ipAddress": "123.123.123.2", "remoteAs": 0}),
        ),
    )
    .await;
    store_in_etcd(
        "bgppolicydefinedsets.loxilb.io/bgppolicydefinedsetsservices/policy-prefix",
        &stored(
            &set.metadata,
            "bgppolicydefinedsets.loxilb.io/v1",
            "BGPPolicyDefinedSetsService",
            json!({"name": "ps2", "definedType": "prefix",
                   "prefixList": [{"ipPrefix": "192.168.0.0/16", "masklengthRange": "24-32"}]}),
        ),
    )
    .await;
    for (yaml, field) in [
        (PEER, "spec.remoteAs"),
        (PREFIX_SET, "spec.prefixList[0].masklengthRange"),
    ] {
        let message = wait_for("Accepted False naming the field", WAIT, || async {
            let s = status_of(&w.client, yaml).await?;
            let (status, _, message) = condition(&s, "Accepted")?;
            (status == "False").then(|| message.to_string())
        })
        .await;
        assert!(message.contains(field), "{message}");
    }
    let bgp = w.sim.bgp();
    assert!(
        bgp.neighbors
            .iter()
            .any(|n| n.ip == "123.123.123.2" && n.remote_as == 65123),
        "the peer stays: {bgp:?}"
    );
    assert!(
        bgp.defined_sets.iter().any(|s| s.name == "ps2"),
        "the set stays: {bgp:?}"
    );
    delete_yaml(&w.client, PEER).await;
    delete_yaml(&w.client, PREFIX_SET).await;
    for yaml in [PEER, PREFIX_SET] {
        wait_for("removed", WAIT, || async {
            gone(&w.client, yaml).await.then_some(())
        })
        .await;
    }
    w.finish().await;
}

/// After a loxilb restart the replay goes in loxilb's order: global settings, neighbours,
/// policy sets, definitions, applications, then the rules.
#[tokio::test]
async fn a_loxilb_restart_replays_bgp_in_order_then_the_rules() {
    let w = World::with_sim("bgpreplay", options(None), bgp_sim()).await;
    w.add_node("node-a", "10.7.0.1").await;
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        apply_yaml(&w.client, yaml).await.unwrap();
    }
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    let complete = || {
        let bgp = w.sim.bgp();
        bgp.global.is_some()
            && bgp.neighbors.len() == 2
            && bgp.defined_sets.len() == 2
            && bgp.policies.iter().any(|p| p.name == "poltest")
            && bgp.assignments.iter().any(|a| a.policies == ["poltest"])
            && w.rules_for(&ip).len() == 1
    };
    wait_for("everything configured", WAIT, || async {
        complete().then_some(())
    })
    .await;
    w.sim.restart();
    wait_for("everything back after the restart", WAIT, || async {
        complete().then_some(())
    })
    .await;
    let log = w.sim.write_log();
    let first = |what: &str, path: &str| {
        log.iter()
            .position(|e| e.method == "POST" && e.status == 200 && e.path.starts_with(path))
            .unwrap_or_else(|| panic!("no {what} in {log:#?}"))
    };
    let order = [
        first("global", "/config/bgp/global"),
        first("neighbour", "/config/bgp/neigh"),
        first("defined set", "/config/bgp/policy/definedsets/"),
        first("definition", "/config/bgp/policy/definitions"),
        first("application", "/config/bgp/policy/apply"),
        first("rule", "/config/loadbalancer"),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "replay order {order:?} in {log:#?}"
    );
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        delete_yaml(&w.client, yaml).await;
    }
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        wait_for("removed", WAIT, || async {
            gone(&w.client, yaml).await.then_some(())
        })
        .await;
    }
    w.finish().await;
}

/// Errors right after a loxilb restart (here every second write answers 500) are retried with
/// back-off: the replay completes, and no resource reports a failure for them. Without rules
/// the restart is not seen by the probe when loxilb refuses the restart marker; goBGP's
/// "hasn't started yet" gives it away.
#[tokio::test]
async fn errors_right_after_a_restart_are_retried_not_reported() {
    let w = World::with_sim("bgpbackoff", options(None), bgp_sim()).await;
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        apply_yaml(&w.client, yaml).await.unwrap();
    }
    let complete = || {
        let bgp = w.sim.bgp();
        bgp.global.is_some()
            && bgp.neighbors.len() == 2
            && bgp.defined_sets.len() == 2
            && bgp.policies.iter().any(|p| p.name == "poltest")
            && bgp.assignments.iter().any(|a| a.policies == ["poltest"])
    };
    wait_for("everything configured", WAIT, || async {
        complete().then_some(())
    })
    .await;
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        wait_for("Programmed", WAIT, || async {
            let s = status_of(&w.client, yaml).await?;
            (condition(&s, "Programmed")?.0 == "True").then_some(())
        })
        .await;
    }
    w.sim.set_fault(Some(loxilb_sim::Fault {
        status: 500,
        rate: 0.5,
        only_writes: true,
    }));
    w.sim.restart();
    wait_for("everything back after the restart", WAIT, || async {
        complete().then_some(())
    })
    .await;
    w.sim.set_fault(None);
    let log = w.sim.write_log();
    assert!(
        log.iter()
            .any(|e| e.status == 500 && e.path.starts_with("/config/bgp")),
        "no BGP write failed: {log:#?}"
    );
    // The Warning Events about this test's resources (by uid: the names are reused).
    let mut uids = Vec::new();
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        let manifest: Value = serde_saphyr::from_str(yaml).unwrap();
        let name = manifest["metadata"]["name"].as_str().unwrap();
        let object = api_of(&w.client, &manifest).get(name).await.unwrap();
        uids.push(object.metadata.uid.unwrap());
    }
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(w.client.clone(), "default");
    let warnings: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding
                    .as_ref()
                    .and_then(|r| r.uid.as_ref())
                    .is_some_and(|u| uids.contains(u))
        })
        .map(|e| format!("{:?}: {:?}", e.reason, e.note))
        .collect();
    assert!(warnings.is_empty(), "failures reported: {warnings:?}");
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        let s = status_of(&w.client, yaml).await.unwrap();
        assert_eq!(condition(&s, "Programmed").unwrap().0, "True", "{s:?}");
        delete_yaml(&w.client, yaml).await;
    }
    for yaml in [PEER, PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL] {
        wait_for("removed", WAIT, || async {
            gone(&w.client, yaml).await.then_some(())
        })
        .await;
    }
    w.finish().await;
}

/// Deletes the resources of `yamls` and waits until they are gone (the controller removed
/// its finalizer).
async fn remove(client: &kube::Client, yamls: &[&str]) {
    for yaml in yamls {
        delete_yaml(client, yaml).await;
    }
    for yaml in yamls {
        wait_for("removed", WAIT, || async {
            gone(client, yaml).await.then_some(())
        })
        .await;
    }
}

/// The four BGP CRDs.
const BGP_CRDS: [&str; 4] = [
    "bgppeerservices.bgppeer.loxilb.io",
    "bgppolicydefinedsetsservices.bgppolicydefinedsets.loxilb.io",
    "bgppolicydefinitionservices.bgppolicydefinition.loxilb.io",
    "bgppolicyapplyservices.bgppolicyapply.loxilb.io",
];

/// BGP CRDs installed while the controller runs with `--bgp-crds` are followed without a
/// restart (docs/bgp.md#installing-the-crds): the controller starts in a cluster without them
/// (and serves Services and the flags' BGP meanwhile), the CRDs shipped in
/// `deploy/optional/bgp-crds.yaml` are installed, then a peer, which reaches loxilb and gets
/// its status.
#[tokio::test]
async fn bgp_crds_installed_while_running_are_followed() {
    let mut w = World::with_sim("bgplate", options(None), bgp_sim()).await;
    // A cluster without the CRDs: deleted while the controller still runs, so that it lets
    // go of any resource a failed test left behind.
    delete_crds(&w.client, &BGP_CRDS).await;
    w.stop_controller().await;
    w.start_controller(&options(None)).await;
    w.add_node("node-a", "10.7.0.1").await;
    let ip = w.serve_one_port("web", 80).await;
    assert_eq!(w.rules_for(&ip).len(), 1);

    install_shipped_crds(&w.client, "optional/bgp-crds.yaml").await;
    apply_yaml(&w.client, PEER).await.unwrap();
    wait_for("the peer on loxilb", WAIT, || async {
        w.sim
            .bgp()
            .neighbors
            .iter()
            .any(|n| n.ip == "123.123.123.2")
            .then_some(())
    })
    .await;
    wait_for("the peer Programmed", WAIT, || async {
        let s = status_of(&w.client, PEER).await?;
        (condition(&s, "Programmed")?.0 == "True").then_some(())
    })
    .await;
    remove(&w.client, &[PEER]).await;
    w.finish().await;
}

/// POSTs of policy applications the simulator received (since its start or last restart).
fn apply_posts(sim: &loxilb_sim::Simulator) -> usize {
    sim.write_log()
        .iter()
        .filter(|e| e.method == "POST" && e.path.starts_with("/config/bgp/policy/apply"))
        .count()
}

/// A BGP item loxilb refuses is not sent again at every health tick (200 ms here): kube-
/// loxilb's example application to a peer address, which loxilb refuses, is retried with a
/// delay that doubles from 0.5 s, its refusal kept in `Programmed` meanwhile; an edit of the
/// resource retries it at once, and so does a loxilb restart.
#[tokio::test]
async fn a_refusal_is_retried_with_back_off_not_at_every_tick() {
    let w = World::with_sim("bgprefused", options(None), bgp_sim()).await;
    apply_yaml(&w.client, APPLY_EXAMPLE).await.unwrap();
    let refused = || async {
        let s = status_of(&w.client, APPLY_EXAMPLE).await?;
        let (status, reason, message) = condition(&s, "Programmed")?;
        (status == "False" && reason == "LoxilbRefused" && message.contains("10.10.10.254"))
            .then_some(())
    };
    wait_for("the refusal in Programmed", WAIT, refused).await;

    // 10 s, 50 health ticks: without back-off one POST per tick.
    let before = apply_posts(&w.sim);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sent = apply_posts(&w.sim) - before;
    eprintln!("{sent} POSTs of the refused application in 10 s");
    assert!(
        (1..=6).contains(&sent),
        "{sent} POSTs of the refused application in 10 s"
    );
    assert!(
        refused().await.is_some(),
        "the refusal is kept in the status"
    );

    // An edit is tried at once (the next back-off retry is more than 5 s away).
    let manifest: Value = serde_saphyr::from_str(APPLY_EXAMPLE).unwrap();
    let before = apply_posts(&w.sim);
    api_of(&w.client, &manifest)
        .patch(
            "policy-apply",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"routeAction": "reject"}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    wait_for(
        "the edited application sent",
        Duration::from_secs(3),
        || async { (apply_posts(&w.sim) > before).then_some(()) },
    )
    .await;
    eprintln!("edit sent after {:?}", started.elapsed());

    // A loxilb restart: tried again at once with the replay. After the edit the retries come
    // 0.5, 1.5, 3.5, 7.5 and 15.5 s later: the restart falls between the last two.
    tokio::time::sleep(Duration::from_secs(8)).await;
    w.sim.restart();
    wait_for(
        "the application sent after the restart",
        Duration::from_secs(3),
        || async { (apply_posts(&w.sim) > 0).then_some(()) },
    )
    .await;

    remove(&w.client, &[APPLY_EXAMPLE]).await;
    w.finish().await;
}

/// A policy whose definition is deleted while an application still names it stays on loxilb
/// until the application goes: loxilb would delete it from under the (import) application,
/// whose removal it then refuses for good ("not found policy"). Then both are removed.
#[tokio::test]
async fn a_policy_deleted_before_its_application_goes_after_it() {
    let w = World::with_sim("bgporder", options(None), bgp_sim()).await;
    let all = [PREFIX_SET_PS1, NEIGHBOR_SET, DEFINITION, APPLY_GLOBAL];
    for yaml in all {
        apply_yaml(&w.client, yaml).await.unwrap();
    }
    let applied = || {
        w.sim
            .bgp()
            .assignments
            .iter()
            .any(|a| a.target == "global" && a.policies == ["poltest"])
    };
    let policy = || w.sim.bgp().policies.iter().any(|p| p.name == "poltest");
    wait_for("the policy applied", WAIT, || async {
        (applied() && policy()).then_some(())
    })
    .await;
    delete_yaml(&w.client, DEFINITION).await;
    // A few health ticks (200 ms): the policy stays, the application names it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(policy() && applied(), "{:?}", w.sim.bgp());
    delete_yaml(&w.client, APPLY_GLOBAL).await;
    wait_for(
        "the application, then the policy, removed",
        WAIT,
        || async { (!applied() && !policy()).then_some(()) },
    )
    .await;
    remove(&w.client, &all).await;
    w.finish().await;
}
