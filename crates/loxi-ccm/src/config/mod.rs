//! The validated configuration the controller runs with, and how it is put together.
//!
//! Every option of `loxi-ccm run` (and `check`) is taken from four layers, highest first:
//!
//! 1. the command line (`--external-cidr ...`, or a kube-loxilb alias such as `--externalCIDR`);
//! 2. its environment variable (`LOXI_CCM_EXTERNAL_CIDR`, as declared on the clap argument);
//! 3. the YAML config file named by `--config` / `LOXI_CCM_CONFIG` (key `externalCidr`, or a
//!    legacy spelling such as `externalCIDR`, see [`file_keys`]);
//! 4. the default declared on the clap argument.
//!
//! A layer replaces the option as a whole (a list given in the environment is not merged with
//! the file's list). How it works ([`load`]): clap parses the command line alone (environment
//! lookups switched off), so `ArgMatches::value_source` says exactly which options the user
//! typed. For every other option the environment, then the file, is consulted, and the value
//! found is handed back to clap as if typed (`--long=value`), in a second parse, so each value
//! goes through the very parser the flag uses. Whatever fails in that second parse is reported
//! with the layer the value came from: `environment LOXI_CCM_LB_MODE: invalid value "x": ...`,
//! `config file /etc/loxi-ccm/config.yaml: key "externalCidr": invalid value ...`. The
//! semantic checks of [`Config::from_args_with`] name the source the same way.
pub mod check;
pub mod cli;
pub mod sources;
pub mod token;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, FromArgMatches};
use loxi_domain::bgp::{BgpInput, BgpSettings};
use loxi_domain::ipam::{AddressBlock, Family};
use loxi_domain::text::shown;
use loxi_domain::{ClusterId, ControllerName, Defaults, NatMode, Pool};
use loxilb_client::{ClientConfig, ClientError, LoxilbClient, Token};
use thiserror::Error;

use crate::config::cli::{AUDIT, CHECK, RunArgs};
use crate::leader::{LeaseConfig, default_identity};
use crate::node_init::NodeInitArgs;

/// The name of the pool built from `--external-cidr`.
pub const DEFAULT_POOL: &str = "default";
/// The name of the pool built from `--external-cidr6`.
pub const DEFAULT_POOL6: &str = "default6";
/// Secondary pools are named `secondary0`, `secondary1`, ... in the order given.
pub use loxi_domain::addressing::SECONDARY_POOL_PREFIX;

/// Why the configuration cannot be used. The text always names where the bad value came from.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// One option, or one config-file key, is wrong. `origin` reads like
    /// `flag --external-cidr`, `environment LOXI_CCM_LB_MODE`,
    /// `config file /etc/loxi-ccm/config.yaml: key "lbMode"` or `config file /x.yaml`.
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    /// Options that are fine alone but not together (or one that is missing everywhere).
    #[error("{0}")]
    Conflict(String),
}

impl ConfigError {
    fn invalid(origin: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: origin.into(),
            message: message.into(),
        }
    }
}

/// One loxilb named by `--loxilb-url`: its group and its client settings.
#[derive(Debug, Clone)]
pub struct ConfiguredLoxilb {
    /// `east` for `east=http://...`, else the default group (`--zone`).
    pub group: String,
    pub client: ClientConfig,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// One per loxilb URL; all share [`Config::loxilb_token`].
    pub loxilb: Vec<ConfiguredLoxilb>,
    /// The loxilb token every client sends (redacted in Debug output), replaced in place by
    /// the re-reading of `--loxilb-token-file` or the watch of `--loxilb-token-secret`.
    pub loxilb_token: Token,
    /// Where the token comes from, when it can change while running.
    pub loxilb_token_source: TokenSource,
    /// `--loxilb-insecure-skip-tls-verify`.
    pub loxilb_insecure_skip_tls_verify: bool,
    /// The first pool holding IPv4 addresses (or the first pool when none does): what the
    /// controller used before several pools existed. Equal to one element of `pools`.
    pub pool: Pool,
    /// Every address pool, in priority order: `--external-cidr` (pool "default"), then
    /// `--cidr-pools` in the order given, then `--external-cidr6` ("default6"), then
    /// `--cidr6-pools`. Entries with the same name are one pool with several blocks (possibly
    /// of both families). Never empty; no two blocks overlap.
    pub pools: Vec<Pool>,
    /// Pools for secondary (multi-homing) addresses from `--external-secondary-cidrs`, named
    /// `secondary0`, `secondary1`, ...; one IPv4 block each. They overlap no other block.
    pub secondary_pools: Vec<Pool>,
    /// `--set-unique-ip`: one address per Service (exclusive); false = shared, as kube-loxilb.
    pub unique_ip: bool,
    pub class: String,
    /// This controller among several in one cluster (`--controller-name`, else derived from
    /// the class): docs/architecture.md#several-controllers-in-one-cluster.
    pub controller: ControllerName,
    pub ccm_mode: bool,
    pub defaults: Defaults,
    /// `--source-ranges` is not `ignore`: the Services' source ranges are enforced.
    pub enforce_source_ranges: bool,
    /// `--source-ranges=firewall`: enforced by loxilb's firewall rather than the rules'
    /// `allowedSources` (docs/configuration.md#source-ranges).
    pub source_ranges_firewall: bool,
    pub cluster_id: Option<ClusterId>,
    pub namespace: Option<String>,
    pub health_interval: Duration,
    pub drift_interval: Duration,
    pub concurrency: u16,
    /// Client-side Kubernetes API rate limit (used when the client is built, in main).
    pub kube_api: crate::k8s::api::RateLimit,
    /// Rules one loxilb instance holds at most.
    pub loxilb_max_rules: usize,
    /// Rule writes in flight to one loxilb at most (`--loxilb-write-window`).
    pub loxilb_write_window: usize,
    /// `None`: leader election off (this replica is always the leader).
    pub leader: Option<LeaseConfig>,
    pub node_init: NodeInitArgs,
    /// Read Multus network-status from Pod metadata.
    pub multus: bool,
    /// `None`: BGP off (`--bgp-local-as` unset or 0).
    pub bgp: Option<BgpSettings>,
    /// `Some` without `--loxilb-url`: the loxilbs are followed in the cluster.
    pub discovery: Option<Discovery>,
    /// `Some` with BGP on: the BGP-peer-only loxilbs are followed in the cluster
    /// (`--loxilb-peer-service`, docs/fleet.md#bgp-peer-only-loxilbs).
    pub peer_discovery: Option<Discovery>,
    /// Timeout, token and CA for loxilbs that join later (discovered, `LoxiURL`).
    pub loxilb_template: ClientConfig,
    /// The default group's name (`--zone`, kube-loxilb's zone; `llb` unless set): the group
    /// of loxilbs named without one, and the prefix of its HA instances (`llb-inst0`, ...).
    pub zone: String,
    /// HA instances per group (`--num-zone-instances`: `<zone>-inst0`, ...).
    pub zone_instances: u16,
    /// `None`: no HA roles (`--set-roles` unset).
    pub roles: Option<loxi_domain::roles::HaSettings>,
    /// With BGP: how long a MASTER cut off from its BGP peers keeps the role while another
    /// loxilb of its group reaches them (`--ha-bgp-hold`).
    pub ha_bgp_hold: std::time::Duration,
    /// Namespace and name of the ConfigMap recording the HA masters: the leader-election
    /// namespace, `<leader-elect-name>-ha-roles`.
    pub roles_record: (String, String),
    /// Namespace and name of the ConfigMap showing the fleet, group by group: the
    /// leader-election namespace, `<leader-elect-name>-fleet`.
    pub fleet_record: (String, String),
    /// `--bgp-crds`: serve kube-loxilb's BGP custom resources (only with `bgp`).
    pub bgp_crds: bool,
}

/// Where the loxilb token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// No token, or `--loxilb-token` (fixed for the life of the process).
    Fixed,
    /// `--loxilb-token-file`, re-read while running ([`token::reread_file`]).
    File(PathBuf),
    /// `--loxilb-token-secret`, read at start-up and watched ([`token::watch_secret`]).
    Secret(token::SecretRef),
}

// ---------------------------------------------------------------------------------------------
// Where each option came from.

/// The layer an option's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Env(String),
    File { path: PathBuf, key: String },
    Default,
}

impl Origin {
    /// `flag --lb-mode`, `environment LOXI_CCM_LB_MODE`, `config file X: key "lbMode"`,
    /// `default of --lb-mode`.
    pub fn describe(&self, long: &str) -> String {
        match self {
            Origin::Flag => format!("flag --{long}"),
            Origin::Env(var) => format!("environment {var}"),
            Origin::File { path, key } => {
                format!("config file {}: key {}", path.display(), shown(key))
            }
            Origin::Default => format!("default of --{long}"),
        }
    }
}

/// The origin of every option, by clap argument id.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    /// id -> (long flag name, origin)
    entries: HashMap<String, (String, Origin)>,
}

impl Origins {
    fn insert(&mut self, id: &str, long: &str, origin: Origin) {
        self.entries
            .insert(id.to_string(), (long.to_string(), origin));
    }

    /// Where the option with clap id `id` came from ([`Origin::Default`] when unknown).
    pub fn of(&self, id: &str) -> Origin {
        self.entries
            .get(id)
            .map(|(_, o)| o.clone())
            .unwrap_or(Origin::Default)
    }

    /// The source of option `id` as error messages name it. Without recorded origins (a
    /// [`Config::from_args`] caller) simply `--long-name`.
    pub fn describe(&self, id: &str) -> String {
        match self.entries.get(id) {
            Some((long, origin)) => origin.describe(long),
            None => format!("--{}", long_of(id)),
        }
    }

    fn by_long(&self, long: &str) -> Option<&Origin> {
        self.entries
            .values()
            .find(|(l, _)| l == long)
            .map(|(_, o)| o)
    }
}

