//! Shared glue for integration tests: one real control plane per test binary, tests run one at
//! a time (they share cluster-scoped Nodes), each in its own namespace with its own simulator
//! and its own in-process controller.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeStatus, Service, ServicePort, ServiceSpec,
};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use loxi_ccm::config::Config;
use loxilb_sim::{SimConfig, Simulator};
use testenv::ControlPlane;
use tokio::sync::{Mutex, MutexGuard, oneshot};

pub const CLASS: &str = "loxilb.io/loxilb";

static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::const_new(());

/// The shared control plane, started on first use (on its own runtime, since each test has
/// its own and the processes outlive any one test).
pub fn control_plane() -> &'static ControlPlane {
    CONTROL_PLANE.get_or_init(|| {
        std::thread::spawn(|| {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(ControlPlane::start())
                .expect("control plane starts")
        })
        .join()
        .expect("control plane thread")
    })
}

/// Polls `check` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub const WAIT: Duration = Duration::from_secs(30);

/// One test's world: namespace, simulator, controller.
pub struct World {
    _serial: MutexGuard<'static, ()>,
    pub client: kube::Client,
    pub ns: String,
    pub sim: Simulator,
    pub services: Api<Service>,
    pub nodes: Api<Node>,
    controller: Option<(
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

pub struct Options {
    pub cidr: String,
    pub ccm_mode: bool,
    pub drift: &'static str,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cidr: "192.0.2.0/24".into(),
            ccm_mode: false,
            drift: "30s",
        }
    }
}

impl World {
    pub async fn new(name: &str) -> World {
        Self::with(name, Options::default()).await
    }

    pub async fn with(name: &str, opts: Options) -> World {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let serial = SERIAL.lock().await;
        let cp = control_plane();
        let client = cp.admin_client().await.unwrap();
        let ns = format!("{name}-{}", std::process::id() % 100_000);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await;
        let nodes: Api<Node> = Api::all(client.clone());
        // Nodes are cluster-scoped: start every test from none.
        for n in nodes.list(&ListParams::default()).await.unwrap() {
            let _ = nodes
                .delete(&n.metadata.name.unwrap(), &DeleteParams::default())
                .await;
        }
        let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
            .await
            .unwrap();
        let mut world = World {
            _serial: serial,
            services: Api::namespaced(client.clone(), &ns),
            nodes,
            client,
            ns,
            sim,
            controller: None,
        };
        world.start_controller(&opts).await;
        world
    }

    pub fn config(&self, opts: &Options) -> Config {
        let mut args = vec![
            "loxi-ccm".to_string(),
            "run".into(),
            format!("--loxilb-url={}", self.sim.url()),
            format!("--external-cidr={}", opts.cidr),
            format!("--namespace={}", self.ns),
            "--cluster-id=test".into(),
            "--health-interval=200ms".into(),
            format!("--drift-interval={}", opts.drift),
            // Leader election on, with the Lease in the test's namespace.
            format!("--leader-elect-namespace={}", self.ns),
        ];
        if opts.ccm_mode {
            args.push("--ccm-mode".into());
        }
        let cli = <loxi_ccm::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
        let loxi_ccm::cli::Command::Run(run) = cli.command;
        Config::from_args(&run).unwrap()
    }

    pub async fn start_controller(&mut self, opts: &Options) {
        let cfg = self.config(opts);
        let (tx, rx) = oneshot::channel::<()>();
        let client = self.client.clone();
        let handle = tokio::spawn(loxi_ccm::controller::run(client, cfg, None, async {
            let _ = rx.await;
        }));
        self.controller = Some((tx, handle));
    }

    pub async fn stop_controller(&mut self) {
        if let Some((tx, handle)) = self.controller.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
        }
    }

    pub async fn add_node(&self, name: &str, ip: &str) {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        self.nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        self.set_node_status(name, ip, true).await;
    }

    pub async fn set_node_status(&self, name: &str, ip: &str, ready: bool) {
        let status = NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: ip.into(),
            }]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        self.nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    /// A LoadBalancer Service with the given class and (port, protocol) list.
    pub fn lb_service(name: &str, class: Option<&str>, ports: &[(i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_class: class.map(str::to_string),
                selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
                ports: Some(
                    ports
                        .iter()
                        .map(|(port, proto)| ServicePort {
                            name: Some(format!("{}-{port}", proto.to_lowercase())),
                            port: *port,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn create(&self, svc: &Service) -> Service {
        self.services
            .create(&PostParams::default(), svc)
            .await
            .unwrap()
    }

    pub async fn get(&self, name: &str) -> Option<Service> {
        self.services.get_opt(name).await.unwrap()
    }

    /// Waits for the Service's first ingress IP.
    pub async fn wait_for_ip(&self, name: &str) -> String {
        wait_for(&format!("an ingress IP on {name}"), WAIT, || async {
            self.get(name).await.and_then(|s| {
                s.status?
                    .load_balancer?
                    .ingress?
                    .first()
                    .and_then(|i| i.ip.clone())
            })
        })
        .await
    }

    /// The simulator's rules for `ip`, as (port, protocol, sorted "ip:port" endpoints).
    pub fn rules_for(&self, ip: &str) -> Vec<(u16, String, Vec<String>)> {
        let mut rules: Vec<_> = self
            .sim
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

    pub fn condition(svc: &Service, type_: &str) -> Option<(String, String, String)> {
        svc.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// Event reasons recorded for a Service (events.k8s.io/v1).
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason)
            .collect()
    }

    pub async fn finish(mut self) {
        self.stop_controller().await;
    }
}
