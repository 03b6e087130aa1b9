//! The cloud node controller for bare metal: what a cloud CCM (CloudStack, PhoenixNAP, ...)
//! does when a kubelet started with `--cloud-provider=external` registers a Node, with the
//! operator's inventory standing in for the cloud's API.
//!
//! For every Node carrying the taint `node.cloudprovider.kubernetes.io/uninitialized`:
//!
//! 1. `spec.providerID` is set when empty, to `loxilb://<node-name>` (the node name is the only
//!    stable machine identity bare metal has; it is never changed once set, as the API
//!    server forbids it).
//! 2. `status.addresses` becomes one `InternalIP` per address in the kubelet's annotation
//!    `alpha.kubernetes.io/provided-node-ip` (its `--node-ip`; a dual-stack pair
//!    `10.0.0.5,fd00::5` gives two) followed by `Hostname` (the existing Hostname address, or
//!    the node name). Without the annotation the existing non-Hostname addresses are kept.
//!    An annotation that does not parse leaves the Node uninitialized with a Warning Event
//!    `InvalidNodeIP`: a Node with a wrong address is worse than a Node that waits.
//! 3. The first matching inventory entry ([`loxi_domain::inventory`], which documents the
//!    format) sets `topology.kubernetes.io/zone`, `topology.kubernetes.io/region` and
//!    `node.kubernetes.io/instance-type`. Entries match by node-name glob and/or by CIDR
//!    against the provided and InternalIP addresses. Labels the entry does not give are left
//!    as they are (e.g. set by `kubelet --node-labels`).
//! 4. The uninitialized taint is removed; every other taint is kept.
//!
//! The addresses go first (a separate `status` write), then labels, providerID and the taint
//! removal in ONE write, so no scheduler ever sees an untainted Node without its topology.
//! That write carries `metadata.resourceVersion` (optimistic concurrency): `spec.taints` is
//! replaced as a whole by a JSON merge patch, and a concurrent taint change by someone else
//! must make us re-read rather than be overwritten.
//!
//! A Node the inventory does not know is initialized without topology labels, unless
//! `--node-init-require-inventory`: then it keeps the taint and gets a Warning Event
//! `NodeNotInInventory` (events.k8s.io/v1, in namespace `default`, since Nodes have none).
//!
//! Lifecycle: a Node whose entry says `retired: true` gets the taint
//! `node.cloudprovider.kubernetes.io/shutdown:NoSchedule` (also when already initialized),
//! and loses it when no entry marks it retired any more. Apart from that rule, initialized
//! Nodes are never written: topology is decided once, at initialization, like a cloud CCM.
//!
//! The inventory comes from a file (`--inventory-file`, YAML or JSON) or a ConfigMap
//! (`--inventory-configmap ns/name`, key `inventory.yaml`), re-read on every reconcile so an
//! edit applies without restart. Edits also trigger a pass over every Node: the ConfigMap is
//! watched, the file is polled every 10 s. A broken inventory (syntax, unknown key, bad CIDR
//! ...) blocks initialization (logged, Warning Event `InventoryInvalid` on waiting Nodes)
//! rather than initializing Nodes without their topology. So does one that cannot be read
//! (file missing, ConfigMap or its key missing, API error): Warning Event
//! `InventoryUnavailable` on waiting Nodes, retried with backoff and as soon as the file or
//! ConfigMap changes. Each waiting Node gets one Event per distinct problem, not one per
//! retry. Without either source the inventory is empty.
//!
//! Every decision is in the pure [`plan_node`] (+ [`desired_taints`]); [`run`] only reads,
//! plans and writes, and writes nothing for a Node already in the desired state.
//!
//! RBAC: nodes get/list/watch/patch, nodes/status patch, events.k8s.io events create/patch
//! in `default`, and configmaps get/list/watch in the inventory's namespace.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeAddress, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use loxi_domain::inventory::{Document, Inventory, InventoryError};
use serde_json::json;
use thiserror::Error;
use tracing::{info, warn};

pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
pub const ANN_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Scheme of `spec.providerID`: `loxilb://<node-name>`.
pub const PROVIDER_ID_PREFIX: &str = "loxilb://";
/// Key of the inventory in the ConfigMap (its content may be YAML or JSON).
pub const CONFIGMAP_KEY: &str = "inventory.yaml";

pub const REASON_NOT_IN_INVENTORY: &str = "NodeNotInInventory";
pub const REASON_INVALID_NODE_IP: &str = "InvalidNodeIP";
pub const REASON_NODE_IP_UNKNOWN: &str = "NodeIPUnknown";
pub const REASON_INVENTORY_INVALID: &str = "InventoryInvalid";
pub const REASON_INVENTORY_UNAVAILABLE: &str = "InventoryUnavailable";

