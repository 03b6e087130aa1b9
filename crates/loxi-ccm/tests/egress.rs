//! kube-loxilb's `Egress` resource (`--egress`) against the real API server and the
//! simulator's firewall: kube-loxilb's example applies unchanged; the SNAT rules follow pods
//! into and out of the selector; a deleted Egress leaves no rule behind (and a rule that is
//! not ours stays); a restarted loxilb gets the rules back; a source named by two Egresses
//! stays with the older one and the other says so.
//!
//! Pods are created through the API with their status (`podIPs`) written as a kubelet would:
//! the control plane runs no kubelet, and the controller reads nothing else of them.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::pods::running_pod;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use loxi_ccm::egress::crds::{Egress, EgressSpec};
use loxilb_sim::{FwAction, SimFwRule};
use serde_json::json;

fn options() -> Options {
    Options {
        extra_args: vec!["--egress".into()],
        ..Options::default()
    }
}

/// The Egress CRD, and the namespace's default ServiceAccount that pods need.
async fn with_crd(w: &World) {
    use kube::CustomResourceExt;
    install_crd(&w.client, &Egress::crd()).await;
    common::pods::default_service_account(w).await;
}

fn egresses(w: &World) -> Api<Egress> {
    Api::namespaced(w.client.clone(), &w.ns)
}

fn pods(w: &World) -> Api<Pod> {
    Api::namespaced(w.client.clone(), &w.ns)
}

/// The simulator's SNAT rules: (source, vip, preference).
fn snat_rules(w: &World) -> BTreeSet<(String, String, u32)> {
    w.sim
        .firewall_rules()
        .into_iter()
        .filter_map(|r: SimFwRule| match r.action {
            FwAction::Snat { to_ip, .. } if r.on_default => Some((r.source, to_ip, r.preference)),
            _ => None,
        })
        .collect()
}