/// The long flag of the `run` option with clap id `id`.
fn long_of(id: &str) -> String {
    crate::config::cli::command()
        .find_subcommand("run")
        .and_then(|run| {
            run.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_long().map(str::to_string))
        })
        .unwrap_or_else(|| id.replace('_', "-"))
}

// ---------------------------------------------------------------------------------------------
// Config-file keys.

/// File keys accepted besides the camelCase of the long flag: kube-loxilb's flag and config
/// spellings, and loxi-ccm (Go)'s ConfigMap keys (`apiServerURL` is its list of loxilb API
/// URLs, `externalIPcidr` its pool).
const LEGACY_KEYS: &[(&str, &[&str])] = &[
    ("loxilb_urls", &["loxiURL", "apiServerURL"]),
    ("external_cidr", &["externalCIDR", "externalIPcidr"]),
    ("external_cidr6", &["externalCIDR6"]),
    ("cidr_pools", &["cidrPools"]),
    ("cidr6_pools", &["cidr6Pools"]),
    (
        "external_secondary_cidrs",
        &["externalSecondaryCIDRs", "ExternalSecondaryCIDRs"],
    ),
    ("set_unique_ip", &["setUniqueIP", "setExclIPAM"]),
    ("bgp_local_as", &["setBGP"]),
    ("bgp_listen_port", &["listenBGPPort"]),
    ("bgp_peers", &["extBGPPeers"]),
    ("bgp_multihop", &["eBGPMultiHop"]),
    ("bgp_crds", &["enableBGPCRDs"]),
    ("lb_mode", &["setLBMode"]),
    ("monitor", &["monitor"]),
    ("use_pod_network", &["usePodNetwork"]),
    ("load_balancer_class", &["loxilbLoadBalancerClass"]),
];

/// `east=http://a:11111` -> (`east`, `http://a:11111`); a plain URL belongs to `default`.
fn split_group<'a>(entry: &'a str, default: &'a str) -> (&'a str, &'a str) {
    match entry.split_once('=') {
        Some((group, url)) if !group.contains("://") && !group.contains('/') => {
            (group.trim(), url.trim())
        }
        _ => (default, entry),
    }
}

/// kube-loxilb settings (flags and config-file keys) whose feature loxi-ccm does not have
/// yet. Refused with an explanation rather than ignored: silently dropping e.g.
/// `privateCIDR` would change what loxilb is told. What each did and what to do meanwhile:
/// [`NOT_YET_SUPPORTED_DOC`].
pub const NOT_YET_SUPPORTED: &[&str] = &[
    "externalSecondaryCIDRs6",
    "privateCIDR",
    "appendEPs",
    "gatewayAPI",
    "loxilbGatewayClass",
];

/// The section of the documentation the refusal of a [`NOT_YET_SUPPORTED`] setting names.
pub const NOT_YET_SUPPORTED_DOC: &str = "docs/migration.md#what-is-not-supported-yet";

/// kube-loxilb / loxi-ccm (Go) config-file keys that mean nothing here (its own process
/// settings); refused by name as well, so that a reused file is read knowingly.
const WITHOUT_MEANING: &[&str] = &[
    "hostProcPathPrefix",
    "withNamespace",
    "nodePortServiceVirtIP",
    "clientConnection",
];

/// Why the kube-loxilb / loxi-ccm (Go) setting `name` is refused, if it is one loxi-ccm
/// knows and does not take.
fn unsupported(name: &str) -> Option<String> {
    if NOT_YET_SUPPORTED.contains(&name) {
        return Some(format!(
            "kube-loxilb's {name} is not supported by loxi-ccm yet: remove it \
             ({NOT_YET_SUPPORTED_DOC} says what it did and what to do instead)"
        ));
    }
    WITHOUT_MEANING.contains(&name).then(|| {
        format!(
            "{name} is a kube-loxilb / loxi-ccm (Go) setting that means nothing to loxi-ccm: \
             remove it (docs/migration.md#from-kube-loxilb)"
        )
    })
}

/// A command line refused by clap because of an argument that is a [`NOT_YET_SUPPORTED`]
/// kube-loxilb flag (or a [`WITHOUT_MEANING`] key written as a flag): the error that says
/// so, naming the flag, instead of clap's "unexpected argument".
fn unsupported_flag(e: &clap::Error, argv: &[OsString]) -> Option<LoadError> {
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = arg.strip_prefix("--")?;
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    let message = unsupported(name)?;
    let mode = match argv
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .and_then(|a| a.to_str())
    {
        Some(CHECK) => Mode::Check,
        Some(AUDIT) => Mode::Audit,
        _ => Mode::Run,
    };
    Some(LoadError::Invalid {
        mode,
        error: ConfigError::invalid(format!("flag --{name}"), message),
    })
}

/// Where the loxilbs are found in the cluster (docs/fleet.md#discovery).
#[derive(Debug, Clone)]
pub struct Discovery {
    /// The Service whose EndpointSlices list the loxilbs.
    pub service: String,
    /// `None`: any namespace.
    pub namespace: Option<String>,
    /// Their API port (when a slice does not give another: `fleet::discovery`).
    pub port: u16,
    /// `--loxilb-discovery-scheme https`: their URLs are `https://`.
    pub https: bool,
    /// `--loxilb-discovery-zones`: each loxilb's group is its topology zone.
    pub by_zone: bool,
}

impl Discovery {
    /// The API URL of the loxilb at `address`, `port`.
    pub fn url(&self, address: &std::net::IpAddr, port: u16) -> String {
        let scheme = if self.https { "https" } else { "http" };
        match address {
            std::net::IpAddr::V4(a) => format!("{scheme}://{a}:{port}"),
            std::net::IpAddr::V6(a) => format!("{scheme}://[{a}]:{port}"),
        }
    }
}

/// `loxilb-url` -> `loxilbUrl`, `external-cidr6` -> `externalCidr6`.
pub fn camel_case(long: &str) -> String {
    let mut out = String::with_capacity(long.len());
    for (i, part) in long.split('-').filter(|p| !p.is_empty()).enumerate() {
        if i == 0 {
            out.push_str(part);
        } else {
            let mut chars = part.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        }
    }
    out
}

/// The config-file keys of an option: the camelCase of its long flag first, then legacy
/// spellings. Empty for `--config` itself (a config file cannot name another one) and for
/// `--help` / `--version`.
pub fn file_keys(arg: &Arg) -> Vec<String> {
    let id = arg.get_id().as_str();
    if matches!(id, "config" | "help" | "version") {
        return Vec::new();
    }
    let Some(long) = arg.get_long() else {
        return Vec::new();
    };
    let mut keys = vec![camel_case(long)];
    for (_, extra) in LEGACY_KEYS.iter().filter(|(i, _)| *i == id) {
        for k in *extra {
            if !keys.iter().any(|have| have == k) {
                keys.push(k.to_string());
            }
        }
    }
    keys
}

/// Values found in the config file, by clap id: (the key used, the values as text).
#[derive(Debug, Default)]
struct FileLayer {
    path: PathBuf,
    values: HashMap<String, (String, Vec<String>)>,
}

fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

fn parse_file(path: &Path, text: &str, args: &[&Arg]) -> Result<FileLayer, ConfigError> {
    let at = format!("config file {}", path.display());
    let doc: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::invalid(&at, format!("not valid YAML: {e}")))?
    };
    let map = match doc {
        serde_json::Value::Null => serde_json::Map::new(),
        serde_json::Value::Object(m) => m,
        other => {
            return Err(ConfigError::invalid(
                &at,
                format!(
                    "expected a mapping of option keys to values at the top level, found {}",
                    json_kind(&other)
                ),
            ));
        }
    };
    let mut by_key: HashMap<String, &Arg> = HashMap::new();
    for arg in args {
        for key in file_keys(arg) {
            by_key.insert(key, arg);
        }
    }
    let mut layer = FileLayer {
        path: path.to_path_buf(),
        values: HashMap::new(),
    };
    for (key, value) in map {
        let Some(arg) = by_key.get(key.as_str()) else {
            if let Some(why) = unsupported(&key) {
                return Err(ConfigError::invalid(
                    format!("{at}: key {}", shown(&key)),
                    why,
                ));
            }
            let hint = suggest(&key, by_key.keys().map(String::as_str))
                .map(|k| format!(" (did you mean {k:?}?)"))
                .unwrap_or_default();
            return Err(ConfigError::invalid(
                &at,
                format!("unknown key {}{hint}", shown(&key)),
            ));
        };
        let origin = format!("{at}: key {}", shown(&key));
        let Some(values) = scalars(&value).map_err(|m| ConfigError::invalid(&origin, m))? else {
            continue; // `key:` with no value: as if absent
        };
        if values.is_empty() && takes_many(arg) {
            continue;
        }
        if !takes_many(arg) && values.len() != 1 {
            return Err(ConfigError::invalid(
                &origin,
                format!("expects one value, got a list of {}", values.len()),
            ));
        }
        let id = arg.get_id().to_string();
        if let Some((other, _)) = layer.values.get(&id) {
            let (first, second) = if *other < key {
                (other.as_str(), key.as_str())
            } else {
                (key.as_str(), other.as_str())
            };
            return Err(ConfigError::invalid(
                &at,
                format!(
                    "keys {} and {} both set --{}: keep one",
                    shown(first),
                    shown(second),
                    arg.get_long().unwrap_or(&id)
                ),
            ));
        }
        layer.values.insert(id, (key, values));
    }
    Ok(layer)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// A YAML value as the text values clap would receive: a scalar is one value, a list of
