//! `loxi-ccm check`: everything `run` needs, verified once, with a readable report.
//!
//! 1. The configuration (all layers, every value validated as `run` would).
//! 2. The Kubernetes API: `GET /version`, then the credentials (who we are, listing Services
//!    and Nodes), the cluster identity, and the permissions `run` uses (one
//!    SelfSubjectAccessReview per verb and resource).
//!    A 401 answer is reported as refused credentials and a 403 as a missing permission
//!    (named); only a connection failure or a timeout is "unreachable".
//! 3. The node-initialization inventory (`--inventory-file` / `--inventory-configmap`),
//!    loaded and validated by the code node initialization uses.
//! 4. Every loxilb of the fleet (`--loxilb-url`, the discovered ones and those of `LoxiURL`
//!    resources, as the controller finds them: `crate::config::sources`): `GET /version`
//!    (reachable) and a rule listing (which, unlike `/version`, needs the token when loxilb
//!    runs with authentication).
//! 5. The write queues of a controller running beside it (`crate::config::queues`):
//!    informational, never a failure.
//!
//! One line per check, `OK` or `FAIL` with the reason; [`Report::passed`] decides the exit code.
//! Nothing is written anywhere.

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, ListParams, PostParams};
use loxi_domain::ClusterId;
use loxi_domain::text::shown;
use loxilb_client::{ClientConfig, LoxilbClient};

pub use super::check_line::CheckLine;
use crate::config::{Config, ConfigError, Loaded};
use crate::node_init::InventorySource;

/// Upper bound for one Kubernetes call of the check.
const KUBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The outcome of every check, in order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: Vec<CheckLine>,
}

impl Report {
    fn push(&mut self, ok: bool, name: impl Into<String>, detail: impl Into<String>) {
        self.lines.push(CheckLine {
            ok,
            name: name.into(),
            detail: detail.into(),
        });
    }

    pub fn pass(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(true, name, detail);
    }

    pub fn fail(&mut self, name: impl Into<String>, detail: impl Into<String>) {
        self.push(false, name, detail);
    }

    /// A report holding only the failed configuration (nothing else can be checked).
    pub fn config_failure(error: &ConfigError) -> Report {
        let mut r = Report::default();
        r.fail("configuration", error.to_string());
        r
    }

    /// True when every check passed.
    pub fn passed(&self) -> bool {
        !self.lines.is_empty() && self.lines.iter().all(|l| l.ok)
    }

