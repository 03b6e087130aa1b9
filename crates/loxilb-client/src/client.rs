//! The HTTP client.

mod firewall;
mod metadata;

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use url::Url;

use crate::bgp::{
    BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpNeighborStatus, BgpPolicy, BgpPolicyApply,
    DefinedSetKind, DefinedSetList, NeighborList, PolicyList,
};
use crate::dto::{CiState, CiStateList, LoadbalanceEntry, ResultBody, VersionInfo};
use crate::error::{ClientError, classify};
use crate::listing::{self, ChunkReader, Listing};
use crate::token::Token;

/// Installs the one rustls crypto provider of the process (ring, which kube also uses).
/// Two providers in one binary make client creation panic, so every entry point calls this;
/// later calls are no-ops.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Bounded retries for retryable failures (connection errors, timeouts, 5xx) inside one call.
/// Longer-term retries belong to the caller's per-object backoff.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub attempts: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// The waits between attempts: from `min_delay`, doubling, at most `max_delay`, one
    /// fewer than `attempts` (a policy of 0 attempts still makes one).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        use backon::BackoffBuilder;
        backon::ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_max_times(self.attempts.max(1) - 1)
            .build()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// e.g. `http://10.0.0.5:11111`; the API base path `/netlox/v1` is added.
    pub url: String,
    /// Per-call timeout.
    pub timeout: Duration,
    /// Sent verbatim in `Authorization` (loxilb wants no `Bearer ` prefix); shared, so that
    /// a replaced token reaches every client at its next request.
    pub token: Token,
    /// PEM CA bundle that signs loxilb's HTTPS certificate; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any certificate (`--loxilb-insecure-skip-tls-verify`): encryption without
    /// knowing who answers. For tests and first steps only.
    pub insecure_skip_tls_verify: bool,
    pub retry: RetryPolicy,
    /// Who is calling, sent in [`IDENTITY_HEADER`] with every call: the controller passes
    /// its leader-election identity, so that a loxilb log (or the simulator's write log)
    /// says which replica sent each write. loxilb ignores the header
    /// (docs/loxilb-api.md#transport). `None`: not sent.
    pub identity: Option<String>,
}

/// The header carrying [`ClientConfig::identity`]: ours, not loxilb's (it ignores unknown
/// headers); the simulator records it with every write (`loxilb_sim::SimWrite::caller`).
pub const IDENTITY_HEADER: &str = "x-loxi-ccm-identity";

/// The `User-Agent` of every call: `loxi-ccm/<version>`.
pub const USER_AGENT: &str = concat!("loxi-ccm/", env!("CARGO_PKG_VERSION"));

impl ClientConfig {
    pub fn new(url: &str) -> ClientConfig {
        ClientConfig {
            url: url.to_string(),
            timeout: Duration::from_secs(5),
            token: Token::default(),
            ca_pem: None,
            insecure_skip_tls_verify: false,
            retry: RetryPolicy::default(),
            identity: None,
        }
    }
}

/// Result of a successful write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// 200 `{"result":"Success"}`: created or updated.
    Applied,
    /// 409 with `exist`: loxilb already holds exactly this (the normal idempotent answer).
    AlreadyPresent,
}

/// Result of a successful delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    /// 404 `no-rule`: nothing to delete.
    AlreadyAbsent,
}

/// An HTTP client for one loxilb instance; `pooled: false` keeps no idle connection.
fn http_client(cfg: &ClientConfig, pooled: bool) -> Result<reqwest::Client, ClientError> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(value) = cfg
        .identity
        .as_deref()
        .and_then(|id| reqwest::header::HeaderValue::from_str(id).ok())
    {
        headers.insert(IDENTITY_HEADER, value);
    }
    let mut builder = reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .default_headers(headers)
        .timeout(cfg.timeout)
        .connect_timeout(cfg.timeout.min(Duration::from_secs(2)))
        .pool_idle_timeout(Duration::from_secs(60));
    if !pooled {
        builder = builder.pool_max_idle_per_host(0);
    }
    if let Some(pem) = &cfg.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| ClientError::Config(format!("loxilb CA bundle: {e}")))?;
        builder = builder.tls_certs_only(certs);
    }
    if cfg.insecure_skip_tls_verify {
        builder = builder.tls_danger_accept_invalid_certs(true);
    }
    builder
        .build()
        .map_err(|e| ClientError::Config(format!("HTTP client: {e}")))
}