/// scalars several. `None` for null.
fn scalars(v: &serde_json::Value) -> Result<Option<Vec<String>>, String> {
    fn one(v: &serde_json::Value) -> Result<String, String> {
        match v {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Bool(b) => Ok(b.to_string()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            other => Err(format!(
                "expected a value or a list of values, found {} in the list",
                json_kind(other)
            )),
        }
    }
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Array(items) => {
            items.iter().map(one).collect::<Result<_, _>>().map(Some)
        }
        serde_json::Value::Object(_) => {
            Err("expected a value or a list of values, found a mapping".to_string())
        }
        scalar => Ok(Some(vec![one(scalar)?])),
    }
}

/// The known key closest to a mistyped one: at most 2 edits apart ignoring case, the
/// exact-case distance breaking ties.
fn suggest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    known
        .filter_map(|k| {
            let d = edit_distance(&lower, &k.to_ascii_lowercase());
            (d <= 2).then(|| ((d, edit_distance(key, k)), k))
        })
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

// ---------------------------------------------------------------------------------------------
// Loading: command line > environment > config file > default.

/// Which subcommand was invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Check,
    Audit,
}

/// The options of `run` / `check`, every layer applied, and where each came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub mode: Mode,
    pub args: RunArgs,
    pub origins: Origins,
    /// The config file read, if any.
    pub config_file: Option<PathBuf>,
}

impl Loaded {
    /// Validates the options into the controller's [`Config`].
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::from_args_with(&self.args, &self.origins)
    }
}

#[derive(Debug, Error)]
pub enum LoadError {
    /// Command-line syntax, or `--help` / `--version`: clap renders it (`err.exit()`).
    #[error("{0}")]
    Clap(clap::Error),
    /// A value from the environment or the config file is wrong, or the file is.
    #[error("{error}")]
    Invalid { mode: Mode, error: ConfigError },
}

/// Parses `argv` (program name first) with every layer. `env` looks up environment variables
/// (`|k| std::env::var_os(k)` in the binary; a map in tests).
pub fn load<I, T>(argv: I, env: &dyn Fn(&str) -> Option<OsString>) -> Result<Loaded, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let full = crate::config::cli::command();
    // The same tree without environment lookups: clap then sees the command line only, and
    // the layers below it are applied here.
    let parser = full
        .clone()
        .mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None)));

    let first = match parser.clone().try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            let e = match e.kind() {
                // Rendered by the full tree so that help shows the environment variables.
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    full.clone().try_get_matches_from(&argv).err().unwrap_or(e)
                }
                _ => e,
            };
            if let Some(refused) = unsupported_flag(&e, &argv) {
                return Err(refused);
            }
            return Err(LoadError::Clap(e));
        }
    };
    let Some((name, sub)) = first.subcommand() else {
        // clap requires a subcommand; this is only reachable if that changes.
        return Err(LoadError::Clap(
            full.clone()
                .error(ErrorKind::MissingSubcommand, "a subcommand is required"),
        ));
    };
    let mode = match name {
        CHECK => Mode::Check,
        AUDIT => Mode::Audit,
        _ => Mode::Run,
    };
    let invalid = |error: ConfigError| LoadError::Invalid { mode, error };
    let sub_cmd = full
        .find_subcommand(name)
        .expect("the parsed subcommand exists");
    let args: Vec<&Arg> = sub_cmd
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let typed = |id: &str| sub.value_source(id) == Some(ValueSource::CommandLine);

    // The config file itself: flag, else environment.
    let config_env = args
        .iter()
        .find(|a| a.get_id() == "config")
        .and_then(|a| a.get_env())
        .and_then(|e| e.to_str())
        .unwrap_or("LOXI_CCM_CONFIG")
        .to_string();
    let (config_path, config_origin) = if typed("config") {
        (sub.get_one::<PathBuf>("config").cloned(), Origin::Flag)
    } else if let Some(v) = env(&config_env) {
        (Some(PathBuf::from(v)), Origin::Env(config_env.clone()))
    } else {
        (None, Origin::Default)
    };
    let file = match &config_path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                invalid(ConfigError::invalid(
                    format!("config file {}", path.display()),
                    format!(
                        "cannot be read: {e} (named by {})",
                        config_origin.describe("config")
                    ),
                ))
            })?;
            Some(parse_file(path, &text, &args).map_err(invalid)?)
        }
        None => None,
    };

    let mut origins = Origins::default();
    let mut extra: Vec<OsString> = Vec::new();
    for arg in &args {
        let id = arg.get_id().as_str();
        let long = arg.get_long().unwrap_or(id);
        if id == "config" {
            origins.insert(id, long, config_origin.clone());
            continue;
        }
        if typed(id) {
            origins.insert(id, long, Origin::Flag);
            continue;
        }
        let from_env = arg
            .get_env()
            .and_then(|var| var.to_str())
            .and_then(|var| env(var).map(|value| (var, value)));
        let (values, origin) = match from_env {
            Some((var, value)) => {
                let origin = Origin::Env(var.to_string());
                let value = value.into_string().map_err(|_| {
                    invalid(ConfigError::invalid(
                        origin.describe(long),
                        "the value is not valid UTF-8",
                    ))
                })?;
                (vec![value], origin)
            }
            None => match file.as_ref().and_then(|f| f.values.get(id).map(|v| (f, v))) {
                Some((f, (key, values))) => (
                    values.clone(),
                    Origin::File {
                        path: f.path.clone(),
                        key: key.clone(),
                    },
                ),
                None => {
                    origins.insert(id, long, Origin::Default);
                    continue;
                }
            },
        };
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            // A flag that takes no value on the command line.
            for v in &values {
                match v.trim() {
                    "true" => extra.push(format!("--{long}").into()),
                    "false" => {}
                    _ => {
                        return Err(invalid(ConfigError::invalid(
                            origin.describe(long),
                            format!("invalid value {}: expected true or false", shown(v)),
                        )));
                    }
                }
            }
        } else {
            extra.extend(
                values
                    .iter()
                    .map(|v| OsString::from(format!("--{long}={v}"))),
            );
        }
        origins.insert(id, long, origin);
    }

    let mut argv2 = argv;
    argv2.extend(extra);
    let second = parser
        .try_get_matches_from(&argv2)
        .map_err(|e| attribute(e, &origins, mode))?;
    let sub2 = second
        .subcommand_matches(name)
        .expect("the same subcommand parses again");
    let args = RunArgs::from_arg_matches(sub2).map_err(LoadError::Clap)?;
    Ok(Loaded {
        mode,
        args,
        origins,
        config_file: config_path,
    })
}

fn context_strings(e: &clap::Error, kind: ContextKind) -> Vec<String> {
    match e.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    }
}

/// Turns an error of the second parse into one naming the environment variable or the
/// config-file key the bad value came from.
fn attribute(e: clap::Error, origins: &Origins, mode: Mode) -> LoadError {
    let mut involved: Vec<(String, Origin)> = Vec::new();
    for kind in [ContextKind::InvalidArg, ContextKind::PriorArg] {
        for text in context_strings(&e, kind) {
            // "--lb-mode <LB_MODE>", "--monitor[=<MONITOR>]": the flag is the leading word.
            let long = text.strip_prefix("--").map(|rest| {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .unwrap_or(rest.len());
                &rest[..end]
            });
            if let Some(long) = long
                && let Some(origin) = origins.by_long(long)
            {
                involved.push((long.to_string(), origin.clone()));
            }
        }
    }
    let Some((long, origin)) = involved
        .iter()
        .find(|(_, o)| !matches!(o, Origin::Flag | Origin::Default))
        .cloned()
    else {
        return LoadError::Clap(e);
    };
    let error = match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let value = context_strings(&e, ContextKind::InvalidValue)
                .into_iter()
                .next()
                .unwrap_or_default();
            let valid = context_strings(&e, ContextKind::ValidValue);
            let reason = if !valid.is_empty() {
                format!("expected one of {}", valid.join(", "))
            } else if let Some(source) = std::error::Error::source(&e) {
                source.to_string()
            } else {
                clap_sentence(&e)
            };
            ConfigError::invalid(
                origin.describe(&long),
                format!("invalid value {}: {reason}", shown(&value)),
            )
        }
        _ => {
            let whence: Vec<String> = involved
                .iter()
                .map(|(l, o)| format!("--{l} from {}", o.describe(l)))
                .collect();
            ConfigError::Conflict(format!("{} ({})", clap_sentence(&e), whence.join("; ")))
        }
    };
    LoadError::Invalid { mode, error }
}

