//! Developer tasks, run as `cargo xtask <task>`:
//!
//! - `demo [--exit]`: builds what is missing, starts etcd + kube-apiserver, the loxilb
//!   simulator and loxi-ccm, creates 3 Nodes and a LoadBalancer Service with a TCP and a UDP
//!   port, and prints the Service with its EXTERNAL-IP and the simulator's rule table. Runs
//!   until Ctrl-C, or exits after showing the result with `--exit`.
//! - `test`: the whole test suite as CI runs it: builds the control plane (cached) while
//!   cargo compiles, then `cargo fmt --check`, `cargo clippy -D warnings`, the dependency
//!   check (`deny`), `cargo test`. helm, promtool and actionlint (the chart, alert-rule and
//!   release-workflow tests) are built the same way (`scripts/go-tool.sh`, cached by
//!   version); a tool that cannot be built fails the run.
//! - `deny`: `cargo deny check licenses bans sources` against `deny.toml`, with a cargo-deny
//!   of a pinned version installed once into the cache (works offline afterwards).
//! - `bench [--quick | --fleet | --profile <instant|loxilb-0.9.8> [--profile-tick-ms MS]]`:
//!   builds the release binaries and runs `loxi-bench` with the flags given
//!   (docs/BENCHMARKS.md).
//! - `image [--context-only] [--reproducible] [--arch amd64|arm64] [--name REF]`: the
//!   container image from `deploy/Dockerfile`, as an OCI archive under `target/image/`,
//!   without a Docker daemon (buildah), reproducibly (`image.rs`).
//! - `realnode`: the opt-in real-node tier (`realnode.rs`, docs/testing.md): installs the
//!   Debian packages, builds kubelet, kube-proxy and kube-scheduler (cached), the image, and
//!   runs `crates/loxi-ccm/tests/real_node.rs`. Not part of `test`.
//! - `manifests`: renders the plain manifests of `deploy/` from the Helm chart
//!   (`charts/loxi-ccm`, values `charts/deploy-values.yaml`); the chart tests fail while
//!   `deploy/` differs from that rendering.

mod conformance;
mod image;
mod packages;
mod realnode;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn run(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let status = cmd.status().with_context(|| format!("starting: {what}"))?;
    if !status.success() {
        bail!("failed ({status}): {what}");
    }
    Ok(())
}

fn control_plane_script() -> Command {
    let mut c = Command::new("bash");
    c.arg(workspace_root().join("scripts/control-plane.sh"))
        .env("K8S_VERSION", testenv::K8S_VERSION)
        .stdout(Stdio::null());
    c
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("demo") => demo(args.iter().any(|a| a == "--exit")),
        Some("bench") => bench(&args[1..]),
        Some("deny") => deny(),
        Some("manifests") => manifests(),
        Some("image") => image::image(&args[1..]),
        Some("realnode") => realnode::realnode(),
        Some("conformance") => conformance::conformance(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <demo [--exit] | test | deny | bench [--quick | --fleet | --profile <instant|loxilb-0.9.8> [--profile-tick-ms MS]] [loxi-bench flags] | manifests | conformance [suite flags] | image [--context-only] [--reproducible] [--arch amd64|arm64] [--name REF] | realnode>"
            );
            std::process::exit(2);
        }
    }
}

/// `bench [--quick | --fleet | --profile NAME] [flags]`: the release loxi-ccm binary against
/// a real API server and the simulator (see bench/ and docs/BENCHMARKS.md); every flag goes
/// to `loxi-bench` as given (`--profile`, `--profile-tick-ms` included); `--help` lists them.
fn bench(args: &[String]) -> Result<()> {
    let mut build = cargo();
    build.args(["build", "--release", "-p", "loxi-ccm", "-p", "loxi-bench"]);
    run(build, "cargo build --release -p loxi-ccm -p loxi-bench")?;
    let mut bench = cargo();
    bench
        .args(["run", "--quiet", "--release", "-p", "loxi-bench", "--"])
        .args(args)
        .env(
            "LOXI_BENCH_COMMAND",
            format!("cargo xtask bench {}", args.join(" ")).trim_end(),
        );
    run(bench, "loxi-bench")
}

/// `manifests`: writes `deploy/` as rendered from the chart, and removes `.yaml` files the
/// chart no longer renders.
fn manifests() -> Result<()> {
    let helm = testenv::tools::helm()?;
    let deploy = workspace_root().join("deploy");
    let rendered = testenv::chart::plain_manifests(&helm)?;
    for existing in testenv::chart::yaml_files_in(&deploy)? {
        if !rendered.iter().any(|(path, _)| *path == existing) {
            eprintln!("xtask: removing deploy/{}", existing.display());
            std::fs::remove_file(deploy.join(&existing))?;
        }
    }
    for (path, text) in rendered {
        let target = deploy.join(&path);
        if std::fs::read_to_string(&target).ok().as_deref() != Some(text.as_str()) {
            eprintln!("xtask: writing deploy/{}", path.display());
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&target, text)?;
        }
    }
    Ok(())
}