/// How often `--inventory-file` is checked for changes (a ConfigMap mounted as a volume is
/// refreshed by the kubelet about once a minute, so faster polling buys nothing).
const FILE_POLL: Duration = Duration::from_secs(10);
const CONCURRENCY: u16 = 4;
const FIELD_MANAGER: &str = "loxi-ccm-node-init";

/// Flags of the cloud node controller.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NodeInitArgs {
    /// Do not run the cloud node controller (Nodes with the
    /// node.cloudprovider.kubernetes.io/uninitialized taint are then left to another CCM).
    #[arg(
        long = "disable-node-init",
        env = "LOXI_CCM_DISABLE_NODE_INIT",
        default_value_t = false
    )]
    pub disable_node_init: bool,

    /// Inventory file (YAML or JSON) giving zone, region, instance type and retirement per
    /// node-name glob or CIDR. Re-read on every reconcile, checked for changes every 10 s.
    #[arg(
        long = "inventory-file",
        env = "LOXI_CCM_INVENTORY_FILE",
        conflicts_with = "inventory_configmap"
    )]
    pub inventory_file: Option<PathBuf>,

    /// Inventory ConfigMap as <namespace>/<name>, key inventory.yaml (YAML or JSON). Watched:
    /// edits apply to every Node without restart.
    #[arg(
        long = "inventory-configmap",
        env = "LOXI_CCM_INVENTORY_CONFIGMAP",
        value_parser = parse_configmap_ref
    )]
    pub inventory_configmap: Option<ConfigMapRef>,

    /// Leave Nodes the inventory does not know uninitialized (tainted), with a Warning Event
    /// NodeNotInInventory, instead of initializing them without topology labels.
    #[arg(
        long = "node-init-require-inventory",
        env = "LOXI_CCM_NODE_INIT_REQUIRE_INVENTORY",
        default_value_t = false
    )]
    pub require_inventory: bool,
}

/// `namespace/name` of the inventory ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub fn parse_configmap_ref(s: &str) -> Result<ConfigMapRef, String> {
    match s.trim().split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(ConfigMapRef {
                namespace: ns.to_string(),
                name: name.to_string(),
            })
        }
        _ => Err(format!("expected <namespace>/<name>, got {s:?}")),
    }
}

/// Where the inventory comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventorySource {
    /// No inventory: every Node is unknown.
    Empty,
    File(PathBuf),
    ConfigMap(ConfigMapRef),
}

impl NodeInitArgs {
    pub fn source(&self) -> InventorySource {
        match (&self.inventory_file, &self.inventory_configmap) {
            (Some(path), _) => InventorySource::File(path.clone()),
            (None, Some(cm)) => InventorySource::ConfigMap(cm.clone()),
            (None, None) => InventorySource::Empty,
        }
    }

    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            require_inventory: self.require_inventory,
        }
    }
}

impl std::fmt::Display for InventorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InventorySource::Empty => f.write_str("no inventory"),
            InventorySource::File(p) => write!(f, "file {}", p.display()),
            InventorySource::ConfigMap(cm) => write!(f, "ConfigMap {cm} key {CONFIGMAP_KEY}"),
        }
    }
}

/// Why the inventory could not be used.
#[derive(Debug, Error)]
pub enum LoadError {
    /// Could not be read (file missing, API error, ConfigMap or key missing): may pass, so
    /// the reconcile is retried with backoff.
    #[error("reading the inventory from {origin}: {message}")]
    Unavailable { origin: String, message: String },
    /// Not YAML/JSON.
    #[error("inventory from {origin} does not parse: {message}")]
    Syntax { origin: String, message: String },
    /// Parses, but is not a valid inventory.
    #[error("inventory from {origin}: {error}")]
    Invalid {
        origin: String,
        error: InventoryError,
    },
}

/// Parses an inventory text: JSON when it starts with `{`, otherwise YAML. Empty text (or
/// only comments) is an empty inventory.
pub fn parse_inventory(text: &str, origin: &str) -> Result<Inventory, LoadError> {
    let syntax = |message: String| LoadError::Syntax {
        origin: origin.to_string(),
        message,
    };
    let doc: Document = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?
    } else if text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
    {
        Document::Null
    } else {
        serde_saphyr::from_str(text).map_err(|e| syntax(e.to_string()))?
    };
    Inventory::from_document(&doc).map_err(|error| LoadError::Invalid {
        origin: origin.to_string(),
        error,
    })
}

impl InventorySource {
    /// Reads and parses the inventory now.
    pub async fn load(&self, client: &kube::Client) -> Result<Inventory, LoadError> {
        let origin = self.to_string();
        let unavailable = |message: String| LoadError::Unavailable {
            origin: origin.clone(),
            message,
        };
        let text = match self {
            InventorySource::Empty => return Ok(Inventory::default()),
            InventorySource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|e| unavailable(e.to_string()))?,
            InventorySource::ConfigMap(cm) => {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
                let map = api
                    .get_opt(&cm.name)
                    .await
                    .map_err(|e| unavailable(crate::k8s::api::error_text(&e)))?
                    .ok_or_else(|| unavailable("the ConfigMap does not exist".into()))?;
                map.data
                    .and_then(|mut d| d.remove(CONFIGMAP_KEY))
                    .ok_or_else(|| {
                        unavailable(format!("the ConfigMap has no key {CONFIGMAP_KEY}"))
                    })?
            }
        };
        parse_inventory(&text, &origin)
    }
}