/// The first line of a clap error without its `error: ` prefix.
fn clap_sentence(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let line = rendered.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

// ---------------------------------------------------------------------------------------------
// Validation.

/// `--leader-elect-name`'s default: the default controller's Lease.
const DEFAULT_LEASE_NAME: &str = "loxi-ccm";

impl Config {
    /// Validates options whose origins are not known (tests, embedders): errors name the flag.
    pub fn from_args(args: &RunArgs) -> Result<Config, ConfigError> {
        Config::from_args_with(args, &Origins::default())
    }

    /// Validates the options; every error names the option and the layer its value came from.
    pub fn from_args_with(args: &RunArgs, origins: &Origins) -> Result<Config, ConfigError> {
        let bad = |id: &str, value: &str, reason: &str| {
            ConfigError::invalid(
                origins.describe(id),
                format!("invalid value {}: {reason}", shown(value)),
            )
        };
        let mode: NatMode = args.lb_mode.trim().parse().map_err(|()| {
            bad(
                "lb_mode",
                &args.lb_mode,
                "expected default, onearm, fullnat, dsr, fullproxy, hostonearm or 0-5",
            )
        })?;
        let cluster_id = match args.cluster_id.as_deref() {
            Some(id) => Some(
                ClusterId::new(id)
                    .map_err(|_| bad("cluster_id", id, "expected 1-32 characters of [a-z0-9-]"))?,
            ),
            None => None,
        };
        if let Some(ns) = &args.namespace
            && ns.trim().is_empty()
        {
            return Err(bad("namespace", ns, "must not be empty"));
        }
        if args.load_balancer_class.trim().is_empty() {
            return Err(bad(
                "load_balancer_class",
                &args.load_balancer_class,
                "must not be empty",
            ));
        }
        if args.concurrency == 0 {
            return Err(bad("concurrency", "0", "must be at least 1"));
        }
        if args.loxilb_write_window == 0 {
            return Err(bad("loxilb_write_window", "0", "must be at least 1"));
        }
        if !args.kube_api_qps.is_finite() || args.kube_api_qps < 0.0 {
            return Err(bad(
                "kube_api_qps",
                &args.kube_api_qps.to_string(),
                "must be 0 (no limit) or a positive number of requests per second",
            ));
        }
        if args.kube_api_qps > 0.0 && args.kube_api_burst == 0 {
            return Err(bad(
                "kube_api_burst",
                "0",
                "must be at least 1 when --kube-api-qps sets a limit",
            ));
        }
        for (id, d) in [
            ("loxilb_timeout", args.loxilb_timeout),
            ("health_interval", args.health_interval),
            ("drift_interval", args.drift_interval),
        ] {
            if d.is_zero() {
                return Err(bad(id, &format!("{d:?}"), "must be longer than 0"));
            }
        }
        let controller = match args.controller_name.as_deref() {
            Some(name) => ControllerName::new(name.trim()).map_err(|_| {
                bad(
                    "controller_name",
                    name,
                    "expected 1-40 characters of [a-z0-9-], starting and ending with a letter \
                     or digit, or \"default\"",
                )
            })?,
            None => ControllerName::for_class(args.load_balancer_class.trim()),
        };
        // Each controller elects its own leader: two controllers on one Lease would leave one
        // of them standing by for good.
        let lease_name = if matches!(origins.of("leader_elect_name"), Origin::Default)
            && args.leader_elect_name == DEFAULT_LEASE_NAME
        {
            controller.suffixed(DEFAULT_LEASE_NAME)
        } else {
            args.leader_elect_name.clone()
        };
        if args.leader_elect && args.leader_elect_lease_duration < Duration::from_secs(1) {
            return Err(bad(
                "leader_elect_lease_duration",
                &format!("{:?}", args.leader_elect_lease_duration),
                "must be at least 1s (the Lease counts in whole seconds)",
            ));
        }
        if args.leader_elect {
            for (id, v) in [
                ("leader_elect_namespace", &args.leader_elect_namespace),
                ("leader_elect_name", &args.leader_elect_name),
            ] {
                if v.trim().is_empty() {
                    return Err(bad(id, v, "must not be empty"));
                }
            }
            // Refused here rather than by the API server on every attempt to take the Lease.
            if !is_dns_label(&args.leader_elect_namespace) {
                return Err(bad(
                    "leader_elect_namespace",
                    &args.leader_elect_namespace,
                    "not a namespace name (RFC 1123 label: at most 63 characters of [a-z0-9-], \
                     starting and ending with a letter or digit)",
                ));
            }
            if !loxi_domain::address_name::is_object_name(&args.leader_elect_name) {
                return Err(bad(
                    "leader_elect_name",
                    &args.leader_elect_name,
                    "not a Lease name (RFC 1123 subdomain: at most 253 characters of [a-z0-9-.], \
                     starting and ending with a letter or digit)",
                ));
            }
        }

        let ca_pem = match &args.loxilb_ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    ConfigError::invalid(
                        origins.describe("loxilb_ca_file"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                crate::k8s::api::check_ca_bundle(&pem, path).map_err(|message| {
                    ConfigError::invalid(origins.describe("loxilb_ca_file"), message)
                })?;
                Some(pem)
            }
            None => None,
        };
        let given: Vec<&str> = [
            ("loxilb_token", args.loxilb_token.is_some()),
            ("loxilb_token_file", args.loxilb_token_file.is_some()),
            ("loxilb_token_secret", args.loxilb_token_secret.is_some()),
        ]
        .into_iter()
        .filter_map(|(id, set)| set.then_some(id))
        .collect();
        if given.len() > 1 {
            let by: Vec<String> = given.iter().map(|id| origins.describe(id)).collect();
            return Err(ConfigError::Conflict(format!(
                "the loxilb token is given more than once, by {}: keep one",
                by.join(" and by ")
            )));
        }
        // This process's identity: its leader-election identity, and sent to every loxilb
        // with each call (`loxilb_client::IDENTITY_HEADER`) so that a write can be traced
        // to the replica that sent it.
        let identity = default_identity();
        let token = Token::default();
        let token_source = if let Some(value) = &args.loxilb_token {
            let value = value.expose();
            if value.trim().is_empty() {
                return Err(ConfigError::invalid(
                    origins.describe("loxilb_token"),
                    "is empty",
                ));
            }
            token.set(Some(value));
            TokenSource::Fixed
        } else if let Some(path) = &args.loxilb_token_file {
            let value = token::read_token_file(path)
                .map_err(|m| ConfigError::invalid(origins.describe("loxilb_token_file"), m))?;
            token.set(Some(&value));
            TokenSource::File(path.clone())
        } else if let Some(text) = &args.loxilb_token_secret {
            let secret = token::SecretRef::parse(text)
                .map_err(|m| bad("loxilb_token_secret", text, m.as_str()))?;
            TokenSource::Secret(secret)
        } else {
            TokenSource::Fixed
        };

        let zone = args.zone.trim();
        if !loxi_domain::placement::is_group_name(zone) {
            return Err(bad(
                "zone",
                zone,
                "expected a group name: lower-case letters, digits and '-', at most 50 characters",
            ));
        }
        let mut loxilb = Vec::new();
        for entry in args
            .loxilb_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
        {
            let (group, url) = split_group(entry, zone);
            if !loxi_domain::placement::is_group_name(group) {
                return Err(bad(
                    "loxilb_urls",
                    entry,
                    "the group before '=' must be lower-case letters, digits and '-', at most 50 characters",
                ));
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(bad(
                    "loxilb_urls",
                    url,
                    "a loxilb URL must start with http:// or https://",
                ));
            }
            let mut c = ClientConfig::new(url);
            c.timeout = args.loxilb_timeout;
            c.token = token.clone();
            c.ca_pem = ca_pem.clone();
            c.insecure_skip_tls_verify = args.loxilb_insecure_skip_tls_verify;
            c.identity = Some(identity.clone());
            // Building the client checks the URL (host present) and the CA bundle.
            match LoxilbClient::new(c.clone()) {
                Ok(_) => {}
                Err(ClientError::Config(msg)) if msg.contains("CA bundle") => {
                    return Err(ConfigError::invalid(
                        origins.describe("loxilb_ca_file"),
                        msg,
                    ));
                }
                Err(e) => return Err(bad("loxilb_urls", url, &e.to_string())),
            }
            loxilb.push(ConfiguredLoxilb {
                group: group.to_string(),
                client: c,
            });
        }
        // The Service (and namespace) whose EndpointSlices list loxilbs (docs/fleet.md#discovery).
        let followed = |service_id: &str,
                        service: &str,
                        namespace_id: &str,
                        namespace: Option<&str>|
         -> Result<Discovery, ConfigError> {
            let service = service.trim();
            if !loxi_domain::address_name::is_object_name(service) {
                return Err(bad(service_id, service, "expected the name of a Service"));
            }
            let namespace = namespace.map(str::trim).filter(|n| !n.is_empty());
            if let Some(ns) = namespace
                && !is_dns_label(ns)
            {
                return Err(bad(namespace_id, ns, "expected a namespace name"));
            }
            if args.loxilb_port == 0 {
                return Err(bad("loxilb_port", "0", "expected a port, 1-65535"));
            }
            Ok(Discovery {
                service: service.to_string(),
                namespace: namespace.map(str::to_string),
                port: args.loxilb_port,
                https: args.loxilb_discovery_scheme == "https",
                by_zone: args.loxilb_discovery_zones,
            })
        };
        let discovery = if loxilb.is_empty() {
            Some(followed(
                "loxilb_service",
                &args.loxilb_service,
                "loxilb_service_namespace",
                args.loxilb_service_namespace.as_deref(),
            )?)
        } else {
            None
        };

        // Discovered loxilbs and LoxiURL ones: the same timeout, token and TLS settings as
        // the configured URLs.
        let mut loxilb_template = ClientConfig::new("http://loxilb");
        loxilb_template.timeout = args.loxilb_timeout;
        loxilb_template.token = token.clone();
        loxilb_template.ca_pem = ca_pem.clone();
        loxilb_template.insecure_skip_tls_verify = args.loxilb_insecure_skip_tls_verify;
        loxilb_template.identity = Some(identity.clone());

        let (pools, secondary_pools) = build_pools(args, origins)?;
        let bgp = bgp_settings(args, origins)?;
        // BGP-peer-only loxilbs get BGP settings only: followed only with BGP on.
        let peer_discovery = match &bgp {
            Some(_) => Some(followed(
                "loxilb_peer_service",
                &args.loxilb_peer_service,
                "loxilb_peer_service_namespace",
                args.loxilb_peer_service_namespace.as_deref(),
            )?),
            None => None,
        };
        let roles = match args.set_roles.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(vip) => {
                if vip.parse::<std::net::IpAddr>().is_err() {
                    return Err(bad(
                        "set_roles",
                        vip,
                        "the HA VIP must be an IP address (0.0.0.0 for none)",
                    ));
                }
                Some(loxi_domain::roles::HaSettings {
                    vip: vip.to_string(),
                    instance_count: args.num_zone_instances,
                    excluded: non_empty(&args.exclude_role_list)
                        .map(str::to_string)
                        .collect(),
                })
            }
        };
        if args.bgp_crds && bgp.is_none() {
            return Err(ConfigError::invalid(
                origins.describe("bgp_crds"),
                "the BGP custom resources need BGP on: set the local AS number (--bgp-local-as, \
                 kube-loxilb: --setBGP)"
                    .to_string(),
            ));
        }
        if bgp.is_some() && args.num_zone_instances > 1 {
            // docs/fleet.md#several-ha-instances-and-bgp: seen on loxilb 0.9.8.
            return Err(ConfigError::invalid(
                origins.describe("num_zone_instances"),
                format!(
                    "{} HA instances with BGP on: loxilb advertises every address with the BGP \
                     preference (MED) of llb-inst0's role, whatever the HA instance of its rule, \
                     so the router sends the traffic of the other instances' addresses to a \
                     loxilb that is not their MASTER and they are unreachable; use one HA \
                     instance per group (--num-zone-instances=1) with BGP",
                    args.num_zone_instances
                ),
            ));
        }
        let pool = pools
            .iter()
            .find(|p| p.size(Family::V4) > 0)
            .unwrap_or(&pools[0])
            .clone();

        Ok(Config {
            loxilb,
            loxilb_token: token,
            loxilb_token_source: token_source,
            loxilb_insecure_skip_tls_verify: args.loxilb_insecure_skip_tls_verify,
            pool,
            pools,
            secondary_pools,
            unique_ip: args.set_unique_ip,
            class: args.load_balancer_class.clone(),
            controller,
            ccm_mode: args.ccm_mode,
            defaults: Defaults {
                mode,
                monitor: args.monitor,
                use_pod_network: args.use_pod_network,
            },
            enforce_source_ranges: args.source_ranges != "ignore",
            source_ranges_firewall: args.source_ranges == "firewall",
            cluster_id,
            namespace: args.namespace.clone(),
            health_interval: args.health_interval,
            drift_interval: args.drift_interval,
            concurrency: args.concurrency,
            kube_api: crate::k8s::api::RateLimit {
                qps: args.kube_api_qps,
                burst: args.kube_api_burst,
            },
            loxilb_max_rules: args.loxilb_max_rules,
            loxilb_write_window: args.loxilb_write_window,
            leader: args.leader_elect.then(|| {
                let mut lease =
                    LeaseConfig::new(&args.leader_elect_namespace, &lease_name, identity.clone());
                lease.lease_duration = args.leader_elect_lease_duration;
                // client-go's proportions: renew within 2/3 of the lease, retry at 2/15.
                lease.renew_deadline = args.leader_elect_lease_duration * 2 / 3;
                lease.retry_period = args.leader_elect_lease_duration * 2 / 15;
                lease
            }),
            node_init: args.node_init.clone(),
            multus: args.multus,
            bgp,
            discovery,
            peer_discovery,
            loxilb_template,
            zone: zone.to_string(),
            zone_instances: args.num_zone_instances,
            roles,
            fleet_record: (
                args.leader_elect_namespace.clone(),
                format!("{lease_name}-fleet"),
            ),
            ha_bgp_hold: args.ha_bgp_hold,
            roles_record: (
                args.leader_elect_namespace.clone(),
                format!("{lease_name}-ha-roles"),
            ),
            bgp_crds: args.bgp_crds,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// BGP.

/// The BGP settings from the flags (`loxi_domain::bgp`), a refusal naming the option it came
/// from.
fn bgp_settings(args: &RunArgs, origins: &Origins) -> Result<Option<BgpSettings>, ConfigError> {
    let peers = args.bgp_peers.join(",");
    let input = BgpInput {
        local_asn: args.bgp_local_as.as_deref(),
        router_id: args.bgp_router_id.as_deref(),
        listen_port: args.bgp_listen_port,
        multihop: args.bgp_multihop,
        peers: (!peers.is_empty()).then_some(peers.as_str()),
    };
    BgpSettings::from_input(&input).map_err(|e| {
        let id = match e.field.as_str() {
            loxi_domain::bgp::FIELD_LOCAL_ASN => "bgp_local_as",
            loxi_domain::bgp::FIELD_ROUTER_ID => "bgp_router_id",
            loxi_domain::bgp::FIELD_LISTEN_PORT => "bgp_listen_port",
            _ => "bgp_peers",
        };
        ConfigError::invalid(origins.describe(id), e.to_string())
    })
}

// ---------------------------------------------------------------------------------------------
// Pools.

/// One block of one pool, with the text and the source it came from (for messages).
struct BlockEntry {
    pool: String,
    block: AddressBlock,
    origin: String,
}

fn non_empty(items: &[String]) -> impl Iterator<Item = &str> {
    items.iter().map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// Whether `name` is an RFC 1123 label, as namespace names must be.
fn is_dns_label(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-')
}

fn valid_pool_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Parses one block of the expected family; `value` is the text as given (for messages).
fn parse_block(
    origins: &Origins,
    id: &str,
    value: &str,
    block_text: &str,
    family: Family,
    other_family_hint: &str,
) -> Result<AddressBlock, ConfigError> {
    let origin = origins.describe(id);
    let block: AddressBlock = block_text
        .parse()
        .map_err(|e: loxi_domain::ipam::BlockError| {
            ConfigError::invalid(
                &origin,
                format!("invalid value {}: {}", shown(value), e.reason),
            )
        })?;
    if block.family() != family {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: {block_text} is {}; {} blocks go in {other_family_hint}",
                shown(value),
                block.family(),
                block.family()
            ),
        ));
    }
    Ok(block)
}

/// `name=block` of --cidr-pools / --cidr6-pools.
fn named_block(
    origins: &Origins,
    id: &str,
    item: &str,
    family: Family,
    other_family_hint: &str,
) -> Result<BlockEntry, ConfigError> {
    let origin = origins.describe(id);
    let Some((name, text)) = item.split_once('=') else {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: expected <pool name>=<CIDR or range>",
                shown(item)
            ),
        ));
    };
    let name = name.trim();
    if !valid_pool_name(name) {
        return Err(ConfigError::invalid(
            &origin,
            format!(
                "invalid value {}: pool name {} must be 1-63 letters, digits, '-', '_' or \
                 '.', starting with a letter or digit",
                shown(item),
                shown(name)
            ),
        ));
    }
    let block = parse_block(origins, id, item, text.trim(), family, other_family_hint)?;
    Ok(BlockEntry {
        pool: name.to_string(),
        block,
        origin,
    })
}

