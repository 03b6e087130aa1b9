//! End to end: the `deploy/` manifests applied with kubectl to a real kube-apiserver (RBAC on),
//! and the built `loxi-ccm` binary started as a user would, authenticated as the shipped
//! ServiceAccount, so the shipped ClusterRole is what is tested.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, DeleteParams, PostParams};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;

/// [`common::poll_for`] with the end-to-end timeout (the binary starts, takes its Lease).
async fn wait_for<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    f: impl FnMut() -> Fut,
) -> T {
    let (timeout, every) = (Duration::from_secs(60), Duration::from_millis(100));
    common::poll_for(what, timeout, every, String::new, f).await
}

#[tokio::test]
async fn shipped_manifests_and_rbac_run_the_binary_end_to_end() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    // Everything below runs with the shipped ServiceAccount's rights only.
    let sa_kc = apply_shipped_manifests(&cp).await;

    let admin = cp.admin_client().await.unwrap();
    let ns = "e2e";
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, ip) in [("e2e-a", "10.9.0.1"), ("e2e-b", "10.9.0.2")] {
        add_node(&admin, name, ip).await;
    }

    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let log_path = cp.dir().join("loxi-ccm.log");
    let admin_port = testenv::free_port().unwrap();
    let mut ccm = KillOnDrop(
        loxi_ccm_run(&sa_kc, &sim, &format!("127.0.0.1:{admin_port}"))
            .args([
                "--log-format",
                "json",
                // A tight client-side limit: start-up's lists and watches exceed the burst,
                // so requests really wait for tokens, through the real TLS + token stack.
                "--kube-api-qps",
                "20",
                "--kube-api-burst",
                "5",
            ])
            .stdout(std::fs::File::create(&log_path).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let ip = wait_for("an address on web", || async {
        services
            .get("web")
            .await
            .ok()?
            .status?
            .load_balancer?
            .ingress?
            .first()?
            .ip
            .clone()
    })
    .await;
    assert!(ip.starts_with("198.51.100."));
    wait_for("two rules", || async {
        (sim.rules().iter().filter(|r| r.external_ip == ip).count() == 2).then_some(())
    })
    .await;

    // The cloud node controller, under the same ServiceAccount: a kubelet-style new Node.
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "e2e-new", "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.9.0.3"}},
                "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let node = wait_for("e2e-new initialized", || async {
        let n = nodes.get("e2e-new").await.ok()?;
        let tainted = n
            .spec
            .as_ref()?
            .taints
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.key.contains("uninitialized")));
        (!tainted).then_some(n)
    })
    .await;
    assert_eq!(
        node.spec.unwrap().provider_id.as_deref(),
        Some("loxilb://e2e-new")
    );
    let addresses: Vec<(String, String)> = node
        .status
        .unwrap()
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".to_string(), "10.9.0.3".to_string())),
        "{addresses:?}"
    );

    // Metrics and probes answer.
    let metrics = reqwest_get(&format!("http://127.0.0.1:{admin_port}/metrics")).await;
    assert!(metrics.contains("loxi_ccm_reconciles_total"), "{metrics}");
    assert!(
        reqwest_get(&format!("http://127.0.0.1:{admin_port}/readyz"))
            .await
            .starts_with("ok")
    );

    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("web deleted and its rules gone", || async {
        (services.get_opt("web").await.ok()?.is_none() && sim.rules().is_empty()).then_some(())
    })
    .await;

    // SIGTERM: the binary stops by itself.
    let started = Instant::now();
    unsafe {
        libc_kill(ccm.0.id() as i32, 15);
    }
    let status = exit_of(&mut ccm.0, "loxi-ccm ignored SIGTERM").await;
    eprintln!(
        "loxi-ccm exited {status} {:?} after SIGTERM",
        started.elapsed()
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(!log.contains("forbidden"), "RBAC denied something:\n{log}");
}

