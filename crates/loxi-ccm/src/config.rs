//! The validated configuration the controller runs with, built from the command line.

use std::time::Duration;

use loxi_domain::ipam::AddressBlock;
use loxi_domain::{ClusterId, Defaults, NatMode, Pool};
use loxilb_client::ClientConfig;
use thiserror::Error;

use crate::cli::RunArgs;
use crate::leader::{LeaseConfig, default_identity};
use crate::node_init::NodeInitArgs;

/// The name of the pool built from `--external-cidr`.
pub const DEFAULT_POOL: &str = "default";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("--external-cidr: {0}")]
    Pool(#[from] loxi_domain::ipam::BlockError),
    #[error(
        "--lb-mode {0:?}: expected default, onearm, fullnat, dsr, fullproxy, hostonearm or 0-5"
    )]
    LbMode(String),
    #[error("--cluster-id: {0}")]
    ClusterId(String),
    #[error("--loxilb-url {url:?}: {reason}")]
    LoxilbUrl { url: String, reason: String },
    #[error("--loxilb-ca-file {path}: {source}")]
    CaFile {
        path: String,
        source: std::io::Error,
    },
    #[error("--concurrency must be at least 1")]
    Concurrency,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub loxilb: Vec<ClientConfig>,
    pub pool: Pool,
    pub class: String,
    pub ccm_mode: bool,
    pub defaults: Defaults,
    pub cluster_id: Option<ClusterId>,
    pub namespace: Option<String>,
    pub health_interval: Duration,
    pub drift_interval: Duration,
    pub concurrency: u16,
    /// `None`: leader election off (this replica is always the leader).
    pub leader: Option<LeaseConfig>,
    pub node_init: NodeInitArgs,
}

impl Config {
    pub fn from_args(args: &RunArgs) -> Result<Config, ConfigError> {
        let block: AddressBlock = args.external_cidr.parse()?;
        let mode: NatMode = args
            .lb_mode
            .trim()
            .parse()
            .map_err(|()| ConfigError::LbMode(args.lb_mode.clone()))?;
        let cluster_id = args
            .cluster_id
            .as_deref()
            .map(ClusterId::new)
            .transpose()
            .map_err(ConfigError::ClusterId)?;
        let ca_pem = match &args.loxilb_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|source| ConfigError::CaFile {
                path: path.display().to_string(),
                source,
            })?),
            None => None,
        };
        let mut loxilb = Vec::new();
        for url in args
            .loxilb_urls
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
        {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::LoxilbUrl {
                    url: url.to_string(),
                    reason: "must start with http:// or https://".into(),
                });
            }
            let mut c = ClientConfig::new(url);
            c.timeout = args.loxilb_timeout;
            c.token = args.loxilb_token.clone();
            c.ca_pem = ca_pem.clone();
            loxilb.push(c);
        }
        if loxilb.is_empty() {
            return Err(ConfigError::LoxilbUrl {
                url: String::new(),
                reason: "at least one loxilb URL is required".into(),
            });
        }
        if args.concurrency == 0 {
            return Err(ConfigError::Concurrency);
        }
        Ok(Config {
            loxilb,
            pool: Pool::new(DEFAULT_POOL, vec![block]),
            class: args.load_balancer_class.clone(),
            ccm_mode: args.ccm_mode,
            defaults: Defaults {
                mode,
                monitor: args.monitor,
            },
            cluster_id,
            namespace: args.namespace.clone(),
            health_interval: args.health_interval,
            drift_interval: args.drift_interval,
            concurrency: args.concurrency,
            leader: args.leader_elect.then(|| {
                let mut lease = LeaseConfig::new(
                    &args.leader_elect_namespace,
                    &args.leader_elect_name,
                    default_identity(),
                );
                lease.lease_duration = args.leader_elect_lease_duration;
                // client-go's proportions: renew within 2/3 of the lease, retry at 2/15.
                lease.renew_deadline = args.leader_elect_lease_duration * 2 / 3;
                lease.retry_period = args.leader_elect_lease_duration * 2 / 15;
                lease
            }),
            node_init: args.node_init.clone(),
        })
    }
}