#[derive(Clone)]
pub struct LoxilbClient {
    http: reqwest::Client,
    /// For rule listings only: no idle connections kept. hyper grows a connection's read
    /// buffer up to ~400 KiB while a multi-megabyte listing streams in and keeps it as long
    /// as the connection lives; pooled, every connection that once carried a listing kept
    /// one (heaptrack: ~4 MB of the controller's peak at 2,000 rules). A listing is rare
    /// (start-up, drift check, after a restart): one more connection setup is nothing.
    listing_http: reqwest::Client,
    base: Arc<Url>,
    /// `POST /config/loadbalancer`, parsed once: it is the call a Node change makes for
    /// every rule.
    rule_url: Arc<Url>,
    display: Arc<str>,
    cfg: Arc<ClientConfig>,
    /// Asked before, during and at the end of sending every write (see
    /// [`LoxilbClient::with_write_gate`]).
    write_gate: Option<WriteGate>,
}

/// Decides, at the moment a write is about to be sent, whether it may be: `false` stops it
/// with [`ClientError::WritesStopped`]. Reads are never gated.
pub type WriteGate = Arc<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for LoxilbClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoxilbClient")
            .field("url", &self.display)
            .finish()
    }
}

enum Answer {
    Ok(bytes::Bytes),
    Status(StatusCode, ResultBody),
}

impl LoxilbClient {
    pub fn new(cfg: ClientConfig) -> Result<LoxilbClient, ClientError> {
        install_crypto_provider();
        let trimmed = cfg.url.trim_end_matches('/');
        // Check the URL as given: once the base path is appended, "http://" would read as
        // host "netlox".
        let given = Url::parse(trimmed)
            .map_err(|e| ClientError::Config(format!("loxilb URL {:?}: {e}", cfg.url)))?;
        let base = Url::parse(&format!("{trimmed}/netlox/v1/"))
            .map_err(|e| ClientError::Config(format!("loxilb URL {:?}: {e}", cfg.url)))?;
        if !matches!(given.scheme(), "http" | "https") || given.host_str().is_none_or(str::is_empty)
        {
            return Err(ClientError::Config(format!(
                "loxilb URL {:?} must be http:// or https:// with a host",
                cfg.url
            )));
        }
        let rule_url = base
            .join("config/loadbalancer")
            .map_err(|e| ClientError::Config(format!("loxilb URL {:?}: {e}", cfg.url)))?;
        let http = http_client(&cfg, true)?;
        let listing_http = http_client(&cfg, false)?;
        Ok(LoxilbClient {
            http,
            listing_http,
            display: trimmed.into(),
            base: Arc::new(base),
            rule_url: Arc::new(rule_url),
            cfg: Arc::new(cfg),
            write_gate: None,
        })
    }

    /// Every later write (any method but GET, each retry included) asks `gate` before it
    /// starts, again after every step of the call that waits (connecting, the TLS handshake,
    /// a pooled connection) and last when the connection writes its body; a closed gate at
    /// any of these ends the call with [`ClientError::WritesStopped`]. A controller passes
    /// "do I still hold the leader Lease", so that a replica that lost it never writes again,
    /// whatever it had under way (docs/architecture.md#leader-election).
    pub fn with_write_gate(mut self, gate: WriteGate) -> LoxilbClient {
        self.write_gate = Some(gate);
        self
    }

    /// The URL this client talks to, as configured (for logs, metrics, reports).
    pub fn url(&self) -> &str {
        &self.display
    }