/// Waits until the auditor (`loxi-ccm audit`'s checks, with the replicas' options) reports no
/// violation for the whole cluster.
async fn audit_clean(admin: &kube::Client, sim: &Simulator) {
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
fn loxi_ccm_run(kubeconfig: &Path, sim: &Simulator, admin: &str) -> Command {
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
async fn exit_of(child: &mut std::process::Child, stuck: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{stuck}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

async fn reqwest_get(url: &str) -> String {
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
async fn apply_shipped_manifests(cp: &testenv::ControlPlane) -> std::path::PathBuf {
    let kubectl = cp.k8s_bin_dir().join("kubectl");
    let admin_kc = cp.kubeconfig_path();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    for args in [
        // As an operator would, with strict validation.
        vec![
            "apply".to_string(),
            "--validate=strict".into(),
            "-f".into(),
            deploy.display().to_string(),
        ],
        vec![
            "wait".into(),
            "--for=condition=established".into(),
            "--timeout=60s".into(),
            "crd/addressclaims.ipam.loxilb.io".into(),
            "crd/addresspools.ipam.loxilb.io".into(),
        ],
    ] {
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&admin_kc)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&admin_kc)
        .args(["-n", "kube-system", "create", "token", "loxi-ccm"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let sa_kc = cp.dir().join("sa.kubeconfig");
    cp.write_kubeconfig(&sa_kc, &token).unwrap();
    sa_kc
}

/// A control plane with the shipped manifests, one Ready Node and a simulator: what the
/// two-process tests start from (the kubeconfig is the shipped ServiceAccount's).
async fn two_process_setup(
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

async fn add_node(admin: &kube::Client, name: &str, ip: &str) {
    common::nodes::add_node(&Api::all(admin.clone()), name, ip).await;
}

/// Two processes of the binary WITHOUT leader election (a misconfigured Deployment, or two
/// clusters' controllers sharing a pool by mistake) allocating at once from a pool barely
/// larger than the burst: the claims' name uniqueness still gives every address to one
/// Service only, and each Service ends with exactly one claimed address.
#[tokio::test]
async fn two_processes_without_leader_election_never_duplicate() {
    let (cp, sa_kc, admin, sim) = two_process_setup("race-a", "10.8.1.1").await;
    let start = |name: &str| {
        KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
                .env("POD_NAME", name)
                .args(["run", "--kubeconfig"])
                .arg(&sa_kc)
                .args([
                    "--loxilb-url",
                    &sim.url(),
                    // 62 usable addresses for 60 Services.
                    "--external-cidr",
                    "198.51.100.0/26",
                    "--admin-addr",
                    &format!("127.0.0.1:{}", testenv::free_port().unwrap()),
                    "--leader-elect=false",
                ])
                .stdout(std::fs::File::create(cp.dir().join(format!("{name}.log"))).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let replicas = [start("racer-a"), start("racer-b")];
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    // One port for all: no two may share an address.
    let names: Vec<String> = (0..60).map(|i| format!("race{i}")).collect();
    futures::future::join_all(names.iter().map(|name| {
        let services = services.clone();
        async move {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
            }))
            .unwrap();
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
    }))
    .await;
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    let shown = wait_for("60 addresses, one claim each", || async {
        let shown: std::collections::BTreeMap<String, String> = services
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|s| {
                Some((
                    s.metadata.name?,
                    s.status?.load_balancer?.ingress?.first()?.ip.clone()?,
                ))
            })
            .collect();
        let claims = claims.list(&Default::default()).await.ok()?.items;
        (shown.len() == 60 && claims.len() == 60).then_some(shown)
    })
    .await;
    let unique: std::collections::BTreeSet<&String> = shown.values().collect();
    assert_eq!(
        unique.len(),
        60,
        "one address given to two Services: {shown:?}"
    );
    for c in claims.list(&Default::default()).await.unwrap().items {
        assert_eq!(
            shown.get(&c.spec.service.name),
            Some(&c.spec.address),
            "claim {} names a Service that does not show it",
            c.spec.address
        );
    }
    wait_for("exactly one rule per Service", || async {
        let rules = sim.rules();
        let ips: std::collections::BTreeSet<String> =
            rules.iter().map(|r| r.external_ip.clone()).collect();
        (rules.len() == 60 && ips.iter().all(|ip| unique.contains(ip))).then_some(())
    })
    .await;
    for mut child in replicas {
        unsafe {
            libc_kill(child.0.id() as i32, 15);
        }
        let _ = child.0.wait();
    }
    // How much the two really raced (informational: the outcome above is what counts).
    for name in ["racer-a", "racer-b"] {
        let log = std::fs::read_to_string(cp.dir().join(format!("{name}.log"))).unwrap_or_default();
        eprintln!(
            "{name}: {} race(s) lost to the other process",
            log.matches("claimed by someone else first").count()
                + log.matches("released a second address").count()
        );
    }
}

/// Two replicas of the binary with leader election, as the Deployment runs them: the leader
/// is stopped in the middle of a burst, the standby takes over; no duplicate address, no lost
/// and no orphaned rule.
#[tokio::test]
async fn leader_failover_between_two_processes() {
    let (cp, sa_kc, admin, sim) = two_process_setup("fo-a", "10.8.0.1").await;

    let start = |name: &str| {
        let port = testenv::free_port().unwrap();
        let child = KillOnDrop(
            Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
                .env("POD_NAME", name)
                .args(["run", "--kubeconfig"])
                .arg(&sa_kc)
                .args([
                    "--loxilb-url",
                    &sim.url(),
                    "--external-cidr",
                    "198.51.100.0/24",
                    "--admin-addr",
                    &format!("127.0.0.1:{port}"),
                    "--leader-elect-lease-duration",
                    "6s",
                ])
                .stdout(std::fs::File::create(cp.dir().join(format!("{name}.log"))).unwrap())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        (child, port)
    };
    let mut replicas = vec![start("replica-a"), start("replica-b")];
    let leader = wait_for("a leader", || async {
        for (i, (_, port)) in replicas.iter().enumerate() {
            let body = reqwest_get(&format!("http://127.0.0.1:{port}/readyz")).await;
            if body.contains("(leader") {
                return Some(i);
            }
        }
        None
    })
    .await;

    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    let svc = |i: usize| -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": format!("fo{i}")},
            "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        }))
        .unwrap()
    };
    let published = || async {
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
            .collect::<std::collections::BTreeMap<String, String>>()
    };
    for i in 0..10 {
        services
            .create(&PostParams::default(), &svc(i))
            .await
            .unwrap();
    }
    wait_for("first addresses", || async {
        (published().await.len() >= 3).then_some(())
    })
    .await;
    // Stop the leader mid-burst (SIGTERM: it releases the Lease).
    let (mut old, _) = replicas.remove(leader);
    unsafe {
        libc_kill(old.0.id() as i32, 15);
    }
    let stopped = Instant::now();
    for i in 10..20 {
        services
            .create(&PostParams::default(), &svc(i))
            .await
            .unwrap();
    }
    let _ = old.0.wait();
    let all = wait_for("20 addresses after failover", || async {
        let p = published().await;
        (p.len() == 20).then_some(p)
    })
    .await;
    eprintln!(
        "standby served all 20 Services {:?} after the leader's SIGTERM",
        stopped.elapsed()
    );
    let unique: std::collections::BTreeSet<&String> = all.values().collect();
    assert_eq!(unique.len(), 20, "duplicate addresses: {all:?}");
    wait_for("exactly the 20 rules", || async {
        let ips: std::collections::BTreeSet<String> =
            sim.rules().into_iter().map(|r| r.external_ip).collect();
        (ips.len() == 20 && ips.iter().all(|ip| unique.contains(ip))).then_some(())
    })
    .await;
    // The new leader deletes as well: no orphan left.
    for i in 0..5 {
        services
            .delete(&format!("fo{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("rules of deleted Services gone", || async {
        (sim.rules().len() == 15).then_some(())
    })
    .await;
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("15 claims", || async {
        (claims.list(&Default::default()).await.ok()?.items.len() == 15).then_some(())
    })
    .await;
    for (mut child, _) in replicas {
        unsafe {
            libc_kill(child.0.id() as i32, 15);
        }
        let _ = child.0.wait();
    }
}

/// One replica of the binary with leader election (6 s Lease) and the drift check out of the
/// way, so that every loxilb write a test sees comes from a Service's own pass.
fn start_replica(
    cp: &testenv::ControlPlane,
    sa_kc: &Path,
    sim: &Simulator,
    name: &str,
) -> (KillOnDrop, u16) {
    let port = testenv::free_port().unwrap();
    let child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
            .env("POD_NAME", name)
            .args(["run", "--kubeconfig"])
            .arg(sa_kc)
            .args([
                "--loxilb-url",
                &sim.url(),
                "--external-cidr",
                "198.51.100.0/24",
                "--admin-addr",
                &format!("127.0.0.1:{port}"),
                "--leader-elect-lease-duration",
                "6s",
                "--drift-interval",
                "10m",
            ])
            .stdout(std::fs::File::create(cp.dir().join(format!("{name}.log"))).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (child, port)
}

async fn role(port: u16) -> String {
    reqwest_get(&format!("http://127.0.0.1:{port}/readyz")).await
}

fn one_port_service(name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

/// Name -> first ingress IP of every Service of `default` that shows one.
async fn shown(services: &Api<Service>) -> std::collections::BTreeMap<String, String> {
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

/// The leader is frozen (SIGSTOP) with rule writes in flight, long enough for the standby to
/// take over, serve new Services and delete old ones; once resumed (SIGCONT) the old leader
/// must not write to loxilb at all: its Lease ran out while it was frozen, and every write
/// asks the Lease before it starts, after each step that waits and when the connection
/// writes it (`loxilb_client::LoxilbClient::with_write_gate`). The writes are told apart by
/// the caller the simulator records (each replica sends its Lease identity,
/// `loxilb_client::IDENTITY_HEADER`): the new leader may go on writing meanwhile (in one CI
/// run, a count of all writes saw 22 where 21 were expected and could not say whose).
#[tokio::test]
async fn a_frozen_leader_once_resumed_writes_nothing_to_loxilb() {
    let (cp, sa_kc, admin, sim) = two_process_setup("pause-a", "10.8.2.1").await;
    let mut replicas = vec![
        start_replica(&cp, &sa_kc, &sim, "pause-1"),
        start_replica(&cp, &sa_kc, &sim, "pause-2"),
    ];
    let leader = wait_for("a leader", || async {
        for (i, (_, port)) in replicas.iter().enumerate() {
            if role(*port).await.contains("(leader") {
                return Some(i);
            }
        }
        None
    })
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    for i in 0..6 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("p{i}")))
            .await
            .unwrap();
    }
    wait_for("6 Services served", || async {
        (shown(&services).await.len() == 6 && sim.rules().len() == 6).then_some(())
    })
    .await;
    // The leader's identity, as its Lease and every loxilb call it sends name it.
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-system");
    let old_leader = lease
        .get("loxi-ccm")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a Lease holder");
    assert!(
        old_leader.starts_with(&format!("pause-{}_", leader + 1)),
        "{old_leader}"
    );
    assert!(
        sim.writes_from(&old_leader) >= 6,
        "the leader's writes carry its identity: {:?}",
        sim.writes_by_caller()
    );

    // Writes now take 1.5 s: the next Services' rule POSTs are in flight at the freeze.
    sim.set_write_latency(Duration::from_millis(1500));
    let writes_before = sim.writes();
    for i in 6..12 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("p{i}")))
            .await
            .unwrap();
    }
    wait_for("a rule write in flight", || async {
        (sim.writes() > writes_before).then_some(())
    })
    .await;
    let (frozen, _) = replicas.remove(leader);
    let (_, standby_port) = replicas[0];
    let stopped_at = sim.uptime();
    unsafe {
        libc_kill(frozen.0.id() as i32, 19); // SIGSTOP
    }
    sim.set_write_latency(Duration::ZERO);
    wait_for("the standby leads", || async {
        role(standby_port).await.contains("(leader").then_some(())
    })
    .await;
    wait_for("12 Services served by the new leader", || async {
        (shown(&services).await.len() == 12 && sim.rules().len() == 12).then_some(())
    })
    .await;
    for i in 0..6 {
        services
            .delete(&format!("p{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("the deleted Services' rules and claims gone", || async {
        let claims = claims.list(&Default::default()).await.ok()?.items.len();
        (sim.rules().len() == 6 && claims == 6).then_some(())
    })
    .await;
    // The live Services' addresses: a deleted Service may still be listed (its finalizer on
    // its way out) with the address it showed.
    let listed = services.list(&Default::default()).await.unwrap().items;
    let deleting: Vec<String> = listed
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_some())
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    if !deleting.is_empty() {
        eprintln!(
            "deleted Services still listed once their rules and claims are gone: {deleting:?}"
        );
    }
    let live: std::collections::BTreeSet<String> = shown(&services)
        .await
        .into_iter()
        .filter(|(name, _)| !deleting.contains(name))
        .map(|(_, ip)| ip)
        .collect();
    let rules_before = sim.rules();
    let writes_before = sim.writes();
    let old_writes_before = sim.writes_from(&old_leader);
    let logged_before = sim.write_log().len();

    let mut frozen = frozen;
    let resumed_at = sim.uptime();
    unsafe {
        libc_kill(frozen.0.id() as i32, 18); // SIGCONT
    }
    // It finds its Lease lost and exits (a restart brings it back as a standby).
    let exited = Instant::now();
    loop {
        if frozen.0.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            exited.elapsed() < Duration::from_secs(60),
            "the resumed old leader did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let since: Vec<String> = sim.write_log()[logged_before..]
        .iter()
        .map(|w| {
            format!(
                "{} {} {} by {} (accepted {:?}, completed {:?} after the simulator's start)",
                w.method,
                w.path,
                w.status,
                w.caller.as_deref().unwrap_or("?"),
                w.accepted,
                w.completed
            )
        })
        .collect();
    // Read before the check: on a failure its tail tells what the old leader did on resuming
    // (the control plane's directory does not outlive the run).
    let log = std::fs::read_to_string(
        cp.dir()
            .join(format!("pause-{}.log", if leader == 0 { 1 } else { 2 })),
    )
    .unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    assert_eq!(
        sim.writes_from(&old_leader),
        old_writes_before,
        "the resumed old leader {old_leader} wrote to loxilb: {since:?}; SIGSTOP {:?} and \
         SIGCONT {:?} after the simulator's start (a write accepted before SIGSTOP left before \
         the freeze); its log, last lines first:\n{}",
        stopped_at,
        resumed_at,
        tail.join("\n")
    );
    // Anybody else's (the new leader's) are only reported.
    eprintln!(
        "writes after SIGCONT: {} in all, 0 by the old leader: {since:?}",
        sim.writes() - writes_before
    );
    assert_eq!(sim.rules(), rules_before);
    let ips: std::collections::BTreeSet<String> =
        sim.rules().into_iter().map(|r| r.external_ip).collect();
    assert_eq!(ips, live, "rules for exactly the live Services");
    eprintln!(
        "old leader after SIGCONT: {} write(s) stopped by the Lease check",
        log.matches("may no longer write").count()
    );
    audit_clean(&admin, &sim).await;
}

/// A standby started while Services existed, which then saw them deleted by the leader, is
/// promoted: it must only ever clean up, never claim or program a Service that is gone (its
/// reconciles queued at start-up hold the old objects while they wait for leadership).
#[tokio::test]
async fn a_promoted_standby_never_brings_back_services_deleted_while_it_stood_by() {
    let (cp, sa_kc, admin, sim) = two_process_setup("promo-a", "10.8.3.1").await;
    let (mut first, first_port) = start_replica(&cp, &sa_kc, &sim, "promo-1");
    wait_for("a leader", || async {
        role(first_port).await.contains("(leader").then_some(())
    })
    .await;
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    for i in 0..4 {
        services
            .create(&PostParams::default(), &one_port_service(&format!("q{i}")))
            .await
            .unwrap();
    }
    wait_for("4 Services served", || async {
        (shown(&services).await.len() == 4 && sim.rules().len() == 4).then_some(())
    })
    .await;
    let (_second, second_port) = start_replica(&cp, &sa_kc, &sim, "promo-2");
    wait_for("a synced standby", || async {
        role(second_port).await.contains("(standby").then_some(())
    })
    .await;
    for i in 0..4 {
        services
            .delete(&format!("q{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    wait_for("all gone", || async {
        let gone = !services
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with('q'))
            });
        let claims = claims.list(&Default::default()).await.ok()?.items.len();
        (gone && claims == 0 && sim.rules().is_empty()).then_some(())
    })
    .await;
    unsafe {
        libc_kill(first.0.id() as i32, 15);
    }
    let _ = first.0.wait();
    wait_for("the standby leads", || async {
        role(second_port).await.contains("(leader").then_some(())
    })
    .await;
    // A Service created after the promotion is served after the reconciles queued before it.
    services
        .create(&PostParams::default(), &one_port_service("q9"))
        .await
        .unwrap();
    let ip = wait_for("q9 served", || async {
        let ip = shown(&services).await.get("q9").cloned()?;
        sim.rules()
            .iter()
            .any(|r| r.external_ip == ip)
            .then_some(ip)
    })
    .await;
    let claimed: Vec<String> = claims
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.spec.service.name)
        .collect();
    assert_eq!(
        claimed,
        vec!["q9".to_string()],
        "claims for deleted Services"
    );
    let ips: Vec<String> = sim.rules().into_iter().map(|r| r.external_ip).collect();
    assert_eq!(ips, vec![ip], "rules for deleted Services");
    audit_clean(&admin, &sim).await;
}

/// An admin address that cannot be listened on (the port is taken) stops `loxi-ccm run` at
/// once, before it asks for the Lease: exit 1 and a message naming the flag, the address and
/// the system's answer. Leading without `/healthz`, `/readyz` and `/metrics` would make the
/// kubelet's probes fail for a reason nobody sees.
#[tokio::test]
async fn an_admin_address_in_use_stops_the_binary_before_it_leads() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let sa_kc = apply_shipped_manifests(&cp).await;
    let admin = cp.admin_client().await.unwrap();
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();

    let mut ccm = KillOnDrop(
        loxi_ccm_run(&sa_kc, &sim, &addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let status = exit_of(
        &mut ccm.0,
        &format!("loxi-ccm still runs 30 s after it could not listen on {addr}"),
    )
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(ccm.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    println!("exit {status} after {:?}: {stderr}", started.elapsed());
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: --admin-addr {addr}: cannot listen for /healthz, /readyz and /metrics: "
        )) && stderr.contains("in use"),
        "{stderr}"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin, "kube-system");
    assert!(
        leases.get_opt("loxi-ccm").await.unwrap().is_none(),
        "no Lease was asked for"
    );
    assert!(sim.rules().is_empty());
    drop(taken);
}
