//! `loxilb-sim` binary: serves the simulated loxilb API (and `/admin`) until
//! Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use loxilb_sim::{API_BASE, Profile, SimConfig, Simulator};

/// Stateful stand-in for the loxilb REST API (in-memory, for tests and demos).
///
/// The loxilb API is served under /netlox/v1; a JSON admin API under /admin
/// on the same listener offers: POST /admin/restart, POST /admin/down
/// [{"seconds":N}], PUT /admin/latency {"ms":N}, PUT|DELETE /admin/fault
/// {"status":500,"rate":1.0,"onlyWrites":true}, GET|PUT /admin/bgp {"enabled":true},
/// PUT /admin/bgp/peer-state {"ip":"...","state":"ESTABLISHED"}, PUT /admin/token
/// {"token":"..."}, GET|PUT /admin/profile {"profile":"loxilb-0.9.8","tickMs":100},
/// GET /admin/costs, GET /admin/rules, GET /admin/writes, GET /admin/stats.
/// While down the listener is closed, so only the timed form of /admin/down
/// brings the simulator back.
#[derive(Debug, Parser)]
#[command(name = "loxilb-sim", version, about, long_about)]
struct Args {
    /// Address to listen on (API and admin share it); port 0 picks a free port.
    #[arg(long, env = "LOXILB_SIM_LISTEN", default_value = "127.0.0.1:11111")]
    listen: SocketAddr,

    /// Maximum number of LB rules (loxilb: 2048); one more answers 403 rule-hwm error.
    #[arg(long, env = "LOXILB_SIM_MAX_RULES", default_value_t = 2048)]
    max_rules: usize,

    /// Require `Authorization: <TOKEN>` (verbatim, no "Bearer") on every API call except /version.
    #[arg(long, env = "LOXILB_SIM_TOKEN", hide_env_values = true)]
    token: Option<String>,

    /// Serve HTTPS (only) with this PEM certificate chain, as loxilb's --tls; needs --tls-key.
    #[arg(long, env = "LOXILB_SIM_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "LOXILB_SIM_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,

    /// Run as loxilb started with BGP (`-b`): /config/bgp works instead of answering 403.
    #[arg(long, env = "LOXILB_SIM_BGP")]
    bgp: bool,

    /// Run as a BGP-peer-only loxilb (kube-loxilb's loxilb-peer-service): BGP works, every
    /// rule, endpoint and cluster-state call answers 403 "running in bgp only mode".
    #[arg(long, env = "LOXILB_SIM_BGP_ONLY")]
    bgp_only: bool,

    /// Artificial delay in milliseconds added before every API call.
    #[arg(long, env = "LOXILB_SIM_LATENCY_MS", default_value_t = 0)]
    latency_ms: u64,

    /// What rule writes cost. "instant": every call answered at once (loxilbs before
    /// 2026-03-04; fast tests). "loxilb-0.9.8": loxilb 0.9.8 since 2026-03-04: rule POSTs
    /// take one lock, a create or update holds it until the next tick of a worker (one write
    /// per tick), a re-POST that changes nothing answers 409 once it has the lock, deletes
    /// and GETs answer at once, a request waiting more than 60 ticks is applied but not
    /// answered, goBGP answers 9 ticks after the start (docs/loxilb-api.md#costs-and-versions).
    #[arg(long, env = "LOXILB_SIM_PROFILE", default_value = Profile::INSTANT,
          value_parser = Profile::NAMES)]
    profile: String,

    /// The worker's tick of --profile loxilb-0.9.8 in milliseconds (loxilb: 1000); the write
    /// timeout and goBGP's start-up delay scale with it.
    #[arg(long, env = "LOXILB_SIM_PROFILE_TICK_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    profile_tick_ms: u64,
}

#[cfg(unix)]
async fn terminate() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        // Without a SIGTERM handler, Ctrl-C still works.
        Err(_) => std::future::pending::<()>().await,
    }
}

#[cfg(not(unix))]
async fn terminate() {
    std::future::pending::<()>().await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let profile = Profile::named(&args.profile, Duration::from_millis(args.profile_tick_ms))
        .context("--profile and --profile-tick-ms")?;
    let cfg = SimConfig {
        max_rules: args.max_rules,
        auth_token: args.token,
        bgp: args.bgp,
        bgp_only: args.bgp_only,
        profile,
        ..SimConfig::default()
    };
    let sim = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let read = |p: &std::path::Path| {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            };
            Simulator::start_tls(args.listen, cfg, &read(cert)?, &read(key)?).await
        }
        _ => Simulator::start(args.listen, cfg).await,
    }
    .with_context(|| format!("cannot listen on {}", args.listen))?;
    sim.set_latency(Duration::from_millis(args.latency_ms));
    tracing::info!(api = %format!("{}{API_BASE}", sim.url()), "ready");
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        () = terminate() => {}
    }
    tracing::info!("shutting down");
    sim.shutdown().await;
    Ok(())
}