    /// `check passed: 7 checks OK` / `check failed: 2 of 7 checks failed`.
    pub fn summary(&self) -> String {
        let failed = self.lines.iter().filter(|l| !l.ok).count();
        if failed == 0 {
            format!("check passed: {} checks OK", self.lines.len())
        } else {
            format!(
                "check failed: {failed} of {} checks failed",
                self.lines.len()
            )
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// Runs every check. The configuration is validated first; without a valid one nothing else
/// is tried.
pub async fn run(loaded: &Loaded) -> Report {
    let mut report = Report::default();
    let cfg = match loaded.config() {
        Ok(cfg) => cfg,
        Err(e) => return Report::config_failure(&e),
    };
    report.pass("configuration", describe_config(&cfg, loaded));
    report.pass("fleet", describe_fleet(&cfg));
    let (mut kube_lines, api) = kube_checks(loaded.args.kube_api.kubeconfig.as_deref(), &cfg).await;
    kube_lines
        .lines
        .extend(inventory_check(api.as_ref(), &cfg).await);
    kube_lines
        .lines
        .extend(roles_check(api.as_ref(), &cfg).await);
    // The token is in a Secret: read it first, so the loxilb checks prove it.
    if let (crate::config::TokenSource::Secret(secret), Some(api)) =
        (&cfg.loxilb_token_source, &api)
    {
        match crate::config::token::read_secret(api, secret).await {
            Ok(Some(value)) => {
                cfg.loxilb_token.set(Some(&value));
                kube_lines.pass("loxilb token", format!("Secret {secret} holds a token"));
            }
            Ok(None) => kube_lines.fail(
                "loxilb token",
                format!("Secret {secret} or its key does not exist: no token is sent"),
            ),
            Err(e) => kube_lines.fail("loxilb token", e),
        }
    }
    // Every loxilb of the fleet, as the controller finds them: --loxilb-url, the discovered
    // ones, those of LoxiURL resources (crate::config::sources).
    let loxilbs = match &api {
        Some(api) => match crate::config::sources::loxilbs(api, &cfg).await {
            Ok(all) if all.is_empty() => {
                kube_lines.fail(
                    "fleet members",
                    "no loxilb found: nothing can be programmed",
                );
                all
            }
            Ok(all) => all,
            Err(e) => {
                kube_lines.fail("fleet members", crate::k8s::api::anyhow_text(&e));
                cfg.loxilb.clone()
            }
        },
        None => cfg.loxilb.clone(),
    };
    let loxilb_lines = loxilb_checks(&cfg, &loxilbs).await;
    report.lines.extend(kube_lines.lines);
    report.lines.extend(loxilb_lines.lines);
    // A controller running beside this check (its Pod): what waits for each loxilb.
    report
        .lines
        .extend(crate::config::queues::lines(loaded.args.admin.admin_addr).await);
    report
}

fn describe_config(cfg: &Config, loaded: &Loaded) -> String {
    let pools: Vec<String> = cfg
        .pools
        .iter()
        .chain(&cfg.secondary_pools)
        .map(|p| {
            let blocks: Vec<String> = p.blocks.iter().map(|b| b.to_string()).collect();
            format!("{}={}", p.name, blocks.join("+"))
        })
        .collect();
    let mut text = format!(
        "{} loxilb instance(s); pools {}; {} IPs; class {}{}",
        cfg.loxilb.len(),
        pools.join(", "),
        if cfg.unique_ip { "unique" } else { "shared" },
        cfg.class,
        if cfg.ccm_mode {
            " and class-less Services (CCM mode)"
        } else {
            ""
        },
    );
    match &cfg.bgp {
        None => text.push_str("; BGP off"),
        Some(b) => {
            let peers: Vec<String> = b.peers.iter().map(ToString::to_string).collect();
            text.push_str(&format!(
                "; BGP local AS {}, router id {}, listen port {}, peers {}{}{}",
                b.local_asn,
                b.router_id
                    .map_or_else(|| "each loxilb's address".to_string(), |r| r.to_string()),
                b.listen_port.unwrap_or(179),
                if peers.is_empty() {
                    "none from the flags".to_string()
                } else {
                    peers.join(",")
                },
                if b.multihop { ", multihop" } else { "" },
                if cfg.bgp_crds {
                    ", kube-loxilb's BGP resources served"
                } else {
                    ""
                },
            ));
        }
    }
    if let Some(path) = &loaded.config_file {
        text.push_str(&format!("; config file {}", path.display()));
    }
    // Where the token comes from, never its value.
    match (&cfg.loxilb_token_source, cfg.loxilb_token.is_set()) {
        (crate::config::TokenSource::File(path), _) => {
            text.push_str(&format!("; loxilb token from file {}", path.display()));
        }
        (crate::config::TokenSource::Secret(secret), _) => {
            text.push_str(&format!("; loxilb token from Secret {secret}"));
        }
        (crate::config::TokenSource::Fixed, true) => text.push_str("; loxilb token set"),
        (crate::config::TokenSource::Fixed, false) => {}
    }
    if cfg.loxilb_insecure_skip_tls_verify {
        text.push_str(
            "; WARNING: loxilb certificates are not verified (--loxilb-insecure-skip-tls-verify)",
        );
    }
    text
}

/// Where the loxilbs come from and how roles are arbitrated (docs/fleet.md).
fn describe_fleet(cfg: &Config) -> String {
    let members = match &cfg.discovery {
        Some(d) => format!(
            "loxilbs discovered from the EndpointSlices of Service {} in {} ({}://...:{})",
            d.service,
            d.namespace
                .as_deref()
                .map_or("any namespace".to_string(), |ns| format!("namespace {ns}")),
            if d.https { "https" } else { "http" },
            d.port
        ),
        None => {
            let mut groups: std::collections::BTreeMap<&str, usize> = Default::default();
            for c in &cfg.loxilb {
                *groups.entry(c.group.as_str()).or_default() += 1;
            }
            let each: Vec<String> = groups
                .iter()
                .map(|(g, n)| format!("group {g}: {n}"))
                .collect();
            format!(
                "{} loxilb(s) from --loxilb-url ({})",
                cfg.loxilb.len(),
                each.join(", ")
            )
        }
    };
    let instances = format!(
        "{} per group ({})",
        cfg.zone_instances,
        loxi_domain::roles::instance_names(&cfg.zone, cfg.zone_instances).join(", ")
    );
    let roles = match &cfg.roles {
        Some(r) => {
            let (ns, name) = &cfg.roles_record;
            let excluded = if r.excluded.is_empty() {
                String::new()
            } else {
                format!(", never to {}", r.excluded.join(", "))
            };
            format!(
                "HA roles for {instances} with VIP {}{excluded}, recorded in ConfigMap {ns}/{name}",
                r.vip
            )
        }
        None => format!("HA instances {instances}, roles not set (--set-roles unset)"),
    };
    let peers = match &cfg.peer_discovery {
        Some(p) => format!(
            ", BGP-peer-only loxilbs from Service {} in {}",
            p.service,
            p.namespace
                .as_deref()
                .map_or("any namespace".to_string(), |ns| format!("namespace {ns}")),
        ),
        None => String::new(),
    };
    format!("{members}, plus LoxiURL resources if any{peers}; {roles}")
}

/// The HA masters recorded (docs/fleet.md#the-record), with `--set-roles`.
async fn roles_check(api: Option<&kube::Client>, cfg: &Config) -> Option<CheckLine> {
    cfg.roles.as_ref()?;
    let client = api?;
    let (ns, name) = &cfg.roles_record;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), ns);
    let line = |ok: bool, detail: String| CheckLine {
        ok,
        name: "HA roles".into(),
        detail,
    };
    Some(
        match tokio::time::timeout(KUBE_TIMEOUT, cms.get_opt(name)).await {
            Ok(Ok(Some(cm))) => {
                let masters: Vec<String> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(instance, master)| format!("{instance} MASTER {master}"))
                    .collect();
                line(
                    true,
                    if masters.is_empty() {
                        "no master recorded yet".into()
                    } else {
                        masters.join(", ")
                    },
                )
            }
            Ok(Ok(None)) => line(true, format!("no record yet ({ns}/{name})")),
            Ok(Err(e)) => line(false, format!("reading {ns}/{name}: {e}")),
            Err(_) => line(
                false,
                format!(
                    "reading {ns}/{name}: no answer within {}s",
                    KUBE_TIMEOUT.as_secs()
                ),
            ),
        },
    )
}

