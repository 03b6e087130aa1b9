//! Command line. Every option of `run` (and `check`, which takes the same options) can also
//! come from an environment variable (`LOXI_CCM_*`) or a YAML config file (`--config`); the
//! layering itself is in [`crate::config::load`]. kube-loxilb's spellings are accepted as flag
//! aliases so existing manifests keep working.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "loxi-ccm",
    version,
    about = "Kubernetes Service type=LoadBalancer controller and cloud-controller-manager for loxilb",
    long_about = "loxi-ccm gives Services of type LoadBalancer an external IP from the operator's \
pool, programs one loxilb rule per address and port on every loxilb instance, reports the \
address in the Service status, and removes the rules under a finalizer when the Service goes.\n\n\
Every option is read, by precedence, from the command line, then its LOXI_CCM_* environment \
variable, then the YAML config file (--config), then its default."
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

/// Name of the subcommand that validates the configuration and reaches every dependency.
pub const CHECK: &str = "check";

/// Name of the read-only subcommand that checks a live cluster's invariants (`crate::audit`).
pub const AUDIT: &str = "audit";

/// The complete command tree the binary parses: [`Cli`] plus `check`, which takes exactly the
/// options of `run` (same flags, environment variables and config-file keys).
///
/// `check` is added here rather than as a [`Command`] variant so that code matching
/// `Command::Run` irrefutably keeps compiling.
pub fn command() -> clap::Command {
    let check = RunArgs::augment_args(clap::Command::new(CHECK))
        .about(
            "Check the configuration, reach the Kubernetes API and every loxilb, print one line \
per check and exit non-zero on any problem",
        )
        .long_about(
            "Validates the configuration exactly as `run` would (same flags, environment \
variables and config file), then checks the Kubernetes API (GET /version), the credentials \
(listing Services and Nodes, and the permissions `run` needs) and every loxilb (GET /version \
and a rule listing, which also proves the token). Prints one OK or FAIL line per check; exits \
1 when any check fails.",
        );
    let audit = RunArgs::augment_args(clap::Command::new(AUDIT))
        .about(
            "Check a live cluster and its loxilbs against the controller's invariants (read-only); \
print each violation with the objects involved and exit 1 if any",
        )
        .long_about(
            "Reads the Services, Nodes, EndpointSlices, AddressClaims and AddressPools from the \
API server and every loxilb's rules, computes each served Service's rules with the controller's \
own planner, and checks: no address with two owners beyond legal sharing; every served Service \
has its rules, with the right endpoints and flags, on every loxilb that answers; no rule named \
as this cluster's whose Service is gone; no claim without an owner or a reservation; no Service \
with our finalizer showing an address no claim backs; no address outside every pool unless \
asked for; with BGP, advertisement counts matching the rules where loxilb exposes them (only \
the simulator does). Takes the options of `run` (the same cluster id, namespace, pools and \
loxilb URLs). Writes nothing. Prints one VIOLATION line per finding and NOTE lines for what \
was not checked; exits 0 when clean, 1 on any violation, 2 when the audit could not run.",
        );
    Cli::command().subcommand(check).subcommand(audit)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The options of `run` (and `check`, `audit`), one group per concern, each shown under its
/// own heading in `--help`. Those of [`GO_BOOLS`] are Go-style booleans.
#[derive(Debug, Clone, Args)]
#[command(mut_args(go_bools))]
pub struct RunArgs {
    /// YAML config file: keys are the options in camelCase (e.g. externalCidr), and
    /// kube-loxilb's and loxi-ccm's (Go) spellings. Flags and environment variables override it.
    #[arg(long, env = "LOXI_CCM_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub kube_api: KubeApiArgs,

    #[command(flatten)]
    pub loxilbs: LoxilbArgs,

    #[command(flatten)]
    pub loxilb_api: LoxilbApiArgs,

    #[command(flatten)]
    pub pools: PoolArgs,

    #[command(flatten)]
    pub services: ServiceArgs,

    #[command(flatten)]
    pub gateway: GatewayArgs,

    #[command(flatten)]
    pub bgp: BgpArgs,

    #[command(flatten)]
    pub ha: HaArgs,

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub admin: AdminArgs,

    #[command(flatten, next_help_heading = "Node initialization")]
    pub node_init: crate::node_init::NodeInitArgs,
}

/// Where the Kubernetes API is and how much this controller may ask of it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes API")]
pub struct KubeApiArgs {
    /// Path to a kubeconfig. Without it: in-cluster configuration, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Client-side limit on Kubernetes API requests per second (client-go's QPS); 0, the
    /// default, sets none: the API server protects itself (API Priority and Fairness) and
    /// answers 429 when it must, which the client retries. Set a limit to cap what this
    /// controller may ask of a shared API server; a burst of new Services costs about five
    /// requests per Service. Requests held back for a second or more are logged.
    #[arg(
        long = "kube-api-qps",
        env = "LOXI_CCM_KUBE_API_QPS",
        default_value_t = 0.0
    )]
    pub kube_api_qps: f64,

    /// Requests allowed at once above --kube-api-qps before the limit applies (client-go's
    /// Burst). Only used with a --kube-api-qps above 0.
    #[arg(
        long = "kube-api-burst",
        env = "LOXI_CCM_KUBE_API_BURST",
        default_value_t = 100
    )]
    pub kube_api_burst: u32,
}

