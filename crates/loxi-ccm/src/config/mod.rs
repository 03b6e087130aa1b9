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
//!
//! The code follows the option groups of [`cli::RunArgs`]: [`load`] (the layers), [`origins`]
//! (where each value came from), [`file`] (the config file's keys), and one validator module
//! per group ([`services`], [`leader`], [`loxilbs`], [`pools`], [`bgp`]) that
//! [`Config::from_args_with`] calls in turn.
mod bgp;
pub mod check;
mod check_line;
pub mod cli;
mod file;
mod leader;
mod load;
mod loxilbs;
mod origins;
mod pools;
pub mod queues;
mod services;
pub mod sources;
pub mod token;

use std::path::PathBuf;
use std::time::Duration;

use loxi_domain::bgp::BgpSettings;
use loxi_domain::ipam::Family;
use loxi_domain::{ClusterId, ControllerName, Defaults, Pool};
use loxilb_client::{ClientConfig, Token};
use thiserror::Error;

use crate::config::cli::RunArgs;
use crate::config::loxilbs::Followed;
use crate::leader::{LeaseConfig, default_identity};
use crate::node_init::NodeInitArgs;

pub use file::{NOT_YET_SUPPORTED, NOT_YET_SUPPORTED_DOC, camel_case, file_keys};
pub use load::{LoadError, Loaded, Mode, load};
pub use origins::{Origin, Origins};

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
    /// `--privateCIDR`: the rules' `privateIP` (docs/configuration.md#private-addresses).
    pub private_ip: Option<std::net::IpAddr>,
    /// `--appendEPs`: rules shared with other controllers (docs/configuration.md#shared-rules).
    pub append_endpoints: bool,
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
    /// `--loxilb-gone-after`: unreachable this long, a loxilb counts as gone for good.
    pub loxilb_gone_after: Duration,
    /// `None`: leader election off (this replica is always the leader).
    pub leader: Option<LeaseConfig>,
    pub node_init: NodeInitArgs,
    /// Read Multus network-status from Pod metadata.
    pub multus: bool,
    /// Serve kube-loxilb's Egress resource (`crate::egress`).
    pub egress: bool,
    /// `--enableK8sMetadata`: Kubernetes metadata sent to every loxilb (`crate::k8s_metadata`).
    pub k8s_metadata: bool,
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
    /// `--gateway-api`: the GatewayClass controllerName served (`--loxilb-gateway-class`);
    /// `None`: the Gateway API is not served.
    pub gateway_class: Option<String>,
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

/// Whether `name` is an RFC 1123 label, as namespace names must be.
fn is_dns_label(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 63
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-')
}

impl Config {
    /// Validates options whose origins are not known (tests, embedders): errors name the flag.
    pub fn from_args(args: &RunArgs) -> Result<Config, ConfigError> {
        Config::from_args_with(args, &Origins::default())
    }

