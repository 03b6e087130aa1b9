//! `--appendEPs` (kube-loxilb's spelling): two controllers of two clusters (two real
//! kube-apiservers) share one rule on one loxilb simulator. Each attaches and detaches only
//! its own endpoints; neither's drift check nor replay takes the other's away; deleting one
//! Service detaches its endpoints and leaves the rule to the other; the last one out takes
//! the rule with it. Either controller may restart (or be down while its Service is
//! deleted) and still take off exactly its own endpoints; attaches that would create a rule
//! obey loxilb's limits; and the audit of each compares only its own endpoints.

mod common;

use common::{CLASS, Options, WAIT, World, annotated, install_crds, node_ports, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use loxi_ccm::audit::checks::Kind;
use loxilb_sim::SimConfig;

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
    let mut b = OtherCluster::start(&w).await;
    let b_port = b.serve_web(&[("node-b", "10.0.2.1")]).await;

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
    b.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the rule gone with the last endpoint", WAIT, || async {
        w.rules_for(VIP).is_empty().then_some(())
    })
    .await;
    b.stop_controller().await;
    w.finish().await;
    b.finish().await;
}

/// The other cluster: its own API server, with the world's namespace, and its controller
/// (cluster id `other`, `--appendEPs`) on the world's simulator, started and stopped at will.
struct OtherCluster {
    cp: testenv::ControlPlane,
    client: kube::Client,
    services: Api<Service>,
    nodes: Api<Node>,
    cfg: loxi_ccm::config::Config,
    /// Its admin server's port (metrics).
    admin_port: u16,
    controller: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl OtherCluster {
    async fn start(w: &World) -> OtherCluster {
        let cp = testenv::ControlPlane::start()
            .await
            .expect("second control plane");
        let client = cp.admin_client().await.unwrap();
        install_crds(&client).await;
        Api::<Namespace>::all(client.clone())
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
        OtherCluster {
            services: Api::namespaced(client.clone(), &w.ns),
            nodes: Api::all(client.clone()),
            cfg: loxi_ccm::config::Config::from_args(&run).unwrap(),
            admin_port: testenv::free_port().unwrap(),
            client,
            cp,
            controller: None,
        }
    }

    /// Its `nodes` (name, address) and its Service [`web`], then its controller; returns the
    /// Service's node port.
    async fn serve_web(&mut self, nodes: &[(&str, &str)]) -> i32 {
        for (name, ip) in nodes {
            common::nodes::add_node(&self.nodes, name, ip).await;
        }
        let svc = self
            .services
            .create(&PostParams::default(), &web())
            .await
            .unwrap();
        self.start_controller();
        node_ports(&svc)[0]
    }

    fn start_controller(&mut self) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let admin = std::net::SocketAddr::from(([127, 0, 0, 1], self.admin_port));
        let run =
            loxi_ccm::runtime::run(self.client.clone(), self.cfg.clone(), Some(admin), async {
                let _ = stopped.await;
            });
        self.controller = Some((stop, tokio::spawn(run)));
    }

    async fn stop_controller(&mut self) {
        if let Some((stop, handle)) = self.controller.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), handle).await;
        }
    }

    async fn audit(&self) -> loxi_ccm::audit::Findings {
        loxi_ccm::audit::audit(&self.client, &self.cfg)
            .await
            .expect("the other cluster's audit runs")
    }

    async fn finish(mut self) {
        self.stop_controller().await;
        self.cp.stop();
    }
}

/// Waits until the shared rule holds exactly `want` ("ip:port" endpoints, any order).
async fn wait_shared(w: &World, what: &str, want: &[String]) {
    let want = sorted(want.to_vec());
    wait_for(what, WAIT, || async {
        (sorted(shared_endpoints(w)) == want).then_some(())
    })
    .await;
}

/// Waits until the in-process controller serving `admin_port` has finished a Service
/// reconcile: its pass has seen what loxilb holds.
async fn wait_reconciled(admin_port: u16) {
    wait_for("a reconcile of the restarted controller", WAIT, || async {
        World::metric_sum(
            admin_port,
            "loxi_ccm_reconciles_total",
            &["result=\"success\""],
        )
        .await
        .filter(|n| *n >= 1.0)
    })
    .await;
}