/// Which loxilbs are programmed: named, or followed in the cluster, and their groups.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "loxilbs")]
pub struct LoxilbArgs {
    /// loxilb API endpoint(s), e.g. http://10.0.0.5:11111. Repeat the flag or separate with
    /// commas. Every loxilb of a group gets the rules of the Services placed on that group;
    /// GROUP=URL (east=http://10.0.0.5:11111) puts a loxilb in group GROUP, a plain URL in
    /// the --zone group (docs/fleet.md#groups-and-placement). Unset: the loxilbs running in
    /// the cluster are followed instead (--loxilb-service, docs/fleet.md#discovery).
    /// (kube-loxilb: --loxiURL)
    #[arg(
        long = "loxilb-url",
        alias = "loxiURL",
        env = "LOXI_CCM_LOXILB_URL",
        value_delimiter = ','
    )]
    pub loxilb_urls: Vec<String>,

    /// Name of the default group of loxilbs (kube-loxilb's zone): the group of every loxilb
    /// named without one, and the prefix of its HA instances (<zone>-inst0, ...), which rule
    /// names end with. With several groups, a Service goes to the group its
    /// loxilb.io/zoneselect names, else to the group with the most room, recorded in that
    /// annotation and never moved. (kube-loxilb: --zone)
    #[arg(long = "zone", env = "LOXI_CCM_ZONE", default_value = "llb")]
    pub zone: String,

    /// Accepted so that kube-loxilb's arguments work as they are; it changes nothing. With it,
    /// kube-loxilb publishes a Service's address as an ip instead of its <zone>-<ip>
    /// hostname; loxi-ccm publishes the ip (with ipMode) already, with or without this flag,
    /// and a hostname only when a Service asks for it (loxilb.io/ingress-mode: hostname,
    /// always llb-<ip>). Rule names keep their HA instance (<zone>-inst<N>) either way.
    /// (kube-loxilb: --noZoneName)
    #[arg(
        long = "no-zone-name",
        alias = "noZoneName",
        env = "LOXI_CCM_NO_ZONE_NAME"
    )]
    pub no_zone_name: bool,

    /// Without --loxilb-url: the Service whose ready EndpointSlice addresses are the loxilbs
    /// (kube-loxilb's in-cluster loxilb Service), followed by a watch; a loxilb that appears
    /// is programmed completely before Services count it, one that goes is dropped.
    #[arg(
        long = "loxilb-service",
        env = "LOXI_CCM_LOXILB_SERVICE",
        default_value = "loxilb-lb-service"
    )]
    pub loxilb_service: String,

    /// Namespace of --loxilb-service; unset: any namespace.
    #[arg(
        long = "loxilb-service-namespace",
        env = "LOXI_CCM_LOXILB_SERVICE_NAMESPACE"
    )]
    pub loxilb_service_namespace: Option<String>,

    /// API port of the loxilbs found through --loxilb-service and --loxilb-peer-service
    /// (<scheme>://<address>:<port>); an EndpointSlice that does not list this port but
    /// exactly one other gives that one.
    #[arg(
        long = "loxilb-port",
        env = "LOXI_CCM_LOXILB_PORT",
        default_value_t = 11111
    )]
    pub loxilb_port: u16,

    /// Scheme of the API URLs of the loxilbs found in the cluster (--loxilb-service,
    /// --loxilb-peer-service): http or https. With https the certificate is verified against
    /// --loxilb-ca-file (or the system roots; not at all with
    /// --loxilb-insecure-skip-tls-verify), and the token is sent as to --loxilb-url. loxilb
    /// serves HTTPS only when started with --tls, on a port of its own (8091 by default): set
    /// --loxilb-port to it.
    #[arg(
        long = "loxilb-discovery-scheme",
        env = "LOXI_CCM_LOXILB_DISCOVERY_SCHEME",
        default_value = "http",
        value_parser = ["http", "https"]
    )]
    pub loxilb_discovery_scheme: String,

    /// Discovered loxilbs (--loxilb-service) form one group per topology zone: the zone the
    /// EndpointSlice gives each (its Node's topology.kubernetes.io/zone), lower-cased; one
    /// without a zone joins the --zone group (docs/fleet.md#groups-and-placement). Off: every
    /// discovered loxilb is in the --zone group.
    #[arg(
        long = "loxilb-discovery-zones",
        env = "LOXI_CCM_LOXILB_DISCOVERY_ZONES",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub loxilb_discovery_zones: bool,

    /// With BGP on (--bgp-local-as): the Service whose ready EndpointSlice addresses are
    /// loxilbs running in BGP-peer-only mode (kube-loxilb's loxilb-peer-service), followed by
    /// a watch, with or without --loxilb-url. They get BGP settings, peering with the
    /// rule-holding loxilbs, and never rules nor HA roles; one that goes is removed from the
    /// others' neighbours. No such Service: none.
    #[arg(
        long = "loxilb-peer-service",
        env = "LOXI_CCM_LOXILB_PEER_SERVICE",
        default_value = "loxilb-peer-service"
    )]
    pub loxilb_peer_service: String,

    /// Namespace of --loxilb-peer-service; unset: any namespace.
    #[arg(
        long = "loxilb-peer-service-namespace",
        env = "LOXI_CCM_LOXILB_PEER_SERVICE_NAMESPACE"
    )]
    pub loxilb_peer_service_namespace: Option<String>,
}

