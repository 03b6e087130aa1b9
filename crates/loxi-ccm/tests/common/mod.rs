//! Shared glue for integration tests: one real control plane per test binary, tests run one at
//! a time (they share cluster-scoped Nodes), each in its own namespace with its own simulator
//! and its own in-process controller.

#![allow(dead_code)]

pub mod addresses;
pub mod cluster;
pub mod gateway;
pub mod hold;
pub mod load;
pub mod nodes;
pub mod pods;
pub mod proxy;
pub mod services;
pub mod wait;

// Re-exported so that tests name them `common::x`; each test binary uses some.
#[allow(unused_imports)]
pub use cluster::{
    admin_config, control_plane, delete_crds, host_address, host_address_v6, install_crd,
    install_crds, install_gateway_api_crds, install_shipped_crds, kubectl_apply_strict,
    kubectl_as_admin, serial, shipped_service_account_kubeconfig, store_in_etcd, test_namespace,
};
#[allow(unused_imports)]
pub use services::{COND_ADDRESS, COND_PROGRAMMED, annotated, node_ports};
#[allow(unused_imports)]
pub use wait::{WAIT, poll_for, wait_for};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Service, ServicePort, ServiceSpec};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use loxi_ccm::config::Config;
use loxilb_sim::{SimConfig, Simulator};
use tokio::sync::{MutexGuard, oneshot};

pub const CLASS: &str = "loxilb.io/loxilb";

/// One test's world: namespace, simulator, controller.
pub struct World {
    _serial: MutexGuard<'static, ()>,
    pub client: kube::Client,
    pub ns: String,
    pub sim: Simulator,
    pub services: Api<Service>,
    pub nodes: Api<Node>,
    pub controller: Option<(
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

#[derive(Clone)]
pub struct Options {
    pub cidr: String,
    pub ccm_mode: bool,
    pub drift: &'static str,
    pub leader_elect: bool,
    pub extra_args: Vec<String>,
    /// Serve /metrics, /healthz and /readyz on 127.0.0.1 at this port.
    pub admin_port: Option<u16>,
    /// No `--loxilb-url` for the world's simulator: the loxilbs are discovered
    /// ([`World::set_loxilb_endpoints`]).
    pub discovery: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cidr: "192.0.2.0/24".into(),
            ccm_mode: false,
            drift: "30s",
            leader_elect: true,
            extra_args: Vec::new(),
            admin_port: None,
            discovery: false,
        }
    }
}

/// A simulator that speaks BGP (goBGP's API beside loxilb's).
pub fn bgp_sim() -> SimConfig {
    SimConfig {
        bgp: true,
        ..SimConfig::default()
    }
}

/// The controller's flags for HA roles on every Node and BGP (AS 65100) with one external
/// peer, 192.0.2.250 (AS 65001): a restarted loxilb then gets a role, BGP and rules back.
pub fn roles_and_bgp_args() -> Vec<String> {
    [
        "--set-roles=0.0.0.0",
        "--bgp-local-as=65100",
        "--bgp-peers=192.0.2.250:65001",
    ]
    .map(String::from)
    .to_vec()
}

/// A controller running as its own process ([`World::spawn_process`]), killed (SIGKILL) when
/// dropped.
pub struct ControllerProcess(pub std::process::Child);

/// The controller binary with `flags` after `loxi-ccm run`, its output appended to `log`.
fn spawn_binary(flags: &[String], log: &std::path::Path) -> ControllerProcess {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
        .arg("run")
        .arg(format!(
            "--kubeconfig={}",
            control_plane().kubeconfig_path().display()
        ))
        .args(flags)
        .arg("--admin-addr=127.0.0.1:0")
        .stdout(log)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    ControllerProcess(child)
}

struct SupervisedState {
    process: ControllerProcess,
    restarts: usize,
    other_exit: Option<String>,
}

/// A controller process restarted after it gives up its leadership
/// ([`World::spawn_supervised`]); killed when dropped.
pub struct Supervised {
    state: std::sync::Arc<std::sync::Mutex<SupervisedState>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Supervised {
    /// The current process's id.
    pub fn pid(&self) -> u32 {
        self.state.lock().unwrap().process.pid()
    }

    /// Restarts after a lost leadership so far.
    pub fn restarts(&self) -> usize {
        self.state.lock().unwrap().restarts
    }

    /// An exit that was not a lost leadership, if any.
    pub fn other_exit(&self) -> Option<String> {
        self.state.lock().unwrap().other_exit.clone()
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.state.lock().unwrap().process.kill();
    }
}

impl ControllerProcess {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// `kill -9`: no shutdown path runs, whatever it was doing stops there.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

impl World {
    pub async fn new(name: &str) -> World {
        Self::with(name, Options::default()).await
    }

