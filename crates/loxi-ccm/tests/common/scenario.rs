//! The harness of `service_scenarios.rs`: a mock API server (a `tower-test` pair behind
//! `kube::Client::new`) answering as the real one would, the reconcile's context built as
//! `loxi_ccm::runtime::run` builds it over the loxilb simulator, and the objects the
//! scenarios start from. Included with `#[path]` by the test files that use it only.

#![allow(dead_code)]

pub use std::collections::BTreeMap;
pub use std::net::IpAddr;
pub use std::sync::{Arc, Mutex};
pub use std::time::Duration;

pub use http::{Method, Request, Response, StatusCode};
pub use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Node, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
pub use k8s_openapi::api::discovery::v1::EndpointSlice;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
pub use kube::api::Api;
pub use kube::client::Body;
pub use kube::core::PartialObjectMeta;
pub use kube::runtime::controller::Action;
pub use kube::runtime::events::Reporter;
pub use kube::runtime::reflector::{self, ObjectRef, store::Writer};
pub use kube::runtime::watcher;
pub use loxi_ccm::fleet::placement::Placement;
pub use loxi_ccm::ipam::address_pools::{AddressPool, Pools};
pub use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy, claim_name};
pub use loxi_ccm::ipam::{self, Ipam, service_sharing};
pub use loxi_ccm::k8s::events::EventRecorder;
pub use loxi_ccm::k8s::view::{CLASS_FINALIZER, Selection};
pub use loxi_ccm::leader::{Gate, WriteLease};
pub use loxi_ccm::loxilb::Fleet;
pub use loxi_ccm::metrics::Metrics;
pub use loxi_ccm::service::backoff::Backoff;
pub use loxi_ccm::service::departures::{Departures, Injected, Relisted};
pub use loxi_ccm::service::error::ReconcileError;
pub use loxi_ccm::service::inputs::Inputs;
pub use loxi_ccm::service::plan::rules_for;
pub use loxi_ccm::service::reconcile::reconcile;
pub use loxi_ccm::service::reporter::Report;
pub use loxi_ccm::service::rules_first::RulesFirst;
pub use loxi_ccm::service::teardown;
pub use loxi_ccm::service::{self, Context};
pub use loxi_domain::{ClusterId, Pool};
pub use loxilb_client::{ClientConfig, LoxilbClient};
pub use loxilb_sim::{SimConfig, Simulator};
pub use serde_json::{Value, json};
pub use tokio::sync::{mpsc, watch};

pub const NS: &str = "demo";
pub const NAME: &str = "web";
pub const UID: &str = "5d0c7a3e-0000-4000-8000-000000000001";
pub const CLASS: &str = "loxilb.io/loxilb";
pub const POOL: &str = "default";
pub const CIDR: &str = "192.0.2.0/24";
/// The address a Service of the deletion and annotation scenarios already holds.
pub const VIP: &str = "192.0.2.10";
pub const NODE_IP: &str = "10.0.0.1";
pub const NODE_PORT: i32 = 30080;
/// Generous: the simulator and the mock answer at once; only a hang would take this long.
pub const TIMEOUT: Duration = Duration::from_secs(30);

pub const SERVICE_PATH: &str = "/api/v1/namespaces/demo/services/web";
pub const CLAIMS_PATH: &str = "/apis/ipam.loxilb.io/v1alpha1/addressclaims";
pub const EVENTS_PREFIX: &str = "/apis/events.k8s.io/v1/";

// --- The mock API server -------------------------------------------------------------------

/// One API call as the mock API server received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub path: String,
    /// What the call said, in short (a finalizer list, an address, an Event's type/reason).
    pub summary: String,
    /// Rules the simulator held when the call arrived.
    pub rules_on_sim: usize,
}

impl Call {
    pub fn is_event(&self) -> bool {
        self.path.starts_with(EVENTS_PREFIX)
    }

    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// The objects the mock API server holds, by object path.
#[derive(Default)]
pub struct Objects {
    pub by_path: BTreeMap<String, Value>,
    pub last_rv: u64,
    pub last_uid: u64,
}

impl Objects {
    pub fn next_rv(&mut self) -> String {
        self.last_rv += 1;
        (1000 + self.last_rv).to_string()
    }

