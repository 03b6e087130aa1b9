//! Command line. Every option can also come from an environment variable (`LOXI_CCM_*`), and
//! kube-loxilb's spellings are accepted as aliases so existing manifests keep working.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "loxi-ccm",
    version,
    about = "Kubernetes Service type=LoadBalancer controller and cloud-controller-manager for loxilb",
    long_about = "loxi-ccm gives Services of type LoadBalancer an external IP from the operator's \
pool, programs one loxilb rule per address and port on every loxilb instance, reports the \
address in the Service status, and removes the rules under a finalizer when the Service goes."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Path to a kubeconfig. Without it: in-cluster configuration, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// loxilb API endpoint(s), e.g. http://10.0.0.5:11111. Repeat the flag or separate with
    /// commas; every instance gets every rule. (kube-loxilb: --loxiURL)
    #[arg(
        long = "loxilb-url",
        alias = "loxiURL",
        env = "LOXI_CCM_LOXILB_URL",
        value_delimiter = ',',
        required = true
    )]
    pub loxilb_urls: Vec<String>,

    /// Pool of external addresses: an IPv4 CIDR (network and broadcast addresses are never
    /// handed out) or a range a.b.c.d-a.b.c.e. (kube-loxilb: --externalCIDR; loxi-ccm ConfigMap: externalIPcidr)
    #[arg(
        long = "external-cidr",
        alias = "externalCIDR",
        alias = "externalIPcidr",
        env = "LOXI_CCM_EXTERNAL_CIDR"
    )]
    pub external_cidr: String,

    /// Serve Services whose spec.loadBalancerClass equals this value.
    /// (kube-loxilb: --loxilbLoadBalancerClass)
    #[arg(
        long = "load-balancer-class",
        alias = "loxilbLoadBalancerClass",
        env = "LOXI_CCM_LOAD_BALANCER_CLASS",
        default_value = "loxilb.io/loxilb"
    )]
    pub load_balancer_class: String,

    /// Also serve LoadBalancer Services without a class, as the cluster's cloud provider does
    /// (finalizer service.kubernetes.io/load-balancer-cleanup).
    #[arg(long = "ccm-mode", env = "LOXI_CCM_CCM_MODE", default_value_t = false)]
    pub ccm_mode: bool,

    /// Default loxilb NAT mode for Services without loxilb.io/lbmode: default, onearm,
    /// fullnat, dsr, fullproxy, hostonearm, or kube-loxilb's numbers 0-5. (kube-loxilb: --setLBMode)
    #[arg(
        long = "lb-mode",
        alias = "setLBMode",
        env = "LOXI_CCM_LB_MODE",
        default_value = "default"
    )]
    pub lb_mode: String,

    /// Ask loxilb to health-check endpoints by default (loxilb.io/liveness overrides).
    /// (kube-loxilb: --monitor)
    #[arg(long, env = "LOXI_CCM_MONITOR", default_value_t = false)]
    pub monitor: bool,

    /// Cluster identity written into every rule name so clusters can share a loxilb.
    /// Default: derived from the kube-system namespace UID.
    #[arg(long = "cluster-id", env = "LOXI_CCM_CLUSTER_ID")]
    pub cluster_id: Option<String>,

    /// Watch Services in this namespace only (default: all namespaces).
    #[arg(long, env = "LOXI_CCM_NAMESPACE")]
    pub namespace: Option<String>,

    /// Token sent verbatim in the Authorization header to loxilb (when loxilb runs with auth).
    #[arg(
        long = "loxilb-token",
        env = "LOXI_CCM_LOXILB_TOKEN",
        hide_env_values = true
    )]
    pub loxilb_token: Option<String>,

    /// PEM file with the CA that signs loxilb's HTTPS certificate.
    #[arg(long = "loxilb-ca-file", env = "LOXI_CCM_LOXILB_CA_FILE")]
    pub loxilb_ca_file: Option<PathBuf>,

    /// Timeout of one loxilb API call.
    #[arg(long = "loxilb-timeout", env = "LOXI_CCM_LOXILB_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub loxilb_timeout: Duration,

    /// How often each loxilb is probed (GET /version) for liveness.
    #[arg(long = "health-interval", env = "LOXI_CCM_HEALTH_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub health_interval: Duration,

    /// How often the rules held by each loxilb are compared with what should exist: missing
    /// rules are created, changed ones fixed, orphans this cluster owns deleted.
    #[arg(long = "drift-interval", env = "LOXI_CCM_DRIFT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub drift_interval: Duration,

    /// How many Services are reconciled at the same time.
    #[arg(long, env = "LOXI_CCM_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,

    /// Address of the admin HTTP server (/metrics, /healthz, /readyz).
    #[arg(
        long = "admin-addr",
        env = "LOXI_CCM_ADMIN_ADDR",
        default_value = "0.0.0.0:9500"
    )]
    pub admin_addr: SocketAddr,

    /// Log format.
    #[arg(
        long = "log-format",
        env = "LOXI_CCM_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Log filter in tracing's EnvFilter syntax, e.g. info or loxi_ccm=debug.
    #[arg(long = "log-level", env = "LOXI_CCM_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Elect one active replica through a coordination.k8s.io/v1 Lease; standbys keep warm
    /// caches and take over when the leader stops or its lease expires. Set to false only
    /// when exactly one replica runs.
    #[arg(long = "leader-elect", env = "LOXI_CCM_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    pub leader_elect: bool,

    /// Namespace of the leader-election Lease.
    #[arg(
        long = "leader-elect-namespace",
        env = "LOXI_CCM_LEADER_ELECT_NAMESPACE",
        default_value = "kube-system"
    )]
    pub leader_elect_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(
        long = "leader-elect-name",
        env = "LOXI_CCM_LEADER_ELECT_NAME",
        default_value = "loxi-ccm"
    )]
    pub leader_elect_name: String,

    /// How long a leader's Lease stays valid without renewal; a standby takes over after it.
    #[arg(long = "leader-elect-lease-duration", env = "LOXI_CCM_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    #[command(flatten)]
    pub node_init: crate::node_init::NodeInitArgs,
}

/// Parses durations such as `500ms`, `5s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 5s, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s:?} is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_and_every_flag_is_explained() {
        Cli::command().debug_assert();
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").unwrap();
        for arg in run.get_arguments() {
            if ["help", "version"].contains(&arg.get_id().as_str()) {
                continue;
            }
            assert!(arg.get_help().is_some(), "--{} has no help", arg.get_id());
        }
    }

    #[test]
    fn kube_loxilb_spellings_are_accepted() {
        let cli = Cli::try_parse_from([
            "loxi-ccm",
            "run",
            "--loxiURL=http://a:11111,http://b:11111",
            "--externalCIDR=192.0.2.0/24",
            "--setLBMode=2",
        ])
        .unwrap();
        let Command::Run(args) = cli.command;
        assert_eq!(args.loxilb_urls, ["http://a:11111", "http://b:11111"]);
        assert_eq!(args.external_cidr, "192.0.2.0/24");
        assert_eq!(args.lb_mode, "2");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 parsecs").is_err());
    }
}
