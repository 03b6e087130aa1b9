//! The helpers of the end-to-end tests (`e2e_binary.rs`, `e2e_leader.rs`): the shipped
//! manifests applied with kubectl, the built binary started and stopped as a user would,
//! replicas of it side by side. Included with `#[path]` by the test files that use it only.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;

/// [`crate::common::poll_for`] with the end-to-end timeout (the binary starts, takes its Lease).
pub async fn wait_for<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    f: impl FnMut() -> Fut,
) -> T {
    let (timeout, every) = (Duration::from_secs(60), Duration::from_millis(100));
    crate::common::poll_for(what, timeout, every, String::new, f).await
}

/// Waits until the auditor (`loxi-ccm audit`'s checks, with the replicas' options) reports no
/// violation for the whole cluster.
pub async fn audit_clean(admin: &kube::Client, sim: &Simulator) {
    let cli = <loxi_ccm::config::cli::Cli as clap::Parser>::try_parse_from([
        "loxi-ccm".to_string(),
        "run".into(),
        format!("--loxilb-url={}", sim.url()),
        "--external-cidr=198.51.100.0/24".into(),
    ])
    .unwrap();
    let loxi_ccm::config::cli::Command::Run(run) = cli.command;
    let cfg = loxi_ccm::config::Config::from_args(&run).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last = match loxi_ccm::audit::audit(admin, &cfg).await {
            Ok(f) if f.clean() => return,
            Ok(f) => format!("{f}{}", f.summary()),
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "audit not clean: {last}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Kills the child when dropped, so a failing assertion leaves no controller running.
/// `loxi-ccm run` of this build with kube-loxilb's spellings, as the user of `kubeconfig`:
/// the simulator's URL, the pool 198.51.100.0/24 and the admin server on `admin`. The
/// caller adds the rest.
pub fn loxi_ccm_run(kubeconfig: &Path, sim: &Simulator, admin: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loxi-ccm"));
    command.args(["run", "--kubeconfig"]).arg(kubeconfig).args([
        "--loxiURL",
        &sim.url(),
        "--externalCIDR",
        "198.51.100.0/24",
        "--admin-addr",
        admin,
    ]);
    command
}

/// How `child` exits, within 30 s; `stuck` says what it means when it does not.
pub async fn exit_of(child: &mut std::process::Child, stuck: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{stuck}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    pub fn libc_kill(pid: i32, sig: i32) -> i32;
}

pub async fn reqwest_get(url: &str) -> String {
    // A raw HTTP/1.0 GET keeps this test free of another HTTP client dependency. Empty when
    // nothing listens yet.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let (host, path) = addr.split_once('/').unwrap();
    let Ok(mut s) = tokio::net::TcpStream::connect(host).await else {
        return String::new();
    };
    if s.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .is_err()
    {
        return String::new();
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    buf.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// `kubectl apply -f deploy/` (CRDs established) and a kubeconfig with a token of the
/// shipped ServiceAccount: the binary then runs with exactly the shipped RBAC.
pub async fn apply_shipped_manifests(cp: &testenv::ControlPlane) -> std::path::PathBuf {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    // As an operator would, with strict validation.
    crate::common::kubectl_apply_strict(cp, &deploy);
    crate::common::kubectl_as_admin(
        cp,
        [
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/addressclaims.ipam.loxilb.io",
            "crd/addresspools.ipam.loxilb.io",
        ],
    );
    crate::common::shipped_service_account_kubeconfig(cp, "sa.kubeconfig")
}

/// A control plane with the shipped manifests, one Ready Node and a simulator: what the
/// two-process tests start from (the kubeconfig is the shipped ServiceAccount's).
pub async fn two_process_setup(
    node: &str,
    ip: &str,
) -> (
    testenv::ControlPlane,
    std::path::PathBuf,
    kube::Client,
    Simulator,
) {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let sa_kc = apply_shipped_manifests(&cp).await;
    let admin = cp.admin_client().await.unwrap();
    add_node(&admin, node, ip).await;
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    (cp, sa_kc, admin, sim)
}

pub async fn add_node(admin: &kube::Client, name: &str, ip: &str) {
    crate::common::nodes::add_node(&Api::all(admin.clone()), name, ip).await;
}

/// `loxi-ccm run` of this build as the Pod `name` (its Lease identity), with the kubeconfig
/// `sa_kc` and `flags`; its output in `<name>.log` of the control plane's directory.
pub fn spawn_named(
    cp: &testenv::ControlPlane,
    sa_kc: &Path,
    name: &str,
    flags: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>,
) -> KillOnDrop {
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
            .env("POD_NAME", name)
            .args(["run", "--kubeconfig"])
            .arg(sa_kc)
            .args(flags)
            .stdout(std::fs::File::create(cp.dir().join(format!("{name}.log"))).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The flags of a replica with leader election (6 s Lease) on `sim`, the pool
/// 198.51.100.0/24 and the admin server on `port`.
pub fn replica_flags(sim: &Simulator, port: u16) -> Vec<String> {
    vec![
        format!("--loxilb-url={}", sim.url()),
        "--external-cidr=198.51.100.0/24".into(),
        format!("--admin-addr=127.0.0.1:{port}"),
        "--leader-elect-lease-duration=6s".into(),
    ]
}

/// One replica of the binary with leader election (6 s Lease) and the drift check out of the
/// way, so that every loxilb write a test sees comes from a Service's own pass.
pub fn start_replica(
    cp: &testenv::ControlPlane,
    sa_kc: &Path,
    sim: &Simulator,
    name: &str,
) -> (KillOnDrop, u16) {
    let port = testenv::free_port().unwrap();
    let mut flags = replica_flags(sim, port);
    flags.push("--drift-interval=10m".into());
    (spawn_named(cp, sa_kc, name, flags), port)
}

pub async fn role(port: u16) -> String {
    reqwest_get(&format!("http://127.0.0.1:{port}/readyz")).await
}

pub fn one_port_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

/// Name -> first ingress IP of every Service of `default` that shows one.
pub async fn shown(services: &Api<Service>) -> std::collections::BTreeMap<String, String> {
    services
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| {
            Some((
                s.metadata.name?,
                s.status?.load_balancer?.ingress?.first()?.ip.clone()?,
            ))
        })
        .collect()
}
