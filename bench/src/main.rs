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
mod report;
mod stats;

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};
use serde_json::{Value, json};

use crate::baseline::Baseline;
use crate::ccm::{Ccm, CcmSpec};
use crate::cluster::{BenchNode, Sim, Tracker};
use crate::stats::{Usage, secs, summarize};

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
    /// Ready Nodes with an InternalIP.
    #[arg(long, default_value_t = 50)]
    nodes: usize,
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
        args.n = if args.quick {
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

    let load_before = loadavg();
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"]);
    progress(&format!(
        "N={:?}, {} ports, {} nodes, {flips} flips, steady {}/s, load {load_before}",
        args.n, args.ports, args.nodes, args.rate
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
            "nodes": args.nodes,
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
        let result = run_n(&env, n, flips, &mut run).await;
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
        if let Err(e) = run_bulk(&env, bulk_total, bulk_ours, &mut bulk).await {
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
    progress(&format!("creating {} nodes", args.nodes));
    let nodes = cluster::create_nodes(&client, args.nodes).await?;
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

/// Waits until no Service of the tracker's namespace changed for `quiet`; returns how long
/// after the call the last change came.
async fn settle(tracker: &Tracker, quiet: Duration, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let last = tracker.last_change().filter(|t| *t > started);
        let since = last.map_or(started.elapsed(), |t| t.elapsed());
        if since >= quiet {
            return Ok(last.map_or(Duration::ZERO, |t| t - started));
        }
        if started.elapsed() > timeout {
            bail!("Services still changing after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// Polls the tracker and the simulator together until every Service shows an IP and the
/// simulator holds `rules` rules; returns (all IPs seen, both true), measured from `t0`.
async fn wait_converged(
    env: &Env,
    tracker: &Tracker,
    n: usize,
    rules: usize,
    t0: Instant,
) -> Result<(Duration, Duration)> {
    let mut ips_at = None;
    let mut rules_at = None;
    loop {
        if ips_at.is_none() && tracker.with_ip() >= n {
            ips_at = Some(t0.elapsed());
        }
        if rules_at.is_none() && env.sim.rule_count().await? == rules {
            rules_at = Some(t0.elapsed());
        }
        if let (Some(i), Some(r)) = (ips_at, rules_at) {
            return Ok((i, i.max(r)));
        }
        if t0.elapsed() > env.timeout {
            bail!(
                "not converged after {:?}: {} of {n} Services have an IP, {} of {rules} rules",
                env.timeout,
                tracker.with_ip(),
                env.sim.rule_count().await?
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Deletes the Services and waits until the simulator holds no rule and every object is
/// gone; returns (rules gone, objects gone), measured from the first delete.
async fn teardown(
    env: &Env,
    api: &Api<Service>,
    names: &[String],
    tracker: &Tracker,
) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    cluster::delete_all(api, names, env.args.create_concurrency).await?;
    let mut rules_at = None;
    let mut gone_at = None;
    let mut listed_at = Instant::now();
    loop {
        if rules_at.is_none() && env.sim.rule_count().await? == 0 {
            rules_at = Some(t0.elapsed());
        }
        if gone_at.is_none() && tracker.deleted() >= names.len() {
            gone_at = Some(t0.elapsed());
        }
        // Once a second after the rules are gone, ask the API server too: a watch that
        // stalls without an error (seen once: no Delete event at all) must not hang the run.
        if gone_at.is_none() && rules_at.is_some() && listed_at.elapsed() > Duration::from_secs(1) {
            listed_at = Instant::now();
            let left = api
                .list_metadata(&kube::api::ListParams::default().limit(1))
                .await?;
            if left.items.is_empty() {
                eprintln!(
                    "loxi-bench: teardown: the Service watch saw {} of {} deletions; objects gone by a list (1 s resolution)",
                    tracker.deleted(),
                    names.len()
                );
                gone_at = Some(t0.elapsed());
            }
        }
        if let (Some(r), Some(g)) = (rules_at, gone_at) {
            return Ok((r, g));
        }
        if t0.elapsed() > env.timeout {
            bail!(
                "teardown not done after {:?}: {} rules left, {} of {} objects gone",
                env.timeout,
                env.sim.rule_count().await?,
                tracker.deleted(),
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Wipes the simulator and waits until it holds `rules` rules again; returns (first rule
/// back, all back).
/// When the replay after a wipe at `t0` made progress.
struct Replay {
    /// The simulator's first API call after the wipe (its counter restarts at 0): the
    /// controller's probe that notices the restart; the baseline's first POST.
    noticed: Duration,
    first_rule: Duration,
    all: Duration,
}

async fn wait_replay(env: &Env, rules: usize, t0: Instant) -> Result<Replay> {
    let mut noticed = None;
    let mut first = None;
    loop {
        if noticed.is_none() && env.sim.sim.request_count() > 0 {
            noticed = Some(t0.elapsed());
        }
        let c = env.sim.rule_count().await?;
        if c > 0 && first.is_none() {
            first = Some(t0.elapsed());
        }
        if c >= rules {
            let all = t0.elapsed();
            let first_rule = first.unwrap_or(all);
            return Ok(Replay {
                noticed: noticed.unwrap_or(first_rule).min(first_rule),
                first_rule,
                all,
            });
        }
        if t0.elapsed() > env.timeout {
            bail!("only {c} of {rules} rules back after {:?}", env.timeout);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
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

async fn run_n(env: &Env, n: usize, flips: usize, run: &mut Value) -> Result<()> {
    let args = &env.args;
    let total_rules = n * args.ports;
    let client = &env.client;

    // Controller start-up.
    let mut ccm = Ccm::spawn(&env.spec, &format!("n{n}-first"))?;
    let ready = wait_ready(&mut ccm, env.timeout).await?;
    run["startup_ready_s"] = json!(secs(ready));

    // 1. Burst.
    let ns = format!("burst-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    let tracker = Tracker::start(client, &ns).await?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    progress(&format!("burst: creating {n} Services"));
    let t0 = Instant::now();
    let trace = args.trace.then(|| {
        let (tracker, sim, admin) = (tracker.clone(), env.sim.clone(), ccm.admin.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let text = match http.get(format!("http://{admin}/metrics")).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                let r = |res: &str| {
                    ccm::metric_sum(&text, "loxi_ccm_reconciles_total", &[("result", res)])
                };
                eprintln!(
                    "trace {:>6.2}s  ips {:>5}  rules {:>5}  reconciles ok {:>6} err {:>4}",
                    t0.elapsed().as_secs_f64(),
                    tracker.with_ip(),
                    sim.rule_count().await.unwrap_or(0),
                    r("success"),
                    r("error")
                );
            }
        })
    });
    let created =
        cluster::create_burst(&api, objects, args.create_concurrency, Some(&tracker)).await?;
    let (ips, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    if let Some(t) = trace {
        t.abort();
    }
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());
    let before = cluster::snapshot(&api).await?;
    let distinct: HashSet<&String> = before.values().filter_map(|s| s.ip.as_ref()).collect();
    let u = ccm.usage()?;
    run["burst"] = json!({
        "create_s": secs(created),
        "all_ips_s": secs(ips),
        "converged_s": secs(converged),
        "latency": summary_json(&lat),
        "distinct_ips": distinct.len(),
        "service_writes_per_service": per(writes, n),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "burst: converged in {:.2} s (create {:.2} s), latency p50 {} ms p99 {} ms",
        converged.as_secs_f64(),
        created.as_secs_f64(),
        lat.p50_ms,
        lat.p99_ms
    ));

    // What one full listing of loxilb costs (the controller lists to compare counts).
    let list_t = Instant::now();
    let listing = env.sim.listing_bytes().await?;
    run["burst"]["loxilb_listing_bytes"] = json!(listing);
    run["burst"]["loxilb_listing_ms"] =
        json!(stats::round(list_t.elapsed().as_secs_f64() * 1000.0));

    // 4. loxilb restart: wipe and wait for the replay.
    let cpu0 = ccm.usage()?.cpu_s;
    let t0 = Instant::now();
    env.sim.sim.restart();
    let replay = wait_replay(env, total_rules, t0).await?;
    let (first, all) = (replay.first_rule, replay.all);
    let u = ccm.usage()?;
    run["replay"] = json!({
        "rules": total_rules,
        "total_s": secs(all),
        "noticed_s": secs(replay.noticed),
        "after_noticed_s": secs(all - replay.noticed),
        "first_rule_s": secs(first),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "requests": env.sim.sim.request_count(),
    });
    progress(&format!(
        "replay: {total_rules} rules back in {:.2} s (noticed after {:.2} s, first rule after {:.2} s)",
        all.as_secs_f64(),
        replay.noticed.as_secs_f64(),
        first.as_secs_f64()
    ));

    // 3. Endpoint churn.
    let snapshot_rules = env.sim.sim.rules().len();
    // What one poll costs the simulator (its lock is held that long).
    let query_t = Instant::now();
    let _ = env.sim.rules_with_endpoint(&env.nodes[0].ip.to_string());
    let query_ms = query_t.elapsed().as_secs_f64() * 1000.0;
    let base: HashMap<String, usize> = env
        .nodes
        .iter()
        .map(|node| {
            let ip = node.ip.to_string();
            let c = env.sim.rules_with_endpoint(&ip);
            (ip, c)
        })
        .collect();
    let candidates: Vec<&BenchNode> = env
        .nodes
        .iter()
        .filter(|node| base.get(&node.ip.to_string()).copied().unwrap_or(0) > 0)
        .collect();
    let mut all_samples = Vec::new();
    let mut first_samples = Vec::new();
    let mut rules_changed = Vec::new();
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    let churn_started = Instant::now();
    let writes0 = tracker.changes();
    if candidates.is_empty() {
        bail!("no node is an endpoint of any rule");
    }
    progress(&format!("churn: {flips} node readiness flips"));
    for i in 0..flips {
        let node = candidates[(i / 2) % candidates.len()];
        let ready = i % 2 == 1;
        let ip = node.ip.to_string();
        let target = if ready { base[&ip] } else { 0 };
        let before_count = env.sim.rules_with_endpoint(&ip);
        let t0 = Instant::now();
        cluster::set_node_ready(client, &node.name, ready).await?;
        let mut first = None;
        loop {
            let c = env.sim.rules_with_endpoint(&ip);
            if first.is_none() && c != before_count {
                first = Some(t0.elapsed());
            }
            if c == target {
                break;
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!(
                    "flip {i} of {}: {c} rules forward to it, want {target}",
                    node.name
                );
            }
            tokio::time::sleep(Duration::from_millis(args.churn_poll_ms)).await;
        }
        let done = t0.elapsed();
        all_samples.push(done);
        first_samples.push(first.unwrap_or(done));
        rules_changed.push(before_count.abs_diff(target));
    }
    let u = ccm.usage()?;
    let churn = summarize(&all_samples);
    #[allow(clippy::cast_precision_loss)]
    let mean_changed =
        rules_changed.iter().sum::<usize>() as f64 / rules_changed.len().max(1) as f64;
    run["churn"] = json!({
        "flips": flips,
        "all_rules": summary_json(&churn),
        "first_rule": summary_json(&summarize(&first_samples)),
        "mean_rules_changed_per_flip": stats::round(mean_changed),
        "service_writes_per_flip": per(tracker.changes() - writes0, flips),
        "wall_s": secs(churn_started.elapsed()),
        "poll_ms": args.churn_poll_ms,
        "poll_query_ms": stats::round(query_ms),
        "rules_in_snapshot": snapshot_rules,
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "churn: p50 {} ms p99 {} ms max {} ms (~{mean_changed:.0} rules per flip)",
        churn.p50_ms, churn.p99_ms, churn.max_ms
    ));

    // 3b. Node deletions and re-creations: Nodes that were there when the controller
    // started (a deletion the Node watch once missed).
    let deletions = (flips / 5).max(2);
    progress(&format!(
        "churn: {deletions} node deletions and re-creations"
    ));
    let mut deleted_samples = Vec::new();
    let mut created_samples = Vec::new();
    for i in 0..deletions {
        let node = candidates[i % candidates.len()];
        let ip = node.ip.to_string();
        for (present, samples) in [(false, &mut deleted_samples), (true, &mut created_samples)] {
            let target = if present { base[&ip] } else { 0 };
            let t0 = Instant::now();
            if present {
                cluster::create_node(client, node).await?;
            } else {
                cluster::delete_node(client, &node.name).await?;
            }
            while env.sim.rules_with_endpoint(&ip) != target {
                if t0.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "node {} {}: rules never followed",
                        node.name,
                        if present { "re-created" } else { "deleted" }
                    );
                }
                tokio::time::sleep(Duration::from_millis(args.churn_poll_ms)).await;
            }
            samples.push(t0.elapsed());
        }
    }
    let node_deleted = summarize(&deleted_samples);
    run["churn"]["node_deletions"] = json!(deletions);
    run["churn"]["node_deleted"] = summary_json(&node_deleted);
    run["churn"]["node_created"] = summary_json(&summarize(&created_samples));
    progress(&format!(
        "churn: node deleted -> rules p50 {} ms p99 {} ms",
        node_deleted.p50_ms, node_deleted.p99_ms
    ));

    // Trailing writes of the churn (status updates after the rules) must not count as
    // restart rewrites: wait for quiet first.
    let quiet = settle(&tracker, Duration::from_secs(2), env.timeout).await?;
    run["churn"]["writes_settled_after_last_flip_s"] = json!(secs(quiet));

    // 5. Controller restart.
    let first_counters = ccm.counters().await?;
    let before = cluster::snapshot(&api).await?;
    let first_usage = ccm.usage()?;
    let requests0 = env.sim.sim.request_count();
    let writes0 = tracker.changes();
    let t0 = Instant::now();
    let shutdown = ccm.stop().await?;
    let mut ccm = Ccm::spawn(&env.spec, &format!("n{n}-second"))?;
    let ready = t0.elapsed() + wait_ready(&mut ccm, env.timeout).await?;
    // Steady: every Service reconciled once, every rule present, and then no Service write
    // for QUIET; the steady time is the later of the first two and the last write seen.
    const QUIET: Duration = Duration::from_secs(3);
    let reconciled_at;
    #[allow(clippy::cast_precision_loss)]
    let n_f = n as f64;
    loop {
        let reconciled = ccm
            .metric("loxi_ccm_reconciles_total", &[("result", "success")])
            .await?;
        if reconciled >= n_f && env.sim.rule_count().await? == total_rules {
            reconciled_at = Instant::now();
            break;
        }
        if t0.elapsed() > env.timeout {
            bail!("loxi-ccm not steady {:?} after its restart", env.timeout);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let steady = loop {
        let last = tracker
            .last_change()
            .filter(|t| *t > t0)
            .map_or(reconciled_at, |t| t.max(reconciled_at));
        if last.elapsed() >= QUIET {
            break last - t0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = cluster::snapshot(&api).await?;
    let address_changes = before
        .iter()
        .filter(|(name, s)| after.get(*name).map(|a| &a.ip) != Some(&s.ip))
        .count();
    let rewritten: Vec<&String> = before
        .iter()
        .filter(|(name, s)| {
            after.get(*name).map(|a| &a.resource_version) != Some(&s.resource_version)
        })
        .map(|(name, _)| name)
        .collect();
    // A few examples of what changed, from managedFields (manager, operation, time).
    let examples: Vec<Value> = rewritten
        .iter()
        .take(3)
        .map(|name| {
            json!({
                "service": name,
                "before": before[*name].managed,
                "after": after.get(*name).map(|a| a.managed.clone()),
                "conditions_before": before[*name].conditions,
                "conditions_after": after.get(*name).map(|a| a.conditions.clone()),
            })
        })
        .collect();
    let rewritten = rewritten.len();
    let writes = ccm
        .metric("loxi_ccm_loxilb_calls_total", &[("op", "apply")])
        .await?
        + ccm
            .metric("loxi_ccm_loxilb_calls_total", &[("op", "delete")])
            .await?;
    run["restart"] = json!({
        "shutdown_s": secs(shutdown),
        "ready_s": secs(ready),
        "steady_s": secs(steady),
        "address_changes": address_changes,
        "services_rewritten": rewritten,
        "loxilb_writes": writes,
        "loxilb_requests": env.sim.sim.request_count().saturating_sub(requests0),
        "service_writes": tracker.changes() - writes0,
        "rewritten_examples": examples,
    });
    progress(&format!(
        "restart: shutdown {:.2} s, ready {:.2} s, steady {:.2} s, {address_changes} address changes, {rewritten} Services rewritten",
        shutdown.as_secs_f64(),
        ready.as_secs_f64(),
        steady.as_secs_f64()
    ));

    // 6. Teardown.
    let cpu0 = ccm.usage()?.cpu_s;
    let srv0 = env.server_cpu();
    let (rules_gone, objects_gone) = teardown(env, &api, &names, &tracker).await?;
    let u = ccm.usage()?;
    run["teardown"] = json!({
        "rules_gone_s": secs(rules_gone),
        "objects_gone_s": secs(objects_gone),
        "total_s": secs(rules_gone.max(objects_gone)),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "server_cpu_s": stats::round(env.server_cpu() - srv0),
    });
    progress(&format!(
        "teardown: rules gone {:.2} s, objects gone {:.2} s",
        rules_gone.as_secs_f64(),
        objects_gone.as_secs_f64()
    ));
    drop(tracker);

    // 2. Steady rate.
    let ns = format!("steady-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    let tracker = Tracker::start(client, &ns).await?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("steady: {n} Services at {}/s", args.rate));
    let cpu0 = ccm.usage()?.cpu_s;
    let t0 = Instant::now();
    let created = cluster::create_at_rate(&api, objects, args.rate, &tracker).await?;
    let (_, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());
    let u = ccm.usage()?;
    let (r, o) = teardown(env, &api, &names, &tracker).await?;
    run["steady"] = json!({
        "rate_per_s": args.rate,
        "service_writes_per_service": per(writes, n),
        "create_s": secs(created),
        "converged_s": secs(converged),
        "latency": summary_json(&lat),
        "ccm_cpu_s": stats::round((u.cpu_s - cpu0) * 1000.0) / 1000.0,
        "teardown_s": secs(r.max(o)),
    });
    progress(&format!(
        "steady: latency p50 {} ms p99 {} ms max {} ms",
        lat.p50_ms, lat.p99_ms, lat.max_ms
    ));
    drop(tracker);

    // 7. Resources of both controller processes.
    let second_usage = ccm.usage()?;
    let second_counters = ccm.counters().await?;
    ccm.stop().await?;
    run["resources"] = json!({
        "first_process": usage_json(&first_usage),
        "second_process": usage_json(&second_usage),
        "peak_rss_mib": first_usage.peak_rss_mib().max(second_usage.peak_rss_mib()),
        "cpu_s": stats::round((first_usage.cpu_s + second_usage.cpu_s) * 1000.0) / 1000.0,
    });
    run["counters"] = json!({
        "first_process": first_counters,
        "second_process": second_counters,
    });

    // 8. Baseline.
    if !args.skip_baseline {
        run["baseline"] = run_baseline(env, n).await?;
        let ratio = |a: &Value, b: &Value| -> Value {
            match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) if b > 0.0 => json!((a / b * 100.0).round() / 100.0),
                _ => Value::Null,
            }
        };
        let ratios = json!({
            "burst": ratio(&run["burst"]["converged_s"], &run["baseline"]["burst_s"]),
            "replay": ratio(&run["replay"]["total_s"], &run["baseline"]["replay_s"]),
            "replay_after_noticed": ratio(&run["replay"]["after_noticed_s"], &run["baseline"]["replay_after_noticed_s"]),
            "teardown": ratio(&run["teardown"]["total_s"], &run["baseline"]["teardown_s"]),
            "teardown_rules_gone": ratio(&run["teardown"]["rules_gone_s"], &run["baseline"]["teardown_rules_gone_s"]),
        });
        run["ratio"] = ratios;
        progress(&format!("ratios loxi-ccm / baseline: {}", run["ratio"]));
    }
    Ok(())
}

async fn run_baseline(env: &Env, n: usize) -> Result<Value> {
    let args = &env.args;
    let total_rules = n * args.ports;
    let client = &env.client;
    let ns = format!("baseline-{n}");
    cluster::ensure_namespace(client, &ns).await?;
    let api = env.services(&ns);
    if env.sim.rule_count().await? != 0 {
        bail!("simulator not empty before the baseline");
    }
    let tracker = Tracker::start(client, &ns).await?;
    let node_ips = env.nodes.iter().map(|n| n.ip).collect();
    let base = Baseline::start(
        client,
        &ns,
        &env.sim.sim.url(),
        node_ips,
        Ipv4Addr::new(10, 201, 0, 1),
        args.baseline_concurrency,
    )?;
    let names = cluster::names("svc", n);
    let objects = names
        .iter()
        .map(|name| cluster::lb_service(name, args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("baseline: burst of {n}"));
    let srv0 = env.server_cpu();
    let t0 = Instant::now();
    let created =
        cluster::create_burst(&api, objects, args.create_concurrency, Some(&tracker)).await?;
    let (_, converged) = wait_converged(env, &tracker, n, total_rules, t0).await?;
    let server_cpu = env.server_cpu() - srv0;
    let writes = tracker.changes();
    let lat = summarize(&tracker.latencies());

    let t0 = Instant::now();
    env.sim.sim.restart();
    let replayed = base.replay().await?;
    let replay = wait_replay(env, total_rules, t0).await?;

    let (r, o) = teardown(env, &api, &names, &tracker).await?;
    let failures = base.failures();
    drop(base);
    progress(&format!(
        "baseline: burst {:.2} s, replay {:.2} s, teardown {:.2} s",
        converged.as_secs_f64(),
        replay.all.as_secs_f64(),
        r.max(o).as_secs_f64()
    ));
    Ok(json!({
        "burst_s": secs(converged),
        "burst_create_s": secs(created),
        "burst_server_cpu_s": stats::round(server_cpu),
        "burst_latency": summary_json(&lat),
        "service_writes_per_service": per(writes, n),
        "replay_s": secs(replay.all),
        // Told of the wipe, the baseline calls at once: its whole replay counts.
        "replay_after_noticed_s": secs(replay.all),
        "replayed_rules": replayed,
        "teardown_s": secs(r.max(o)),
        "teardown_rules_gone_s": secs(r),
        "failures": failures,
    }))
}

async fn run_bulk(env: &Env, total: usize, ours: usize, out: &mut Value) -> Result<()> {
    let client = &env.client;
    let others = total - ours;
    let ns = "bulk-clusterip";
    cluster::ensure_namespace(client, ns).await?;
    let api = env.services(ns);
    let objects = cluster::names("cip", others)
        .iter()
        .map(|name| cluster::cluster_ip_service(name))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("bulk: creating {others} ClusterIP Services"));
    let created = cluster::create_burst(&api, objects, env.args.create_concurrency, None).await?;
    out["clusterip_create_s"] = json!(secs(created));

    let mut ccm = Ccm::spawn(&env.spec, "bulk")?;
    let ready = wait_ready(&mut ccm, env.timeout).await?;
    let idle = ccm.usage()?;
    out["ready_s"] = json!(secs(ready));
    out["idle"] = usage_json(&idle);

    let ns = "bulk-lb";
    cluster::ensure_namespace(client, ns).await?;
    let api = env.services(ns);
    let tracker = Tracker::start(client, ns).await?;
    let objects = cluster::names("svc", ours)
        .iter()
        .map(|name| cluster::lb_service(name, env.args.ports))
        .collect::<Result<Vec<_>>>()?;
    progress(&format!("bulk: creating {ours} LoadBalancer Services"));
    let t0 = Instant::now();
    cluster::create_burst(&api, objects, env.args.create_concurrency, Some(&tracker)).await?;
    let (_, converged) = wait_converged(env, &tracker, ours, ours * env.args.ports, t0).await?;
    // Let allocations settle (drift/health loops) before reading the final numbers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let u = ccm.usage()?;
    out["converged_s"] = json!(secs(converged));
    out["after"] = usage_json(&u);
    out["peak_rss_mib"] = json!(u.peak_rss_mib());
    progress(&format!(
        "bulk: converged in {:.2} s, peak RSS {} MiB (idle with {others} ClusterIP: {} MiB)",
        converged.as_secs_f64(),
        u.peak_rss_mib(),
        idle.peak_rss_mib()
    ));
    out["counters"] = ccm.counters().await?;
    ccm.stop().await?;
    Ok(())
}