/// Options of the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanOptions {
    pub require_inventory: bool,
}

/// Something the Node's owner should know, published as a Warning Event on the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanWarning {
    pub reason: &'static str,
    pub message: String,
}

/// What to change on one Node. Every field is a change: `None` / empty / `false` is "leave
/// as is", so the default plan writes nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodePlan {
    /// Set `spec.providerID`.
    pub provider_id: Option<String>,
    /// Replace `status.addresses`.
    pub addresses: Option<Vec<NodeAddress>>,
    /// Labels to set (only those that differ from the Node's).
    pub labels: BTreeMap<String, String>,
    /// Remove the uninitialized taint: the Node is fully initialized by this plan.
    pub remove_uninitialized_taint: bool,
    /// `Some(true)`: add the shutdown taint; `Some(false)`: remove it.
    pub shutdown_taint: Option<bool>,
    pub warning: Option<PlanWarning>,
    /// Index of the matching inventory entry, for logs and Events.
    pub entry: Option<usize>,
}

impl NodePlan {
    /// True when the plan writes nothing.
    pub fn is_noop(&self) -> bool {
        self.provider_id.is_none()
            && self.addresses.is_none()
            && self.labels.is_empty()
            && !self.remove_uninitialized_taint
            && self.shutdown_taint.is_none()
    }
}