/// Why a Kubernetes call of the check failed.
enum KubeFailure {
    /// No answer in time.
    Timeout,
    Error(kube::Error),
}

impl KubeFailure {
    /// The HTTP code of the API server's answer, when it answered.
    fn code(&self) -> Option<u16> {
        match self {
            KubeFailure::Timeout => None,
            KubeFailure::Error(e) => crate::k8s::api::status_code(e),
        }
    }

    /// What went wrong with `action` (`listing Services in all namespaces`), which needs
    /// `need`: refused credentials (401), a missing permission (403), no connection, or the
    /// API server's answer.
    fn explain(&self, action: &str, need: &Need) -> String {
        match self.code() {
            Some(401) => format!(
                "{action} failed: the API server refused the credentials (authentication \
                 failed): {self}"
            ),
            Some(403) => format!("{action} is forbidden: missing permission {need}: {self}"),
            Some(_) => format!("{action} failed: {self}"),
            None => format!("{action} failed, the API server is unreachable: {self}"),
        }
    }
}

impl fmt::Display for KubeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeFailure::Timeout => write!(f, "no answer within {}s", KUBE_TIMEOUT.as_secs()),
            KubeFailure::Error(e) => f.write_str(&crate::k8s::api::error_text(e)),
        }
    }
}

async fn with_timeout<T>(
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeFailure> {
    match tokio::time::timeout(KUBE_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeFailure::Error(e)),
        Err(_) => Err(KubeFailure::Timeout),
    }
}

/// A client with short timeouts (the check must not hang on an unreachable API server), and
/// the API server URL for the report.
async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<(kube::Client, String)> {
    let mut config = crate::k8s::api::config(kubeconfig).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(KUBE_TIMEOUT);
    let url = config.cluster_url.to_string();
    let client = crate::k8s::api::from_config(config, crate::k8s::api::RateLimit::NONE)
        .context("building the Kubernetes client")?;
    Ok((client, url.trim_end_matches('/').to_string()))
}

/// One permission `run` relies on.
struct Need {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: &'static str,
    namespace: Option<String>,
    name: Option<String>,
}

impl Need {
    fn new(verb: &'static str, group: &'static str, resource: &'static str) -> Need {
        Need {
            verb,
            group,
            resource,
            subresource: "",
            namespace: None,
            name: None,
        }
    }

    fn sub(mut self, subresource: &'static str) -> Need {
        self.subresource = subresource;
        self
    }

    fn ns(mut self, namespace: Option<&str>) -> Need {
        self.namespace = namespace.map(str::to_string);
        self
    }

    fn named(mut self, name: &str) -> Need {
        self.name = Some(name.to_string());
        self
    }
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        if let Some(name) = &self.name {
            write!(f, " {}", shown(name))?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => Ok(()),
        }
    }
}