    pub async fn with(name: &str, opts: Options) -> World {
        Self::with_sim(name, opts, SimConfig::default()).await
    }

    /// As [`World::with`], with the world's simulator configured by `sim` (e.g. a small
    /// `max_rules`). More loxilb instances: start simulators and pass their URLs in
    /// `opts.extra_args` as `--loxilb-url=...` (repeated flags add up; instances are then
    /// `[world.sim, extra...]`).
    pub async fn with_sim(name: &str, opts: Options, sim: SimConfig) -> World {
        let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), sim)
            .await
            .unwrap();
        Self::with_simulator(name, opts, sim).await
    }

    /// As [`World::with`], with a simulator the caller started (e.g. serving HTTPS).
    pub async fn with_simulator(name: &str, opts: Options, sim: Simulator) -> World {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let serial = serial().await;
        let cp = control_plane();
        let client = cp.admin_client().await.unwrap();
        let ns = test_namespace(name);
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
        // Claims are cluster-scoped too: a test that failed midway left its own (their
        // addresses would look taken to this one).
        let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(client.clone());
        let _ = claims
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
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
        let mut args = vec!["loxi-ccm".to_string(), "run".into()];
        args.extend(self.run_flags(opts));
        let cli = <loxi_ccm::config::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
        let loxi_ccm::config::cli::Command::Run(run) = cli.command;
        Config::from_args(&run).unwrap()
    }

    /// The controller as its own process (`loxi-ccm run` of this build, same flags as the
    /// in-process one, metrics on a free port): for tests that `kill -9` it or measure its
    /// memory. Its standard output is appended to `log`; dropping the handle kills it.
    pub fn spawn_process(&self, opts: &Options, log: &std::path::Path) -> ControllerProcess {
        spawn_binary(&self.run_flags(opts), log)
    }