    /// Stores `obj` at `path` with a new resourceVersion (and a uid when it has none).
    pub fn store(&mut self, path: &str, mut obj: Value) -> Value {
        obj["metadata"]["resourceVersion"] = json!(self.next_rv());
        if obj["metadata"]["uid"].is_null() {
            self.last_uid += 1;
            obj["metadata"]["uid"] = json!(format!("mock-uid-{}", self.last_uid));
            obj["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
        }
        self.by_path.insert(path.to_string(), obj.clone());
        obj
    }

    /// Answers one request as the API server would.
    pub fn answer(&mut self, method: &Method, path: &str, body: &Value) -> (StatusCode, Value) {
        let sent_rv = body["metadata"]["resourceVersion"].as_str();
        match *method {
            Method::GET => match self.by_path.get(path) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => failure(StatusCode::NOT_FOUND, "NotFound", path),
            },
            Method::POST => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default();
                let object = format!("{path}/{name}");
                if name.is_empty() || self.by_path.contains_key(&object) {
                    return failure(StatusCode::CONFLICT, "AlreadyExists", &object);
                }
                (StatusCode::CREATED, self.store(&object, body.clone()))
            }
            Method::PUT => {
                let Some(current) = self.by_path.get(path) else {
                    return failure(StatusCode::NOT_FOUND, "NotFound", path);
                };
                if sent_rv != current["metadata"]["resourceVersion"].as_str() {
                    return failure(StatusCode::CONFLICT, "Conflict", path);
                }
                let mut next = body.clone();
                next["metadata"]["uid"] = current["metadata"]["uid"].clone();
                (StatusCode::OK, self.store(path, next))
            }
            Method::PATCH => {
                // The status subresource: server-side apply by our one field manager, which
                // owns the whole status it writes.
                let (object, status) = match path.strip_suffix("/status") {
                    Some(object) => (object, true),
                    None => (path, false),
                };
                let Some(current) = self.by_path.get(object) else {
                    return failure(StatusCode::NOT_FOUND, "NotFound", object);
                };
                if sent_rv
                    .is_some_and(|rv| Some(rv) != current["metadata"]["resourceVersion"].as_str())
                {
                    return failure(StatusCode::CONFLICT, "Conflict", object);
                }
                let mut next = current.clone();
                if status {
                    next["status"] = body["status"].clone();
                } else {
                    let mut patch = body.clone();
                    if let Some(meta) = patch["metadata"].as_object_mut() {
                        meta.remove("resourceVersion");
                    }
                    merge(&mut next, &patch);
                }
                (StatusCode::OK, self.store(object, next))
            }
            Method::DELETE => {
                let Some(current) = self.by_path.get(path) else {
                    return failure(StatusCode::NOT_FOUND, "NotFound", path);
                };
                let pre = &body["preconditions"];
                let stale = |field: &str| {
                    pre[field]
                        .as_str()
                        .is_some_and(|want| Some(want) != current["metadata"][field].as_str())
                };
                if stale("uid") || stale("resourceVersion") {
                    return failure(StatusCode::CONFLICT, "Conflict", path);
                }
                self.by_path.remove(path);
                (
                    StatusCode::OK,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
                )
            }
            _ => failure(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", path),
        }
    }
}

pub fn failure(code: StatusCode, reason: &str, what: &str) -> (StatusCode, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason}: {what}"), "reason": reason, "code": code.as_u16(),
        }),
    )
}

/// A JSON merge patch (RFC 7386).
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// What a call said, in short.
pub fn summary(method: &Method, path: &str, body: &Value) -> String {
    if path.starts_with(EVENTS_PREFIX) {
        return format!(
            "{} {}",
            body["type"].as_str().unwrap_or("?"),
            body["reason"].as_str().unwrap_or("?")
        );
    }
    if path.ends_with("/status") {
        let addresses: Vec<&str> = body["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
            .collect();
        let conditions: Vec<String> = body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}={}/{}", c["type"], c["status"], c["reason"]).replace('"', ""))
            .collect();
        return format!("addresses={addresses:?} conditions={conditions:?}");
    }
    if path.starts_with(CLAIMS_PATH) && *method != Method::DELETE {
        return format!("address={}", body["spec"]["address"]);
    }
    if path.contains("/services/") && *method == Method::PATCH {
        return format!("finalizers={}", body["metadata"]["finalizers"]);
    }
    let text = body.to_string();
    text.chars().take(120).collect()
}