/// The sources NATed to `vip` on the simulator.
fn sources_to(w: &World, vip: &str) -> BTreeSet<String> {
    snat_rules(w)
        .into_iter()
        .filter(|(_, to, _)| to == vip)
        .map(|(s, _, _)| s)
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn wait_sources(w: &World, vip: &str, want: &[&str]) {
    let want = set(want);
    wait_for(&format!("SNAT sources to {vip} = {want:?}"), WAIT, || {
        let done = sources_to(w, vip) == want;
        async move { done.then_some(()) }
    })
    .await;
}

async fn label(w: &World, name: &str, labels: serde_json::Value) {
    pods(w)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap();
}

fn egress(name: &str, addresses: &[&str], vip: &str, selector: &[(&str, &str)]) -> Egress {
    Egress {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: EgressSpec {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            vip: vip.into(),
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        },
        status: None,
    }
}

/// The Egress's `programmed` and its `Programmed` condition (status, reason, message).
async fn programmed(w: &World, name: &str) -> Option<(String, String, String, String)> {
    let e = egresses(w).get(name).await.ok()?;
    let s = e.status?;
    let c = s.conditions.iter().find(|c| c.type_ == "Programmed")?;
    Some((
        s.programmed.clone(),
        c.status.clone(),
        c.reason.clone(),
        c.message.clone(),
    ))
}

/// kube-loxilb's example (manifest/crds/egress-example.yaml), as written there, is accepted
/// unchanged by the shipped CRD: nothing of it is refused or pruned.
#[tokio::test]
async fn kube_loxilbs_example_applies_unchanged() {
    let w = World::with("egress-example", options()).await;
    with_crd(&w).await;
    let example = r#"
apiVersion: "egress.loxilb.io/v1"
kind: Egress
metadata:
  name: test-egress
spec:
  #selector: Label selector to select the Pods on which you want the egress rule applied
  selector:
    what: egress-test
  #address: IP list of the Pod on which you want the egress rule applied
  addresses:
  - 10.42.1.2
  - 10.42.0.5
  #vip: IP in addresses is SNATed to the corresponding VIP.
  vip: 172.18.0.254
"#;
    let value: serde_json::Value = serde_saphyr::from_str(example).unwrap();
    let obj: Egress = serde_json::from_value(value.clone()).unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let stored = egresses(&w).create(&dry, &obj).await.unwrap();
    let stored = serde_json::to_value(&stored).unwrap();
    assert_eq!(stored["spec"], value["spec"], "kept as written");
    // Dry run: nothing stored, nothing programmed.
    assert!(egresses(&w).get_opt("test-egress").await.unwrap().is_none());
    // Applied for real, it reaches loxilb.
    egresses(&w)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.254", &["10.42.0.5/32", "10.42.1.2/32"]).await;
    egresses(&w)
        .delete("test-egress", &DeleteParams::default())
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.254", &[]).await;
    w.finish().await;
}

async fn wait_egress_gone(w: &World) {
    wait_for("Egress gone", WAIT, || async {
        egresses(w)
            .get_opt("eg")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// Pods `p1` (labelled `what=<selected>`, 10.244.<net>.5) and `p2` (not selected,
/// 10.244.<net>.6), and the Egress `eg` selecting `p1` and 10.42.<net>.2 to 172.18.<v>.254
/// (`v`: 0 for net 1, else net); waits for its SNAT sources and its `Programmed=True`
/// condition (`what`), checks its finalizer and returns the condition's (instances, status,
/// reason).
async fn selected_egress(
    w: &World,
    net: u8,
    selected: &str,
    what: &str,
) -> (String, String, String) {
    let vip_net = if net == 1 { 0 } else { net };
    let vip = format!("172.18.{vip_net}.254");
    let (pod, extra) = (format!("10.244.{net}.5"), format!("10.42.{net}.2"));
    running_pod(w, "p1", &[("what", selected)], &pod).await;
    running_pod(w, "p2", &[("what", "other")], &format!("10.244.{net}.6")).await;
    egresses(w)
        .create(
            &PostParams::default(),
            &egress("eg", &[&extra], &vip, &[("what", selected)]),
        )
        .await
        .unwrap();
    wait_sources(w, &vip, &[&format!("{pod}/32"), &format!("{extra}/32")]).await;
    let (n, status, reason, _) = wait_for(what, WAIT, || async {
        programmed(w, "eg").await.filter(|p| p.1 == "True")
    })
    .await;
    let e = egresses(w).get("eg").await.unwrap();
    assert!(
        e.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&loxi_ccm::egress::FINALIZER.to_string())
    );
    (n, status, reason)
}

#[tokio::test]
async fn rules_follow_pods_in_and_out_of_the_selector_and_none_leak_after_delete() {
    let w = World::with("egress-follow", options()).await;
    with_crd(&w).await;
    // A SNAT rule that is not ours (kube-loxilb's shape, another preference): never touched.
    let foreign = loxilb_client::firewall::to_snat_entry(&loxi_domain::egress::SnatRule {
        source: "10.99.0.1/32".parse().unwrap(),
        to: "172.18.0.99".parse().unwrap(),
        preference: 7,
    });
    let client =
        loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&w.sim.url())).unwrap();
    client.add_firewall_rule(&foreign).await.unwrap();

    let (n, status, reason) = selected_egress(&w, 1, "egress-test", "Egress programmed").await;
    assert_eq!(
        (n.as_str(), status.as_str(), reason.as_str()),
        ("1/1", "True", "Programmed")
    );

    // p2 joins the selector, p1 leaves it: exactly their rules change.
    label(&w, "p2", json!({"what": "egress-test"})).await;
    wait_sources(
        &w,
        "172.18.0.254",
        &["10.244.1.5/32", "10.244.1.6/32", "10.42.1.2/32"],
    )
    .await;
    label(&w, "p1", json!({"what": null})).await;
    wait_sources(&w, "172.18.0.254", &["10.244.1.6/32", "10.42.1.2/32"]).await;
    // A selected pod deleted: its rule goes.
    pods(&w)
        .delete("p2", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.254", &["10.42.1.2/32"]).await;
    // The vip changes: every source moves to the new one.
    egresses(&w)
        .patch(
            "eg",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"vip": "172.18.0.253"}})),
        )
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.253", &["10.42.1.2/32"]).await;
    assert!(sources_to(&w, "172.18.0.254").is_empty());

    // Deleted: nothing of ours is left, the foreign rule is, and the Egress goes.
    egresses(&w)
        .delete("eg", &DeleteParams::default())
        .await
        .unwrap();
    wait_egress_gone(&w).await;
    wait_for("no SNAT rule of ours", WAIT, || {
        let left: Vec<_> = snat_rules(&w).into_iter().filter(|r| r.2 != 7).collect();
        async move { left.is_empty().then_some(()) }
    })
    .await;
    assert!(
        snat_rules(&w).contains(&("10.99.0.1/32".into(), "172.18.0.99".into(), 7)),
        "the foreign rule stays: {:?}",
        snat_rules(&w)
    );
    w.finish().await;
}