/// What `run` does with the API, as configured (see deploy/20-clusterrole.yaml and
/// deploy/22-role-leases.yaml).
fn needs(cfg: &Config) -> Vec<Need> {
    let mut needs = always_needed(cfg.namespace.as_deref());
    needs.extend(feature_needs(cfg));
    needs.extend(named_object_needs(cfg));
    needs
}

/// What `run` always does: Services, Nodes, Events, address claims and pools, LoxiURLs.
fn always_needed(ns: Option<&str>) -> Vec<Need> {
    let mut needs = vec![
        Need::new("list", "", "services").ns(ns),
        Need::new("watch", "", "services").ns(ns),
        Need::new("patch", "", "services").ns(ns),
        Need::new("patch", "", "services").sub("status").ns(ns),
        Need::new("list", "", "nodes"),
        Need::new("watch", "", "nodes"),
        Need::new("create", "events.k8s.io", "events").ns(ns),
    ];
    // Durable address claims (cluster-scoped, crate::ipam::claims).
    for verb in ["list", "watch", "create", "patch", "update", "delete"] {
        needs.push(Need::new(verb, "ipam.loxilb.io", "addressclaims"));
    }
    // Address pools (crate::ipam::address_pools) and the namespace labels their selectors read.
    for verb in ["list", "watch"] {
        needs.push(Need::new(verb, "ipam.loxilb.io", "addresspools"));
        needs.push(Need::new(verb, "", "namespaces"));
        needs.push(Need::new(verb, "discovery.k8s.io", "endpointslices").ns(ns));
    }
    needs.push(Need::new("patch", "ipam.loxilb.io", "addresspools").sub("status"));
    // kube-loxilb's LoxiURL resources (docs/fleet.md#loxiurl-resources), followed always.
    for verb in ["list", "watch"] {
        needs.push(Need::new(verb, "loxiurl.loxilb.io", "loxiurls"));
    }
    needs
}

/// What the optional features need: Multus, the BGP custom resources, discovery, node
/// initialization.
fn feature_needs(cfg: &Config) -> Vec<Need> {
    let ns = cfg.namespace.as_deref();
    let mut needs = Vec::new();
    if cfg.multus {
        for verb in ["list", "watch"] {
            needs.push(Need::new(verb, "", "pods").ns(ns));
        }
    }
    if cfg.bgp.is_some() && cfg.bgp_crds {
        for (group, plural) in [
            ("bgppeer.loxilb.io", "bgppeerservices"),
            (
                "bgppolicydefinedsets.loxilb.io",
                "bgppolicydefinedsetsservices",
            ),
            (
                "bgppolicydefinition.loxilb.io",
                "bgppolicydefinitionservices",
            ),
            ("bgppolicyapply.loxilb.io", "bgppolicyapplyservices"),
        ] {
            for verb in ["list", "watch", "patch"] {
                needs.push(Need::new(verb, group, plural));
            }
            needs.push(Need::new("patch", group, plural).sub("status"));
        }
        needs.push(Need::new("create", "events.k8s.io", "events").ns(Some("default")));
    }
    for d in cfg.discovery.iter().chain(&cfg.peer_discovery) {
        // The in-cluster loxilbs (docs/fleet.md#discovery), BGP-peer-only ones too.
        for verb in ["list", "watch"] {
            needs.push(
                Need::new(verb, "discovery.k8s.io", "endpointslices").ns(d.namespace.as_deref()),
            );
        }
    }
    if !cfg.node_init.disable_node_init {
        needs.push(Need::new("patch", "", "nodes"));
        needs.push(Need::new("patch", "", "nodes").sub("status"));
        needs.push(Need::new("create", "events.k8s.io", "events").ns(Some("default")));
        if let Some(cm) = &cfg.node_init.inventory_configmap {
            let cns = Some(cm.namespace.as_str());
            needs.push(Need::new("get", "", "configmaps").ns(cns).named(&cm.name));
            needs.push(Need::new("watch", "", "configmaps").ns(cns));
        }
    }
    needs
}

