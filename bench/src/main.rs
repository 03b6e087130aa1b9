//! `loxi-bench` (`cargo xtask bench [--quick]`): measures the release `loxi-ccm` binary,
//! run as its own process, against a real etcd + kube-apiserver (testenv) and the loxilb
//! simulator (in this process), and compares it with a minimal in-process baseline doing only
//! the unavoidable work. Writes `target/bench/results.json` and, for full runs, the results
//! section of `docs/BENCHMARKS.md`.
//!
//! These are measurements, not tests: nothing here fails on a slow number.

mod baseline;
mod ccm;
mod cluster;
mod fleet;
mod profile;
mod report;
mod scale;
mod stats;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};
use serde_json::{Value, json};

use crate::ccm::{Ccm, CcmSpec};
use crate::cluster::{BenchNode, Sim};
use crate::stats::{Usage, secs};

/// Benchmark of loxi-ccm against a real API server and the loxilb simulator.
#[derive(Debug, Clone, Parser)]
#[command(name = "loxi-bench")]
pub struct Args {
    /// Small run for development: N=50, 20 flips, bulk 500/50, no docs update.
    #[arg(long)]
    quick: bool,
    /// Service counts to run (comma separated). Default 250,500,1000 (quick: 50).
    #[arg(long, value_delimiter = ',')]
    n: Vec<usize>,
    /// TCP ports per Service (one rule each).
    #[arg(long, default_value_t = 2)]
    ports: usize,
    /// Ready Nodes with an InternalIP. Default 50 (--profile: 3, so that every rule forwards
    /// to every Node).
    #[arg(long)]
    nodes: Option<usize>,
    /// Node readiness flips in the endpoint-churn scenario. Default 100 (quick: 20).
    #[arg(long)]
    flips: Option<usize>,
    /// Creation rate of the steady scenario, Services per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Create/delete requests in flight in the burst and teardown scenarios.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Services worked on at once by the baseline (loxi-ccm's default --concurrency).
    #[arg(long, default_value_t = 16)]
    baseline_concurrency: usize,
    /// Services in the cluster for the memory scenario. Default 10000 (quick: 500).
    #[arg(long)]
    bulk_total: Option<usize>,
    /// Of which LoadBalancer Services of our class. Default 1000 (quick: 50).
    #[arg(long)]
    bulk_ours: Option<usize>,
    #[arg(long)]
    skip_bulk: bool,
    #[arg(long)]
    skip_baseline: bool,
    /// Poll interval when waiting for the simulator's rules to reflect a Node flip, ms.
    #[arg(long, default_value_t = 20)]
    churn_poll_ms: u64,
    /// Upper bound for any single wait, seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// The loxi-ccm binary. Default: `loxi-ccm` next to this binary (target/release).
    #[arg(long)]
    ccm_bin: Option<PathBuf>,
    /// Extra flag for `loxi-ccm run` (repeatable), e.g. --ccm-arg=--concurrency=32.
    #[arg(long = "ccm-arg", allow_hyphen_values = true)]
    ccm_args: Vec<String>,
    /// Extra environment variable for loxi-ccm, KEY=VALUE (repeatable), e.g.
    /// --ccm-env MALLOC_ARENA_MAX=2.
    #[arg(long = "ccm-env", value_parser = parse_env)]
    ccm_env: Vec<(String, String)>,
    /// JSON results file. Default target/bench/results.json (quick: results-quick.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Markdown file whose generated section is rewritten. Default docs/BENCHMARKS.md for
    /// full runs; quick runs write none unless given.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Do not write any markdown.
    #[arg(long)]
    no_markdown: bool,
    /// Print a timeline (IPs seen, rules, controller reconciles) every 250 ms during bursts.
    #[arg(long)]
    trace: bool,
    /// Run nothing: re-render the markdown (and targets) from this results file.
    #[arg(long)]
    render_only: Option<PathBuf>,
    /// Run only the fleet scenario (docs/BENCHMARKS.md, "Fleet"): groups of loxilbs, Services
    /// placed by capacity, one loxilb restarted. Writes target/bench/results-fleet.json and
    /// the fleet section of docs/BENCHMARKS.md.
    #[arg(long)]
    fleet: bool,
    /// Fleet: LoadBalancer Services created (none names a group: all placed by capacity).
    #[arg(long, default_value_t = 5000)]
    fleet_services: usize,
    /// Fleet: groups of loxilbs (`--loxilb-url=g0=<url>` ... `g<K-1>`).
    #[arg(long, default_value_t = 5)]
    fleet_groups: usize,
    /// Fleet: simulated loxilbs per group.
    #[arg(long, default_value_t = 2)]
    fleet_loxilbs_per_group: usize,
    /// Fleet: rule table of each simulated loxilb (loxilb's is 2048; loxi-ccm keeps its
    /// default --loxilb-max-rules unless given with --ccm-arg).
    #[arg(long, default_value_t = 2048)]
    fleet_max_rules: usize,
    /// Run only the slow-loxilb scenario set (docs/BENCHMARKS.md, "On a slow loxilb") on a
    /// simulator with this cost profile: `instant` or `loxilb-0.9.8`. Writes
    /// target/bench/results-profile.json and that section of docs/BENCHMARKS.md. Default N:
    /// 100,250.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(loxilb_sim::Profile::NAMES))]
    profile: Option<String>,
    /// The profile's datapath tick, ms (1000 on loxilb 0.9.8; shorter runs the same shape
    /// faster).
    #[arg(long, default_value_t = 1000)]
    profile_tick_ms: u64,
}