/// The mock API server: a task answering the requests of a `kube::Client`.
#[derive(Clone)]
pub struct ApiServer {
    pub objects: Arc<Mutex<Objects>>,
    pub calls: Arc<Mutex<Vec<Call>>>,
}

impl ApiServer {
    /// A client whose requests the returned server answers, in arrival order.
    pub fn start(sim: Simulator) -> (kube::Client, ApiServer) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = ApiServer {
            objects: Arc::default(),
            calls: Arc::default(),
        };
        let answering = server.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                let (parts, body) = request.into_parts();
                let bytes = body.collect_bytes().await.unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let path = parts.uri.path().to_string();
                let rules_on_sim = sim.rules().len();
                let (code, reply) =
                    answering
                        .objects
                        .lock()
                        .unwrap()
                        .answer(&parts.method, &path, &body);
                answering.calls.lock().unwrap().push(Call {
                    summary: summary(&parts.method, &path, &body),
                    method: parts.method,
                    path,
                    rules_on_sim,
                });
                let response = Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        });
        (kube::Client::new(service, "default"), server)
    }

    /// Puts `obj` at `path` as it is (resourceVersion and uid included).
    pub fn put(&self, path: &str, obj: &impl serde::Serialize) {
        let value = serde_json::to_value(obj).unwrap();
        self.objects
            .lock()
            .unwrap()
            .by_path
            .insert(path.to_string(), value);
    }

    pub fn get<K: serde::de::DeserializeOwned>(&self, path: &str) -> Option<K> {
        let value = self.objects.lock().unwrap().by_path.get(path).cloned()?;
        Some(serde_json::from_value(value).unwrap())
    }

    /// The Events written, as the API server stores them.
    pub fn stored_events(&self) -> Vec<Value> {
        let objects = self.objects.lock().unwrap();
        objects
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(EVENTS_PREFIX))
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn claims(&self) -> Vec<AddressClaim> {
        let objects = self.objects.lock().unwrap();
        objects
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(&format!("{CLAIMS_PATH}/")))
            .map(|(_, v)| serde_json::from_value(v.clone()).unwrap())
            .collect()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn forget_calls(&self) {
        self.calls.lock().unwrap().clear();
    }
}

// --- The controller side -------------------------------------------------------------------

/// One reconcile's world: its context, the simulator and the mock API server, and the
/// writers of the stores (standing in for the watches).
pub struct Scenario {
    pub ctx: Arc<Context>,
    pub sim: Simulator,
    pub api: ApiServer,
    pub services: Writer<Service>,
    pub claims: Writer<AddressClaim>,
    pub _nodes: Writer<Node>,
    pub _slices: Writer<EndpointSlice>,
    pub _namespaces: Writer<PartialObjectMeta<Namespace>>,
    pub _pools: Writer<AddressPool>,
    pub _requeue: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    pub _inject: mpsc::UnboundedReceiver<Injected>,
}

impl Scenario {
    /// The context as `loxi_ccm::runtime::run` builds it, over one simulator, one ready Node
    /// and the pool [`CIDR`]; the gate still closed.
    pub async fn start() -> Scenario {
        Scenario::start_with(vec![Pool::new(POOL, vec![CIDR.parse().unwrap()])]).await
    }

    /// As [`Scenario::start`], with these pools (from the command line) instead.
    pub async fn start_with(pools: Vec<Pool>) -> Scenario {
        Scenario::start_with_resources(pools, Vec::new()).await
    }