/// What is read or written by name: kube-system (for the cluster id), the Lease, the token
/// Secret, the HA role record.
fn named_object_needs(cfg: &Config) -> Vec<Need> {
    let mut needs = Vec::new();
    if cfg.cluster_id.is_none() {
        needs.push(Need::new("get", "", "namespaces").named("kube-system"));
    }
    if let Some(lease) = &cfg.leader {
        let lns = Some(lease.namespace.as_str());
        needs.push(Need::new("create", "coordination.k8s.io", "leases").ns(lns));
        for verb in ["get", "update"] {
            needs.push(
                Need::new(verb, "coordination.k8s.io", "leases")
                    .ns(lns)
                    .named(&lease.name),
            );
        }
    }
    if let crate::config::TokenSource::Secret(secret) = &cfg.loxilb_token_source {
        // The token Secret: read by name at start-up, then listed and watched with the field
        // selector metadata.name (config/token.rs), which RBAC matches against resourceNames:
        // all three can be limited to this one Secret.
        for verb in ["get", "list", "watch"] {
            needs.push(
                Need::new(verb, "", "secrets")
                    .ns(Some(secret.namespace.as_str()))
                    .named(&secret.name),
            );
        }
    }
    if cfg.roles.is_some() {
        // The HA role record (docs/fleet.md#the-record): created by a server-side apply.
        let (rns, name) = &cfg.roles_record;
        let rns = Some(rns.as_str());
        needs.push(Need::new("create", "", "configmaps").ns(rns));
        for verb in ["get", "patch"] {
            needs.push(Need::new(verb, "", "configmaps").ns(rns).named(name));
        }
    }
    needs
}

async fn allowed(client: &kube::Client, need: &Need) -> Result<bool, String> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(need.verb.to_string()),
                group: Some(need.group.to_string()),
                resource: Some(need.resource.to_string()),
                subresource: (!need.subresource.is_empty()).then(|| need.subresource.to_string()),
                namespace: need.namespace.clone(),
                name: need.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = with_timeout(api.create(&PostParams::default(), &review))
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The Kubernetes checks, and the client when the API server answers with the credentials.
async fn kube_checks(kubeconfig: Option<&Path>, cfg: &Config) -> (Report, Option<kube::Client>) {
    let mut r = Report::default();
    let (client, url) = match kube_client(kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            r.fail("kubernetes client", crate::k8s::api::anyhow_text(&e));
            return (r, None);
        }
    };
    if !api_version_check(&mut r, &client, &url).await {
        return (r, None);
    }
    service_checks(&mut r, &client, cfg).await;
    node_check(&mut r, &client).await;
    cluster_id_check(&mut r, &client, cfg).await;
    r.pass("controller", controller_line(cfg));
    permissions_check(&mut r, &client, cfg).await;
    (r, Some(client))
}

/// GET /version; false when the other checks cannot go on (no answer, or the credentials
/// refused).
async fn api_version_check(r: &mut Report, client: &kube::Client, url: &str) -> bool {
    let api_name = format!("kubernetes API {url}");
    match with_timeout(client.apiserver_version()).await {
        Ok(info) => r.pass(api_name, format!("reachable, version {}", info.git_version)),
        Err(e) => {
            let (detail, go_on) = match e.code() {
                Some(401) => (
                    format!(
                        "reachable, but authentication failed: the API server refused the \
                         credentials of the kubeconfig ({e})"
                    ),
                    false,
                ),
                Some(403) => (
                    format!("reachable, but reading /version is forbidden: {e}"),
                    true,
                ),
                Some(_) => (format!("reachable, but /version failed: {e}"), true),
                None => (format!("unreachable: {e}"), false),
            };
            r.fail(api_name, detail);
            return go_on;
        }
    }

    true
}

/// Listing Services (the credentials), and whether the API server filters them by type.
async fn service_checks(r: &mut Report, client: &kube::Client, cfg: &Config) {
    // Who we are (informational; older API servers may not serve SelfSubjectReview).
    let whoami: Api<SelfSubjectReview> = Api::all(client.clone());
    let who = with_timeout(whoami.create(&PostParams::default(), &SelfSubjectReview::default()))
        .await
        .ok()
        .and_then(|r| r.status)
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .map(|u| format!(" as {u}"))
        .unwrap_or_default();
    let (services, scope): (Api<Service>, String) = match &cfg.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            format!("namespace {ns}"),
        ),
        None => (Api::all(client.clone()), "all namespaces".to_string()),
    };
    let ns = cfg.namespace.as_deref();
    let list_services = Need::new("list", "", "services").ns(ns);
    let one = ListParams::default().limit(1);
    match with_timeout(services.list(&one)).await {
        Ok(_) => r.pass(
            "kubernetes credentials",
            format!("authenticated{who}; can list Services in {scope}"),
        ),
        Err(e) if e.code() == Some(403) => r.fail(
            "kubernetes credentials",
            format!(
                "authenticated{who}, but {}",
                e.explain(&format!("listing Services in {scope}"), &list_services)
            ),
        ),
        Err(e) => r.fail(
            "kubernetes credentials",
            e.explain(&format!("listing Services in {scope}{who}"), &list_services),
        ),
    }
    // Where the API server cannot filter by type, every Service is watched (informational);
    // any other failure (a refusal, no answer) means the watch cannot run.
    let by_type = one.clone().fields(crate::k8s::view::TYPE_SELECTOR);
    match with_timeout(services.list_metadata(&by_type)).await {
        Ok(_) => r.pass(
            "service watch",
            format!(
                "filtered by type ({}): other Services are never sent",
                crate::k8s::view::TYPE_SELECTOR
            ),
        ),
        Err(e) if matches!(e.code(), Some(400 | 422)) => r.pass(
            "service watch",
            format!("every Service (the API server cannot filter by type: {e})"),
        ),
        Err(e) => r.fail(
            "service watch",
            e.explain(&format!("listing Services in {scope}"), &list_services),
        ),
    }
}