pub fn provider_id(node_name: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{node_name}")
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// The kubelet's `--node-ip` addresses, deduplicated, in order; `Err` names the first token
/// that is not an IP.
fn provided_ips(node: &Node) -> Result<Vec<IpAddr>, String> {
    let Some(value) = node.annotations().get(ANN_PROVIDED_NODE_IP) else {
        return Ok(Vec::new());
    };
    let mut ips = Vec::new();
    for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let ip: IpAddr = token.parse().map_err(|_| token.to_string())?;
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

fn current_addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// Decides everything about one Node. Pure.
pub fn plan_node(node: &Node, inventory: &Inventory, opts: &PlanOptions) -> NodePlan {
    let name = node.name_any();
    let provided = provided_ips(node);
    // Match on every address we know: the kubelet's choice and what the status already shows.
    let mut match_ips: Vec<IpAddr> = provided.as_ref().cloned().unwrap_or_default();
    for a in current_addresses(node) {
        if a.type_ == "InternalIP"
            && let Ok(ip) = a.address.parse::<IpAddr>()
            && !match_ips.contains(&ip)
        {
            match_ips.push(ip);
        }
    }
    let found = inventory.lookup(&name, &match_ips);
    let retired = found.is_some_and(|(_, e)| e.retired);
    let mut plan = NodePlan {
        entry: found.map(|(i, _)| i),
        shutdown_taint: (retired != has_taint(node, TAINT_SHUTDOWN)).then_some(retired),
        ..NodePlan::default()
    };
    if !has_taint(node, TAINT_UNINITIALIZED) {
        return plan;
    }
    let provided = match provided {
        Ok(ips) => ips,
        Err(token) => {
            plan.warning = Some(PlanWarning {
                reason: REASON_INVALID_NODE_IP,
                message: format!(
                    "annotation {ANN_PROVIDED_NODE_IP} holds {token:?}, not an IP address; \
                     the node stays uninitialized until the kubelet's --node-ip is fixed"
                ),
            });
            return plan;
        }
    };
    let entry = match found {
        Some((_, e)) => Some(e),
        None if opts.require_inventory => {
            plan.warning = Some(PlanWarning {
                reason: REASON_NOT_IN_INVENTORY,
                message: format!(
                    "no inventory entry matches node {name} (addresses {}); it stays \
                     uninitialized until one does (--node-init-require-inventory)",
                    fmt_ips(&match_ips)
                ),
            });
            return plan;
        }
        None => None,
    };

    let spec_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    if spec_id.is_none_or(str::is_empty) {
        plan.provider_id = Some(provider_id(&name));
    }

    let current = current_addresses(node);
    let hostname = current
        .iter()
        .find(|a| a.type_ == "Hostname")
        .map_or(name.clone(), |a| a.address.clone());
    let mut addresses: Vec<NodeAddress> = if provided.is_empty() {
        current
            .iter()
            .filter(|a| a.type_ != "Hostname")
            .cloned()
            .collect()
    } else {
        provided
            .iter()
            .map(|ip| NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            })
            .collect()
    };
    if addresses.is_empty() {
        plan.warning = Some(PlanWarning {
            reason: REASON_NODE_IP_UNKNOWN,
            message: format!(
                "node {name} has no {ANN_PROVIDED_NODE_IP} annotation (kubelet --node-ip) and no \
                 address in its status; initialized with its Hostname address only"
            ),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: hostname,
    });
    if addresses != current {
        plan.addresses = Some(addresses);
    }

    if let Some(e) = entry {
        let labels = node.labels();
        for (key, value) in [
            (LABEL_ZONE, &e.zone),
            (LABEL_REGION, &e.region),
            (LABEL_INSTANCE_TYPE, &e.instance_type),
        ] {
            if let Some(v) = value
                && labels.get(key) != Some(v)
            {
                plan.labels.insert(key.to_string(), v.clone());
            }
        }
    }
    plan.remove_uninitialized_taint = true;
    plan
}

fn fmt_ips(ips: &[IpAddr]) -> String {
    if ips.is_empty() {
        return "none known".into();
    }
    ips.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Node's full new taint list, or `None` when the plan does not change it. Other taints
/// keep their order and content.
pub fn desired_taints(current: &[Taint], plan: &NodePlan) -> Option<Vec<Taint>> {
    let mut taints = current.to_vec();
    if plan.remove_uninitialized_taint {
        taints.retain(|t| t.key != TAINT_UNINITIALIZED);
    }
    match plan.shutdown_taint {
        Some(true) if !taints.iter().any(|t| t.key == TAINT_SHUTDOWN) => taints.push(Taint {
            key: TAINT_SHUTDOWN.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }),
        Some(false) => taints.retain(|t| t.key != TAINT_SHUTDOWN),
        _ => {}
    }
    (taints != current).then_some(taints)
}

#[derive(Debug, Error)]
pub enum NodeInitError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Inventory(LoadError),
}

struct Ctx {
    client: kube::Client,
    nodes: Api<Node>,
    source: InventorySource,
    opts: PlanOptions,
    recorder: crate::k8s::events::EventRecorder,
    /// Consecutive failures per Node, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The last warning published per Node: a Node waiting for the inventory is reconciled on
    /// every status change, and each would otherwise be one more Event write.
    warned: Mutex<HashMap<String, (String, String)>>,
}

impl Ctx {
    fn publish(&self, node: &Node, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(crate::k8s::events::note_text(&note)),
            action: "InitializeNode".into(),
            secondary: None,
        };
        self.recorder.publish(event, node.object_ref(&()));
    }

    fn warn_once(&self, node: &Node, reason: &str, message: &str) {
        let key = (reason.to_string(), message.to_string());
        let new = match self.warned.lock() {
            Ok(mut w) => w.insert(node.name_any(), key.clone()) != Some(key),
            Err(_) => true,
        };
        if new {
            self.publish(node, EventType::Warning, reason, message.to_string());
        }
    }

    fn clear_warning(&self, name: &str) {
        if let Ok(mut w) = self.warned.lock() {
            w.remove(name);
        }
    }
}

/// Runs the cloud node controller until `shutdown` resolves. With `--disable-node-init` it
/// only waits for `shutdown`, so callers can join it with other tasks unconditionally.
pub async fn run(
    client: kube::Client,
    args: NodeInitArgs,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    if args.disable_node_init {
        info!("node initialization disabled");
        shutdown.await;
        return Ok(());
    }
    let source = args.source();
    info!(inventory = %source, require_inventory = args.require_inventory, "node initialization controller starting");

    let nodes: Api<Node> = Api::all(client.clone());
    let (store, writer) = reflector::store::<Node>();
    // Reconcile only when something the plan reads changes, not on every heartbeat-driven
    // status update.
    let triggers = crate::k8s::triggers::touched_objects(
        reflector(
            writer,
            watcher(nodes.clone(), crate::k8s::trim::list_config()),
        )
        .default_backoff(),
    )
    .predicate_filter(relevant_hash, Default::default());

    let mut controller = Controller::for_stream(triggers, store)
        .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY));
    match &source {
        InventorySource::ConfigMap(cm) => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cm.namespace);
            let changes = watcher(
                api,
                watcher::Config::default().fields(&format!("metadata.name={}", cm.name)),
            )
            .default_backoff()
            .touched_objects()
            .filter_map(|r| async move {
                match r {
                    Ok(_) => Some(()),
                    Err(e) => {
                        warn!(error = %e, "inventory ConfigMap watch error");
                        None
                    }
                }
            });
            controller = controller.reconcile_all_on(changes);
        }
        InventorySource::File(path) => {
            controller = controller.reconcile_all_on(file_changes(path.clone()));
        }
        InventorySource::Empty => {}
    }

    let reporter = Reporter {
        controller: "loxi-ccm".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Ctx {
        // Node initialization has no metrics endpoint of its own: drops are logged only.
        recorder: crate::k8s::events::EventRecorder::new(
            client.clone(),
            reporter,
            Default::default(),
        ),
        client,
        nodes,
        source,
        opts: args.plan_options(),
        failures: Mutex::default(),
        warned: Mutex::default(),
    });
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "node controller event");
            }
        })
        .await;
    info!("node initialization controller stopped");
    Ok(())
}