/// Any two overlapping blocks (in different pools or in the same one) are an error naming
/// both.
fn check_overlaps(entries: &[&BlockEntry]) -> Result<(), ConfigError> {
    let mut spans: Vec<(Family, u128, u128, usize)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let (first, last) = e.block.bounds();
            (e.block.family(), first, last, i)
        })
        .collect();
    spans.sort_by_key(|&(family, first, last, _)| (family == Family::V6, first, last));
    // The block reaching furthest so far, per family run.
    let mut reach: Option<(Family, u128, usize)> = None;
    for &(family, first, last, i) in &spans {
        if let Some((rf, rlast, ri)) = reach
            && rf == family
            && first <= rlast
        {
            let (a, b) = (entries[ri], entries[i]);
            return Err(ConfigError::Conflict(format!(
                "address blocks overlap: {} of pool {:?} ({}) and {} of pool {:?} ({})",
                a.block, a.pool, a.origin, b.block, b.pool, b.origin
            )));
        }
        if reach.is_none_or(|(rf, rlast, _)| rf != family || last > rlast) {
            reach = Some((family, last, i));
        }
    }
    Ok(())
}

fn build_pools(args: &RunArgs, origins: &Origins) -> Result<(Vec<Pool>, Vec<Pool>), ConfigError> {
    let mut entries: Vec<BlockEntry> = Vec::new();
    if let Some(text) = &args.external_cidr {
        let block = parse_block(
            origins,
            "external_cidr",
            text,
            text.trim(),
            Family::V4,
            "--external-cidr6",
        )?;
        entries.push(BlockEntry {
            pool: DEFAULT_POOL.to_string(),
            block,
            origin: origins.describe("external_cidr"),
        });
    }
    for item in non_empty(&args.cidr_pools) {
        entries.push(named_block(
            origins,
            "cidr_pools",
            item,
            Family::V4,
            "--cidr6-pools",
        )?);
    }
    if let Some(text) = &args.external_cidr6 {
        let block = parse_block(
            origins,
            "external_cidr6",
            text,
            text.trim(),
            Family::V6,
            "--external-cidr",
        )?;
        entries.push(BlockEntry {
            pool: DEFAULT_POOL6.to_string(),
            block,
            origin: origins.describe("external_cidr6"),
        });
    }
    for item in non_empty(&args.cidr6_pools) {
        entries.push(named_block(
            origins,
            "cidr6_pools",
            item,
            Family::V6,
            "--cidr-pools",
        )?);
    }
    let mut secondary: Vec<BlockEntry> = Vec::new();
    for (i, text) in non_empty(&args.external_secondary_cidrs).enumerate() {
        let block = parse_block(
            origins,
            "external_secondary_cidrs",
            text,
            text,
            Family::V4,
            "no option yet (IPv6 secondary pools are not supported)",
        )?;
        secondary.push(BlockEntry {
            pool: loxi_domain::addressing::secondary_pool_name(i),
            block,
            origin: origins.describe("external_secondary_cidrs"),
        });
    }
    if entries.is_empty() {
        return Err(ConfigError::Conflict(
            "no address pool: set --external-cidr, --external-cidr6, --cidr-pools or \
             --cidr6-pools (or their LOXI_CCM_* variables or config keys)"
                .to_string(),
        ));
    }
    let all: Vec<&BlockEntry> = entries.iter().chain(&secondary).collect();
    check_overlaps(&all)?;
    if let Some(clash) = secondary
        .iter()
        .find(|s| entries.iter().any(|e| e.pool == s.pool))
    {
        return Err(ConfigError::Conflict(format!(
            "pool name {:?} is used by {} and by the secondary pools of {}: rename the pool",
            clash.pool,
            entries
                .iter()
                .find(|e| e.pool == clash.pool)
                .map(|e| e.origin.as_str())
                .unwrap_or_default(),
            clash.origin
        )));
    }

    let mut pools: Vec<Pool> = Vec::new();
    for e in entries {
        match pools.iter_mut().find(|p| p.name == e.pool) {
            Some(p) => p.blocks.push(e.block),
            None => pools.push(Pool::new(&e.pool, vec![e.block])),
        }
    }
    let secondary_pools = secondary
        .into_iter()
        .map(|e| Pool::new(&e.pool, vec![e.block]))
        .collect();
    Ok((pools, secondary_pools))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).map(OsString::from)
    }

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "loxi-ccm-config-test-{}-{name}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, content).unwrap();
        path
    }

    fn run(argv: &[&str], env: &dyn Fn(&str) -> Option<OsString>) -> Result<Loaded, LoadError> {
        let mut full = vec!["loxi-ccm", "run"];
        full.extend_from_slice(argv);
        load(full, env)
    }

    fn err(r: Result<Loaded, LoadError>) -> String {
        match r {
            Ok(l) => match l.config() {
                Ok(_) => panic!("expected an error"),
                Err(e) => e.to_string(),
            },
            Err(LoadError::Invalid { error, .. }) => error.to_string(),
            Err(LoadError::Clap(e)) => e.render().to_string(),
        }
    }

    const BASE: &[&str] = &["--loxilb-url=http://127.0.0.1:11111"];

    #[test]
    fn precedence_flag_then_env_then_file_then_default() {
        let file = temp_file(
            "precedence",
            "lbMode: onearm\nloxilbUrl: http://10.0.0.1:11111\nexternalCidr: 192.0.2.0/24\n\
             monitor: true\n",
        );
        let f = file.to_str().unwrap();
        let env = env_of(&[("LOXI_CCM_LB_MODE", "fullnat"), ("LOXI_CCM_CONFIG", f)]);

        // Flag beats environment and file.
        let l = run(&["--lb-mode=dsr"], &env).unwrap();
        assert_eq!(l.args.lb_mode, "dsr");
        assert_eq!(l.origins.of("lb_mode"), Origin::Flag);

        // Environment beats file.
        let l = run(&[], &env).unwrap();
        assert_eq!(l.args.lb_mode, "fullnat");
        assert_eq!(
            l.origins.of("lb_mode"),
            Origin::Env("LOXI_CCM_LB_MODE".into())
        );

        // File beats default; untouched options keep their default.
        let env = env_of(&[("LOXI_CCM_CONFIG", f)]);
        let l = run(&[], &env).unwrap();
        assert_eq!(l.args.lb_mode, "onearm");
        assert_eq!(
            l.origins.of("lb_mode"),
            Origin::File {
                path: file.clone(),
                key: "lbMode".into()
            }
        );
        assert!(l.args.monitor);
        assert_eq!(l.args.concurrency, 16);
        assert_eq!(l.origins.of("concurrency"), Origin::Default);
        assert_eq!(l.config_file.as_deref(), Some(file.as_path()));
        let cfg = l.config().unwrap();
        assert_eq!(cfg.defaults.mode, NatMode::OneArm);
        assert_eq!(cfg.loxilb[0].client.url, "http://10.0.0.1:11111");
        assert_eq!(cfg.pool.name, DEFAULT_POOL);

        // --config beats LOXI_CCM_CONFIG; nothing from the environment's file is read.
        let other = temp_file("precedence-other", "lbMode: hostonearm\n");
        let l = run(
            &[
                &format!("--config={}", other.display()),
                BASE[0],
                "--external-cidr=192.0.2.0/24",
            ],
            &env,
        )
        .unwrap();
        assert_eq!(l.args.lb_mode, "hostonearm");
    }

    #[test]
    fn default_is_the_last_layer() {
        let l = run(&[], &env_of(&[])).unwrap();
        assert_eq!(l.args.lb_mode, "default");
        assert_eq!(l.origins.of("lb_mode"), Origin::Default);
        assert!(l.config_file.is_none());
    }

    #[test]
    fn legacy_and_kube_loxilb_keys_lists_and_comma_strings() {
        let file = temp_file(
            "legacy",
            "apiServerURL:\n  - http://10.0.0.1:11111\n  - http://10.0.0.2:11111\n\
             externalIPcidr: 192.0.2.0/24\n\
             cidrPools: a=198.51.100.0/25,b=198.51.100.128/25\n\
             cidr6Pools: [c=2001:db8:1::/64, c=2001:db8:2::/64]\n\
             externalCIDR6: 2001:db8::/64\n\
             externalSecondaryCIDRs: 203.0.113.0/26,203.0.113.64/26\n\
             setLBMode: 2\nsetUniqueIP: true\nloxilbLoadBalancerClass: example.com/lb\n\
             concurrency: 4\nhealthInterval: 500ms\ndisableNodeInit: true\n",
        );
        let env = env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]);
        let cfg = run(&[], &env).unwrap().config().unwrap();
        let urls: Vec<_> = cfg.loxilb.iter().map(|c| c.client.url.as_str()).collect();
        assert_eq!(urls, ["http://10.0.0.1:11111", "http://10.0.0.2:11111"]);
        let names: Vec<_> = cfg.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "a", "b", "default6", "c"]);
        assert_eq!(cfg.pools[4].blocks.len(), 2);
        let secondary: Vec<_> = cfg
            .secondary_pools
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(secondary, ["secondary0", "secondary1"]);
        assert_eq!(cfg.defaults.mode, NatMode::FullNat);
        assert!(cfg.unique_ip);
        assert_eq!(cfg.class, "example.com/lb");
        assert_eq!(cfg.concurrency, 4);
        assert_eq!(cfg.health_interval, Duration::from_millis(500));
        assert!(cfg.node_init.disable_node_init);
        assert_eq!(cfg.pool.name, "default");
    }

    /// kube-loxilb's flags for features loxi-ccm does not have yet are refused by name,
    /// pointing at the section of docs/migration.md about them, not with clap's bare
    /// "unexpected argument"; `check` reports the same.
    #[test]
    fn unsupported_kube_loxilb_flags_name_the_docs_section() {
        for (argv, flag) in [
            (vec!["--privateCIDR=10.10.0.0/16"], "privateCIDR"),
            (vec!["--privateCIDR", "10.10.0.0/16"], "privateCIDR"),
            (vec!["--appendEPs"], "appendEPs"),
            (vec!["--appendEPs=true"], "appendEPs"),
            (
                vec!["--externalSecondaryCIDRs6=2001:db8::/64"],
                "externalSecondaryCIDRs6",
            ),
        ] {
            let e = err(run(&[BASE, &argv[..]].concat(), &env_of(&[])));
            assert_eq!(
                e,
                format!(
                    "flag --{flag}: kube-loxilb's {flag} is not supported by loxi-ccm yet: \
                     remove it (docs/migration.md#what-is-not-supported-yet says what it did \
                     and what to do instead)"
                ),
                "{argv:?}"
            );
        }
        let checked = load(["loxi-ccm", "check", "--appendEPs", BASE[0]], &env_of(&[]));
        assert!(
            matches!(
                checked,
                Err(LoadError::Invalid {
                    mode: Mode::Check,
                    ..
                })
            ),
            "{checked:?}"
        );
        // Other unknown flags keep clap's message (with its suggestions).
        let e = err(run(&[BASE[0], "--externalCIDRR=10.0.0.0/8"], &env_of(&[])));
        assert!(e.contains("unexpected argument"), "{e}");
    }

    /// kube-loxilb's `noZoneName`, as a flag and as a config-file key.
    #[test]
    fn no_zone_name_from_a_flag_or_the_file() {
        let l = run(
            &[BASE[0], "--noZoneName", "--externalCIDR=192.0.2.0/24"],
            &env_of(&[]),
        )
        .unwrap();
        assert!(l.args.no_zone_name);
        assert!(l.config().is_ok(), "{:?}", l.config().err());
        let file = temp_file("nozonename", "noZoneName: true\n");
        let l = run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        )
        .unwrap();
        assert!(l.args.no_zone_name);
        assert!(matches!(l.origins.of("no_zone_name"), Origin::File { .. }));
    }

    #[test]
    fn unknown_and_unsupported_keys_name_the_file() {
        let file = temp_file("unknown", "externalCidrr: 192.0.2.0/24\n");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert_eq!(
            e,
            format!(
                "config file {}: unknown key \"externalCidrr\" (did you mean \"externalCidr\"?)",
                file.display()
            )
        );
        let file = temp_file("unsupported", "privateCIDR: 10.0.0.0/8\n");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert_eq!(
            e,
            format!(
                "config file {}: key \"privateCIDR\": kube-loxilb's privateCIDR is not \
                 supported by loxi-ccm yet: remove it (docs/migration.md#what-is-not-supported-yet \
                 says what it did and what to do instead)",
                file.display()
            )
        );
        let file = temp_file("meaningless", "hostProcPathPrefix: /host\n");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(
            e.contains("key \"hostProcPathPrefix\": hostProcPathPrefix is a kube-loxilb")
                && e.contains("docs/migration.md#from-kube-loxilb"),
            "{e}"
        );
        let file = temp_file(
            "twice",
            "externalCidr: 192.0.2.0/24\nexternalCIDR: 192.0.2.0/24\n",
        );
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(
            e.contains("\"externalCIDR\" and \"externalCidr\" both set --external-cidr"),
            "{e}"
        );
        let file = temp_file("notamap", "- a\n- b\n");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(e.contains("expected a mapping"), "{e}");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", "/nonexistent/loxi-ccm.yaml")]),
        ));
        assert!(
            e.starts_with("config file /nonexistent/loxi-ccm.yaml: cannot be read")
                && e.contains("environment LOXI_CCM_CONFIG"),
            "{e}"
        );
    }

    #[test]
    fn invalid_values_name_their_source() {
        let cidr = "--external-cidr=192.0.2.0/24";
        // Semantic check, from the environment.
        let e = err(run(&[BASE[0], cidr], &env_of(&[("LOXI_CCM_LB_MODE", "x")])));
        assert_eq!(
            e,
            "environment LOXI_CCM_LB_MODE: invalid value \"x\": expected default, onearm, \
             fullnat, dsr, fullproxy, hostonearm or 0-5"
        );
        // clap's own parser, from the environment and from the file.
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_CONCURRENCY", "many")]),
        ));
        assert!(
            e.starts_with("environment LOXI_CCM_CONCURRENCY: invalid value \"many\": "),
            "{e}"
        );
        let file = temp_file("badvalues", "logFormat: xml\n");
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert_eq!(
            e,
            format!(
                "config file {}: key \"logFormat\": invalid value \"xml\": expected one of text, json",
                file.display()
            )
        );
        let file = temp_file("badduration", "driftInterval: soon\n");
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(
            e.starts_with(&format!(
                "config file {}: key \"driftInterval\": invalid value \"soon\": ",
                file.display()
            )),
            "{e}"
        );
        let e = err(run(&[BASE[0], cidr], &env_of(&[("LOXI_CCM_MONITOR", "1")])));
        assert_eq!(
            e,
            "environment LOXI_CCM_MONITOR: invalid value \"1\": expected one of true, false"
        );
        let e = err(run(BASE, &env_of(&[("LOXI_CCM_DISABLE_NODE_INIT", "yes")])));
        assert_eq!(
            e,
            "environment LOXI_CCM_DISABLE_NODE_INIT: invalid value \"yes\": expected true or false"
        );
        // A bad block from a flag.
        let e = err(run(
            &[BASE[0], "--external-cidr=192.0.2.0/33"],
            &env_of(&[]),
        ));
        assert!(
            e.starts_with("flag --external-cidr: invalid value \"192.0.2.0/33\""),
            "{e}"
        );
        // Lists in the file for a single-valued option.
        let file = temp_file("list", "lbMode: [a, b]\n");
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(
            e.ends_with("key \"lbMode\": expects one value, got a list of 2"),
            "{e}"
        );
    }

    #[test]
    fn bgp_settings_from_flags_environment_and_file() {
        let cidr = "--external-cidr=192.0.2.0/24";
        let ok = |argv: &[&str], env: &[(&str, &str)]| {
            let mut full = vec![BASE[0], cidr];
            full.extend_from_slice(argv);
            run(&full, &env_of(env)).unwrap().config().unwrap()
        };
        assert_eq!(ok(&[], &[]).bgp, None);
        let cfg = ok(
            &[
                "--bgp-local-as=4200000001",
                "--bgp-peers=192.0.2.254:65001,[2001:db8::1]:65002",
                "--bgp-multihop",
            ],
            &[],
        );
        let bgp = cfg.bgp.unwrap();
        assert_eq!(bgp.local_asn.get(), 4_200_000_001);
        assert!(bgp.multihop);
        let peers: Vec<String> = bgp.peers.iter().map(|p| p.address.to_string()).collect();
        assert_eq!(peers, ["192.0.2.254", "2001:db8::1"]);
        // kube-loxilb's spellings, from the environment and the config file.
        let cfg = ok(
            &["--setBGP=65100"],
            &[("LOXI_CCM_BGP_PEERS", "10.0.0.1:65001")],
        );
        assert_eq!(cfg.bgp.unwrap().peers.len(), 1);
        let file = temp_file("bgp", "setBGP: 65100\nextBGPPeers: 10.0.0.1:65001\n");
        let cfg = ok(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]);
        assert_eq!(cfg.bgp.unwrap().local_asn.get(), 65100);
        // The BGP resources: loxi-ccm's flag, kube-loxilb's flag and file key.
        assert!(!ok(&["--setBGP=65100"], &[]).bgp_crds);
        assert!(ok(&["--setBGP=65100", "--bgp-crds"], &[]).bgp_crds);
        assert!(ok(&["--setBGP=65100", "--enableBGPCRDs=true"], &[]).bgp_crds);
        let file = temp_file("bgpcrds", "setBGP: 65100\nenableBGPCRDs: true\n");
        assert!(ok(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]).bgp_crds);
        // Each refusal names the option it came from.
        for (argv, option) in [
            (
                vec!["--bgp-local-as=0", "--bgp-peers=1.2.3.4:65001"],
                "flag --bgp-peers",
            ),
            (
                vec!["--bgp-local-as=65100", "--bgp-peers=1.2.3.4:abc"],
                "flag --bgp-peers",
            ),
            (
                vec!["--bgp-local-as=65100", "--bgp-router-id=2001:db8::1"],
                "flag --bgp-router-id",
            ),
            (vec!["--bgp-local-as=x"], "flag --bgp-local-as"),
            (vec!["--bgp-crds"], "flag --bgp-crds"),
            (
                vec!["--bgp-local-as=65100", "--num-zone-instances=2"],
                "flag --num-zone-instances",
            ),
        ] {
            let mut full = vec![BASE[0], cidr];
            full.extend(argv.iter().copied());
            let e = err(run(&full, &env_of(&[])));
            assert!(e.starts_with(option), "{e}");
        }
        // Several HA instances with BGP: refused naming loxilb's behaviour, from any layer.
        let e = err(run(
            &[BASE[0], cidr, "--setBGP=65100"],
            &env_of(&[("LOXI_CCM_NUM_ZONE_INSTANCES", "2")]),
        ));
        assert!(
            e.starts_with("environment LOXI_CCM_NUM_ZONE_INSTANCES:")
                && e.contains("llb-inst0's role"),
            "{e}"
        );
        assert!(
            ok(&["--setBGP=65100", "--num-zone-instances=1"], &[])
                .bgp
                .is_some()
        );
        assert_eq!(ok(&["--num-zone-instances=2"], &[]).zone_instances, 2);
    }

    #[test]
    fn leader_election_names_are_kubernetes_names() {
        let cidr = "--external-cidr=192.0.2.0/24";
        // A Lease name is an RFC 1123 subdomain: no upper case, no underscore.
        let e = err(run(
            &[BASE[0], cidr, "--leader-elect-name=Loxi-CCM"],
            &env_of(&[]),
        ));
        assert!(
            e.starts_with("flag --leader-elect-name: invalid value \"Loxi-CCM\": not a Lease name"),
            "{e}"
        );
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_LEADER_ELECT_NAME", "loxi_ccm")]),
        ));
        assert!(
            e.starts_with("environment LOXI_CCM_LEADER_ELECT_NAME: invalid value \"loxi_ccm\""),
            "{e}"
        );
        // A namespace name is an RFC 1123 label: no dot either.
        for bad in ["Kube-System", "kube.system", "-ns", &"n".repeat(64)] {
            let flag = format!("--leader-elect-namespace={bad}");
            let e = err(run(&[BASE[0], cidr, &flag], &env_of(&[])));
            assert!(
                e.starts_with(&format!(
                    "flag --leader-elect-namespace: invalid value {bad:?}: not a namespace name"
                )),
                "{e}"
            );
        }
        let file = temp_file("leasename", "leaderElectName: \"ccm.\"\n");
        let e = err(run(
            &[BASE[0], cidr],
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert!(
            e.starts_with(&format!(
                "config file {}: key \"leaderElectName\": invalid value \"ccm.\"",
                file.display()
            )),
            "{e}"
        );
        // Valid names, including a dotted Lease name and the longest namespace.
        let long_ns = format!("--leader-elect-namespace={}", "n".repeat(63));
        let loaded = run(
            &[
                BASE[0],
                cidr,
                "--leader-elect-name=loxi-ccm.example.org",
                &long_ns,
            ],
            &env_of(&[]),
        )
        .unwrap();
        let lease = loaded.config().unwrap().leader.unwrap();
        assert_eq!(lease.name, "loxi-ccm.example.org");
        assert_eq!(lease.namespace, "n".repeat(63));
        // Without leader election the names are not used, so not checked.
        let loaded = run(
            &[
                BASE[0],
                cidr,
                "--leader-elect=false",
                "--leader-elect-name=X",
            ],
            &env_of(&[]),
        )
        .unwrap();
        assert!(loaded.config().unwrap().leader.is_none());
    }

    #[test]
    fn each_controller_has_its_name_and_its_own_lease() {
        let cidr = "--external-cidr=192.0.2.0/24";
        let cfg = |argv: &[&str]| {
            let mut all = vec![BASE[0], cidr];
            all.extend_from_slice(argv);
            run(&all, &env_of(&[])).unwrap().config().unwrap()
        };
        // The default class: the default controller, today's Lease and records.
        let default = cfg(&[]);
        assert!(default.controller.is_default());
        assert_eq!(default.leader.unwrap().name, "loxi-ccm");
        assert_eq!(default.roles_record.1, "loxi-ccm-ha-roles");
        // Another class: a name derived from it, and a Lease of its own.
        let other = cfg(&["--loxilbLoadBalancerClass=example.com/other"]);
        assert_eq!(other.controller.name(), Some("example-com-other"));
        assert_eq!(other.leader.unwrap().name, "loxi-ccm-example-com-other");
        assert_eq!(other.fleet_record.1, "loxi-ccm-example-com-other-fleet");
        // Given names win; an explicit Lease name is kept as given.
        let named = cfg(&[
            "--load-balancer-class=example.com/other",
            "--controller-name=zone-b",
            "--leader-elect-name=loxi-ccm",
        ]);
        assert_eq!(named.controller.name(), Some("zone-b"));
        assert_eq!(named.leader.unwrap().name, "loxi-ccm");
        let back = cfg(&[
            "--load-balancer-class=example.com/x",
            "--controller-name=default",
        ]);
        assert!(back.controller.is_default());
        let e = err(run(
            &[BASE[0], cidr, "--controller-name=Zone_B"],
            &env_of(&[]),
        ));
        assert!(
            e.starts_with("flag --controller-name: invalid value \"Zone_B\": expected 1-40"),
            "{e}"
        );
    }

    #[test]
    fn kube_api_rate_limit_layers_and_bounds() {
        let cidr = "--external-cidr=192.0.2.0/24";
        let limit = |argv: &[&str], env: &dyn Fn(&str) -> Option<OsString>| {
            let l = run(argv, env).unwrap().config().unwrap().kube_api;
            (l.qps, l.burst)
        };
        assert_eq!(limit(&[BASE[0], cidr], &env_of(&[])), (0.0, 100));
        let file = temp_file("qps", "kubeApiQps: 50\nkubeApiBurst: 20\n");
        assert_eq!(
            limit(
                &[BASE[0], cidr, "--kube-api-burst=30"],
                &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
            ),
            (50.0, 30)
        );
        let e = err(run(&[BASE[0], cidr, "--kube-api-qps=-1"], &env_of(&[])));
        assert!(
            e.starts_with("flag --kube-api-qps: invalid value \"-1\""),
            "{e}"
        );
        let e = err(run(
            &[BASE[0], cidr, "--kube-api-qps=5"],
            &env_of(&[("LOXI_CCM_KUBE_API_BURST", "0")]),
        ));
        assert!(
            e.starts_with("environment LOXI_CCM_KUBE_API_BURST: invalid value \"0\""),
            "{e}"
        );
    }

    #[test]
    fn pools_are_validated() {
        let env = env_of(&[]);
        let e = err(run(BASE, &env));
        assert!(e.starts_with("no address pool"), "{e}");
        let e = err(run(&[BASE[0], "--external-cidr=2001:db8::/64"], &env));
        assert!(
            e.contains("is IPv6; IPv6 blocks go in --external-cidr6"),
            "{e}"
        );
        let e = err(run(&[BASE[0], "--cidr-pools=10.0.0.0/24"], &env));
        assert!(e.contains("expected <pool name>=<CIDR or range>"), "{e}");
        let e = err(run(
            &[
                BASE[0],
                "--external-cidr=10.0.0.0/24",
                "--cidr-pools=b=10.0.0.128-10.0.0.130",
            ],
            &env,
        ));
        assert_eq!(
            e,
            "address blocks overlap: 10.0.0.0/24 of pool \"default\" (flag --external-cidr) and \
             10.0.0.128-10.0.0.130 of pool \"b\" (flag --cidr-pools)"
        );
        // Network and broadcast addresses are not part of a block: these touch, not overlap.
        let cfg = run(
            &[
                BASE[0],
                "--cidr-pools=a=10.0.0.0/30,b=10.0.0.3-10.0.0.4,a=10.0.1.0/24",
            ],
            &env,
        )
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(cfg.pools.len(), 2);
        assert_eq!(cfg.pools[0].blocks.len(), 2);
        assert_eq!(cfg.pool.name, "a");
        // IPv6 only: the first pool stands in for `pool`.
        let cfg = run(&[BASE[0], "--external-cidr6=2001:db8::/64"], &env)
            .unwrap()
            .config()
            .unwrap();
        assert_eq!(cfg.pool.name, DEFAULT_POOL6);
        // Secondary pools overlapping a primary one.
        let e = err(run(
            &[
                BASE[0],
                "--external-cidr=10.0.0.0/24",
                "--external-secondary-cidrs=10.0.0.0/28",
            ],
            &env,
        ));
        assert!(e.starts_with("address blocks overlap"), "{e}");
    }

    #[test]
    fn bounds_match_the_domain_block_sizes() {
        for text in [
            "10.0.0.0/24",
            "10.0.0.0/31",
            "10.0.0.1/32",
            "10.0.0.5-10.0.0.9",
            "2001:db8::/64",
            "2001:db8::/127",
            "2001:db8::1-2001:db8::5",
        ] {
            let block: AddressBlock = text.parse().unwrap();
            let (first, last) = block.bounds();
            assert_eq!(last - first + 1, block.size(), "{text}");
        }
    }

    #[test]
    fn token_file() {
        let token = temp_file("token", "s3cret\n");
        let cfg = run(
            &[
                BASE[0],
                "--external-cidr=10.0.0.0/24",
                &format!("--loxilb-token-file={}", token.display()),
            ],
            &env_of(&[]),
        )
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(cfg.loxilb[0].client.token.get().as_deref(), Some("s3cret"));
        assert!(
            !format!("{cfg:?}").contains("s3cret"),
            "Debug shows no token"
        );
        let e = err(run(
            &[
                BASE[0],
                "--external-cidr=10.0.0.0/24",
                &format!("--loxilb-token-file={}", token.display()),
            ],
            &env_of(&[("LOXI_CCM_LOXILB_TOKEN", "other")]),
        ));
        assert_eq!(
            e,
            "the loxilb token is given more than once, by environment LOXI_CCM_LOXILB_TOKEN and by flag \
             --loxilb-token-file: keep one"
        );
    }

    #[test]
    fn conflicts_between_layers_name_both() {
        let file = temp_file("conflict", "inventoryConfigmap: kube-system/inv\n");
        let e = err(run(
            &[BASE[0], "--external-cidr=10.0.0.0/24"],
            &env_of(&[
                ("LOXI_CCM_CONFIG", file.to_str().unwrap()),
                ("LOXI_CCM_INVENTORY_FILE", "/etc/inv.yaml"),
            ]),
        ));
        assert!(
            e.contains("environment LOXI_CCM_INVENTORY_FILE")
                && e.contains("key \"inventoryConfigmap\""),
            "{e}"
        );
    }

    #[test]
    fn file_keys_and_camel_case() {
        assert_eq!(camel_case("loxilb-url"), "loxilbUrl");
        assert_eq!(camel_case("external-cidr6"), "externalCidr6");
        assert_eq!(camel_case("kubeconfig"), "kubeconfig");
        let cmd = crate::config::cli::command();
        let run = cmd.find_subcommand("run").unwrap();
        let keys = |id: &str| file_keys(run.get_arguments().find(|a| a.get_id() == id).unwrap());
        assert_eq!(
            keys("loxilb_urls"),
            ["loxilbUrl", "loxiURL", "apiServerURL"]
        );
        assert_eq!(keys("cidr_pools"), ["cidrPools"]);
        assert!(keys("config").is_empty());
        // No key is shared by two options.
        let mut seen = HashMap::new();
        for arg in run.get_arguments() {
            for k in file_keys(arg) {
                if let Some(other) = seen.insert(k.clone(), arg.get_id().to_string()) {
                    panic!("key {k} used by {other} and {}", arg.get_id());
                }
            }
        }
        // Every legacy entry names a real option.
        for (id, _) in LEGACY_KEYS {
            assert!(run.get_arguments().any(|a| a.get_id() == *id), "{id}");
        }
    }

    #[test]
    fn discovered_loxilbs_scheme_and_peer_only_service() {
        let pool = "--external-cidr=192.0.2.0/24";
        let cfg = run(&[pool], &env_of(&[])).unwrap().config().unwrap();
        let d = cfg.discovery.unwrap();
        assert_eq!(
            d.url(&"10.0.0.1".parse().unwrap(), 11111),
            "http://10.0.0.1:11111"
        );
        assert!(cfg.peer_discovery.is_none(), "followed only with BGP on");
        let cfg = run(
            &[
                pool,
                "--loxilb-discovery-scheme=https",
                "--loxilb-port=8091",
                "--bgp-local-as=64512",
                "--loxilb-peer-service-namespace=kube-system",
            ],
            &env_of(&[]),
        )
        .unwrap()
        .config()
        .unwrap();
        let d = cfg.discovery.unwrap();
        assert_eq!(
            d.url(&"fd00::1".parse().unwrap(), 8091),
            "https://[fd00::1]:8091"
        );
        let p = cfg.peer_discovery.unwrap();
        assert_eq!(
            (p.service.as_str(), p.namespace.as_deref(), p.https),
            ("loxilb-peer-service", Some("kube-system"), true)
        );
        // With --loxilb-url too (as kube-loxilb), for BGP only.
        let mut with_url = BASE.to_vec();
        with_url.extend([pool, "--bgp-local-as=64512"]);
        let cfg = run(&with_url, &env_of(&[])).unwrap().config().unwrap();
        assert!(cfg.discovery.is_none() && cfg.peer_discovery.is_some());
        let e = err(run(
            &[
                pool,
                "--bgp-local-as=64512",
                "--loxilb-peer-service=Not_A_Name",
            ],
            &env_of(&[]),
        ));
        assert!(e.contains("--loxilb-peer-service"), "{e}");
        let e = err(run(&[pool, "--loxilb-discovery-scheme=ftp"], &env_of(&[])));
        assert!(e.contains("ftp"), "{e}");
    }

    #[test]
    fn from_args_names_flags_without_origins() {
        let cli = <crate::config::cli::Cli as clap::Parser>::try_parse_from([
            "loxi-ccm",
            "run",
            "--loxilb-url=http://a:1",
            "--external-cidr=nope",
        ])
        .unwrap();
        let crate::config::cli::Command::Run(args) = cli.command;
        let e = Config::from_args(&args).unwrap_err().to_string();
        assert!(
            e.starts_with("--external-cidr: invalid value \"nope\""),
            "{e}"
        );
    }
}