async fn node_check(r: &mut Report, client: &kube::Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    let one = ListParams::default().limit(1);
    match with_timeout(nodes.list(&one)).await {
        Ok(list) => r.pass(
            "kubernetes nodes",
            format!(
                "can list Nodes ({})",
                if list.items.is_empty() {
                    "none yet"
                } else {
                    "at least one"
                }
            ),
        ),
        Err(e) => r.fail(
            "kubernetes nodes",
            e.explain("listing Nodes", &Need::new("list", "", "nodes")),
        ),
    }
}

/// The cluster id: configured, or from the kube-system namespace's UID.
async fn cluster_id_check(r: &mut Report, client: &kube::Client, cfg: &Config) {
    match &cfg.cluster_id {
        Some(id) => r.pass("cluster id", format!("{} (configured)", id.as_str())),
        None => {
            let namespaces: Api<Namespace> = Api::all(client.clone());
            match with_timeout(namespaces.get("kube-system")).await {
                Ok(ns) => {
                    let id = ClusterId::from_uid(ns.metadata.uid.as_deref().unwrap_or_default());
                    r.pass(
                        "cluster id",
                        format!("{} (from the kube-system namespace UID)", id.as_str()),
                    );
                }
                Err(e) => r.fail(
                    "cluster id",
                    format!(
                        "{}; grant it or set --cluster-id",
                        e.explain(
                            "reading namespace kube-system",
                            &Need::new("get", "", "namespaces").named("kube-system")
                        )
                    ),
                ),
            }
        }
    }
}

/// Every permission `run` needs, asked with SelfSubjectAccessReviews.
async fn permissions_check(r: &mut Report, client: &kube::Client, cfg: &Config) {
    let needs = needs(cfg);
    let mut missing = Vec::new();
    let mut errors = Vec::new();
    for need in &needs {
        match allowed(client, need).await {
            Ok(true) => {}
            Ok(false) => missing.push(need.to_string()),
            Err(e) => errors.push(format!("{need}: {e}")),
        }
    }
    if !errors.is_empty() {
        r.fail(
            "permissions",
            format!("could not ask the API server: {}", errors.join("; ")),
        );
    } else if !missing.is_empty() {
        r.fail(
            "permissions",
            format!(
                "missing {} of {}: {}",
                missing.len(),
                needs.len(),
                missing.join(", ")
            ),
        );
    } else {
        r.pass(
            "permissions",
            format!("all {} permissions `run` uses are granted", needs.len()),
        );
    }
}

/// The node-initialization inventory, loaded and validated by node initialization's own code
/// (nothing when node initialization is off or has no inventory). `api` is the client when
/// the API server answers; a ConfigMap inventory is not read without one (the API line
/// already failed), a file inventory is.
async fn inventory_check(api: Option<&kube::Client>, cfg: &Config) -> Option<CheckLine> {
    let source = cfg.node_init.source();
    if cfg.node_init.disable_node_init || source == InventorySource::Empty {
        return None;
    }
    let client = match (api, &source) {
        (Some(client), _) => client.clone(),
        // Loading a file does not call the API server: a client that would not reach one.
        (None, InventorySource::File(_)) => crate::k8s::api::from_config(
            kube::Config::new("http://127.0.0.1:1".parse().ok()?),
            crate::k8s::api::RateLimit::NONE,
        )
        .ok()?,
        (None, _) => return None,
    };
    let name = "node inventory".to_string();
    let line = match tokio::time::timeout(KUBE_TIMEOUT, source.load(&client)).await {
        Ok(Ok(inventory)) => CheckLine {
            ok: true,
            name,
            detail: format!(
                "{source}: valid, {} {}",
                inventory.entries.len(),
                if inventory.entries.len() == 1 {
                    "entry"
                } else {
                    "entries"
                }
            ),
        },
        Ok(Err(e)) => CheckLine {
            ok: false,
            name,
            detail: e.to_string(),
        },
        Err(_) => CheckLine {
            ok: false,
            name,
            detail: format!(
                "reading the inventory from {source}: no answer within {}s",
                KUBE_TIMEOUT.as_secs()
            ),
        },
    };
    Some(line)
}