    /// As [`Scenario::start_with`], with `AddressPool` resources besides.
    pub async fn start_with_resources(pools: Vec<Pool>, resources: Vec<AddressPool>) -> Scenario {
        let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
            .await
            .unwrap();
        let (client, api) = ApiServer::start(sim.clone());
        let cluster = ClusterId::new("scenario").unwrap();
        let loxilb = LoxilbClient::new(ClientConfig::new(&sim.url())).unwrap();
        let fleet = Fleet::new(vec![loxilb], &cluster);

        let (service_store, services) = reflector::store::<Service>();
        let (node_store, mut nodes) = reflector::store::<Node>();
        let (slice_store, slices) = reflector::store::<EndpointSlice>();
        let (claim_store, claims) = reflector::store::<AddressClaim>();
        let (namespace_store, namespaces) = reflector::store::<PartialObjectMeta<Namespace>>();
        nodes.apply_watcher_event(&watcher::Event::Apply(ready_node("node-1", NODE_IP)));
        let (pool_store, mut pool_writer) = reflector::store::<AddressPool>();
        for resource in resources {
            pool_writer.apply_watcher_event(&watcher::Event::Apply(resource));
        }

        let (requeue_tx, requeue_rx) = mpsc::unbounded_channel();
        let (inject_tx, inject_rx) = mpsc::unbounded_channel();
        let metrics = Metrics::new();
        let ipam = Arc::new(Ipam::new(
            ipam::Settings {
                pools,
                zone: "llb".into(),
                ..ipam::Settings::default()
            },
            Pools::new(Api::all(client.clone()), Some(pool_store), namespace_store),
            claim_store,
            Api::all(client.clone()),
            requeue_tx.clone(),
            metrics.clone(),
        ));
        let reporter = Reporter {
            controller: "loxi-ccm".into(),
            instance: None,
        };
        let placement = Placement::new("llb", metrics.clone());
        let ctx = Arc::new(Context {
            report: Report::new(
                EventRecorder::new(client.clone(), reporter, metrics.events_dropped()),
                metrics,
                "loxi-ccm".into(),
            ),
            settings: service::Settings::default(),
            selection: Selection::new(CLASS, false, loxi_domain::ControllerName::default()),
            kube: client,
            cluster,
            inputs: Inputs::new(service_store, node_store, slice_store, None),
            ipam,
            fleet,
            gate: Arc::new(Gate::new(watch::channel(true).1, WriteLease::always())),
            backoff: Backoff::default(),
            room_requeue: service::context::room_requeue(requeue_tx.clone()),
            requeue: requeue_tx,
            departures: Departures::new(false, inject_tx, Relisted::default()),
            teardown: RulesFirst::new(16),
            placement,
        });
        Scenario {
            ctx,
            sim,
            api,
            services,
            claims,
            _nodes: nodes,
            _slices: slices,
            _namespaces: namespaces,
            _pools: pool_writer,
            _requeue: requeue_rx,
            _inject: inject_rx,
        }
    }

    /// The Service as the API server and the Service watch hold it.
    pub fn seed_service(&mut self, svc: &Service) {
        self.api.put(SERVICE_PATH, svc);
        self.services
            .apply_watcher_event(&watcher::Event::Apply(svc.clone()));
    }

    /// The claim as the API server and the claim watch hold it.
    pub fn seed_claim(&mut self, claim: &AddressClaim) {
        let path = format!("{CLAIMS_PATH}/{}", claim.metadata.name.as_deref().unwrap());
        self.api.put(&path, claim);
        self.claims
            .apply_watcher_event(&watcher::Event::Apply(claim.clone()));
    }

    /// Start-up: the address index rebuilt from the stores, then the gate opened.
    pub fn ready(&self) {
        let services = self.ctx.inputs.services.state();
        self.ctx.ipam.rebuild(services.iter().map(|s| s.as_ref()));
        self.ctx.gate.set_ready();
    }

    /// What the watches deliver after the writes: the Service and the claims as the API
    /// server holds them now.
    pub fn deliver_watch_events(&mut self) {
        let svc: Service = self.api.get(SERVICE_PATH).expect("the Service exists");
        self.services
            .apply_watcher_event(&watcher::Event::Apply(svc));
        for claim in self.api.claims() {
            self.claims
                .apply_watcher_event(&watcher::Event::Apply(claim));
        }
    }