impl Args {
    /// `--nodes`, or its default: 3 for `--profile`, else 50.
    fn nodes(&self) -> usize {
        self.nodes
            .unwrap_or(if self.profile.is_some() { 3 } else { 50 })
    }
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ lives in the workspace")
        .to_path_buf()
}

struct Env {
    args: Args,
    client: kube::Client,
    sim: Sim,
    nodes: Vec<BenchNode>,
    spec: CcmSpec,
    server_pids: Vec<u32>,
    timeout: Duration,
}

impl Env {
    /// CPU seconds of kube-apiserver + etcd so far.
    fn server_cpu(&self) -> f64 {
        self.server_pids
            .iter()
            .filter_map(|p| stats::usage(*p).ok())
            .map(|u| u.cpu_s)
            .sum()
    }

    fn services(&self, ns: &str) -> Api<Service> {
        Api::namespaced(self.client.clone(), ns)
    }
}

fn progress(msg: &str) {
    eprintln!("loxi-bench: {msg}");
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim_end().to_string())
        .unwrap_or_default()
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    json!({
        "nproc": command_output("nproc", &[]),
        "cpu_model": cpu,
        "free_h": command_output("free", &["-h"]),
        "kernel": command_output("uname", &["-sr"]),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.n.is_empty() {
        args.n = if args.profile.is_some() {
            vec![100, 250]
        } else if args.quick {
            vec![50]
        } else {
            vec![250, 500, 1000]
        };
    }
    let flips = args.flips.unwrap_or(if args.quick { 20 } else { 100 });
    let bulk_total = args
        .bulk_total
        .unwrap_or(if args.quick { 500 } else { 10_000 });
    let bulk_ours = args
        .bulk_ours
        .unwrap_or(if args.quick { 50 } else { 1000 })
        .min(bulk_total);
    loxilb_client::install_crypto_provider();
    let root = workspace_root();
    if let Some(path) = &args.render_only {
        let mut results: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        if !results["fleet"].is_null() {
            let md = args
                .markdown
                .clone()
                .unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
            fleet::write_markdown(&md, &results)?;
            println!("{}", fleet::summary_text(&results));
            return Ok(());
        }
        if results["config"]["profile"].is_string() {
            results["targets"] = profile::targets(&results);
            std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
            let md = args
                .markdown
                .clone()
                .unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
            profile::write_markdown(&md, &results)?;
            println!("{}", profile::summary_text(&results));
            return Ok(());
        }
        results["targets"] = report::targets(&results);
        std::fs::write(path, serde_json::to_string_pretty(&results)?)?;
        let md = args
            .markdown
            .clone()
            .unwrap_or_else(|| root.join("docs/BENCHMARKS.md"));
        report::write_markdown(&md, &results)?;
        println!("{}", report::summary_text(&results));
        return Ok(());
    }
    let bench_dir = root.join("target/bench");
    let log_dir = bench_dir.join("logs");
    std::fs::create_dir_all(&log_dir)?;
    let out_path = args.out.clone().unwrap_or_else(|| {
        bench_dir.join(if args.quick {
            "results-quick.json"
        } else {
            "results.json"
        })
    });
    let md_path = if args.no_markdown {
        None
    } else {
        args.markdown
            .clone()
            .or_else(|| (!args.quick).then(|| root.join("docs/BENCHMARKS.md")))
    };
    let ccm_bin = match &args.ccm_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary directory")?
            .join("loxi-ccm"),
    };
    if !ccm_bin.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p loxi-ccm` (cargo xtask bench does)",
            ccm_bin.display()
        );
    }
    let command = std::env::var("LOXI_BENCH_COMMAND").unwrap_or_else(|_| {
        std::env::args()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    });

    if args.fleet {
        return fleet::main(&args, &root, &ccm_bin, command).await;
    }
    if let Some(name) = &args.profile {
        let tick = Duration::from_millis(args.profile_tick_ms);
        let Some(p) = loxilb_sim::Profile::named(name, tick) else {
            bail!(
                "--profile {name} with --profile-tick-ms {}",
                args.profile_tick_ms
            );
        };
        return profile::main(&args, &root, &ccm_bin, command, p).await;
    }

    let load_before = loadavg();
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"]);
    progress(&format!(
        "N={:?}, {} ports, {} nodes, {flips} flips, steady {}/s, load {load_before}",
        args.n,
        args.ports,
        args.nodes(),
        args.rate
    ));
    let run_started = Instant::now();

    let Cluster {
        cp,
        client,
        server_pids,
        nodes,
    } = start_cluster(&args, &root, &[]).await?;
    let max_n = args.n.iter().copied().max().unwrap_or(0).max(bulk_ours);
    let sim = Simulator::start(
        "127.0.0.1:0".parse::<SocketAddr>()?,
        SimConfig {
            max_rules: (max_n * args.ports + 64).max(2048),
            ..SimConfig::default()
        },
    )
    .await?;
    let sim = Sim::new(sim)?;
    let lease_ns = "loxi-bench";
    cluster::ensure_namespace(&client, lease_ns).await?;
    let spec = CcmSpec {
        bin: ccm_bin.clone(),
        kubeconfig: cp.kubeconfig_path(),
        loxilb_urls: vec![sim.sim.url()],
        external_cidr: "10.200.0.0/16".into(),
        lease_namespace: lease_ns.into(),
        log_dir: log_dir.clone(),
        extra: args.ccm_args.clone(),
        env: args.ccm_env.clone(),
    };
    let env = Env {
        timeout: Duration::from_secs(args.timeout),
        args: args.clone(),
        client,
        sim,
        nodes,
        spec,
        server_pids,
    };

    let mut results = json!({
        "date": date,
        "command": command,
        "machine": machine(),
        "source": source(&root, &ccm_bin),
        "load_before": load_before,
        "config": {
            "n": args.n,
            "ports": args.ports,
            "nodes": args.nodes(),
            "flips": flips,
            "steady_rate_per_s": args.rate,
            "create_concurrency": args.create_concurrency,
            "baseline_concurrency": args.baseline_concurrency,
            "ccm_bin": ccm_bin.display().to_string(),
            "ccm_extra_args": args.ccm_args,
            "ccm_env": args.ccm_env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "k8s_version": testenv::K8S_VERSION,
            "quick": args.quick,
        },
        "runs": [],
    });
    let write = |results: &Value| -> Result<()> {
        std::fs::write(&out_path, serde_json::to_string_pretty(results)?)?;
        Ok(())
    };

    let mut failure = None;
    for &n in &args.n {
        progress(&format!("=== N = {n}"));
        let mut run = json!({"n": n});
        let result = scale::run_n(&env, n, flips, &mut run).await;
        if let Err(e) = &result {
            run["error"] = json!(format!("{e:#}"));
        }
        if let Some(runs) = results["runs"].as_array_mut() {
            runs.push(run);
        }
        write(&results)?;
        if let Err(e) = result {
            failure = Some(e);
            break;
        }
    }
    if failure.is_none() && !args.skip_bulk {
        progress(&format!(
            "=== memory: {bulk_total} Services, {bulk_ours} of them ours"
        ));
        let mut bulk = json!({"total": bulk_total, "ours": bulk_ours});
        if let Err(e) = scale::run_bulk(&env, bulk_total, bulk_ours, &mut bulk).await {
            bulk["error"] = json!(format!("{e:#}"));
            failure = Some(e);
        }
        results["bulk"] = bulk;
    }
    results["load_after"] = json!(loadavg());
    results["wall_s"] = json!(secs(run_started.elapsed()));
    results["targets"] = report::targets(&results);
    write(&results)?;
    progress(&format!("results: {}", out_path.display()));
    if let Some(md) = &md_path {
        report::write_markdown(md, &results)?;
        progress(&format!("markdown: {}", md.display()));
    }
    println!("{}", report::summary_text(&results));
    cp.stop();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The commit measured, uncommitted changes, and when the controller binary was built.
fn source(root: &Path, ccm_bin: &Path) -> Value {
    let root = root.display().to_string();
    json!({
        "commit": command_output("git", &["-C", &root, "rev-parse", "--short", "HEAD"]),
        "uncommitted": command_output("git", &["-C", &root, "diff", "--shortstat", "HEAD"]),
        "ccm_bin_modified": std::fs::metadata(ccm_bin).and_then(|m| m.modified()).ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs()),
    })
}

/// The API server, etcd and the Nodes every scenario shares.
struct Cluster {
    cp: testenv::ControlPlane,
    client: kube::Client,
    /// kube-apiserver and etcd, for their CPU time.
    server_pids: Vec<u32>,
    nodes: Vec<BenchNode>,
}

async fn start_cluster(args: &Args, root: &Path, api_args: &[&str]) -> Result<Cluster> {
    progress("starting etcd + kube-apiserver");
    let cp = testenv::ControlPlane::start_with_api_args(api_args).await?;
    let client = cp.admin_client().await?;
    let server_pids: Vec<u32> = ["kube-apiserver", "etcd"]
        .iter()
        .flat_map(|name| stats::find_pids(name, cp.dir()))
        .collect();
    install_crds(&cp, root)?;
    warm_up_claims(&client).await?;
    progress(&format!("creating {} nodes", args.nodes()));
    let nodes = cluster::create_nodes(&client, args.nodes()).await?;
    Ok(Cluster {
        cp,
        client,
        server_pids,
        nodes,
    })
}

/// Applies every CRD manifest in deploy/ (`*crd*.yaml`) that the controller may need.
/// Writes (and deletes) one `AddressClaim` before anything is measured. The first writes of
/// a CRD's objects after the CRD was installed take the API server ~2 s here (its serving
/// path for the new type is built on first use): a cluster that has had the CRD for more
/// than a moment does not pay that, and the baseline, which runs after loxi-ccm, never did.
/// Without this warm-up, loxi-ccm's N = 250 burst paid it (latency p50 ~2.2 s).
async fn warm_up_claims(client: &kube::Client) -> Result<()> {
    use kube::api::{ApiResource, DeleteParams, DynamicObject, PostParams};
    use kube::core::GroupVersionKind;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("ipam.loxilb.io", "v1alpha1", "AddressClaim"),
        "addressclaims",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let ip = "192.0.2.254";
    let claim = DynamicObject::new(ip, &resource).data(json!({
        "spec": {
            "address": ip,
            "pool": "warm-up",
            "service": {"namespace": "default", "name": "warm-up", "uid": ""},
        }
    }));
    let t0 = Instant::now();
    api.create(&PostParams::default(), &claim)
        .await
        .context("warm-up AddressClaim")?;
    progress(&format!(
        "first AddressClaim write took {:.2} s (warm-up, not measured)",
        t0.elapsed().as_secs_f64()
    ));
    api.delete(ip, &DeleteParams::default()).await?;
    Ok(())
}

fn install_crds(cp: &testenv::ControlPlane, root: &Path) -> Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("deploy"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.contains("crd") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Ok(());
    }
    let kubectl = cp.k8s_bin_dir().join("kubectl");
    let mut steps: Vec<Vec<String>> = files
        .iter()
        .map(|f| vec!["apply".into(), "-f".into(), f.display().to_string()])
        .collect();
    steps.push(
        [
            "wait",
            "--for=condition=established",
            "--all",
            "crd",
            "--timeout=60s",
        ]
        .map(String::from)
        .to_vec(),
    );
    for step in steps {
        progress(&format!("kubectl {}", step.join(" ")));
        let out = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(&step)
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                step.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    Ok(())
}

/// Waits until `/readyz` says ready, leading and not degraded.
async fn wait_ready(ccm: &mut Ccm, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        if ccm.fully_ready().await? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("loxi-ccm not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({"peak_rss_mib": u.peak_rss_mib(), "rss_mib": stats::round(kib_to_mib(u.rss_kib)), "cpu_s": u.cpu_s})
}

fn kib_to_mib(k: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = k as f64 / 1024.0;
    v
}

/// `a / b` rounded to 0.1 (writes per Service, per flip).
fn per(a: usize, b: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = a as f64 / b.max(1) as f64;
    stats::round(v)
}

fn summary_json(s: &stats::Summary) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}