async fn loxilb_checks(cfg: &Config, loxilbs: &[crate::config::ConfiguredLoxilb]) -> Report {
    let checks = loxilbs.iter().cloned().map(|c| async move {
        let (line, rules) = one_loxilb(c.client.clone()).await;
        let mut lines = vec![line];
        if let Some(bgp) = &cfg.bgp {
            lines.push(one_loxilb_bgp(c.client, bgp).await);
        }
        (c.group, rules, lines)
    });
    let results = futures::future::join_all(checks).await;
    let mut lines: Vec<CheckLine> = Vec::new();
    let mut groups: std::collections::BTreeMap<&str, Vec<Option<usize>>> = Default::default();
    for (group, rules, group_lines) in &results {
        groups.entry(group.as_str()).or_default().push(*rules);
        lines.extend(group_lines.iter().cloned());
    }
    for (group, rules) in groups {
        lines.push(group_line(group, &rules, cfg.loxilb_max_rules));
    }
    Report { lines }
}

/// A group's line (docs/fleet.md#groups-and-placement): how many of its loxilbs answer, and
/// the fullest one's rules against the configured table size. A group none of whose
/// loxilbs answers fails.
fn group_line(group: &str, rules: &[Option<usize>], capacity: usize) -> CheckLine {
    let reachable = rules.iter().filter(|r| r.is_some()).count();
    let fullest = rules.iter().flatten().max().copied().unwrap_or(0);
    CheckLine {
        ok: reachable > 0,
        name: format!("group {group}"),
        detail: format!(
            "{reachable}/{} loxilb(s) reachable; fullest holds {fullest} of {capacity} rules",
            rules.len()
        ),
    }
}

/// Makes the lines of one check, all under `name`.
fn line_named(name: String) -> impl Fn(bool, String) -> CheckLine {
    move |ok, detail| CheckLine {
        ok,
        name: name.clone(),
        detail,
    }
}

/// A loxilb client making one attempt per call: the report should say what happens now,
/// quickly.
fn client_trying_once(mut c: ClientConfig) -> Result<LoxilbClient, loxilb_client::ClientError> {
    c.retry.attempts = 1;
    LoxilbClient::new(c)
}

/// The BGP line of one loxilb: each neighbour it holds with its session state, and the
/// configured peers it does not hold (yet).
async fn one_loxilb_bgp(c: ClientConfig, bgp: &loxi_domain::bgp::BgpSettings) -> CheckLine {
    let line = line_named(format!("loxilb {} BGP", c.url));
    let client = match client_trying_once(c) {
        Ok(client) => client,
        Err(e) => return line(false, e.to_string()),
    };
    let listed = match client.list_bgp_neighbors().await {
        Ok(listed) => listed,
        Err(loxilb_client::ClientError::BgpDisabled { .. }) => {
            return line(
                false,
                "loxilb runs without BGP (start it with -b): it refuses every BGP call".into(),
            );
        }
        Err(e) => return line(false, format!("listing the BGP neighbours failed: {e}")),
    };
    let mut parts: Vec<String> = listed
        .iter()
        .map(|n| {
            format!(
                "{} AS {} {} (for {})",
                n.ip_address, n.remote_as, n.state, n.updowntime
            )
        })
        .collect();
    let missing: Vec<String> = bgp
        .peers
        .iter()
        .filter(|p| {
            !listed
                .iter()
                .any(|n| n.ip_address.parse::<std::net::IpAddr>().ok() == Some(p.address))
        })
        .map(ToString::to_string)
        .collect();
    if parts.is_empty() {
        parts.push("no neighbour".into());
    }
    let mut detail = parts.join(", ");
    if !missing.is_empty() {
        detail.push_str(&format!(
            "; configured but not held (yet): {}",
            missing.join(", ")
        ));
    }
    line(true, detail)
}

/// One loxilb's line, and the rules it holds when it could be listed.
async fn one_loxilb(c: ClientConfig) -> (CheckLine, Option<usize>) {
    let line = line_named(format!("loxilb {}", c.url));
    let client = match client_trying_once(c) {
        Ok(client) => client,
        Err(e) => return (line(false, e.to_string()), None),
    };
    let version = match client.version().await {
        Ok(v) => v,
        Err(e) => return (line(false, e.to_string()), None),
    };
    match client.list_rules().await {
        Ok(rules) => (
            line(
                true,
                format!(
                    "reachable, version {} ({}), {} rule(s)",
                    version.version,
                    version.build_info,
                    rules.len()
                ),
            ),
            Some(rules.len()),
        ),
        Err(e) => (
            line(
                false,
                format!(
                    "reachable (version {}), but listing rules failed: {e}",
                    version.version
                ),
            ),
            None,
        ),
    }
}