    /// Validates the options, group by group; every error names the option and the layer its
    /// value came from.
    pub fn from_args_with(args: &RunArgs, origins: &Origins) -> Result<Config, ConfigError> {
        let services = services::service_settings(&args.services, origins)?;
        loxilbs::check_loxilb_api_limits(&args.loxilb_api, origins)?;
        let kube_api = services::kube_api_rate_limit(&args.kube_api, origins)?;
        // This process's identity: its leader-election identity, and sent to every loxilb
        // with each call (`loxilb_client::IDENTITY_HEADER`) so that a write can be traced
        // to the replica that sent it.
        let identity = default_identity();
        let lease_name = leader::lease_name(&args.leader, &services.controller, origins);
        let leader = leader::lease(&args.leader, &lease_name, &identity, origins)?;

        let ca_pem = loxilbs::ca_pem(&args.loxilb_api, origins)?;
        let (token, token_source) = loxilbs::token(&args.loxilb_api, origins)?;
        let loxilb_template = loxilbs::client_template(&args.loxilb_api, &token, ca_pem, &identity);
        let zone = loxilbs::zone(&args.loxilbs, origins)?;
        let loxilb = loxilbs::configured_loxilbs(&args.loxilbs, &loxilb_template, &zone, origins)?;
        let discovery = if loxilb.is_empty() {
            Some(loxilbs::discovery(
                &args.loxilbs,
                Followed::Loxilbs,
                origins,
            )?)
        } else {
            None
        };

        let (pools, secondary_pools) = pools::build_pools(&args.pools, origins)?;
        let bgp = bgp::bgp_settings(&args.bgp, origins)?;
        // BGP-peer-only loxilbs get BGP settings only: followed only with BGP on.
        let peer_discovery = match bgp {
            Some(_) => Some(loxilbs::discovery(
                &args.loxilbs,
                Followed::BgpPeers,
                origins,
            )?),
            None => None,
        };
        let roles = bgp::ha_roles(&args.ha, origins)?;
        bgp::check_bgp_needs(bgp.is_some(), &args.bgp, &args.ha, origins)?;
        let pool = pools
            .iter()
            .find(|p| p.size(Family::V4) > 0)
            .unwrap_or(&pools[0])
            .clone();
        let record_namespace = &args.leader.leader_elect_namespace;

        Ok(Config {
            loxilb,
            loxilb_token: token,
            loxilb_token_source: token_source,
            loxilb_insecure_skip_tls_verify: args.loxilb_api.loxilb_insecure_skip_tls_verify,
            pool,
            pools,
            secondary_pools,
            unique_ip: args.pools.set_unique_ip,
            class: args.services.load_balancer_class.clone(),
            controller: services.controller,
            ccm_mode: args.services.ccm_mode,
            defaults: services.defaults,
            enforce_source_ranges: args.services.source_ranges != "ignore",
            source_ranges_firewall: args.services.source_ranges == "firewall",
            cluster_id: services.cluster_id,
            private_ip: services.private_ip,
            append_endpoints: args.services.append_endpoints,
            namespace: args.services.namespace.clone(),
            health_interval: args.loxilb_api.health_interval,
            drift_interval: args.loxilb_api.drift_interval,
            concurrency: args.services.concurrency,
            kube_api,
            loxilb_max_rules: args.loxilb_api.loxilb_max_rules,
            loxilb_write_window: args.loxilb_api.loxilb_write_window,
            loxilb_gone_after: args.loxilb_api.loxilb_gone_after,
            leader,
            node_init: args.node_init.clone(),
            multus: args.services.multus,
            egress: args.services.egress,
            k8s_metadata: args.services.k8s_metadata,
            bgp,
            discovery,
            peer_discovery,
            loxilb_template,
            zone,
            zone_instances: args.ha.num_zone_instances,
            roles,
            fleet_record: (record_namespace.clone(), format!("{lease_name}-fleet")),
            ha_bgp_hold: args.ha.ha_bgp_hold,
            roles_record: (record_namespace.clone(), format!("{lease_name}-ha-roles")),
            bgp_crds: args.bgp.bgp_crds,
            gateway_class: services::gateway_class(&args.gateway, origins)?,
        })
    }
}

/// The options of `loxi-ccm run <flags>`, for the validators' unit tests.
#[cfg(test)]
fn run_args(flags: &[&str]) -> RunArgs {
    use clap::Parser;
    let argv = ["loxi-ccm", "run"].iter().chain(flags);
    let cli::Command::Run(args) = cli::Cli::try_parse_from(argv).unwrap().command;
    *args
}

#[cfg(test)]
mod tests {
    use super::file::LEGACY_KEYS;
    use super::*;
    use loxi_domain::NatMode;
    use loxi_domain::ipam::AddressBlock;
    use std::collections::BTreeMap;
    use std::collections::HashMap;
    use std::ffi::OsString;

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
    const POOL: &[&str] = &["--external-cidr=192.0.2.0/24"];

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
        assert_eq!(l.args.services.lb_mode, "dsr");
        assert_eq!(l.origins.of("lb_mode"), Origin::Flag);

        // Environment beats file.
        let l = run(&[], &env).unwrap();
        assert_eq!(l.args.services.lb_mode, "fullnat");
        assert_eq!(
            l.origins.of("lb_mode"),
            Origin::Env("LOXI_CCM_LB_MODE".into())
        );