#[tokio::test]
async fn a_restarted_loxilb_gets_the_egress_rules_back() {
    // The periodic pass far away: only the replay after the restart can bring them back.
    let opts = Options {
        drift: "600s",
        ..options()
    };
    let w = World::with("egress-restart", opts).await;
    with_crd(&w).await;
    // The probe notices a restart by the marker it places with the Services' rules
    // (docs/loxilb-api.md#detecting-a-restart): one Service, as any user of egress has.
    w.add_node("egress-node", "10.0.0.21").await;
    w.serve_one_port("web", 80).await;
    running_pod(&w, "p1", &[("app", "out")], "10.244.2.5").await;
    egresses(&w)
        .create(
            &PostParams::default(),
            &egress("eg", &["10.42.2.0/24"], "172.18.0.250", &[("app", "out")]),
        )
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.250", &["10.244.2.5/32", "10.42.2.0/24"]).await;
    // The pass that programmed them is over (it writes the status last).
    wait_for("Egress programmed with both sources", WAIT, || async {
        let e = egresses(&w).get("eg").await.ok()?;
        (e.status?.sources.len() == 2).then_some(())
    })
    .await;
    w.sim.restart();
    assert!(snat_rules(&w).is_empty(), "a restart wipes the firewall");
    wait_sources(&w, "172.18.0.250", &["10.244.2.5/32", "10.42.2.0/24"]).await;
    egresses(&w)
        .delete("eg", &DeleteParams::default())
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.250", &[]).await;
    w.finish().await;
}

/// A loxilb holding only Egress rules (no Service at all) that restarts gets them back at
/// once, not at the next drift check: the probe looks for its restart marker because it
/// holds SNAT rules of ours.
#[tokio::test]
async fn an_egress_only_loxilb_restart_is_replayed_at_once() {
    // The periodic pass far away: only the replay after the restart can bring them back.
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        drift: "600s",
        admin_port: Some(admin_port),
        ..options()
    };
    let w = World::with("egress-only-restart", opts).await;
    with_crd(&w).await;
    egresses(&w)
        .create(
            &PostParams::default(),
            &egress("eg", &["10.42.3.0/24"], "172.18.0.251", &[]),
        )
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.251", &["10.42.3.0/24"]).await;
    wait_for("Egress programmed", WAIT, || async {
        let e = egresses(&w).get("eg").await.ok()?;
        (e.status?.sources.len() == 1).then_some(())
    })
    .await;
    // The Egress metrics say so too.
    wait_for("loxi_ccm_egresses_programmed 1", WAIT, || async {
        (World::metric(admin_port, "loxi_ccm_egresses_programmed").await? == 1.0).then_some(())
    })
    .await;
    let not = World::metric_sum(admin_port, "loxi_ccm_egresses_not_programmed", &[]).await;
    assert_eq!(not, Some(0.0), "no Egress counted as not programmed");
    // loxilb's own rule behind an SNAT rule (`snat:<vip>:0`) is the only one.
    assert!(
        w.sim.rules().iter().all(|r| r.name.starts_with("snat:")),
        "no Service's rule on this loxilb: {:?}",
        w.sim.rules()
    );
    w.sim.restart();
    assert!(snat_rules(&w).is_empty(), "a restart wipes the firewall");
    // Well before the 600 s drift interval.
    wait_sources(&w, "172.18.0.251", &["10.42.3.0/24"]).await;
    w.finish().await;
}

/// One source named by two Egresses: loxilb holds one rule per source, the older Egress
/// keeps it, the younger reports the conflict (condition, Warning Event) and gets it once
/// the older one goes. A bad spec is reported by name and programs nothing.
#[tokio::test]
async fn a_source_named_twice_stays_with_the_older_egress() {
    let w = World::with("egress-conflict", options()).await;
    with_crd(&w).await;
    egresses(&w)
        .create(
            &PostParams::default(),
            &egress("first", &["10.42.3.1"], "172.18.0.240", &[]),
        )
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.240", &["10.42.3.1/32"]).await;
    egresses(&w)
        .create(
            &PostParams::default(),
            &egress("second", &["10.42.3.1", "10.42.3.2"], "172.18.0.241", &[]),
        )
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.241", &["10.42.3.2/32"]).await;
    let (_, status, _, message) = wait_for("the conflict reported", WAIT, || async {
        programmed(&w, "second")
            .await
            .filter(|p| p.2 == "SourceConflict")
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("10.42.3.1/32") && message.contains("first"),
        "{message}"
    );
    wait_for("a Warning Event about it", WAIT, || async {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(w.client.clone(), &w.ns);
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("SourceConflict")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("second")
            })
            .then_some(())
    })
    .await;
    assert_eq!(sources_to(&w, "172.18.0.240"), set(&["10.42.3.1/32"]));
    egresses(&w)
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    wait_sources(&w, "172.18.0.241", &["10.42.3.1/32", "10.42.3.2/32"]).await;

    // A spec with an address that is not one: said on the resource, nothing of it sent.
    egresses(&w)
        .create(
            &PostParams::default(),
            &egress("bad", &["10.42.3.300"], "172.18.0.242", &[]),
        )
        .await
        .unwrap();
    let e = wait_for("the bad spec reported", WAIT, || async {
        let e = egresses(&w).get("bad").await.ok()?;
        e.status
            .clone()?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Accepted" && c.status == "False")
    })
    .await;
    assert!(e.message.contains("10.42.3.300"), "{}", e.message);
    assert!(sources_to(&w, "172.18.0.242").is_empty());
    for name in ["second", "bad"] {
        egresses(&w)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("no SNAT rule left", WAIT, || {
        let left = snat_rules(&w);
        async move { left.is_empty().then_some(()) }
    })
    .await;
    w.finish().await;
}