/// Who this controller is among several in one cluster, and the names that say so
/// (docs/architecture.md#several-controllers-in-one-cluster).
fn controller_line(cfg: &Config) -> String {
    let selection =
        crate::k8s::view::Selection::new(&cfg.class, cfg.ccm_mode, cfg.controller.clone());
    let svc = k8s_openapi::api::core::v1::Service {
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            load_balancer_class: Some(cfg.class.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let rules = match cfg.controller.name() {
        None => "ccm-<cluster id>_...".to_string(),
        Some(name) => format!("ccm-<cluster id>.{name}_..."),
    };
    format!(
        "{} (class {}{}; finalizer {}; rules named {rules}; lease {})",
        cfg.controller,
        cfg.class,
        if cfg.ccm_mode {
            " and class-less Services"
        } else {
            ""
        },
        selection.finalizer_for(&svc),
        cfg.leader
            .as_ref()
            .map_or("none (--leader-elect=false)".to_string(), |l| format!(
                "{}/{}",
                l.namespace, l.name
            )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lines_and_summary() {
        let mut r = Report::default();
        assert!(!r.passed(), "an empty report proves nothing");
        r.pass("configuration", "fine");
        assert!(r.passed());
        r.fail(
            "loxilb http://127.0.0.1:1",
            "loxilb at http://127.0.0.1:1 is unreachable",
        );
        assert!(!r.passed());
        assert_eq!(
            r.to_string(),
            "OK   configuration: fine\nFAIL loxilb http://127.0.0.1:1: loxilb at \
             http://127.0.0.1:1 is unreachable\n"
        );
        assert_eq!(r.summary(), "check failed: 1 of 2 checks failed");
    }

    #[test]
    fn refusals_are_told_apart_from_outages() {
        let api = |code: u16, reason: &str, message: &str| {
            let s = kube::core::Status::failure(message, reason).with_code(code);
            KubeFailure::Error(kube::Error::Api(Box::new(s)))
        };
        let need = Need::new("list", "", "services").ns(Some("web"));
        let text = api(401, "Unauthorized", "Unauthorized").explain("listing Services", &need);
        assert_eq!(
            text,
            "listing Services failed: the API server refused the credentials (authentication \
             failed): 401 Unauthorized"
        );
        let text =
            api(403, "Forbidden", "services is forbidden: no").explain("listing Services", &need);
        assert_eq!(
            text,
            "listing Services is forbidden: missing permission list services in namespace web: \
             403 Forbidden: services is forbidden: no"
        );
        let text = KubeFailure::Timeout.explain("listing Services", &need);
        assert!(text.contains("unreachable"), "{text}");
        assert_eq!(
            Need::new("get", "", "namespaces")
                .named("kube\u{200b}system")
                .to_string(),
            "get namespaces \"kube\u{200b}system\""
        );
    }

    #[test]
    fn needs_follow_the_configuration() {
        let cli = <crate::config::cli::Cli as clap::Parser>::try_parse_from([
            "loxi-ccm",
            "run",
            "--loxilb-url=http://127.0.0.1:11111",
            "--external-cidr=192.0.2.0/24",
            "--cluster-id=test",
            "--leader-elect=false",
            "--disable-node-init",
        ])
        .unwrap();
        let crate::config::cli::Command::Run(args) = cli.command;
        let cfg = Config::from_args(&args).unwrap();
        let list: Vec<String> = needs(&cfg).iter().map(|n| n.to_string()).collect();
        assert!(
            list.contains(&"patch services/status".to_string()),
            "{list:?}"
        );
        assert!(
            !list
                .iter()
                .any(|n| n.contains("leases") || n.starts_with("get namespaces"))
        );
        assert!(!list.iter().any(|n| n.contains("secrets")), "{list:?}");

        let cli = <crate::config::cli::Cli as clap::Parser>::try_parse_from([
            "loxi-ccm",
            "run",
            "--loxilb-url=http://127.0.0.1:11111",
            "--external-cidr=192.0.2.0/24",
            "--loxilb-token-secret=kube-system/loxi-ccm-loxilb-auth",
        ])
        .unwrap();
        let crate::config::cli::Command::Run(args) = cli.command;
        let cfg = Config::from_args(&args).unwrap();
        let list: Vec<String> = needs(&cfg).iter().map(|n| n.to_string()).collect();
        for verb in ["get", "list", "watch"] {
            let need = format!("{verb} secrets \"loxi-ccm-loxilb-auth\" in namespace kube-system");
            assert!(list.contains(&need), "{need} not in {list:?}");
        }
    }
}
