//! kube-loxilb's `--enableK8sMetadata` against the real API server and the simulator: the
//! metadata arrives (the Service, the pods it selects, the Nodes), a pod change sends that
//! pod only, a restarted loxilb gets the full set again; off, the controller never lists or
//! watches Pods (the API server's own count of Pod watches says so) and sends nothing.
//!
//! Pods are created through the API with their status written as a kubelet would: the
//! control plane runs no kubelet.

mod common;

use std::collections::BTreeSet;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use loxilb_sim::SimK8sMeta;
use serde_json::json;

fn on() -> Options {
    Options {
        extra_args: vec!["--enableK8sMetadata".into()],
        ..Options::default()
    }
}

fn pods(w: &World) -> Api<Pod> {
    Api::namespaced(w.client.clone(), &w.ns)
}

/// A pod with `app: <app>` whose status shows `ip`, as a kubelet would write it.
async fn pod(w: &World, name: &str, app: &str, ip: &str) {
    common::pods::default_service_account(w).await;
    common::pods::running_pod(w, name, &[("app", app)], ip).await;
}

/// A Service of our class on port 80 selecting `app: web`.
async fn web_service(w: &World) -> String {
    let mut svc = World::lb_service("web", Some(CLASS), &[(80, "TCP")]);
    svc.spec.as_mut().unwrap().selector = Some([("app".to_string(), "web".to_string())].into());
    w.create(&svc).await;
    w.wait_for_ip("web").await
}

/// What the posts since `from` told loxilb, merged as loxilb would keep it: (pods as
/// name=ip, Services as name=externalIP, Nodes).
fn known(posts: &[SimK8sMeta]) -> (BTreeSet<String>, BTreeSet<String>, BTreeSet<String>) {
    let mut p = std::collections::BTreeMap::new();
    let mut s = std::collections::BTreeMap::new();
    let mut n = BTreeSet::new();
    for post in posts {
        for x in &post.pods {
            p.insert(x.name.clone(), x.ip.clone());
        }
        for x in &post.services {
            s.insert(x.name.clone(), x.external_ip.clone());
        }
        for x in &post.nodes {
            n.insert(x.name.clone());
        }
    }
    (
        p.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        s.into_iter().map(|(k, v)| format!("{k}={v}")).collect(),
        n,
    )
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The metadata arrives once the Service has its address; a pod that changes is sent alone;
/// a loxilb that restarts is sent the full set again.
#[tokio::test]
async fn metadata_arrives_then_only_changes() {
    let w = World::with("k8smeta-on", on()).await;
    w.add_node("meta-n1", "10.0.0.1").await;
    pod(&w, "web-1", "web", "10.244.0.1").await;
    pod(&w, "web-2", "web", "10.244.0.2").await;
    pod(&w, "db-1", "db", "10.244.0.3").await;
    let ip = web_service(&w).await;

    let want = (
        set(&["web-1=10.244.0.1", "web-2=10.244.0.2"]),
        set(&[&format!("web={ip}")]),
        set(&["meta-n1"]),
    );
    wait_for(
        "loxilb knows the Service, its pods and the Node",
        WAIT,
        || {
            let got = known(&w.sim.k8s_metadata_posts());
            let done = got == want;
            async move { done.then_some(()) }
        },
    )
    .await;
    let first = w.sim.k8s_metadata_posts();
    assert!(
        first
            .iter()
            .all(|p| p.pods.iter().all(|p| p.name != "db-1")),
        "a pod no Service of ours selects is not sent: {first:?}"
    );

    // One pod changes: that pod alone is sent.
    let mark = w.sim.k8s_metadata_posts().len();
    pods(&w)
        .patch_status(
            "web-2",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"podIP": "10.244.0.9", "podIPs": [{"ip": "10.244.0.9"}]}}),
            ),
        )
        .await
        .unwrap();
    wait_for("the changed pod reaches loxilb", WAIT, || {
        let posts = w.sim.k8s_metadata_posts();
        let done = known(&posts).0.contains("web-2=10.244.0.9");
        async move { done.then_some(()) }
    })
    .await;
    let since: Vec<SimK8sMeta> = w.sim.k8s_metadata_posts().split_off(mark);
    assert!(!since.is_empty());
    for post in &since {
        let names: Vec<&str> = post.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            (names, post.services.len(), post.nodes.len()),
            (vec!["web-2"], 0, 0),
            "only the changed pod is sent, not the world: {since:?}"
        );
    }

    // A restart wipes what loxilb knew: it is sent the full set again.
    w.sim.restart();
    let want = (
        set(&["web-1=10.244.0.1", "web-2=10.244.0.9"]),
        set(&[&format!("web={ip}")]),
        set(&["meta-n1"]),
    );
    wait_for("the restarted loxilb knows everything again", WAIT, || {
        let got = known(&w.sim.k8s_metadata_posts());
        let done = got == want;
        async move { done.then_some(()) }
    })
    .await;
}

/// The API server's count of namespaced Pod watches open now
/// (`apiserver_longrunning_requests`): the controller runs with `--namespace`, and the API
/// server keeps a cluster-wide Pod watch of its own.
async fn pod_watches(w: &World) -> u64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = w.client.request_text(req).await.unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("apiserver_longrunning_requests{"))
        .collect();
    assert!(
        !lines.is_empty(),
        "the API server exposes apiserver_longrunning_requests"
    );
    lines
        .iter()
        .filter(|l| {
            l.contains("resource=\"pods\"")
                && l.contains("verb=\"WATCH\"")
                && l.contains("scope=\"namespace\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Off (the default): no Pod watch is opened and nothing is sent, while Services are served
/// as usual. The same count shows the Pod watch when the flag is on, so it can tell.
#[tokio::test]
async fn off_watches_no_pods_and_sends_nothing() {
    let w = World::new("k8smeta-off").await;
    w.add_node("meta-n1", "10.0.0.1").await;
    pod(&w, "web-1", "web", "10.244.0.1").await;
    let ip = web_service(&w).await;
    wait_for("the Service's rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;
    // Watches of an earlier test's controller close once it stopped.
    // (The controller runs without the flag: a Pod watch of its own would keep this above 0.)
    wait_for("no Pod watch open", WAIT, || async {
        (pod_watches(&w).await == 0).then_some(())
    })
    .await;
    assert!(
        w.sim.k8s_metadata_posts().is_empty(),
        "nothing is sent without the flag"
    );
    drop(w);

    let w = World::with("k8smeta-watch", on()).await;
    wait_for("the Pod watch of the flag", WAIT, || async {
        (pod_watches(&w).await >= 1).then_some(())
    })
    .await;
}