/// Hash of what [`plan_node`] reads (and what the writes change), so our own writes still
/// come back once to confirm the desired state, and unrelated updates do not.
fn relevant_hash(node: &Node) -> Option<u64> {
    let spec = node.spec.as_ref();
    let view = json!([
        node.metadata.uid,
        node.metadata.deletion_timestamp,
        node.metadata.labels,
        node.annotations().get(ANN_PROVIDED_NODE_IP),
        spec.and_then(|s| s.provider_id.as_ref()),
        spec.and_then(|s| s.taints.as_ref()),
        node.status.as_ref().and_then(|s| s.addresses.as_ref()),
    ]);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    view.to_string().hash(&mut h);
    Some(h.finish())
}

/// One `()` each time the file's content changes (or it appears / disappears).
fn file_changes(path: PathBuf) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((path, None::<Option<Vec<u8>>>), |(path, last)| async move {
        let mut last = last;
        loop {
            let now = tokio::fs::read(&path).await.ok();
            let changed = last.as_ref().is_some_and(|l| *l != now);
            last = Some(now);
            if changed {
                return Some(((), (path, last)));
            }
            tokio::time::sleep(FILE_POLL).await;
        }
    })
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, NodeInitError> {
    let name = node.name_any();
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let inventory = match ctx.source.load(&ctx.client).await {
        Ok(inv) => inv,
        Err(e @ LoadError::Unavailable { .. }) => {
            // May pass by itself (or by creating the file / ConfigMap): retried with backoff,
            // and the waiting Node says why it stays tainted.
            if has_taint(&node, TAINT_UNINITIALIZED) {
                ctx.warn_once(
                    &node,
                    REASON_INVENTORY_UNAVAILABLE,
                    &format!("{e}; the node stays uninitialized until the inventory can be read"),
                );
            }
            return Err(NodeInitError::Inventory(e));
        }
        Err(e) => {
            // Only the inventory's author can fix this, and the fix (a ConfigMap or file
            // change) re-triggers every Node: no point retrying until then.
            warn!(node = %name, error = %e, "inventory invalid: not initializing");
            if has_taint(&node, TAINT_UNINITIALIZED) {
                ctx.warn_once(&node, REASON_INVENTORY_INVALID, &e.to_string());
            }
            return Ok(Action::await_change());
        }
    };
    let plan = plan_node(&node, &inventory, &ctx.opts);
    match &plan.warning {
        Some(w) => {
            warn!(node = %name, reason = w.reason, "{}", w.message);
            ctx.warn_once(&node, w.reason, &w.message);
        }
        None => ctx.clear_warning(&name),
    }
    apply(&node, &plan, &ctx).await?;
    if let Ok(mut f) = ctx.failures.lock() {
        f.remove(&name);
    }
    Ok(Action::await_change())
}