/// How every loxilb is called (token, TLS, timeouts) and how much it is given.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "loxilb API")]
pub struct LoxilbApiArgs {
    /// Token sent verbatim in the Authorization header to loxilb (when loxilb runs with auth).
    /// Prefer --loxilb-token-file or --loxilb-token-secret: a flag's value shows in the
    /// process list, and it can only change with a restart. Never logged or printed.
    #[arg(
        long = "loxilb-token",
        env = "LOXI_CCM_LOXILB_TOKEN",
        hide_env_values = true
    )]
    pub loxilb_token: Option<SecretText>,

    /// File holding the loxilb token (e.g. a mounted Secret); surrounding whitespace is
    /// ignored. Re-read every 2 s: a new token is used without a restart (an unreadable or
    /// empty file keeps the token in use). Only one of the three token options.
    #[arg(long = "loxilb-token-file", env = "LOXI_CCM_LOXILB_TOKEN_FILE")]
    pub loxilb_token_file: Option<PathBuf>,

    /// Secret holding the loxilb token, namespace/name[:key] (key default: token), e.g.
    /// kube-system/loxi-ccm-loxilb-auth. Watched: a new token is used without a restart; a
    /// missing Secret or key means no token. Needs get/list/watch on that Secret.
    #[arg(long = "loxilb-token-secret", env = "LOXI_CCM_LOXILB_TOKEN_SECRET")]
    pub loxilb_token_secret: Option<String>,

    /// PEM file with the CA(s) that sign loxilb's HTTPS certificate (https:// URLs); without
    /// it, the system's trusted roots. The certificate must name the URL's host.
    #[arg(long = "loxilb-ca-file", env = "LOXI_CCM_LOXILB_CA_FILE")]
    pub loxilb_ca_file: Option<PathBuf>,

    /// Accept any HTTPS certificate from loxilb, without checking who signed it or whom it
    /// names: the traffic is encrypted but anybody in the path can read the token. For
    /// tests only; logged as a warning at start-up and by check.
    #[arg(
        long = "loxilb-insecure-skip-tls-verify",
        env = "LOXI_CCM_LOXILB_INSECURE_SKIP_TLS_VERIFY"
    )]
    pub loxilb_insecure_skip_tls_verify: bool,

    /// Timeout of one loxilb API call.
    #[arg(long = "loxilb-timeout", env = "LOXI_CCM_LOXILB_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub loxilb_timeout: Duration,

    /// How often each loxilb is probed: liveness (GET /version) and, while up, whether it
    /// restarted since the last probe (GET /config/cistate/all: the controller's restart
    /// marker is gone), in which case every rule is replayed at once. Both answers are a few
    /// bytes; a loxilb that refuses the marker is probed by listing its rules instead.
    #[arg(long = "health-interval", env = "LOXI_CCM_HEALTH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub health_interval: Duration,

    /// How often the rules held by each loxilb are compared with what should exist: missing
    /// rules are created, changed ones fixed, orphans this cluster owns deleted.
    #[arg(long = "drift-interval", env = "LOXI_CCM_DRIFT_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub drift_interval: Duration,

    /// Rules one loxilb instance holds at most (loxilb's own limit is 2048). A Service whose
    /// rules would not fit gets the condition reason CapacityExceeded instead of a retry storm,
    /// and is programmed as soon as room frees.
    #[arg(
        long = "loxilb-max-rules",
        env = "LOXI_CCM_LOXILB_MAX_RULES",
        default_value_t = 2048
    )]
    pub loxilb_max_rules: usize,

    /// Rule writes in flight to one loxilb at most. Fewer go when it answers slowly: the
    /// writes in flight are kept within half of --loxilb-timeout at the time per write
    /// learnt from its answers (a loxilb since 2026-03-04 takes one rule write per second),
    /// the most urgent first (docs/architecture.md#writing-to-a-slow-loxilb).
    #[arg(
        long = "loxilb-write-window",
        env = "LOXI_CCM_LOXILB_WRITE_WINDOW",
        default_value_t = 16
    )]
    pub loxilb_write_window: usize,

    /// How long a loxilb stays unreachable before it counts as gone for good. Until then a
    /// deleted Service whose rules it may still hold keeps its address and finalizer (an
    /// address released while an old rule for it still forwards could go to another
    /// Service); after that they are released, and the loxilb, should it come back, loses
    /// that Service's rules in its replay. Long enough for a loxilb's restart or its node's
    /// reboot (docs/architecture.md#writing-to-a-slow-loxilb).
    #[arg(long = "loxilb-gone-after", env = "LOXI_CCM_LOXILB_GONE_AFTER", default_value = "10m", value_parser = parse_duration)]
    pub loxilb_gone_after: Duration,
}