fn test() -> Result<()> {
    // The Go builds of the control plane, helm and promtool (minutes when cold, cached by
    // version) run one after the other while cargo compiles.
    eprintln!(
        "xtask: building the Kubernetes control plane, helm and promtool, fetching the Gateway API CRDs, in the background if missing"
    );
    let mut control_plane = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; K8S_VERSION={} bash scripts/control-plane.sh >/dev/null; bash scripts/go-tool.sh helm >/dev/null; bash scripts/go-tool.sh promtool >/dev/null; bash scripts/go-tool.sh actionlint >/dev/null; bash scripts/gateway-api-crds.sh >/dev/null",
            testenv::K8S_VERSION
        ))
        .current_dir(workspace_root())
        .spawn()
        .context("starting scripts/control-plane.sh and scripts/go-tool.sh")?;
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run(fmt, "cargo fmt --check")?;
    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy, "cargo clippy -D warnings")?;
    deny()?;
    let mut build = cargo();
    build.args(["test", "--workspace", "--no-run"]);
    run(build, "cargo test --no-run")?;
    let status = control_plane.wait()?;
    if !status.success() {
        bail!(
            "building the Go tools failed ({status}): scripts/control-plane.sh, scripts/go-tool.sh (helm, promtool, actionlint) or scripts/gateway-api-crds.sh, see their output above"
        );
    }
    let mut tests = cargo();
    tests.args(["test", "--workspace"]);
    run(tests, "cargo test --workspace")
}

/// The cargo-deny the dependency check runs: pinned, so that a new release cannot change the
/// verdict (or the config format) under us.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// The cache root shared with scripts/control-plane.sh.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOXI_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("loxi-ccm")
}

/// `cargo deny check licenses bans sources` (deny.toml). cargo-deny is installed once per
/// version under the cache (`cargo install --locked`, needs crates.io that one time);
/// `cargo fetch` fills the registry cache with every platform's crates (crates.io the first
/// time, nothing after), then the check itself runs offline. Advisories are left out: they need the RustSec database.
fn deny() -> Result<()> {
    let root = cache_root().join(format!("cargo-deny-{CARGO_DENY_VERSION}"));
    let bin = root.join("bin").join("cargo-deny");
    if !bin.exists() {
        let mut install = cargo();
        install
            .args(["install", "--locked", "cargo-deny", "--version"])
            .arg(CARGO_DENY_VERSION)
            .arg("--root")
            .arg(&root)
            // Its own target directory: the workspace's build cache stays untouched.
            .env("CARGO_TARGET_DIR", root.join("build"));
        run(
            install,
            &format!(
                "installing cargo-deny {CARGO_DENY_VERSION} into {}",
                root.display()
            ),
        )?;
        let _ = std::fs::remove_dir_all(root.join("build"));
    }
    // cargo-deny reads `cargo metadata` for every platform, so the crates of other platforms
    // (windows-sys, ...) that a Linux build never downloads must be in the registry cache first.
    let mut fetch = cargo();
    fetch.args(["fetch", "--locked"]);
    run(
        fetch,
        "cargo fetch --locked (every platform's crates, for cargo-deny)",
    )?;
    let mut check = Command::new(&bin);
    check.current_dir(workspace_root()).args([
        "deny",
        "--offline",
        "check",
        "--hide-inclusion-graph",
        "licenses",
        "bans",
        "sources",
    ]);
    run(check, "cargo deny check licenses bans sources")
}

/// A child process killed when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    testenv::free_port()
}

fn demo(exit_after: bool) -> Result<()> {
    run(
        control_plane_script(),
        "building the Kubernetes control plane (cached)",
    )?;
    let mut build = cargo();
    build.args(["build", "--quiet", "-p", "loxi-ccm", "-p", "loxilb-sim"]);
    run(build, "cargo build -p loxi-ccm -p loxilb-sim")?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(demo_async(exit_after))
}