/// Per-Node exponential backoff (0.5 s doubling to 5 min), reset on success.
fn error_policy(node: Arc<Node>, err: &NodeInitError, ctx: Arc<Ctx>) -> Action {
    let name = node.name_any();
    let n = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(name.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
    let delay = loxi_domain::duration::retry_delay(n);
    warn!(node = %name, error = %err, retry_in = ?delay, "node initialization failed");
    Action::requeue(delay)
}

/// Writes the plan: addresses (status subresource) first, then labels, providerID and
/// taints in one optimistic-concurrency write.
async fn apply(node: &Node, plan: &NodePlan, ctx: &Ctx) -> Result<(), NodeInitError> {
    if plan.is_noop() {
        return Ok(());
    }
    let name = node.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut resource_version = node.metadata.resource_version.clone();
    if let Some(addresses) = &plan.addresses {
        let patch = json!({ "status": { "addresses": addresses } });
        let updated = ctx
            .nodes
            .patch_status(&name, &params, &Patch::Merge(patch))
            .await?;
        resource_version = updated.metadata.resource_version;
    }

    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let taints = desired_taints(current, plan);
    let mut spec = serde_json::Map::new();
    if let Some(id) = &plan.provider_id {
        spec.insert("providerID".into(), json!(id));
    }
    if let Some(t) = &taints {
        spec.insert("taints".into(), json!(t));
    }
    if !spec.is_empty() || !plan.labels.is_empty() {
        let mut metadata = serde_json::Map::new();
        metadata.insert("resourceVersion".into(), json!(resource_version));
        if !plan.labels.is_empty() {
            metadata.insert("labels".into(), json!(plan.labels));
        }
        let patch = json!({ "metadata": metadata, "spec": spec });
        ctx.nodes
            .patch(&name, &params, &Patch::Merge(patch))
            .await?;
    }

    if plan.remove_uninitialized_taint {
        let topology = if plan.labels.is_empty() {
            "no topology labels".to_string()
        } else {
            plan.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let entry = plan.entry.map_or("no inventory entry".to_string(), |i| {
            format!("inventory entry {i}")
        });
        info!(node = %name, %entry, %topology, "node initialized");
        ctx.publish(
            node,
            EventType::Normal,
            "NodeInitialized",
            format!("initialized from {entry}: {topology}"),
        );
    }
    match plan.shutdown_taint {
        Some(true) => {
            info!(node = %name, "node retired: shutdown taint added");
            ctx.publish(
                node,
                EventType::Normal,
                "NodeRetired",
                format!(
                    "inventory entry {} marks the node retired: taint {TAINT_SHUTDOWN}:NoSchedule added",
                    plan.entry.unwrap_or_default()
                ),
            );
        }
        Some(false) => {
            info!(node = %name, "node no longer retired: shutdown taint removed");
            ctx.publish(
                node,
                EventType::Normal,
                "NodeReturned",
                format!(
                    "no inventory entry marks the node retired: taint {TAINT_SHUTDOWN} removed"
                ),
            );
        }
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    const INVENTORY: &str = r#"
nodes:
  - match: { name: "rack1-*" }            # glob on the node name
    zone: rack1
    region: dc-east
    instanceType: r640
  - match: { cidr: "10.0.2.0/24" }
    zone: rack2
    region: dc-east
  - match: { name: "old-node-3" }
    retired: true
"#;

    fn inventory() -> Inventory {
        parse_inventory(INVENTORY, "test").unwrap()
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        }
    }

    fn addr(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.into(),
            address: address.into(),
        }
    }

    fn node(name: &str, ip: Option<&str>, taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: ip
                    .map(|ip| BTreeMap::from([(ANN_PROVIDED_NODE_IP.into(), ip.into())])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: None,
        }
    }

    fn uninit(name: &str, ip: &str) -> Node {
        node(
            name,
            Some(ip),
            vec![taint(TAINT_UNINITIALIZED, "NoSchedule")],
        )
    }

    /// The Node after the plan was written, as the API server would hold it.
    fn applied(mut n: Node, plan: &NodePlan) -> Node {
        let spec = n.spec.get_or_insert_default();
        if let Some(id) = &plan.provider_id {
            spec.provider_id = Some(id.clone());
        }
        if let Some(t) = desired_taints(spec.taints.as_deref().unwrap_or_default(), plan) {
            spec.taints = Some(t);
        }
        if let Some(a) = &plan.addresses {
            n.status.get_or_insert_default().addresses = Some(a.clone());
        }
        n.metadata
            .labels
            .get_or_insert_default()
            .extend(plan.labels.clone());
        n
    }

    fn opts(require_inventory: bool) -> PlanOptions {
        PlanOptions { require_inventory }
    }

    #[test]
    fn initializes_a_node_matched_by_name() {
        let n = uninit("rack1-a", "10.0.1.5");
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.provider_id.as_deref(), Some("loxilb://rack1-a"));
        assert_eq!(
            plan.addresses,
            Some(vec![
                addr("InternalIP", "10.0.1.5"),
                addr("Hostname", "rack1-a")
            ])
        );
        assert_eq!(
            plan.labels,
            BTreeMap::from([
                (LABEL_ZONE.into(), "rack1".into()),
                (LABEL_REGION.into(), "dc-east".into()),
                (LABEL_INSTANCE_TYPE.into(), "r640".into()),
            ])
        );
        assert!(plan.remove_uninitialized_taint);
        assert_eq!(plan.shutdown_taint, None);
        assert_eq!((plan.warning, plan.entry), (None, Some(0)));
    }

    #[test]
    fn cidr_match_and_dual_stack_addresses() {
        let n = uninit("worker-7", "10.0.2.7, fd00::7");
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.entry, Some(1));
        assert_eq!(
            plan.addresses,
            Some(vec![
                addr("InternalIP", "10.0.2.7"),
                addr("InternalIP", "fd00::7"),
                addr("Hostname", "worker-7"),
            ])
        );
        assert_eq!(
            plan.labels.get(LABEL_ZONE).map(String::as_str),
            Some("rack2")
        );
        assert!(!plan.labels.contains_key(LABEL_INSTANCE_TYPE));
    }

    #[test]
    fn cidr_matches_an_existing_internal_ip_without_annotation() {
        let mut n = node("w", None, vec![taint(TAINT_UNINITIALIZED, "NoSchedule")]);
        n.status = Some(NodeStatus {
            addresses: Some(vec![
                addr("InternalIP", "10.0.2.9"),
                addr("Hostname", "w.lab"),
            ]),
            ..NodeStatus::default()
        });
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.entry, Some(1));
        // Addresses already as desired (existing kept, Hostname kept): no status write.
        assert_eq!(plan.addresses, None);
        assert!(plan.remove_uninitialized_taint);
    }

    #[test]
    fn unknown_node_is_initialized_without_labels() {
        let n = uninit("stranger", "192.168.9.9");
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert!(plan.remove_uninitialized_taint);
        assert!(plan.labels.is_empty());
        assert_eq!(plan.provider_id.as_deref(), Some("loxilb://stranger"));
        assert!(plan.addresses.is_some());
        assert_eq!((plan.warning, plan.entry), (None, None));
    }

    #[test]
    fn unknown_node_waits_when_inventory_required() {
        let n = uninit("stranger", "192.168.9.9");
        let plan = plan_node(&n, &inventory(), &opts(true));
        assert!(plan.is_noop(), "{plan:?}");
        let w = plan.warning.unwrap();
        assert_eq!(w.reason, REASON_NOT_IN_INVENTORY);
        assert!(w.message.contains("192.168.9.9"), "{}", w.message);
    }

    #[test]
    fn invalid_provided_ip_leaves_the_node_waiting() {
        let n = uninit("rack1-b", "10.0.1.5,not-an-ip");
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert!(plan.is_noop());
        assert_eq!(plan.warning.unwrap().reason, REASON_INVALID_NODE_IP);
    }

    #[test]
    fn no_ip_at_all_initializes_with_hostname_and_warns() {
        let n = node("bare", None, vec![taint(TAINT_UNINITIALIZED, "NoSchedule")]);
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.addresses, Some(vec![addr("Hostname", "bare")]));
        assert!(plan.remove_uninitialized_taint);
        assert_eq!(plan.warning.unwrap().reason, REASON_NODE_IP_UNKNOWN);
    }

    #[test]
    fn keeps_existing_provider_id_hostname_and_matching_labels() {
        let mut n = uninit("rack1-c", "10.0.1.6");
        n.spec.as_mut().unwrap().provider_id = Some("metal://abc".into());
        n.status = Some(NodeStatus {
            addresses: Some(vec![addr("Hostname", "rack1-c.example.org")]),
            ..NodeStatus::default()
        });
        n.metadata.labels = Some(BTreeMap::from([(LABEL_ZONE.into(), "rack1".into())]));
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.provider_id, None);
        assert_eq!(
            plan.addresses,
            Some(vec![
                addr("InternalIP", "10.0.1.6"),
                addr("Hostname", "rack1-c.example.org")
            ])
        );
        assert!(!plan.labels.contains_key(LABEL_ZONE));
        assert!(plan.labels.contains_key(LABEL_REGION));
    }

    #[test]
    fn initialized_node_is_not_touched() {
        let n = node("rack1-z", Some("10.0.1.9"), vec![]);
        let plan = plan_node(&n, &inventory(), &opts(true));
        assert!(plan.is_noop(), "{plan:?}");
        assert_eq!(plan.warning, None);
        // Not in the inventory either: still nothing, and no warning (initialization is over).
        let n = node("stranger", Some("192.168.1.1"), vec![]);
        assert_eq!(
            plan_node(&n, &inventory(), &opts(true)),
            NodePlan::default()
        );
    }

    #[test]
    fn plan_is_idempotent() {
        for n in [
            uninit("rack1-a", "10.0.1.5"),
            uninit("w", "10.0.2.3,fd00::3"),
            uninit("stranger", "192.168.9.9"),
            uninit("old-node-3", "10.9.9.9"),
        ] {
            let first = plan_node(&n, &inventory(), &opts(false));
            assert!(!first.is_noop());
            let after = applied(n, &first);
            let second = plan_node(&after, &inventory(), &opts(false));
            assert!(second.is_noop(), "{second:?}");
            assert_eq!(second.warning, None);
        }
    }

    #[test]
    fn retired_node_gets_and_loses_the_shutdown_taint() {
        // Already initialized: only the lifecycle rule applies.
        let n = node(
            "old-node-3",
            Some("10.9.9.9"),
            vec![taint("a", "NoExecute")],
        );
        let plan = plan_node(&n, &inventory(), &opts(false));
        assert_eq!(plan.shutdown_taint, Some(true));
        assert!(!plan.remove_uninitialized_taint && plan.labels.is_empty());
        let after = applied(n, &plan);
        let taints = after.spec.as_ref().unwrap().taints.clone().unwrap();
        assert_eq!(
            taints,
            vec![taint("a", "NoExecute"), taint(TAINT_SHUTDOWN, "NoSchedule")]
        );
        assert!(plan_node(&after, &inventory(), &opts(false)).is_noop());

        let unretired = parse_inventory(
            "nodes:\n  - match: {name: old-node-3}\n    retired: false\n",
            "test",
        )
        .unwrap();
        let plan = plan_node(&after, &unretired, &opts(false));
        assert_eq!(plan.shutdown_taint, Some(false));
        let back = applied(after, &plan);
        assert_eq!(
            back.spec.unwrap().taints.unwrap(),
            vec![taint("a", "NoExecute")]
        );
        // Dropped from the inventory altogether: not retired either.
        let n = node(
            "old-node-3",
            None,
            vec![taint(TAINT_SHUTDOWN, "NoSchedule")],
        );
        assert_eq!(
            plan_node(&n, &Inventory::default(), &opts(false)).shutdown_taint,
            Some(false)
        );
    }

    #[test]
    fn desired_taints_keeps_others_in_order() {
        let current = vec![
            taint("x", "NoSchedule"),
            taint(TAINT_UNINITIALIZED, "NoSchedule"),
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
        ];
        let plan = NodePlan {
            remove_uninitialized_taint: true,
            shutdown_taint: Some(true),
            ..NodePlan::default()
        };
        assert_eq!(
            desired_taints(&current, &plan),
            Some(vec![
                taint("x", "NoSchedule"),
                taint("node.kubernetes.io/not-ready", "NoSchedule"),
                taint(TAINT_SHUTDOWN, "NoSchedule"),
            ])
        );
        assert_eq!(desired_taints(&current, &NodePlan::default()), None);
        let remove_absent = NodePlan {
            shutdown_taint: Some(false),
            ..NodePlan::default()
        };
        assert_eq!(desired_taints(&current, &remove_absent), None);
    }

    #[test]
    fn parses_yaml_json_and_empty() {
        assert_eq!(inventory().entries.len(), 3);
        let json =
            r#"{"nodes": [{"match": {"cidr": "10.0.2.0/24"}, "zone": "rack2", "retired": false}]}"#;
        let inv = parse_inventory(json, "test").unwrap();
        assert_eq!(inv.entries[0].zone.as_deref(), Some("rack2"));
        assert_eq!(parse_inventory("", "t").unwrap(), Inventory::default());
        assert_eq!(
            parse_inventory("# nothing yet\n\n", "t").unwrap(),
            Inventory::default()
        );
        assert_eq!(
            parse_inventory("nodes: []\n", "t").unwrap(),
            Inventory::default()
        );
        // Unquoted YAML integers are their text.
        let inv = parse_inventory("nodes:\n- match: {name: a}\n  zone: 3\n", "t").unwrap();
        assert_eq!(inv.entries[0].zone.as_deref(), Some("3"));
    }

    #[test]
    fn parse_errors_are_typed() {
        let bad_key = "nodes:\n- match: {name: a}\n- match: {name: b}\n  zonee: x\n";
        match parse_inventory(bad_key, "t") {
            Err(LoadError::Invalid { error, .. }) => {
                assert_eq!((error.index(), error.field()), (Some(1), Some("zonee")));
            }
            other => panic!("{other:?}"),
        }
        let bad_cidr = "nodes:\n- match: {cidr: 10.0.2.0/33}\n";
        match parse_inventory(bad_cidr, "t") {
            Err(LoadError::Invalid { error, .. }) => {
                assert_eq!(
                    (error.index(), error.field()),
                    (Some(0), Some("match.cidr"))
                );
            }
            other => panic!("{other:?}"),
        }
        let bad_glob = r#"{"nodes": [{"match": {"name": "Rack*"}}]}"#;
        match parse_inventory(bad_glob, "t") {
            Err(LoadError::Invalid { error, .. }) => {
                assert_eq!(
                    (error.index(), error.field()),
                    (Some(0), Some("match.name"))
                );
            }
            other => panic!("{other:?}"),
        }
        let retired_yes = "nodes:\n- match: {name: a}\n  retired: maybe\n";
        assert!(matches!(
            parse_inventory(retired_yes, "t"),
            Err(LoadError::Invalid {
                error: InventoryError::WrongType {
                    field: "retired",
                    ..
                },
                ..
            })
        ));
        assert!(matches!(
            parse_inventory("nodes: [\n", "t"),
            Err(LoadError::Syntax { .. })
        ));
        assert!(matches!(
            parse_inventory("{\"nodes\": ", "t"),
            Err(LoadError::Syntax { .. })
        ));
    }

    #[test]
    fn flags() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: NodeInitArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--inventory-configmap=kube-system/loxi-inventory",
            "--node-init-require-inventory",
        ])
        .unwrap();
        assert_eq!(
            cli.args.source(),
            InventorySource::ConfigMap(ConfigMapRef {
                namespace: "kube-system".into(),
                name: "loxi-inventory".into()
            })
        );
        assert!(cli.args.require_inventory && !cli.args.disable_node_init);
        let cli = Cli::try_parse_from(["x", "--inventory-file=/etc/inv.yaml"]).unwrap();
        assert_eq!(
            cli.args.source(),
            InventorySource::File("/etc/inv.yaml".into())
        );
        assert_eq!(
            Cli::try_parse_from(["x"]).unwrap().args.source(),
            InventorySource::Empty
        );
        assert!(Cli::try_parse_from(["x", "--inventory-configmap=nope"]).is_err());
        assert!(
            Cli::try_parse_from(["x", "--inventory-file=a", "--inventory-configmap=a/b"]).is_err()
        );
    }
}