/// The address pools external IPs are taken from, and whether Services share them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Address pools")]
pub struct PoolArgs {
    /// Default IPv4 pool, named "default": a CIDR (network and broadcast addresses are never
    /// handed out) or a range a.b.c.d-a.b.c.e. (kube-loxilb: --externalCIDR; loxi-ccm: externalIPcidr)
    #[arg(
        long = "external-cidr",
        alias = "externalCIDR",
        alias = "externalIPcidr",
        env = "LOXI_CCM_EXTERNAL_CIDR"
    )]
    pub external_cidr: Option<String>,

    /// Default IPv6 pool, named "default6": a CIDR or a range a::b-a::c. (kube-loxilb: --externalCIDR6)
    #[arg(
        long = "external-cidr6",
        alias = "externalCIDR6",
        env = "LOXI_CCM_EXTERNAL_CIDR6"
    )]
    pub external_cidr6: Option<String>,

    /// Named IPv4 pools, name=CIDR or name=a-b, comma-separated; a name given several times
    /// gets several blocks. They come after --external-cidr, in the order given. (kube-loxilb: --cidrPools)
    #[arg(
        long = "cidr-pools",
        alias = "cidrPools",
        env = "LOXI_CCM_CIDR_POOLS",
        value_delimiter = ','
    )]
    pub cidr_pools: Vec<String>,

    /// Named IPv6 pools, name=CIDR or name=a-b, comma-separated (as --cidr-pools).
    /// (kube-loxilb: --cidr6Pools)
    #[arg(
        long = "cidr6-pools",
        alias = "cidr6Pools",
        env = "LOXI_CCM_CIDR6_POOLS",
        value_delimiter = ','
    )]
    pub cidr6_pools: Vec<String>,

    /// IPv4 pools for secondary (SCTP multi-homing) addresses, comma-separated; they are named
    /// secondary0, secondary1, ... in order. (kube-loxilb: --externalSecondaryCIDRs)
    #[arg(
        long = "external-secondary-cidrs",
        alias = "externalSecondaryCIDRs",
        env = "LOXI_CCM_EXTERNAL_SECONDARY_CIDRS",
        value_delimiter = ','
    )]
    pub external_secondary_cidrs: Vec<String>,

    /// Give every Service its own address (exclusive IPAM). Off: Services share an address
    /// when their ports differ, as kube-loxilb's default shared mode. (kube-loxilb: --setUniqueIP)
    #[arg(
        long = "set-unique-ip",
        alias = "setUniqueIP",
        env = "LOXI_CCM_SET_UNIQUE_IP"
    )]
    pub set_unique_ip: bool,
}

