//! `--appendEPs` (kube-loxilb's spelling): two controllers of two clusters (two real
//! kube-apiservers) share one rule on one loxilb simulator. Each attaches and detaches only
//! its own endpoints; neither's drift check nor replay takes the other's away; deleting one
//! Service detaches its endpoints and leaves the rule to the other; the last one out takes
//! the rule with it.

mod common;

use common::{CLASS, Options, WAIT, World, annotated, install_crds, node_ports, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

const VIP: &str = "192.0.2.77";

fn web() -> Service {
    annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/staticIP", VIP)],
    )
}

/// The endpoints of the shared rule, sorted (empty: no rule).
fn shared_endpoints(w: &World) -> Vec<String> {
    w.rules_for(VIP)
        .into_iter()
        .flat_map(|(_, _, eps)| eps)
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test]
async fn two_controllers_share_a_rule_and_never_take_each_others_endpoints() {
    let a_opts = Options {
        drift: "1s",
        extra_args: vec!["--appendEPs".into()],
        ..Options::default()
    };
    let w = World::with("sharedrules", a_opts).await;
    w.add_node("node-a", "10.0.1.1").await;
    let a_svc = w.create(&web()).await;
    let a_port = node_ports(&a_svc)[0];

    // The other cluster: its own API server, Node and Service on the same address and port.
    let cp2 = testenv::ControlPlane::start()
        .await
        .expect("second control plane");
    let c2 = cp2.admin_client().await.unwrap();
    install_crds(&c2).await;
    Api::<Namespace>::all(c2.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(w.ns.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let nodes2: Api<Node> = Api::all(c2.clone());
    common::nodes::add_node(&nodes2, "node-b", "10.0.2.1").await;
    let services2: Api<Service> = Api::namespaced(c2.clone(), &w.ns);
    let b_svc = services2
        .create(&PostParams::default(), &web())
        .await
        .unwrap();
    let b_port = node_ports(&b_svc)[0];
    let args = [
        "loxi-ccm".to_string(),
        "run".into(),
        "--external-cidr=192.0.2.0/24".into(),
        format!("--namespace={}", w.ns),
        "--cluster-id=other".into(),
        "--health-interval=200ms".into(),
        "--drift-interval=1s".into(),
        format!("--leader-elect-namespace={}", w.ns),
        format!("--loxilb-url={}", w.sim.url()),
        "--appendEPs=true".into(),
    ];
    let cli = <loxi_ccm::config::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
    let loxi_ccm::config::cli::Command::Run(run) = cli.command;
    let b_cfg = loxi_ccm::config::Config::from_args(&run).unwrap();
    let (b_stop, b_stopped) = tokio::sync::oneshot::channel::<()>();
    let b = tokio::spawn(loxi_ccm::runtime::run(c2.clone(), b_cfg, None, async {
        let _ = b_stopped.await;
    }));

    let a_ep = |ip: &str| format!("{ip}:{a_port}");
    let b_ep = format!("10.0.2.1:{b_port}");
    let both = sorted(vec![a_ep("10.0.1.1"), b_ep.clone()]);
    wait_for("one rule with both clusters' endpoints", WAIT, || async {
        (sorted(shared_endpoints(&w)) == both).then_some(())
    })
    .await;
    assert_eq!(w.rules_for(VIP).len(), 1);

    // Drift checks of both (1 s apart) compare only their own endpoints: nothing is
    // written while several of them run.
    let writes = w.sim.writes();
    let requests = w.sim.request_count();
    wait_for("several drift checks of both", WAIT, || async {
        (w.sim.request_count() > requests + 60).then_some(())
    })
    .await;
    assert_eq!(w.sim.writes(), writes, "a drift check wrote");
    assert_eq!(sorted(shared_endpoints(&w)), both);

    // A's endpoints change: it attaches the new one, then detaches the one it lost; B's stay.
    w.add_node("node-a2", "10.0.1.2").await;
    let three = sorted(vec![a_ep("10.0.1.1"), a_ep("10.0.1.2"), b_ep.clone()]);
    wait_for("A's new endpoint attached", WAIT, || async {
        (sorted(shared_endpoints(&w)) == three).then_some(())
    })
    .await;
    w.set_node_status("node-a", "10.0.1.1", false).await;
    let moved = sorted(vec![a_ep("10.0.1.2"), b_ep.clone()]);
    wait_for("A's lost endpoint detached", WAIT, || async {
        (sorted(shared_endpoints(&w)) == moved).then_some(())
    })
    .await;

    // loxilb restarts empty: each replays its own endpoints onto the one rule.
    w.sim.restart();
    wait_for("both replayed", WAIT, || async {
        (sorted(shared_endpoints(&w)) == moved).then_some(())
    })
    .await;

    // A's Service goes: only its endpoints are detached, the rule stays with B's.
    w.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("A's Service gone", WAIT, || async {
        w.get("web").await.is_none().then_some(())
    })
    .await;
    wait_for("B's endpoint left alone", WAIT, || async {
        (shared_endpoints(&w) == vec![b_ep.clone()]).then_some(())
    })
    .await;

    // B's Service goes too: its detach takes the last endpoint, and loxilb the rule.
    services2
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the rule gone with the last endpoint", WAIT, || async {
        w.rules_for(VIP).is_empty().then_some(())
    })
    .await;
    let _ = b_stop.send(());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), b).await;
    w.finish().await;
    cp2.stop();
}