async fn demo_async(exit_after: bool) -> Result<()> {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    let bin = target.join("debug");

    eprintln!("xtask: starting etcd + kube-apiserver (RBAC on)");
    let cp = testenv::ControlPlane::start().await?;
    let kubeconfig = cp.kubeconfig_path();
    let client = cp.admin_client().await?;

    let sim_port = free_port()?;
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    eprintln!("xtask: starting the loxilb simulator on {sim_url}");
    let _sim = Guard(
        Command::new(bin.join("loxilb-sim"))
            .args(["--listen", &format!("127.0.0.1:{sim_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting loxilb-sim")?,
    );

    let kubectl_bin = cp.k8s_bin_dir().join("kubectl");
    let crd = workspace_root().join("deploy/05-crd-addressclaims.yaml");
    let pools_crd = workspace_root().join("deploy/06-crd-addresspools.yaml");
    eprintln!(
        "xtask: kubectl apply -f deploy/05-crd-addressclaims.yaml -f deploy/06-crd-addresspools.yaml"
    );
    for args in [
        vec![
            "apply",
            "-f",
            crd.to_str().unwrap_or_default(),
            "-f",
            pools_crd.to_str().unwrap_or_default(),
        ],
        vec![
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/addressclaims.ipam.loxilb.io",
            "crd/addresspools.ipam.loxilb.io",
        ],
    ] {
        let out = Command::new(&kubectl_bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&args)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    let admin_port = free_port()?;
    let log_path = cp.dir().join("loxi-ccm.log");
    eprintln!("xtask: starting loxi-ccm (log: {})", log_path.display());
    let _ccm = Guard(
        Command::new(bin.join("loxi-ccm"))
            .args([
                "run",
                "--kubeconfig",
                kubeconfig.to_str().unwrap_or_default(),
                "--loxilb-url",
                &sim_url,
                "--external-cidr",
                "192.168.100.0/24",
                "--admin-addr",
                &format!("127.0.0.1:{admin_port}"),
            ])
            .stdout(std::fs::File::create(&log_path)?)
            .stderr(std::fs::File::create(cp.dir().join("loxi-ccm.err.log"))?)
            .spawn()
            .context("starting loxi-ccm")?,
    );

    let nodes: Api<Node> = Api::all(client.clone());
    for (i, ip) in ["10.0.0.11", "10.0.0.12", "10.0.0.13"].iter().enumerate() {
        let name = format!("worker-{}", i + 1);
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}}))?,
            )
            .await?;
        nodes
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "addresses": [{"type": "InternalIP", "address": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}]
                }})),
            )
            .await?;
    }
    let manifest = cp.dir().join("demo-service.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1
kind: Service
metadata:
  name: demo
  namespace: default
spec:
  type: LoadBalancer
  loadBalancerClass: loxilb.io/loxilb
  selector:
    app: demo
  ports:
  - name: http
    port: 80
    protocol: TCP
  - name: dns
    port: 53
    protocol: UDP
",
    )?;
    let kubectl = |args: &[&str]| -> Result<String> {
        let out = Command::new(cp.k8s_bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    };
    println!("$ kubectl apply -f demo-service.yaml");
    print!(
        "{}",
        kubectl(&["apply", "-f", manifest.to_str().unwrap_or_default()])?
    );

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    let sim = loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&sim_url))?;
    loop {
        let svc = services.get("demo").await?;
        let has_ip = svc
            .status
            .and_then(|s| s.load_balancer)
            .and_then(|l| l.ingress)
            .is_some_and(|i| !i.is_empty());
        let rules = sim.list_rules().await.map(|r| r.len()).unwrap_or(0);
        if has_ip && rules == 2 {
            break;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!("the Service did not get its address and rules in 60 s; loxi-ccm log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("\n$ kubectl get nodes -o wide");
    print!("{}", kubectl(&["get", "nodes", "-o", "wide"])?);
    println!("\n$ kubectl get service demo");
    print!("{}", kubectl(&["get", "service", "demo"])?);
    println!("\n$ kubectl get events --field-selector involvedObject.name=demo");
    print!(
        "{}",
        kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=demo"
        ])?
    );
    println!("\nloxilb rules (GET {sim_url}/netlox/v1/config/loadbalancer/all):");
    println!(
        "{:<18} {:<6} {:<6} {:<10} {:<50} NAME",
        "EXTERNAL-IP", "PORT", "PROTO", "MODE", "ENDPOINTS"
    );
    let mut rules = sim.list_rules().await?;
    rules.sort_by_key(|r| r.service_arguments.port);
    for r in rules {
        let sa = &r.service_arguments;
        let eps: Vec<String> = r
            .endpoints
            .iter()
            .map(|e| format!("{}:{}", e.endpoint_ip, e.target_port))
            .collect();
        println!(
            "{:<18} {:<6} {:<6} {:<10} {:<50} {}",
            sa.external_ip,
            sa.port,
            sa.protocol,
            sa.mode,
            eps.join(","),
            sa.name
        );
    }
    if exit_after {
        println!("\ndemo done (--exit): stopping everything");
        return Ok(());
    }
    println!(
        "\nRunning. Try: kubectl --kubeconfig {} get svc -w   |  metrics: http://127.0.0.1:{admin_port}/metrics\nCtrl-C to stop.",
        kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    Ok(())
}