/// Which Services this controller serves, and their defaults.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Services")]
pub struct ServiceArgs {
    /// Serve Services whose spec.loadBalancerClass equals this value.
    /// (kube-loxilb: --loxilbLoadBalancerClass)
    #[arg(
        long = "load-balancer-class",
        alias = "loxilbLoadBalancerClass",
        env = "LOXI_CCM_LOAD_BALANCER_CLASS",
        default_value = "loxilb.io/loxilb"
    )]
    pub load_balancer_class: String,

    /// Names this controller when several run in one cluster (one per load-balancer class,
    /// or one per zone as kube-loxilb is run): its finalizer, AddressClaims, rule names,
    /// restart marker, status field manager and default Lease carry the name, so that no
    /// controller ever cleans up, releases or deletes another's Services, addresses or rules.
    /// 1-40 characters of [a-z0-9-]. Default: derived from --load-balancer-class
    /// (example.com/lb gives example-com-lb); the default class gives the default controller
    /// ("default"), which keeps the names of earlier releases.
    #[arg(long = "controller-name", env = "LOXI_CCM_CONTROLLER_NAME")]
    pub controller_name: Option<String>,

    /// Also serve LoadBalancer Services without a class, as the cluster's cloud provider does
    /// (finalizer service.kubernetes.io/load-balancer-cleanup).
    #[arg(long = "ccm-mode", env = "LOXI_CCM_CCM_MODE")]
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

    /// Ask loxilb to health-check the endpoints of every Service. As in kube-loxilb,
    /// loxilb.io/liveness: yes turns it on for one Service without this flag, and
    /// loxilb.io/liveness: no cannot turn it off with it. (kube-loxilb: --monitor)
    #[arg(long, env = "LOXI_CCM_MONITOR")]
    pub monitor: bool,

    /// How spec.loadBalancerSourceRanges are enforced: firewall (allow rules for the ranges and a drop rule for every other source, in loxilb's
    /// firewall, to the Service's address, port and protocol only), enforce (the rules'
    /// allowedSources, as kube-loxilb: loxilb stops load-balanced traffic to every address
    /// while any rule has allowed sources, loxilb issue #1036, seen on v0.9.8) or ignore (not
    /// enforced, said in each such Service's loxilb.io/SourceRangesEnforced condition).
    /// docs/configuration.md#source-ranges
    #[arg(
        long = "source-ranges",
        env = "LOXI_CCM_SOURCE_RANGES",
        default_value = "firewall",
        value_parser = ["firewall", "enforce", "ignore"]
    )]
    pub source_ranges: String,

    /// Send traffic straight to pod IPs and target ports (from EndpointSlices) instead of node
    /// InternalIPs and NodePorts, for Services without loxilb.io/usepodnetwork.
    /// (kube-loxilb: --usePodNetwork)
    #[arg(
        long = "use-pod-network",
        alias = "usePodNetwork",
        env = "LOXI_CCM_USE_POD_NETWORK"
    )]
    pub use_pod_network: bool,

    /// The private address every rule carries as loxilb's privateIP, for clouds where the VIP
    /// is an elastic IP translated to the loxilb instance's own address: written as a CIDR,
    /// the address in it is used (10.10.0.1 of 10.10.0.1/24), or as a bare address. Not for
    /// Services that name their address (loxilb.io/staticIP, spec.loadBalancerIP), nor for
    /// VIPs of the other IP family. loxilb sets it only when a rule is created.
    /// docs/configuration.md#private-addresses (kube-loxilb: --privateCIDR)
    #[arg(
        long = "private-cidr",
        alias = "privateCIDR",
        env = "LOXI_CCM_PRIVATE_CIDR"
    )]
    pub private_cidr: Option<String>,

    /// Share rules with other controllers or clusters on the same loxilb: endpoints are added
    /// to a rule with loxilb's attach and taken off with detach, so a rule on the same
    /// address, port and protocol holds everyone's endpoints; a rule is never deleted
    /// outright (loxilb drops it with its last endpoint) and the drift check compares only
    /// this controller's endpoints. docs/configuration.md#shared-rules (kube-loxilb: --appendEPs)
    #[arg(
        long = "append-endpoints",
        alias = "appendEPs",
        env = "LOXI_CCM_APPEND_ENDPOINTS"
    )]
    pub append_endpoints: bool,

    /// Watch Pod metadata to read Multus' k8s.v1.cni.cncf.io/network-status, so Services with
    /// loxilb.io/multus-nets forward to the pods' secondary-network addresses. Off by default:
    /// it keeps every Pod's metadata in memory.
    #[arg(long = "multus", env = "LOXI_CCM_MULTUS")]
    pub multus: bool,

    /// Serve kube-loxilb's Egress resource (egress.loxilb.io/v1, CRD in
    /// deploy/optional/egress.yaml): the addresses it lists and the pods its selector selects
    /// leave through loxilb source-NATed to its vip (firewall SNAT rules on every loxilb,
    /// docs/egress.md). Off by default: it keeps every Pod's labels and addresses in memory.
    #[arg(long = "egress", env = "LOXI_CCM_EGRESS")]
    pub egress: bool,

    /// Tell every loxilb about this controller's Services, the pods they select and the
    /// Nodes (POST /config/k8smeta, which loxilb's published API lacks): the full set once
    /// per loxilb and after it restarts, then only what changed. Off by default: on, it
    /// watches every Pod. docs/configuration.md#kubernetes-metadata (kube-loxilb:
    /// --enableK8sMetadata)
    #[arg(
        long = "k8s-metadata",
        alias = "enableK8sMetadata",
        env = "LOXI_CCM_K8S_METADATA"
    )]
    pub k8s_metadata: bool,

    /// Cluster identity written into every rule name so clusters can share a loxilb.
    /// Default: derived from the kube-system namespace UID.
    #[arg(long = "cluster-id", env = "LOXI_CCM_CLUSTER_ID")]
    pub cluster_id: Option<String>,

    /// Watch Services in this namespace only (default: all namespaces).
    #[arg(long, env = "LOXI_CCM_NAMESPACE")]
    pub namespace: Option<String>,

    /// How many Services are reconciled at the same time; also how many Services' rules a
    /// replay (after a loxilb restart) or a drift repair sends to one loxilb at once.
    #[arg(long, env = "LOXI_CCM_CONCURRENCY", default_value_t = 16)]
    pub concurrency: u16,
}