        // File beats default; untouched options keep their default.
        let env = env_of(&[("LOXI_CCM_CONFIG", f)]);
        let l = run(&[], &env).unwrap();
        assert_eq!(l.args.services.lb_mode, "onearm");
        assert_eq!(
            l.origins.of("lb_mode"),
            Origin::File {
                path: file.clone(),
                key: "lbMode".into()
            }
        );
        assert!(l.args.services.monitor);
        assert_eq!(l.args.services.concurrency, 16);
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
        assert_eq!(l.args.services.lb_mode, "hostonearm");
    }

    #[test]
    fn default_is_the_last_layer() {
        let l = run(&[], &env_of(&[])).unwrap();
        assert_eq!(l.args.services.lb_mode, "default");
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
        let e = err(run(
            &[BASE, &["--externalSecondaryCIDRs6=2001:db8::/64"][..]].concat(),
            &env_of(&[]),
        ));
        assert_eq!(
            e,
            "flag --externalSecondaryCIDRs6: kube-loxilb's externalSecondaryCIDRs6 is not \
             supported by loxi-ccm yet: remove it (docs/migration.md#what-is-not-supported-yet \
             says what it did and what to do instead)"
        );
        let checked = load(
            [
                "loxi-ccm",
                "check",
                "--externalSecondaryCIDRs6=2001:db8::/64",
                BASE[0],
            ],
            &env_of(&[]),
        );
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

    /// kube-loxilb's `privateCIDR` (refused until issue 28), as a flag, an option and a
    /// config-file key: the address written in the CIDR.
    #[test]
    fn private_cidr_gives_the_rules_private_address() {
        let address = |flags: &[&str], env: &[(&str, &str)]| {
            run(&[BASE, POOL, flags].concat(), &env_of(env))
                .unwrap()
                .config()
                .unwrap()
                .private_ip
        };
        let want = Some("10.10.0.1".parse().unwrap());
        assert_eq!(address(&[], &[]), None);
        assert_eq!(address(&["--privateCIDR=10.10.0.1/24"], &[]), want);
        assert_eq!(address(&["--privateCIDR", "10.10.0.1/24"], &[]), want);
        assert_eq!(address(&["--private-cidr=10.10.0.1"], &[]), want);
        let file = temp_file("privatecidr", "privateCIDR: 10.10.0.1/24\n");
        assert_eq!(
            address(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
            want
        );
        let e = err(run(
            &[BASE, POOL, &["--privateCIDR=10.10.0.1/40"]].concat(),
            &env_of(&[]),
        ));
        assert!(
            e.contains("private-cidr") && e.contains("prefix length"),
            "{e}"
        );
    }

    /// kube-loxilb's `appendEPs` (refused until issue 28): a Go-style boolean flag and a key.
    #[test]
    fn append_eps_shares_rules() {
        let on = |flags: &[&str], env: &[(&str, &str)]| {
            run(&[BASE, POOL, flags].concat(), &env_of(env))
                .unwrap()
                .config()
                .unwrap()
                .append_endpoints
        };
        assert!(!on(&[], &[]));
        assert!(on(&["--appendEPs"], &[]));
        assert!(on(&["--appendEPs=true"], &[]));
        assert!(!on(&["--appendEPs=false"], &[]));
        assert!(on(&["--append-endpoints"], &[]));
        let file = temp_file("appendeps", "appendEPs: true\n");
        assert!(on(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]));
    }

    /// kube-loxilb's `enableK8sMetadata`: a Go-style boolean flag and a key; off by default.
    #[test]
    fn k8s_metadata_from_kube_loxilbs_flag_or_key() {
        let on = |flags: &[&str], env: &[(&str, &str)]| {
            run(&[BASE, POOL, flags].concat(), &env_of(env))
                .unwrap()
                .config()
                .unwrap()
                .k8s_metadata
        };
        assert!(!on(&[], &[]));
        assert!(on(&["--enableK8sMetadata"], &[]));
        assert!(on(&["--enableK8sMetadata=true"], &[]));
        assert!(!on(&["--enableK8sMetadata=false"], &[]));
        assert!(on(&["--k8s-metadata"], &[]));
        let file = temp_file("k8smeta", "enableK8sMetadata: true\n");
        assert!(on(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]));
    }

    /// kube-loxilb's `noZoneName`, as a flag and as a config-file key.
    #[test]
    fn no_zone_name_from_a_flag_or_the_file() {
        let l = run(
            &[BASE[0], "--noZoneName", "--externalCIDR=192.0.2.0/24"],
            &env_of(&[]),
        )
        .unwrap();
        assert!(l.args.loxilbs.no_zone_name);
        assert!(l.config().is_ok(), "{:?}", l.config().err());
        let file = temp_file("nozonename", "noZoneName: true\n");
        let l = run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        )
        .unwrap();
        assert!(l.args.loxilbs.no_zone_name);
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
        let file = temp_file("unsupported", "externalSecondaryCIDRs6: 2001:db8::/64\n");
        let e = err(run(
            BASE,
            &env_of(&[("LOXI_CCM_CONFIG", file.to_str().unwrap())]),
        ));
        assert_eq!(
            e,
            format!(
                "config file {}: key \"externalSecondaryCIDRs6\": kube-loxilb's \
                 externalSecondaryCIDRs6 is not \
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