#[tokio::test]
async fn restarts_of_either_controller_never_cost_the_others_endpoints() {
    let admin_port = testenv::free_port().unwrap();
    let a_opts = Options {
        drift: "1s",
        extra_args: vec!["--appendEPs".into()],
        admin_port: Some(admin_port),
        ..Options::default()
    };
    let mut w = World::with("sharedrestart", a_opts.clone()).await;
    w.add_node("node-a", "10.0.1.1").await;
    w.add_node("node-a2", "10.0.1.2").await;
    let a_port = node_ports(&w.create(&web()).await)[0];
    let mut b = OtherCluster::start(&w).await;
    let b_port = b
        .serve_web(&[("node-b", "10.0.2.1"), ("node-b2", "10.0.2.2")])
        .await;
    let a = |ip: &str| format!("{ip}:{a_port}");
    let bb = |ip: &str| format!("{ip}:{b_port}");
    wait_shared(
        &w,
        "both clusters' endpoints",
        &[a("10.0.1.1"), a("10.0.1.2"), bb("10.0.2.1"), bb("10.0.2.2")],
    )
    .await;

    // Each audit compares only its own endpoints: the other's are neither drift nor orphans.
    let findings = w.audit(&a_opts).await;
    assert!(findings.clean(), "A's audit:\n{findings}");
    let findings = b.audit().await;
    assert!(findings.clean(), "B's audit:\n{findings}");

    // A restarts and, once it has looked, loses a Node: it takes off that endpoint (which it
    // attached before the restart), and nothing of B's.
    w.stop_controller().await;
    w.start_controller(&a_opts).await;
    wait_reconciled(admin_port).await;
    w.set_node_status("node-a", "10.0.1.1", false).await;
    wait_shared(
        &w,
        "A's endpoint from before its restart detached",
        &[a("10.0.1.2"), bb("10.0.2.1"), bb("10.0.2.2")],
    )
    .await;

    // The same for B.
    b.stop_controller().await;
    b.start_controller();
    wait_reconciled(b.admin_port).await;
    common::nodes::set_node_status(&b.nodes, "node-b", "10.0.2.1", false).await;
    wait_shared(
        &w,
        "B's endpoint from before its restart detached",
        &[a("10.0.1.2"), bb("10.0.2.2")],
    )
    .await;

    // A drift behind A's back: its endpoint taken off by hand while it is down. A's audit
    // says so; B's does not care.
    w.stop_controller().await;
    let client =
        loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&w.sim.url())).unwrap();
    let held = client.list_rules().await.unwrap();
    let mut entry = held
        .iter()
        .find(|e| e.service_arguments.external_ip == VIP)
        .unwrap()
        .clone();
    entry.endpoints.retain(|e| e.endpoint_ip == "10.0.1.2");
    entry.service_arguments.oper = 2;
    client.apply_rule(&entry).await.unwrap();
    wait_shared(&w, "A's endpoint detached by hand", &[bb("10.0.2.2")]).await;
    let findings = w.audit(&a_opts).await;
    assert_eq!(
        findings
            .violations
            .iter()
            .map(|v| v.kind)
            .collect::<Vec<_>>(),
        vec![Kind::Rules],
        "{findings}"
    );
    assert!(
        findings.violations[0].detail.contains("10.0.1.2"),
        "{findings}"
    );
    assert!(b.audit().await.clean());

    // A's Service is deleted while A is down (its finalizer holds it). A comes back,
    // re-attaches nothing for it, and detaches what it would have had: only its own.
    w.start_controller(&a_opts).await;
    wait_shared(&w, "A's endpoint back", &[a("10.0.1.2"), bb("10.0.2.2")]).await;
    w.stop_controller().await;
    w.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    w.start_controller(&a_opts).await;
    wait_for("A's Service gone", WAIT, || async {
        w.get("web").await.is_none().then_some(())
    })
    .await;
    wait_shared(&w, "B's endpoint left alone", &[bb("10.0.2.2")]).await;
    // A's audit: the rule may carry A's name; it holds only B's endpoints: not an orphan.
    let findings = w.audit(&a_opts).await;
    assert!(findings.clean(), "A's audit:\n{findings}");
    assert!(b.audit().await.clean());

    b.services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the rule gone with the last endpoint", WAIT, || async {
        w.rules_for(VIP).is_empty().then_some(())
    })
    .await;
    b.finish().await;
    w.finish().await;
}