/// BGP on every loxilb (docs/bgp.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "BGP")]
pub struct BgpArgs {
    /// BGP: the local AS number (1-4294967295; 4-byte ASNs and asdot such as 1.10 accepted).
    /// Set, loxi-ccm configures BGP on every loxilb and rules advertise their addresses
    /// (docs/bgp.md); unset or 0: no BGP. (kube-loxilb: --setBGP)
    #[arg(long = "bgp-local-as", alias = "setBGP", env = "LOXI_CCM_BGP_LOCAL_AS")]
    pub bgp_local_as: Option<String>,

    /// BGP router id, an IPv4 address. Unset: each loxilb's own address from its URL.
    #[arg(long = "bgp-router-id", env = "LOXI_CCM_BGP_ROUTER_ID")]
    pub bgp_router_id: Option<String>,

    /// BGP listen port of loxilb's goBGP (0 or unset: 179). (kube-loxilb: --listenBGPPort)
    #[arg(
        long = "bgp-listen-port",
        alias = "listenBGPPort",
        env = "LOXI_CCM_BGP_LISTEN_PORT"
    )]
    pub bgp_listen_port: Option<u16>,

    /// External BGP peers, comma-separated IP:ASN (IPv6 in brackets: [2001:db8::1]:65001,
    /// an optional :port after the ASN); a peer removed from the list is removed from loxilb.
    /// (kube-loxilb: --extBGPPeers)
    #[arg(
        long = "bgp-peers",
        alias = "extBGPPeers",
        env = "LOXI_CCM_BGP_PEERS",
        value_delimiter = ','
    )]
    pub bgp_peers: Vec<String>,

    /// eBGP multihop (TTL 8) towards the external peers. (kube-loxilb: --eBGPMultiHop)
    #[arg(
        long = "bgp-multihop",
        alias = "eBGPMultiHop",
        env = "LOXI_CCM_BGP_MULTIHOP",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub bgp_multihop: bool,

    /// Serve kube-loxilb's BGP custom resources (BGPPeerService, BGPPolicyDefinedSetsService,
    /// BGPPolicyDefinitionService, BGPPolicyApplyService; CRDs in
    /// deploy/optional/bgp-crds.yaml): their peers and policies are configured on every
    /// loxilb, with status. Needs --bgp-local-as. (kube-loxilb: --enableBGPCRDs)
    #[arg(
        long = "bgp-crds",
        alias = "enableBGPCRDs",
        env = "LOXI_CCM_BGP_CRDS",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub bgp_crds: bool,
}

/// The Gateway API (docs/gateway-api.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Gateway API")]
pub struct GatewayArgs {
    /// Serve the Gateway API: GatewayClasses whose spec.controllerName is
    /// --loxilb-gateway-class are accepted, their Gateways get an address from the pools
    /// (an AddressClaim, as a Service's) and their TCP and UDP listeners become loxilb rules
    /// toward the ready endpoints of the attached TCPRoutes' and UDPRoutes' backends. The
    /// Gateway API CRDs (v1.x, standard channel) must be installed (docs/gateway-api.md).
    /// (kube-loxilb: --gatewayAPI)
    #[arg(
        long = "gateway-api",
        alias = "gatewayAPI",
        env = "LOXI_CCM_GATEWAY_API",
        default_value_t = false,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub gateway_api: bool,