    pub async fn reconcile(&self, svc: &Service) -> Result<Action, ReconcileError> {
        tokio::time::timeout(TIMEOUT, reconcile(Arc::new(svc.clone()), self.ctx.clone()))
            .await
            .expect("the reconcile finished")
    }

    /// The rules of `svc` on `ip` put on the simulator, as an earlier pass left them.
    pub async fn program(&self, svc: &Service, ip: IpAddr) {
        let plan = rules_for(svc, &self.ctx, &[ip], &[])
            .expect("a valid Service")
            .expect("an address");
        let report = self.ctx.fleet.instances()[0]
            .apply_service(
                &self.ctx.cluster,
                NS,
                NAME,
                &plan.rules,
                &self.ctx.report.metrics,
                None,
            )
            .await
            .expect("the simulator takes the rules");
        assert!(report.complete(), "{report:?}");
    }

    /// Waits until every queued Event was written to the mock API server.
    pub async fn flush_events(&self) {
        assert!(
            self.ctx.report.recorder.flush(TIMEOUT).await,
            "Events still queued after {TIMEOUT:?}"
        );
    }

    /// The calls other than Events, in arrival order.
    pub fn api_calls(&self) -> Vec<Call> {
        self.api
            .calls()
            .into_iter()
            .filter(|c| !c.is_event())
            .collect()
    }

    /// The Events written, as `type reason`.
    pub fn events(&self) -> Vec<String> {
        self.api
            .calls()
            .into_iter()
            .filter(|c| c.is_event())
            .map(|c| format!("{} {}", c.method, c.summary))
            .collect()
    }
}

pub fn lines(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::line).collect()
}

/// [`common::nodes::ready_node`] as a store holds it (with a resourceVersion).
pub fn ready_node(name: &str, ip: &str) -> Node {
    let mut node = crate::common::nodes::ready_node(name, ip);
    node.metadata.resource_version = Some("1".into());
    node
}

/// A new LoadBalancer Service of our class: one TCP port, no finalizer, no status.
pub fn new_service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(NS.into()),
            uid: Some(UID.into()),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_class: Some(CLASS.into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                node_port: Some(NODE_PORT),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A Service an earlier pass finished: our finalizer on it, [`VIP`] in its status.
pub fn served_service() -> Service {
    let mut svc = new_service();
    svc.metadata.resource_version = Some("7".into());
    svc.metadata.finalizers = Some(vec![CLASS_FINALIZER.into()]);
    svc.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(VIP.into()),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    });
    svc
}

/// `svc` naming `pool` in `loxilb.io/poolSelect`.
pub fn selecting(pool: &str, mut svc: Service) -> Service {
    svc.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/poolSelect".to_string(),
        pool.to_string(),
    )]));
    svc
}

/// The claim of `ip` listing `svc`, as its reconcile wrote it.
pub fn claim_for(svc: &Service, ip: IpAddr) -> AddressClaim {
    let me = ClaimedBy::new(NS, NAME, UID, &service_sharing(svc, "llb").unwrap());
    let mut claim = AddressClaim::new(
        &claim_name(&ip),
        AddressClaimSpec {
            address: ip.to_string(),
            pool: POOL.into(),
            service: me,
            shared_with: Vec::new(),
            retain_until: None,
            controller: None,
        },
    );
    claim.metadata.uid = Some("claim-uid-1".into());
    claim.metadata.resource_version = Some("3".into());
    claim
}

/// A Service holding [`VIP`] with its claim and its rule on the simulator; the gate open.
pub async fn served() -> (Scenario, Service) {
    served_with(Scenario::start().await).await
}

/// As [`served`], in the scenario `s`.
pub async fn served_with(mut s: Scenario) -> (Scenario, Service) {
    let svc = served_service();
    let vip: IpAddr = VIP.parse().unwrap();
    s.seed_service(&svc);
    s.seed_claim(&claim_for(&svc, vip));
    s.ready();
    s.program(&svc, vip).await;
    assert_eq!(s.sim.rules().len(), 1, "the rule of the earlier pass");
    (s, svc)
}