    /// How long one call waits for its answer.
    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// `GET /version`: the cheapest liveness probe (no auth, docs/loxilb-api.md#liveness).
    pub async fn version(&self) -> Result<VersionInfo, ClientError> {
        let bytes = self.get_ok("version").await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::BadResponse(format!("version: {e}")))
    }

    /// `GET /version` in a single attempt (no retry): a liveness probe that takes at most one
    /// timeout, so a loxilb that accepts connections and never answers is seen down after
    /// one timeout, not after every retry's (docs/fleet.md#failover-timeline).
    pub async fn probe_version(&self) -> Result<VersionInfo, ClientError> {
        let url = self
            .base
            .join("version")
            .map_err(|e| ClientError::Config(format!("path version: {e}")))?;
        let bytes = match self.send_once::<()>(Method::GET, url, None).await? {
            Answer::Ok(bytes) => bytes,
            Answer::Status(status, body) => {
                return Err(classify(status.as_u16(), body.message, body.result));
            }
        };
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::BadResponse(format!("version: {e}")))
    }

    /// `GET /config/loadbalancer/all`, in loxilb's (unspecified) order.
    pub async fn list_rules(&self) -> Result<Vec<LoadbalanceEntry>, ClientError> {
        Ok(self.list_rules_map(Some).await?.items)
    }

    /// `GET /config/loadbalancer/all`, each entry passed through `convert` as soon as it is
    /// read (entries it answers `None` for are only counted): a full listing is never held
    /// as a body plus wire entries plus the result (see [`crate::listing`]).
    pub async fn list_rules_map<T: Send + 'static>(
        &self,
        convert: fn(LoadbalanceEntry) -> Option<T>,
    ) -> Result<Listing<T>, ClientError> {
        let url = self
            .base
            .join("config/loadbalancer/all")
            .map_err(|e| ClientError::Config(format!("rule list URL: {e}")))?;
        self.retrying(
            || self.stream_listing(url.clone(), convert),
            |result| matches!(result, Err(e) if e.is_retryable()),
        )
        .await
    }

    /// `GET /config/cistate/all`: the HA state of every cluster instance loxilb knows
    /// (docs/loxilb-api.md#ha-roles).
    pub async fn cluster_states(&self) -> Result<Vec<CiState>, ClientError> {
        let bytes = self.get_ok("config/cistate/all").await?;
        let list: CiStateList = serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::BadResponse(format!("cistate list: {e}")))?;
        Ok(list.states)
    }

    /// The BGP advertisement reference counts per address, where the loxilb exposes them:
    /// only the loxilb simulator does (`GET /admin/bgp`, `crates/loxilb-sim/src/admin.rs`);
    /// real loxilb keeps them internally and answers 404 for that path, which gives `None`.
    /// Read by `loxi-ccm audit` only.
    pub async fn simulator_advertisements(
        &self,
    ) -> Result<Option<std::collections::BTreeMap<String, u32>>, ClientError> {
        #[derive(serde::Deserialize)]
        struct AdminBgp {
            #[serde(default)]
            advertisements: std::collections::BTreeMap<String, u32>,
        }
        let url = self
            .base
            .join("/admin/bgp")
            .map_err(|e| ClientError::Config(format!("admin URL: {e}")))?;
        match self.send_url::<()>(Method::GET, url, None).await? {
            Answer::Ok(bytes) => serde_json::from_slice::<AdminBgp>(&bytes)
                .map(|b| Some(b.advertisements))
                .map_err(|e| ClientError::BadResponse(format!("admin bgp: {e}"))),
            Answer::Status(status, _) if status.is_client_error() => Ok(None),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `POST /config/cistate`. An unknown instance is created first; posting the state it
    /// already has changes nothing (docs/loxilb-api.md#ha-roles).
    pub async fn set_cluster_state(&self, state: &CiState) -> Result<(), ClientError> {
        match self
            .send(Method::POST, "config/cistate", Some(state))
            .await?
        {
            Answer::Ok(bytes) => success_body(&bytes),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `POST /config/loadbalancer` with the complete rule.
    pub async fn apply_rule(&self, entry: &LoadbalanceEntry) -> Result<WriteOutcome, ClientError> {
        match self
            .send_url(Method::POST, (*self.rule_url).clone(), Some(entry))
            .await?
        {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| WriteOutcome::Applied),
            Answer::Status(StatusCode::CONFLICT, body)
                if body_mentions(&body, "exist") && !body_mentions(&body, "cant modify") =>
            {
                Ok(WriteOutcome::AlreadyPresent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// Deletes the single-port rule `ip:port/protocol` (empty host, block 0).
    pub async fn delete_rule(
        &self,
        ip: &str,
        port: u16,
        protocol: &str,
        bgp: bool,
    ) -> Result<DeleteOutcome, ClientError> {
        let path = format!(
            "config/loadbalancer/externalipaddress/{ip}/port/{port}/protocol/{protocol}?bgp={bgp}&block=0"
        );
        match self.send::<()>(Method::DELETE, &path, None).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| DeleteOutcome::Deleted),
            Answer::Status(StatusCode::NOT_FOUND, body)
                if body_mentions(&body, "no-rule") || body_mentions(&body, "not found") =>
            {
                Ok(DeleteOutcome::AlreadyAbsent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `DELETE /config/loadbalancer/name/{name}`: every rule with exactly this name (200 even
    /// when none matched).
    pub async fn delete_rules_named(&self, name: &str) -> Result<(), ClientError> {
        let mut url = (*self.base).clone();
        url.path_segments_mut()
            .map_err(|()| ClientError::Config("base URL cannot have segments".into()))?
            .pop_if_empty()
            .extend(["config", "loadbalancer", "name", name]);
        match self.send_url::<()>(Method::DELETE, url, None).await? {
            Answer::Ok(bytes) => success_body(&bytes),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // BGP (docs/loxilb-api.md#bgp). With loxilb running without BGP, every call fails with
    // `ClientError::BgpDisabled`.
    // -----------------------------------------------------------------------------------------

    /// `POST /config/bgp/global`: starts goBGP. Repeating it does not change a running
    /// configuration: a changed one needs a loxilb restart.
    pub async fn set_bgp_global(&self, global: &BgpGlobal) -> Result<(), ClientError> {
        let url = self.url_of(&["config", "bgp", "global"])?;
        self.write_url(Method::POST, url, Some(global)).await
    }

    /// `POST /config/bgp/neigh`; an existing peer (409, `can't overwrite the existing
    /// peer`) is [`WriteOutcome::AlreadyPresent`], whatever its settings. Needs the global
    /// configuration first.
    pub async fn add_bgp_neighbor(
        &self,
        neighbor: &BgpNeighbor,
    ) -> Result<WriteOutcome, ClientError> {
        let url = self.url_of(&["config", "bgp", "neigh"])?;
        match self.send_url(Method::POST, url, Some(neighbor)).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| WriteOutcome::Applied),
            Answer::Status(StatusCode::CONFLICT, body) if body_mentions(&body, "exist") => {
                Ok(WriteOutcome::AlreadyPresent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `DELETE /config/bgp/neigh/{ip}?remoteAs=<n>`. `remoteAs` is always sent (without it
    /// loxilb closes the connection unanswered), as the int32 the route declares: an AS above
    /// 2147483647 goes as its two's complement, which loxilb converts back. An unknown peer
    /// is [`DeleteOutcome::AlreadyAbsent`].
    pub async fn delete_bgp_neighbor(
        &self,
        ip: IpAddr,
        remote_as: u32,
    ) -> Result<DeleteOutcome, ClientError> {
        let mut url = self.url_of(&["config", "bgp", "neigh", &ip.to_string()])?;
        url.query_pairs_mut()
            .append_pair("remoteAs", &remote_as.cast_signed().to_string());
        match self.send_url::<()>(Method::DELETE, url, None).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| DeleteOutcome::Deleted),
            Answer::Status(status, body)
                if status.is_server_error()
                    && body_mentions(&body, "can't delete a peer configuration") =>
            {
                Ok(DeleteOutcome::AlreadyAbsent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `GET /config/bgp/neigh/all`: every configured peer with its session state.
    pub async fn list_bgp_neighbors(&self) -> Result<Vec<BgpNeighborStatus>, ClientError> {
        let url = self.url_of(&["config", "bgp", "neigh", "all"])?;
        let list: NeighborList = self.get_json(url, "BGP neighbour list").await?;
        Ok(list.neighbors)
    }

    /// `POST /config/bgp/policy/definedsets/{kind}`: creates the set, or adds the members
    /// to an existing one of that name.
    pub async fn add_bgp_defined_set(
        &self,
        kind: DefinedSetKind,
        set: &BgpDefinedSet,
    ) -> Result<(), ClientError> {
        let url = self.url_of(&[
            "config",
            "bgp",
            "policy",
            "definedsets",
            kind.as_path_segment(),
        ])?;
        self.write_url(Method::POST, url, Some(set)).await
    }

    /// `DELETE /config/bgp/policy/definedsets/{kind}/{name}`; an unknown set is
    /// [`DeleteOutcome::AlreadyAbsent`], one a policy uses an error.
    pub async fn delete_bgp_defined_set(
        &self,
        kind: DefinedSetKind,
        name: &str,
    ) -> Result<DeleteOutcome, ClientError> {
        let url = self.url_of(&[
            "config",
            "bgp",
            "policy",
            "definedsets",
            kind.as_path_segment(),
            name,
        ])?;
        self.delete_url(url, None::<&()>).await
    }

    /// `GET /config/bgp/policy/definedsets/{kind}/all`.
    pub async fn list_bgp_defined_sets(
        &self,
        kind: DefinedSetKind,
    ) -> Result<Vec<BgpDefinedSet>, ClientError> {
        let url = self.url_of(&[
            "config",
            "bgp",
            "policy",
            "definedsets",
            kind.as_path_segment(),
            "all",
        ])?;
        let list: DefinedSetList = self.get_json(url, "BGP defined set list").await?;
        Ok(list.sets)
    }

    /// `POST /config/bgp/policy/definitions`: a new policy, or more statements for an
    /// existing one. A statement name already in use (in any policy) is refused.
    pub async fn add_bgp_policy(&self, policy: &BgpPolicy) -> Result<(), ClientError> {
        let url = self.url_of(&["config", "bgp", "policy", "definitions"])?;
        self.write_url(Method::POST, url, Some(policy)).await
    }

    /// `DELETE /config/bgp/policy/definitions/{name}`, with its statements; an unknown
    /// policy is [`DeleteOutcome::AlreadyAbsent`], an applied one an error.
    pub async fn delete_bgp_policy(&self, name: &str) -> Result<DeleteOutcome, ClientError> {
        let url = self.url_of(&["config", "bgp", "policy", "definitions", name])?;
        self.delete_url(url, None::<&()>).await
    }

    /// `GET /config/bgp/policy/definitions/all`, loxilb's own policies included.
    pub async fn list_bgp_policies(&self) -> Result<Vec<BgpPolicy>, ClientError> {
        let url = self.url_of(&["config", "bgp", "policy", "definitions", "all"])?;
        let list: PolicyList = self.get_json(url, "BGP policy list").await?;
        Ok(list.policies)
    }

    /// `POST /config/bgp/policy/apply`: appends the policies to the target's direction and
    /// sets its default action. A policy already applied there (500 `duplicated policy`) is
    /// [`WriteOutcome::AlreadyPresent`].
    pub async fn apply_bgp_policy(
        &self,
        apply: &BgpPolicyApply,
    ) -> Result<WriteOutcome, ClientError> {
        let url = self.url_of(&["config", "bgp", "policy", "apply"])?;
        match self.send_url(Method::POST, url, Some(apply)).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| WriteOutcome::Applied),
            Answer::Status(status, body)
                if status.is_server_error() && body_mentions(&body, "duplicated policy") =>
            {
                Ok(WriteOutcome::AlreadyPresent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// `DELETE /config/bgp/policy/apply` (with the body, `routeAction` included): removes
    /// the named policies, or all of the direction when none is named. Policies not applied
    /// there are ignored; an unknown policy is an error.
    pub async fn unapply_bgp_policy(&self, apply: &BgpPolicyApply) -> Result<(), ClientError> {
        let url = self.url_of(&["config", "bgp", "policy", "apply"])?;
        self.write_url(Method::DELETE, url, Some(apply)).await
    }

    /// The API URL of these path segments, each percent-encoded as needed.
    fn url_of(&self, segments: &[&str]) -> Result<Url, ClientError> {
        let mut url = (*self.base).clone();
        url.path_segments_mut()
            .map_err(|()| ClientError::Config("base URL cannot have segments".into()))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    /// A write whose only success is 200 `{"result":"Success"}`.
    async fn write_url<B: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
    ) -> Result<(), ClientError> {
        match self.send_url(method, url, body).await? {
            Answer::Ok(bytes) => success_body(&bytes),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    /// A delete that reads a 404 `not found` as already gone.
    async fn delete_url<B: Serialize>(
        &self,
        url: Url,
        body: Option<&B>,
    ) -> Result<DeleteOutcome, ClientError> {
        match self.send_url(Method::DELETE, url, body).await? {
            Answer::Ok(bytes) => success_body(&bytes).map(|()| DeleteOutcome::Deleted),
            Answer::Status(StatusCode::NOT_FOUND, body) if body_mentions(&body, "not found") => {
                Ok(DeleteOutcome::AlreadyAbsent)
            }
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: Url,
        what: &str,
    ) -> Result<T, ClientError> {
        match self.send_url::<()>(Method::GET, url, None).await? {
            Answer::Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ClientError::BadResponse(format!("{what}: {e}"))),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    async fn get_ok(&self, path: &str) -> Result<bytes::Bytes, ClientError> {
        match self.send::<()>(Method::GET, path, None).await? {
            Answer::Ok(bytes) => Ok(bytes),
            Answer::Status(status, body) => {
                Err(classify(status.as_u16(), body.message, body.result))
            }
        }
    }

    async fn send<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Answer, ClientError> {
        let url = self
            .base
            .join(path)
            .map_err(|e| ClientError::Config(format!("path {path:?}: {e}")))?;
        self.send_url(method, url, body).await
    }

    /// One call with bounded retries of retryable failures.
    async fn send_url<B: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
    ) -> Result<Answer, ClientError> {
        // A write that got no answer in time may still be applied: loxilb queues writes and
        // applies them later (docs/loxilb-api.md). Sending it again would only queue one
        // more costly write behind it; the caller learns the outcome from a later listing.
        let write = method != Method::GET;
        self.retrying(
            || self.send_once(method.clone(), url.clone(), body),
            |result| match result {
                Err(ClientError::Timeout { .. }) if write => false,
                Err(e) => e.is_retryable(),
                Ok(Answer::Status(status, body)) => {
                    status.is_server_error()
                        && classify(status.as_u16(), body.message.clone(), body.result.clone())
                            .is_retryable()
                }
                Ok(Answer::Ok(_)) => false,
            },
        )
        .await
    }

    /// Runs `once` until `retry` says no or the policy's attempts are used up.
    async fn retrying<T, F: Future<Output = T>>(
        &self,
        once: impl Fn() -> F,
        retry: impl Fn(&T) -> bool,
    ) -> T {
        let mut delays = self.cfg.retry.delays();
        let mut attempt = 1;
        loop {
            let result = once().await;
            if !retry(&result) {
                return result;
            }
            let Some(delay) = delays.next() else {
                return result;
            };
            tracing::debug!(url = %self.display, attempt, "retrying loxilb call");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        self.authorized(self.http.request(method, url))
    }

    fn authorized(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.cfg.token.get() {
            Some(token) => {
                let mut value = match reqwest::header::HeaderValue::from_str(&token) {
                    Ok(v) => v,
                    // Not a valid header value (a control character): sent as nothing, so
                    // loxilb answers 401 rather than the request failing to build.
                    Err(_) => return req,
                };
                // Never shown by reqwest's or hyper's own Debug output and logs.
                value.set_sensitive(true);
                req.header(reqwest::header::AUTHORIZATION, value)
            }
            None => req,
        }
    }

    /// One listing: chunks go to the parser (on a blocking thread) as they arrive.
    async fn stream_listing<T: Send + 'static>(
        &self,
        url: Url,
        convert: fn(LoadbalanceEntry) -> Option<T>,
    ) -> Result<Listing<T>, ClientError> {
        let mut resp = self
            .authorized(self.listing_http.get(url))
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if status != StatusCode::OK {
            let bytes = resp.bytes().await.map_err(|e| self.transport_error(e))?;
            let body = error_body(&bytes);
            return Err(classify(status.as_u16(), body.message, body.result));
        }
        // Two chunks ahead of the parser at most: hyper hands out chunks of up to ~400 KiB
        // from a fast local loxilb, so a deeper queue holds megabytes of a listing when the
        // parser falls behind.
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let parser =
            tokio::task::spawn_blocking(move || listing::parse(ChunkReader::new(rx), convert));
        let mut transport = None;
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(chunk).await.is_err() {
                        break; // the parser stopped at an error
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    transport = Some(self.transport_error(e));
                    break;
                }
            }
        }
        drop(tx);
        let parsed = parser
            .await
            .map_err(|e| ClientError::BadResponse(format!("rule list parser: {e}")))?;
        if let Some(e) = transport {
            return Err(e);
        }
        parsed.map_err(|e| ClientError::BadResponse(format!("rule list: {e}")))
    }

    async fn send_once<B: Serialize>(
        &self,
        method: Method,
        url: Url,
        body: Option<&B>,
    ) -> Result<Answer, ClientError> {
        let gate = if method == Method::GET {
            None
        } else {
            self.write_gate.clone()
        };
        let stopped = || ClientError::WritesStopped {
            url: self.display.to_string(),
        };
        if let Some(gate) = &gate
            && !gate()
        {
            return Err(stopped());
        }
        let mut req = self.request(method, url);
        if let Some(body) = body {
            let json = serde_json::to_vec(body)
                .map_err(|e| ClientError::Config(format!("request body: {e}")))?;
            // `Content-Type: application/json`, without which loxilb answers 415.
            req = req.header(
                reqwest::header::CONTENT_TYPE,
                reqwest::header::HeaderValue::from_static("application/json"),
            );
            req = match &gate {
                Some(gate) => req.body(reqwest::Body::wrap(GatedBody {
                    data: Some(bytes::Bytes::from(json)),
                    gate: gate.clone(),
                })),
                None => req.body(json),
            };
        }
        let resp = match &gate {
            None => req.send().await,
            // The write Lease is asked again on every poll of the request, that is after
            // every step that waits (DNS, TCP connect, TLS handshake, a pooled connection
            // becoming free, the connection's readiness), and before the poll that hands the
            // request to the connection: a write whose connection took long, or that was
            // frozen on the way (SIGSTOP, a stalled VM), is dropped unsent the moment it is
            // polled again with the Lease gone. The last check is then the body's, in the
            // connection's own task, right before the bytes are written (`GatedBody`).
            // docs/architecture.md#leader-election.
            Some(gate) => {
                let mut sending = std::pin::pin!(req.send());
                let sent = std::future::poll_fn(|cx| {
                    if !gate() {
                        return Poll::Ready(None);
                    }
                    sending.as_mut().poll(cx).map(Some)
                })
                .await;
                match sent {
                    None => return Err(stopped()),
                    Some(Err(e)) if gate_closed(&e) || !gate() => return Err(stopped()),
                    Some(sent) => sent,
                }
            }
        };
        let resp = resp.map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| self.transport_error(e))?;
        if status == StatusCode::OK {
            return Ok(Answer::Ok(bytes));
        }
        Ok(Answer::Status(status, error_body(&bytes)))
    }

    fn transport_error(&self, e: reqwest::Error) -> ClientError {
        if e.is_timeout() {
            ClientError::Timeout {
                url: self.display.to_string(),
                timeout_ms: self.cfg.timeout.as_millis() as u64,
            }
        } else {
            // The innermost cause ("Connection refused") is what an operator needs to read.
            let mut detail = e.to_string();
            let mut tls = None;
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                detail = s.to_string();
                if let Some(err) = rustls_error_in(s) {
                    tls = Some(err.to_string());
                }
                source = s.source();
            }
            // A refused certificate would otherwise read as a bare "unreachable", and be
            // shown on Services as loxilb being away rather than as a certificate to fix.
            if let Some(tls) = tls {
                return ClientError::Tls {
                    url: self.display.to_string(),
                    detail: format!(
                        "TLS handshake failed: {tls} (loxilb's certificate must be signed by a \
                         CA of --loxilb-ca-file, be valid now and name the URL's host)"
                    ),
                };
            }
            ClientError::Unreachable {
                url: self.display.to_string(),
                detail,
            }
        }
    }
}

/// A write's body, handed out only if the write gate still says yes when the connection's
/// task asks for it: hyper buffers the request head, asks the body for its bytes in the same
/// poll and only then writes both to the socket, so this is the last check before the write
/// leaves the process. A closed gate fails the body: hyper drops the connection with the
/// head unwritten, and the call ends with [`ClientError::WritesStopped`]. Its exact length
/// keeps the request as `.json()` would send it (`Content-Length`, not chunked).
struct GatedBody {
    data: Option<bytes::Bytes>,
    gate: WriteGate,
}

/// The error a [`GatedBody`] fails with.
#[derive(Debug, thiserror::Error)]
#[error("the write gate closed before the request was written")]
struct GateClosed;

impl http_body::Body for GatedBody {
    type Data = bytes::Bytes;
    type Error = GateClosed;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, GateClosed>>> {
        let this = self.get_mut();
        let Some(data) = this.data.take() else {
            return Poll::Ready(None);
        };
        if !(this.gate)() {
            return Poll::Ready(Some(Err(GateClosed)));
        }
        Poll::Ready(Some(Ok(http_body::Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Whether a [`GatedBody`] stopped this request.
fn gate_closed(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<GateClosed>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// rustls' error inside `e`: it reaches the client wrapped in io::Errors (two of them, from
/// tokio-rustls and hyper-util), whose `source` skips what they wrap.
fn rustls_error_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_error_in(inner as &(dyn std::error::Error + 'static))
}

/// The body of a non-200 answer; one that is not JSON is kept as the message.
fn error_body(bytes: &[u8]) -> ResultBody {
    serde_json::from_slice(bytes).unwrap_or_else(|_| ResultBody {
        message: Some(String::from_utf8_lossy(bytes).trim().to_string()),
        ..Default::default()
    })
}

fn body_mentions(body: &ResultBody, needle: &str) -> bool {
    body.result
        .as_deref()
        .or(body.message.as_deref())
        .is_some_and(|t| t.to_ascii_lowercase().contains(needle))
}

/// A 200 is a success only when `result` is "Success": DSR with a non-hash selection answers
/// 200 with `{"result":"Error: ..."}` (docs/loxilb-api.md#rejections-inside-a-200).
fn success_body(bytes: &[u8]) -> Result<(), ClientError> {
    let body: ResultBody = serde_json::from_slice(bytes)
        .map_err(|e| ClientError::BadResponse(format!("write answer: {e}")))?;
    match body.result.as_deref() {
        Some("Success") => Ok(()),
        Some(other) => Err(ClientError::Rejected {
            status: 200,
            message: other.to_string(),
        }),
        None => Err(ClientError::BadResponse("200 without a result".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_policy_waits_doubling_up_to_its_maximum_between_its_attempts() {
        let policy = RetryPolicy {
            attempts: 5,
            min_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(150),
        };
        let ms: Vec<u128> = policy.delays().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [50, 100, 150, 150]);
        let once = RetryPolicy {
            attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(once.delays().count(), 0);
    }
}