    /// The GatewayClass spec.controllerName served with --gateway-api: a domain-prefixed
    /// path. (kube-loxilb: --loxilbGatewayClass)
    #[arg(
        long = "loxilb-gateway-class",
        alias = "loxilbGatewayClass",
        env = "LOXI_CCM_LOXILB_GATEWAY_CLASS",
        default_value = "loxilb.io/loxilb"
    )]
    pub loxilb_gateway_class: String,
}

/// HA roles of the loxilbs and HA instances of the Services (docs/fleet.md).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HA roles and instances")]
pub struct HaArgs {
    /// HA roles: for each HA instance exactly one reachable loxilb is MASTER and the others
    /// BACKUP (POST /config/cistate, with this VIP; 0.0.0.0 for none). When a master stops
    /// answering another takes over; roles are recorded in the ConfigMap
    /// <leader-elect-name>-ha-roles (docs/fleet.md). Unset: no roles are set.
    /// (kube-loxilb: --setRoles)
    #[arg(long = "set-roles", alias = "setRoles", env = "LOXI_CCM_SET_ROLES")]
    pub set_roles: Option<String>,

    /// loxilbs never given a role with --set-roles: their URLs or hosts, comma-separated.
    /// (kube-loxilb: --excludeRoleList)
    #[arg(
        long = "exclude-role-list",
        alias = "excludeRoleList",
        env = "LOXI_CCM_EXCLUDE_ROLE_LIST",
        value_delimiter = ','
    )]
    pub exclude_role_list: Vec<String>,

    /// With --set-roles and BGP: how long a MASTER whose BGP sessions with the configured
    /// peers are all down stays MASTER while another loxilb of its group has one
    /// ESTABLISHED; then the role moves there (a session that flaps faster moves nothing;
    /// docs/fleet.md).
    #[arg(long = "ha-bgp-hold", env = "LOXI_CCM_HA_BGP_HOLD", default_value = "10s", value_parser = parse_duration)]
    pub ha_bgp_hold: Duration,

    /// Number of HA instances (llb-inst0, llb-inst1, ...): each Service is given one (the
    /// least used, or loxilb.io/zoneinstance), recorded on the Service and never changed; its
    /// rules carry the instance in their name. Above 1 is refused with BGP on
    /// (docs/fleet.md). (kube-loxilb: --numZoneInstances)
    #[arg(
        long = "num-zone-instances",
        alias = "numZoneInstances",
        env = "LOXI_CCM_NUM_ZONE_INSTANCES",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub num_zone_instances: u16,
}

/// One active replica among several.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Leader election")]
pub struct LeaderArgs {
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

    /// Name of the leader-election Lease (also the prefix of the fleet and HA-role
    /// ConfigMaps). Default: loxi-ccm for the default controller, loxi-ccm-<controller name>
    /// for another (--controller-name), so that each controller elects its own leader.
    #[arg(
        long = "leader-elect-name",
        env = "LOXI_CCM_LEADER_ELECT_NAME",
        default_value = "loxi-ccm"
    )]
    pub leader_elect_name: String,

    /// How long a leader's Lease stays valid without renewal; a standby takes over after it.
    #[arg(long = "leader-elect-lease-duration", env = "LOXI_CCM_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
}

/// The admin HTTP server and the logs.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Admin server and logs")]
pub struct AdminArgs {
    /// Address of the admin HTTP server (/metrics, /healthz, /readyz, /queues). run refuses
    /// to start (exit 1, before it asks for the Lease) when it cannot listen there, e.g. when
    /// the port is in use; check reads the write queues of a controller running beside it
    /// there.
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
}

/// The boolean options (by clap id) written as kube-loxilb's Go flags: `--flag` (true),
/// `--flag=true`, `--flag=false`; false when absent. The value must follow `=`, so the next
/// argument is never taken for it.
const GO_BOOLS: &[&str] = &[
    "no_zone_name",
    "set_unique_ip",
    "ccm_mode",
    "monitor",
    "use_pod_network",
    "append_endpoints",
    "multus",
    "egress",
    "k8s_metadata",
    "loxilb_insecure_skip_tls_verify",
];

/// Makes the options of [`GO_BOOLS`] Go-style booleans, leaving the others (and their order)
/// as they are.
fn go_bools(arg: clap::Arg) -> clap::Arg {
    if !GO_BOOLS.contains(&arg.get_id().as_str()) {
        return arg;
    }
    arg.action(ArgAction::Set)
        .value_parser(clap::value_parser!(bool))
        .num_args(0..=1)
        .require_equals(true)
        .default_value("false")
        .default_missing_value("true")
}

/// A secret given as an option (the loxilb token): `Debug` never shows it, so dumping the
/// options (`RunArgs`, `Loaded`) cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(String);