/// The `loxilb.io/Programmed` condition's (status, reason) of A's Service `name`.
async fn programmed(w: &World, name: &str) -> Option<(String, String)> {
    let svc = w.get(name).await?;
    World::condition(&svc, "loxilb.io/Programmed").map(|(s, r, _)| (s, r))
}

#[tokio::test]
async fn attaches_that_create_rules_obey_loxilbs_capacity() {
    let opts = Options {
        extra_args: vec!["--appendEPs".into()],
        ..Options::default()
    };
    // Room for two rules, one of them someone else's shared rule on 192.0.2.77:80.
    let w = World::with_sim(
        "sharedcapacity",
        opts,
        SimConfig {
            max_rules: 2,
            ..SimConfig::default()
        },
    )
    .await;
    let client =
        loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&w.sim.url())).unwrap();
    let mut theirs = loxilb_client::convert::to_entry(&loxi_domain::Rule {
        key: loxi_domain::RuleKey {
            ip: VIP.parse().unwrap(),
            port: 80,
            protocol: loxi_domain::Protocol::Tcp,
        },
        name: "their-cluster".into(),
        endpoints: vec![loxi_domain::Endpoint {
            ip: "10.0.9.9".parse().unwrap(),
            target_port: 30999,
            weight: 1,
        }],
        mode: loxi_domain::NatMode::Default,
        selection: loxi_domain::EndpointSelection::RoundRobin,
        monitor: false,
        managed: false,
        probe: loxi_domain::model::Probe::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        egress: false,
        allowed_sources: Vec::new(),
        secondary_ips: Vec::new(),
        bgp: false,
        private_ip: None,
    });
    theirs.service_arguments.oper = 1;
    client.apply_rule(&theirs).await.unwrap();
    w.add_node("node-a", "10.0.1.1").await;

    // One new rule fits; the shared rule needs no room.
    let first = w
        .create(&World::lb_service("first", Some(CLASS), &[(90, "TCP")]))
        .await;
    let shared = w.create(&web()).await;
    wait_for("first and web programmed", WAIT, || async {
        let t = ("True".to_string(), "Programmed".to_string());
        (programmed(&w, "first").await? == t && programmed(&w, "web").await? == t).then_some(())
    })
    .await;
    assert_eq!(
        sorted(shared_endpoints(&w)),
        sorted(vec![
            "10.0.9.9:30999".into(),
            format!("10.0.1.1:{}", node_ports(&shared)[0])
        ])
    );
    assert_eq!(node_ports(&first).len(), 1);

    // A third rule does not fit: held back and reported, as our own rules are.
    w.create(&World::lb_service("third", Some(CLASS), &[(91, "TCP")]))
        .await;
    wait_for("third held back", WAIT, || async {
        let (status, reason) = programmed(&w, "third").await?;
        (status == "False" && reason == "CapacityExceeded").then_some(())
    })
    .await;
    // Its further passes send nothing: the limit is known.
    let posts = w.sim.rule_posts();
    for value in ["soon", "later", "never"] {
        w.services
            .patch(
                "third",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"loxilb.io/retain-address": value}}
                })),
            )
            .await
            .unwrap();
        wait_for(&format!("a pass that read {value}"), WAIT, || async {
            let s = w.get("third").await?;
            let (_, _, message) = World::condition(&s, "loxilb.io/AddressAllocated")?;
            message.contains(value).then_some(())
        })
        .await;
    }
    assert_eq!(
        w.sim.rule_posts(),
        posts,
        "a held-back attach was sent again"
    );
    assert_eq!(w.sim.rules().len(), 2);

    // Room frees: the waiting Service is woken and programmed.
    w.services
        .delete("first", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("third programmed once room freed", WAIT, || async {
        let (status, _) = programmed(&w, "third").await?;
        (status == "True").then_some(())
    })
    .await;
    assert_eq!(w.sim.rules().len(), 2);
    w.finish().await;
}