    /// As [`World::spawn_process`], restarted when it exits after losing its leadership, as
    /// the kubelet restarts a controller's container (the process exits on purpose then, to
    /// come back as a standby). Any other exit is left for the test to see.
    pub fn spawn_supervised(&self, opts: &Options, log: &std::path::Path) -> Supervised {
        let flags = self.run_flags(opts);
        let log = log.to_path_buf();
        let state = std::sync::Arc::new(std::sync::Mutex::new(SupervisedState {
            process: spawn_binary(&flags, &log),
            restarts: 0,
            other_exit: None,
        }));
        let watched = state.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
                let mut s = watched.lock().unwrap();
                if s.other_exit.is_some() {
                    continue;
                }
                let Ok(Some(status)) = s.process.0.try_wait() else {
                    continue;
                };
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.matches("lost leadership").count() > s.restarts {
                    s.restarts += 1;
                    s.process = spawn_binary(&flags, &log);
                } else {
                    s.other_exit = Some(format!("exited {status}"));
                }
            }
        });
        Supervised { state, stop }
    }

    /// The flags after `loxi-ccm run` for this world's controller.
    fn run_flags(&self, opts: &Options) -> Vec<String> {
        let mut args = vec![
            format!("--external-cidr={}", opts.cidr),
            format!("--namespace={}", self.ns),
            "--cluster-id=test".into(),
            "--health-interval=200ms".into(),
            format!("--drift-interval={}", opts.drift),
            // Leader election on, with the Lease in the test's namespace.
            format!("--leader-elect-namespace={}", self.ns),
        ];
        if !opts.discovery {
            args.push(format!("--loxilb-url={}", self.sim.url()));
        }
        if opts.ccm_mode {
            args.push("--ccm-mode".into());
        }
        if !opts.leader_elect {
            args.push("--leader-elect=false".into());
        }
        args.extend(opts.extra_args.iter().cloned());
        args
    }

    pub async fn start_controller(&mut self, opts: &Options) {
        self.controller = Some(self.spawn_controller(opts));
    }

    /// Starts one more controller (the caller stops it by sending on / dropping the sender).
    pub fn spawn_controller(
        &self,
        opts: &Options,
    ) -> (
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        self.spawn_controller_with(self.client.clone(), opts)
    }

    /// As [`World::spawn_controller`], talking to the API server through `client` (e.g. one
    /// going through a [`proxy::CutProxy`]).
    pub fn spawn_controller_with(
        &self,
        client: kube::Client,
        opts: &Options,
    ) -> (
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        let cfg = self.config(opts);
        let (tx, rx) = oneshot::channel::<()>();
        let admin = opts
            .admin_port
            .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        let handle = tokio::spawn(loxi_ccm::runtime::run(client, cfg, admin, async {
            let _ = rx.await;
        }));
        (tx, handle)
    }

    /// Address claims (cluster-scoped) of Services in this test's namespace.
    pub async fn claims(&self) -> Vec<loxi_ccm::ipam::claims::AddressClaim> {
        let api: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(self.client.clone());
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.spec.service.namespace == self.ns)
            .collect()
    }

    /// The first ingress IP of each Service of this namespace that has one.
    pub async fn published(&self) -> BTreeMap<String, String> {
        self.services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|s| {
                let ip = s.status?.load_balancer?.ingress?.first()?.ip.clone()?;
                Some((s.metadata.name?, ip))
            })
            .collect()
    }

    pub async fn stop_controller(&mut self) {
        if let Some((tx, handle)) = self.controller.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
        }
    }

    /// Creates a Ready Node with InternalIP `ip` ([`nodes::add_node`]).
    pub async fn add_node(&self, name: &str, ip: &str) {
        nodes::add_node(&self.nodes, name, ip).await;
    }

    pub async fn set_node_status(&self, name: &str, ip: &str, ready: bool) {
        nodes::set_node_status(&self.nodes, name, ip, ready).await;
    }

    /// A LoadBalancer Service with the given class and (port, protocol) list.
    pub fn lb_service(name: &str, class: Option<&str>, ports: &[(i32, &str)]) -> Service {
        services::lb_service(name, class, ports)
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

    /// Creates a one-port LoadBalancer Service of our class and waits until it shows an
    /// address and its rule is in the simulator; returns the address.
    pub async fn serve_one_port(&self, name: &str, port: i32) -> String {
        self.create(&World::lb_service(name, Some(CLASS), &[(port, "TCP")]))
            .await;
        let ip = self.wait_for_ip(name).await;
        wait_for("rule", WAIT, || async {
            (self.rules_for(&ip).len() == 1).then_some(())
        })
        .await;
        ip
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

    /// The sum of a metric's series served on `127.0.0.1:port/metrics` whose labels contain
    /// every one of `labels` (e.g. `op="list"`).
    pub async fn metric_sum(port: u16, name: &str, labels: &[&str]) -> Option<f64> {
        let body = World::metrics_text(port).await?;
        Some(
            body.lines()
                .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
                .filter_map(|l| l.split_once("} "))
                .filter(|(series, _)| labels.iter().all(|want| series.contains(want)))
                .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
                .sum(),
        )
    }

    /// Everything served on `127.0.0.1:port/metrics`.
    pub async fn metrics_text(port: u16) -> Option<String> {
        reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// The value of an unlabelled metric served on `127.0.0.1:port/metrics`.
    pub async fn metric(port: u16, name: &str) -> Option<f64> {
        let body = World::metrics_text(port).await?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// A condition of `svc` as (status, reason, message) ([`services::condition`]).
    pub fn condition(svc: &Service, type_: &str) -> Option<(String, String, String)> {
        services::condition(svc, type_)
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

    /// The in-cluster loxilb Service `service` (selector-less, created if missing) in this
    /// test's namespace, and its EndpointSlice `slice` listing one loxilb at `address`:`port`,
    /// ready or not, as the EndpointSlice controller would for a loxilb Pod: what discovery
    /// follows. The API server refuses loopback addresses there: use [`host_address`] and a
    /// simulator listening on it (each in its own slice, with its own port).
    pub async fn set_loxilb_slice(
        &self,
        service: &str,
        slice: &str,
        address: &str,
        port: u16,
        ready: bool,
    ) {
        self.set_loxilb_slice_in_zone(service, slice, address, port, ready, None)
            .await
    }

    /// As [`World::set_loxilb_slice`], the endpoint in topology zone `zone`.
    pub async fn set_loxilb_slice_in_zone(
        &self,
        service: &str,
        slice: &str,
        address: &str,
        port: u16,
        ready: bool,
        zone: Option<&str>,
    ) {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let svc = Service {
            metadata: ObjectMeta {
                name: Some(service.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![ServicePort {
                    name: Some("loxilb-app".into()),
                    port: 11111,
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let _ = self.services.create(&PostParams::default(), &svc).await;
        let body = serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice,
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": if address.contains(':') { "IPv6" } else { "IPv4" },
            "endpoints": [{"addresses": [address], "conditions": {"ready": ready}, "zone": zone}],
            "ports": [{"name": "loxilb-app", "port": port, "protocol": "TCP"}],
        });
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        api.patch(
            slice,
            &PatchParams::apply("loxi-ccm-tests").force(),
            &Patch::Apply(&body),
        )
        .await
        .unwrap();
    }

    pub async fn delete_loxilb_slice(&self, slice: &str) {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &self.ns);
        api.delete(slice, &DeleteParams::default()).await.unwrap();
    }

    /// Runs the auditor (`loxi-ccm audit`) with the configuration of this world's controller
    /// (`opts`): same namespace, cluster id, pools and loxilb.
    pub async fn audit(&self, opts: &Options) -> loxi_ccm::audit::Findings {
        let cfg = self.config(opts);
        loxi_ccm::audit::audit(&self.client, &cfg)
            .await
            .expect("the audit runs")
    }

    /// Waits until every Service of the namespace satisfies `ready` and the auditor reports
    /// no violation; returns how long that took (the time to recover). Panics after
    /// `timeout` with the last findings.
    pub async fn settle(
        &self,
        opts: &Options,
        timeout: Duration,
        ready: impl Fn(&Service) -> bool,
    ) -> Duration {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let services = self.services.list(&ListParams::default()).await;
            let all_ready = match &services {
                Ok(list) => list.items.iter().all(&ready),
                Err(e) => {
                    last = format!("listing Services: {e}");
                    false
                }
            };
            if all_ready {
                let findings = self.audit(opts).await;
                if findings.clean() {
                    return started.elapsed();
                }
                last = format!("{}{}", findings, findings.summary());
            } else if let Ok(list) = &services {
                let waiting: Vec<String> = list
                    .items
                    .iter()
                    .filter(|s| !ready(s))
                    .take(5)
                    .map(|s| {
                        let conds: Vec<String> = s
                            .status
                            .as_ref()
                            .and_then(|st| st.conditions.as_ref())
                            .into_iter()
                            .flatten()
                            .map(|c| {
                                format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)
                            })
                            .collect();
                        format!(
                            "{}{} [{}]",
                            s.metadata.name.as_deref().unwrap_or(""),
                            if s.metadata.deletion_timestamp.is_some() {
                                " (deleting)"
                            } else {
                                ""
                            },
                            conds.join("; ")
                        )
                    })
                    .collect();
                last = format!("not ready yet: {}", waiting.join(" | "));
            }
            if started.elapsed() > timeout {
                panic!("not settled after {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// [`World::settle`] with every Service showing an address and `loxilb.io/Programmed`
    /// True.
    pub async fn settle_programmed(&self, opts: &Options, timeout: Duration) -> Duration {
        self.settle(opts, timeout, |s| {
            s.status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
                && World::condition(s, "loxilb.io/Programmed").is_some_and(|c| c.0 == "True")
                && s.metadata.deletion_timestamp.is_none()
        })
        .await
    }

    pub async fn finish(mut self) {
        self.stop_controller().await;
        // loxilb EndpointSlices (`set_loxilb_slice`) would be discovered by the next test's
        // controller, which follows them in any namespace: none is left behind.
        let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
            Api::namespaced(self.client.clone(), &self.ns);
        let _ = slices
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        // Claims are cluster-scoped and outlive the namespace: leave none behind for the
        // next test (their addresses would look taken).
        let api: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(self.client.clone());
        for c in self.claims().await {
            let _ = api
                .delete(
                    &c.metadata.name.unwrap_or_default(),
                    &DeleteParams::default(),
                )
                .await;
        }
    }
}

/// Asserts that the audit found, among its findings of `kind`, one whose line holds every
/// one of `needles` (all the findings are shown when it did not).
#[track_caller]
pub fn assert_found(
    found: &loxi_ccm::audit::Findings,
    kind: loxi_ccm::audit::Kind,
    needles: &[&str],
) {
    let has = found.of_kind(kind).iter().any(|v| {
        let line = v.to_string();
        needles.iter().all(|n| line.contains(n))
    });
    assert!(has, "{found}");
}