impl SecretText {
    /// The value itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SecretText {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<SecretText, Self::Err> {
        Ok(SecretText(s.to_string()))
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Durations such as `500ms`, `5s`, `2m`, `1h` (a bare number is seconds).
pub use loxi_domain::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent_and_every_flag_is_explained() {
        Cli::command().debug_assert();
        command().debug_assert();
        let cmd = command();
        for name in ["run", CHECK, AUDIT] {
            let sub = cmd.find_subcommand(name).unwrap();
            for arg in sub.get_arguments() {
                if ["help", "version"].contains(&arg.get_id().as_str()) {
                    continue;
                }
                assert!(arg.get_help().is_some(), "--{} has no help", arg.get_id());
            }
        }
    }

    #[test]
    fn go_booleans_name_options_of_run() {
        let cmd = command();
        let run = cmd.find_subcommand("run").unwrap();
        for id in GO_BOOLS {
            let arg = run.get_arguments().find(|a| a.get_id() == *id);
            assert!(
                arg.is_some_and(|a| a.is_require_equals_set()),
                "{id} is not a Go-style boolean of run"
            );
        }
    }

    #[test]
    fn check_takes_the_options_of_run() {
        let cmd = command();
        let ids = |name: &str| -> Vec<String> {
            cmd.find_subcommand(name)
                .unwrap()
                .get_arguments()
                .map(|a| a.get_id().to_string())
                .collect()
        };
        assert_eq!(ids("run"), ids(CHECK));
        assert_eq!(ids("run"), ids(AUDIT));
    }

    #[test]
    fn kube_loxilb_spellings_are_accepted() {
        let cli = Cli::try_parse_from([
            "loxi-ccm",
            "run",
            "--loxiURL=http://a:11111,http://b:11111",
            "--externalCIDR=192.0.2.0/24",
            "--externalCIDR6=2001:db8::/64",
            "--cidrPools=a=10.0.0.0/24,b=10.0.1.0/24",
            "--cidr6Pools=c=2001:db8:1::/64",
            "--externalSecondaryCIDRs=10.1.0.0/24,10.2.0.0/24",
            "--setUniqueIP",
            "--setLBMode=2",
            "--monitor=true",
            "--loxilbLoadBalancerClass=example.com/lb",
            "--noZoneName",
        ])
        .unwrap();
        let Command::Run(args) = cli.command;
        assert_eq!(
            args.loxilbs.loxilb_urls,
            ["http://a:11111", "http://b:11111"]
        );
        assert_eq!(args.pools.external_cidr.as_deref(), Some("192.0.2.0/24"));
        assert_eq!(args.pools.external_cidr6.as_deref(), Some("2001:db8::/64"));
        assert_eq!(args.pools.cidr_pools, ["a=10.0.0.0/24", "b=10.0.1.0/24"]);
        assert_eq!(args.pools.cidr6_pools, ["c=2001:db8:1::/64"]);
        assert_eq!(
            args.pools.external_secondary_cidrs,
            ["10.1.0.0/24", "10.2.0.0/24"]
        );
        assert!(args.pools.set_unique_ip);
        assert!(args.services.monitor);
        assert_eq!(args.services.lb_mode, "2");
        assert_eq!(args.services.load_balancer_class, "example.com/lb");
        assert!(args.loxilbs.no_zone_name);
    }

    #[test]
    fn booleans_take_go_style_values() {
        let run = |flag: &str| {
            let cli = Cli::try_parse_from(["loxi-ccm", "run", flag]).unwrap();
            let Command::Run(args) = cli.command;
            args
        };
        for (flag, want) in [
            ("--ccm-mode", true),
            ("--ccm-mode=true", true),
            ("--ccm-mode=false", false),
        ] {
            assert_eq!(run(flag).services.ccm_mode, want, "{flag}");
        }
        // kube-loxilb's --noZoneName, every way it is written.
        for (flag, want) in [
            ("--noZoneName", true),
            ("--noZoneName=true", true),
            ("--noZoneName=false", false),
            ("--no-zone-name", true),
        ] {
            assert_eq!(run(flag).loxilbs.no_zone_name, want, "{flag}");
        }
        assert!(Cli::try_parse_from(["loxi-ccm", "run", "--monitor=maybe"]).is_err());
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let cli = Cli::try_parse_from(["loxi-ccm", "run", "--loxilb-token=s3cret-value"]).unwrap();
        let Command::Run(args) = cli.command;
        assert_eq!(
            args.loxilb_api
                .loxilb_token
                .as_ref()
                .map(SecretText::expose),
            Some("s3cret-value")
        );
        assert!(!format!("{args:?}").contains("s3cret-value"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 parsecs").is_err());
    }
}