/// `kubectl` against the test control plane as its admin; panics on a failure.
fn kubectl(args: &[&str]) -> String {
    let cp = common::control_plane();
    let out = std::process::Command::new(cp.k8s_bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shipped RBAC (deploy/ and deploy/optional/egress.yaml, as `kubectl apply` takes them;
/// rendered from the chart) is all the Egress controller needs: with the shipped
/// ServiceAccount's token it programs an Egress, follows pods in and out of its selector,
/// writes its status and finalizer, and cleans up; and the ServiceAccount may do no more
/// with Egresses and Pods than that.
#[tokio::test]
async fn the_shipped_rbac_is_all_the_egress_controller_needs() {
    let opts = Options {
        leader_elect: false,
        ..options()
    };
    let mut w = World::with("egress-rbac", opts.clone()).await;
    with_crd(&w).await;
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for file in [deploy.clone(), deploy.join("optional/egress.yaml")] {
        kubectl(&["apply", "--validate=strict", "-f", file.to_str().unwrap()]);
    }
    // Least privilege: Egresses are read and patched (finalizer, status), never created,
    // replaced or deleted; Pods only listed and watched.
    let sa = "system:serviceaccount:kube-system:loxi-ccm";
    let can = |verb: &str, resource: &str| {
        let cp = common::control_plane();
        let out = std::process::Command::new(cp.k8s_bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(["auth", "can-i", verb, resource, "--as", sa, "-n", &w.ns])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    for (verb, resource) in [
        ("list", "egresses.egress.loxilb.io"),
        ("watch", "egresses.egress.loxilb.io"),
        ("patch", "egresses.egress.loxilb.io"),
        ("patch", "egresses.egress.loxilb.io/status"),
        ("list", "pods"),
        ("watch", "pods"),
    ] {
        assert!(
            can(verb, resource),
            "the ServiceAccount may not {verb} {resource}"
        );
    }
    for (verb, resource) in [
        ("create", "egresses.egress.loxilb.io"),
        ("update", "egresses.egress.loxilb.io"),
        ("delete", "egresses.egress.loxilb.io"),
        ("get", "pods"),
        ("patch", "pods"),
        ("delete", "pods"),
    ] {
        assert!(
            !can(verb, resource),
            "the ServiceAccount may {verb} {resource}"
        );
    }

    // The controller with the ServiceAccount's token.
    let token = kubectl(&["-n", "kube-system", "create", "token", "loxi-ccm"]);
    let cp = common::control_plane();
    let sa_kc = cp.dir().join("egress-sa.kubeconfig");
    cp.write_kubeconfig(&sa_kc, token.trim()).unwrap();
    let sa_client = cp.client_for_kubeconfig(&sa_kc).await.unwrap();
    w.stop_controller().await;
    w.controller = Some(w.spawn_controller_with(sa_client, &opts));

    let (n, _, reason) = selected_egress(&w, 3, "egress-rbac", "Egress status written").await;
    assert_eq!((n.as_str(), reason.as_str()), ("1/1", "Programmed"));
    // Pods in and out of the selector.
    label(&w, "p2", json!({"what": "egress-rbac"})).await;
    label(&w, "p1", json!({"what": null})).await;
    wait_sources(&w, "172.18.3.254", &["10.244.3.6/32", "10.42.3.2/32"]).await;
    // Deleted: its rules go, then its finalizer, then the Egress.
    egresses(&w)
        .delete("eg", &DeleteParams::default())
        .await
        .unwrap();
    wait_sources(&w, "172.18.3.254", &[]).await;
    wait_egress_gone(&w).await;
    w.finish().await;
}
