//! Scenario tests of the Service reconcile below the integration tier, in the style of
//! kube-rs's controller examples: the reconcile runs against a mock API server (a
//! `tower-test` pair behind `kube::Client::new`) and the loxilb simulator, and each test
//! asserts the exact API calls in the order they arrived.
//!
//! The mock API server answers as the real one would for what the reconcile sends (create,
//! get, replace, merge and apply patches, delete with preconditions, `409` on a stale
//! resourceVersion, `404` for absent objects) and records each call with the number of
//! rules the simulator held when it arrived: that number orders the API calls against the
//! loxilb calls. Events are written by a background task, so their order against the other
//! calls is not asserted; they are counted after the recorder is flushed.
//!
//! The stores are filled by hand, as the watches would have filled them; the `Context` is
//! built as `runtime::run` builds it.

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Namespace, Node, Service, ServicePort, ServiceSpec,
    ServiceStatus,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::Api;
use kube::client::Body;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, store::Writer};
use kube::runtime::watcher;
use loxi_ccm::fleet::placement::Placement;
use loxi_ccm::ipam::address_pools::{AddressPool, Pools};
use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy, claim_name};
use loxi_ccm::ipam::{self, Ipam, service_sharing};
use loxi_ccm::k8s::events::EventRecorder;
use loxi_ccm::k8s::view::{CLASS_FINALIZER, Selection};
use loxi_ccm::leader::{Gate, WriteLease};
use loxi_ccm::loxilb::Fleet;
use loxi_ccm::metrics::Metrics;
use loxi_ccm::service::backoff::Backoff;
use loxi_ccm::service::departures::{Departures, Injected, Relisted};
use loxi_ccm::service::error::ReconcileError;
use loxi_ccm::service::inputs::Inputs;
use loxi_ccm::service::plan::rules_for;
use loxi_ccm::service::reconcile::reconcile;
use loxi_ccm::service::reporter::Report;
use loxi_ccm::service::rules_first::RulesFirst;
use loxi_ccm::service::teardown;
use loxi_ccm::service::{self, Context};
use loxi_domain::{ClusterId, Pool};
use loxilb_client::{ClientConfig, LoxilbClient};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

const NS: &str = "demo";
const NAME: &str = "web";
const UID: &str = "5d0c7a3e-0000-4000-8000-000000000001";
const CLASS: &str = "loxilb.io/loxilb";
const POOL: &str = "default";
const CIDR: &str = "192.0.2.0/24";
/// The address a Service of the deletion and annotation scenarios already holds.
const VIP: &str = "192.0.2.10";
const NODE_IP: &str = "10.0.0.1";
const NODE_PORT: i32 = 30080;
/// Generous: the simulator and the mock answer at once; only a hang would take this long.
const TIMEOUT: Duration = Duration::from_secs(30);

const SERVICE_PATH: &str = "/api/v1/namespaces/demo/services/web";
const CLAIMS_PATH: &str = "/apis/ipam.loxilb.io/v1alpha1/addressclaims";
const EVENTS_PREFIX: &str = "/apis/events.k8s.io/v1/";

// --- The mock API server -------------------------------------------------------------------

/// One API call as the mock API server received it.
#[derive(Debug, Clone)]
struct Call {
    method: Method,
    path: String,
    /// What the call said, in short (a finalizer list, an address, an Event's type/reason).
    summary: String,
    /// Rules the simulator held when the call arrived.
    rules_on_sim: usize,
}

impl Call {
    fn is_event(&self) -> bool {
        self.path.starts_with(EVENTS_PREFIX)
    }

    fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// The objects the mock API server holds, by object path.
#[derive(Default)]
struct Objects {
    by_path: BTreeMap<String, Value>,
    last_rv: u64,
    last_uid: u64,
}

impl Objects {
    fn next_rv(&mut self) -> String {
        self.last_rv += 1;
        (1000 + self.last_rv).to_string()
    }

    /// Stores `obj` at `path` with a new resourceVersion (and a uid when it has none).
    fn store(&mut self, path: &str, mut obj: Value) -> Value {
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
    fn answer(&mut self, method: &Method, path: &str, body: &Value) -> (StatusCode, Value) {
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

fn failure(code: StatusCode, reason: &str, what: &str) -> (StatusCode, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason}: {what}"), "reason": reason, "code": code.as_u16(),
        }),
    )
}

/// A JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
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
fn summary(method: &Method, path: &str, body: &Value) -> String {
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
struct ApiServer {
    objects: Arc<Mutex<Objects>>,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl ApiServer {
    /// A client whose requests the returned server answers, in arrival order.
    fn start(sim: Simulator) -> (kube::Client, ApiServer) {
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
    fn put(&self, path: &str, obj: &impl serde::Serialize) {
        let value = serde_json::to_value(obj).unwrap();
        self.objects
            .lock()
            .unwrap()
            .by_path
            .insert(path.to_string(), value);
    }

    fn get<K: serde::de::DeserializeOwned>(&self, path: &str) -> Option<K> {
        let value = self.objects.lock().unwrap().by_path.get(path).cloned()?;
        Some(serde_json::from_value(value).unwrap())
    }

    /// The Events written, as the API server stores them.
    fn stored_events(&self) -> Vec<Value> {
        let objects = self.objects.lock().unwrap();
        objects
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(EVENTS_PREFIX))
            .map(|(_, v)| v.clone())
            .collect()
    }

    fn claims(&self) -> Vec<AddressClaim> {
        let objects = self.objects.lock().unwrap();
        objects
            .by_path
            .iter()
            .filter(|(path, _)| path.starts_with(&format!("{CLAIMS_PATH}/")))
            .map(|(_, v)| serde_json::from_value(v.clone()).unwrap())
            .collect()
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn forget_calls(&self) {
        self.calls.lock().unwrap().clear();
    }
}

// --- The controller side -------------------------------------------------------------------

/// One reconcile's world: its context, the simulator and the mock API server, and the
/// writers of the stores (standing in for the watches).
struct Scenario {
    ctx: Arc<Context>,
    sim: Simulator,
    api: ApiServer,
    services: Writer<Service>,
    claims: Writer<AddressClaim>,
    _nodes: Writer<Node>,
    _slices: Writer<EndpointSlice>,
    _namespaces: Writer<PartialObjectMeta<Namespace>>,
    _pools: Writer<AddressPool>,
    _requeue: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    _inject: mpsc::UnboundedReceiver<Injected>,
}

impl Scenario {
    /// The context as `loxi_ccm::runtime::run` builds it, over one simulator, one ready Node
    /// and the pool [`CIDR`]; the gate still closed.
    async fn start() -> Scenario {
        Scenario::start_with(vec![Pool::new(POOL, vec![CIDR.parse().unwrap()])]).await
    }

    /// As [`Scenario::start`], with these pools (from the command line) instead.
    async fn start_with(pools: Vec<Pool>) -> Scenario {
        Scenario::start_with_resources(pools, Vec::new()).await
    }

    /// As [`Scenario::start_with`], with `AddressPool` resources besides.
    async fn start_with_resources(pools: Vec<Pool>, resources: Vec<AddressPool>) -> Scenario {
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
    fn seed_service(&mut self, svc: &Service) {
        self.api.put(SERVICE_PATH, svc);
        self.services
            .apply_watcher_event(&watcher::Event::Apply(svc.clone()));
    }

    /// The claim as the API server and the claim watch hold it.
    fn seed_claim(&mut self, claim: &AddressClaim) {
        let path = format!("{CLAIMS_PATH}/{}", claim.metadata.name.as_deref().unwrap());
        self.api.put(&path, claim);
        self.claims
            .apply_watcher_event(&watcher::Event::Apply(claim.clone()));
    }

    /// Start-up: the address index rebuilt from the stores, then the gate opened.
    fn ready(&self) {
        let services = self.ctx.inputs.services.state();
        self.ctx.ipam.rebuild(services.iter().map(|s| s.as_ref()));
        self.ctx.gate.set_ready();
    }

    /// What the watches deliver after the writes: the Service and the claims as the API
    /// server holds them now.
    fn deliver_watch_events(&mut self) {
        let svc: Service = self.api.get(SERVICE_PATH).expect("the Service exists");
        self.services
            .apply_watcher_event(&watcher::Event::Apply(svc));
        for claim in self.api.claims() {
            self.claims
                .apply_watcher_event(&watcher::Event::Apply(claim));
        }
    }

    async fn reconcile(&self, svc: &Service) -> Result<Action, ReconcileError> {
        tokio::time::timeout(TIMEOUT, reconcile(Arc::new(svc.clone()), self.ctx.clone()))
            .await
            .expect("the reconcile finished")
    }

    /// The rules of `svc` on `ip` put on the simulator, as an earlier pass left them.
    async fn program(&self, svc: &Service, ip: IpAddr) {
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
    async fn flush_events(&self) {
        assert!(
            self.ctx.report.recorder.flush(TIMEOUT).await,
            "Events still queued after {TIMEOUT:?}"
        );
    }

    /// The calls other than Events, in arrival order.
    fn api_calls(&self) -> Vec<Call> {
        self.api
            .calls()
            .into_iter()
            .filter(|c| !c.is_event())
            .collect()
    }

    /// The Events written, as `type reason`.
    fn events(&self) -> Vec<String> {
        self.api
            .calls()
            .into_iter()
            .filter(|c| c.is_event())
            .map(|c| format!("{} {}", c.method, c.summary))
            .collect()
    }
}

fn lines(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::line).collect()
}

/// [`common::nodes::ready_node`] as a store holds it (with a resourceVersion).
fn ready_node(name: &str, ip: &str) -> Node {
    let mut node = common::nodes::ready_node(name, ip);
    node.metadata.resource_version = Some("1".into());
    node
}

/// A new LoadBalancer Service of our class: one TCP port, no finalizer, no status.
fn new_service() -> Service {
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
fn served_service() -> Service {
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
fn selecting(pool: &str, mut svc: Service) -> Service {
    svc.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/poolSelect".to_string(),
        pool.to_string(),
    )]));
    svc
}

/// The claim of `ip` listing `svc`, as its reconcile wrote it.
fn claim_for(svc: &Service, ip: IpAddr) -> AddressClaim {
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
async fn served() -> (Scenario, Service) {
    served_with(Scenario::start().await).await
}

/// As [`served`], in the scenario `s`.
async fn served_with(mut s: Scenario) -> (Scenario, Service) {
    let svc = served_service();
    let vip: IpAddr = VIP.parse().unwrap();
    s.seed_service(&svc);
    s.seed_claim(&claim_for(&svc, vip));
    s.ready();
    s.program(&svc, vip).await;
    assert_eq!(s.sim.rules().len(), 1, "the rule of the earlier pass");
    (s, svc)
}

// --- The scenarios -------------------------------------------------------------------------

/// A new Service: the finalizer first, then the claim (before anything reaches loxilb),
/// then the rule, then one status write publishing the address. The pass that write
/// triggers writes nothing more.
#[tokio::test]
async fn new_service_is_finalized_then_claimed_then_programmed_then_reported_once() {
    let mut s = Scenario::start().await;
    let svc = new_service();
    s.seed_service(&svc);
    s.ready();

    s.reconcile(&svc).await.expect("the pass succeeds");
    s.flush_events().await;

    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("PATCH {SERVICE_PATH}"),
            format!("POST {CLAIMS_PATH}"),
            format!("PATCH {SERVICE_PATH}/status"),
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].summary,
        format!("finalizers=[\"{CLASS_FINALIZER}\"]")
    );
    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let vip = claims[0].spec.address.clone();
    assert_eq!(claims[0].spec.service.uid, UID);
    assert_eq!(calls[1].summary, format!("address=\"{vip}\""));
    assert_eq!(
        calls[1].rules_on_sim, 0,
        "claimed before anything is programmed"
    );
    assert_eq!(
        calls[2].rules_on_sim, 1,
        "programmed before the address is published"
    );
    assert!(
        calls[2].summary.contains(&format!("addresses=[\"{vip}\"]"))
            && calls[2].summary.contains("loxilb.io/Programmed=True"),
        "{}",
        calls[2].summary
    );

    let rules = s.sim.rules();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        (rules[0].external_ip.as_str(), rules[0].port),
        (vip.as_str(), 80)
    );
    let endpoints: Vec<(&str, u16)> = rules[0]
        .endpoints
        .iter()
        .map(|e| (e.ip.as_str(), e.target_port))
        .collect();
    assert_eq!(endpoints, [(NODE_IP, NODE_PORT as u16)]);
    assert_eq!(
        s.events(),
        [
            "POST Normal AddressAllocated",
            "POST Normal RulesProgrammed"
        ]
    );

    // The watch brings the Service as the status write left it, and the claim: the pass this
    // triggers finds everything in place.
    s.deliver_watch_events();
    s.api.forget_calls();
    let written = s.ctx.inputs.service(&svc).expect("in the store");
    let posts = s.sim.rule_posts();
    s.reconcile(&written)
        .await
        .expect("the second pass succeeds");
    s.flush_events().await;
    let calls = s.api.calls();
    assert!(calls.is_empty(), "nothing more to write: {calls:#?}");
    assert_eq!(s.sim.rule_posts(), posts);
    assert_eq!(s.sim.rules(), rules);
}

/// A bad annotation on a Service that holds its address and its rule: nothing is sent to
/// loxilb, the rule stays, and the owner is told once (one Warning Event, one status write
/// keeping the address).
#[tokio::test]
async fn invalid_annotation_keeps_the_rule_warns_once_and_calls_no_loxilb() {
    let (mut s, svc) = served().await;
    let rules = s.sim.rules();
    let requests = s.sim.request_count();
    s.api.forget_calls();

    let mut bad = svc.clone();
    bad.metadata.resource_version = Some("8".into());
    bad.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/lbmode".to_string(),
        "bogus".to_string(),
    )]));
    s.seed_service(&bad);

    s.reconcile(&bad)
        .await
        .expect("a problem of the Service is no error to retry");
    s.flush_events().await;

    assert_eq!(s.sim.request_count(), requests, "no call to loxilb at all");
    assert_eq!(s.sim.rules(), rules, "the old rule is kept");
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [format!("PATCH {SERVICE_PATH}/status")],
        "{calls:#?}"
    );
    assert!(
        calls[0].summary.contains(&format!("addresses=[\"{VIP}\"]"))
            && calls[0].summary.contains("loxilb.io/Programmed=False"),
        "the address stays published, not programmed as asked: {}",
        calls[0].summary
    );
    let events = s.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with("POST Warning "), "{events:?}");
    let claim: Option<AddressClaim> = s.api.get(&format!(
        "{CLAIMS_PATH}/{}",
        claim_name(&VIP.parse().unwrap())
    ));
    assert!(claim.is_some(), "the claim stays");
}

/// The message of the Service's condition `type_` as the API server holds it.
fn condition_message(s: &Scenario, type_: &str) -> String {
    let svc: Service = s.api.get(SERVICE_PATH).expect("the Service exists");
    svc.status
        .and_then(|st| st.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message)
        .unwrap_or_default()
}

/// Two overlapping pools, the Service naming the inner one: its address lies in both, and
/// the claim, the condition and the Event credit the pool it named, not merely the first
/// pool holding the address.
#[tokio::test]
async fn an_address_in_two_pools_is_credited_to_the_pool_named() {
    let mut s = Scenario::start_with(vec![
        Pool::new(POOL, vec![CIDR.parse().unwrap()]),
        Pool::new("inner", vec!["192.0.2.128/25".parse().unwrap()]),
    ])
    .await;
    let svc = selecting("inner", new_service());
    s.seed_service(&svc);
    s.ready();

    s.reconcile(&svc).await.expect("the pass succeeds");
    s.flush_events().await;

    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].spec.address, "192.0.2.129");
    assert_eq!(claims[0].spec.pool, "inner", "the pool the Service named");
    let message = condition_message(&s, "loxilb.io/AddressAllocated");
    assert_eq!(message, "192.0.2.129 from pool inner");
    let notes: Vec<String> = s
        .api
        .stored_events()
        .iter()
        .filter(|e| e["reason"] == "AddressAllocated")
        .map(|e| e["note"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(notes, ["allocated 192.0.2.129 from pool inner"]);
}

/// `loxilb.io/poolSelect` added to a Service that holds an address from another pool: it
/// keeps the address and its rule, and says so once: in its condition and one Normal Event.
#[tokio::test]
async fn a_pool_selected_after_the_address_is_kept_and_told_once() {
    let scenario = Scenario::start_with(vec![
        Pool::new(POOL, vec![CIDR.parse().unwrap()]),
        Pool::new("other", vec!["198.51.100.0/24".parse().unwrap()]),
    ])
    .await;
    let (mut s, svc) = served_with(scenario).await;
    let rules = s.sim.rules();
    s.api.forget_calls();

    let mut selected = selecting("other", svc.clone());
    selected.metadata.resource_version = Some("8".into());
    s.seed_service(&selected);
    s.reconcile(&selected).await.expect("the pass succeeds");
    s.flush_events().await;

    assert_eq!(s.sim.rules(), rules, "the rule stays on the address");
    assert_eq!(s.api.claims().len(), 1, "no address from the new pool");
    let message = condition_message(&s, "loxilb.io/AddressAllocated");
    assert_eq!(
        message,
        format!(
            "{VIP} from pool default; {VIP} is kept although loxilb.io/poolSelect names pool \
             \"other\", which does not hold it: a Service keeps the address it has, and the new \
             pool applies only once this address is released"
        )
    );
    // (The Service seeded shows no conditions: the pass also reports it programmed.)
    let events = s.events();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.ends_with(" AddressKept"))
            .count(),
        1,
        "{events:?}"
    );
    assert!(
        events.contains(&"POST Normal AddressKept".to_string()),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e.contains("Warning")), "{events:?}");

    // The next pass (the status write's watch event) says nothing new.
    s.deliver_watch_events();
    s.api.forget_calls();
    let written = s.ctx.inputs.service(&selected).expect("in the store");
    s.reconcile(&written).await.expect("the pass succeeds");
    s.flush_events().await;
    let calls = s.api.calls();
    assert!(calls.is_empty(), "told once: {calls:#?}");
}

/// An `AddressPool` resource over `cidr`, as `kubectl apply` would give it.
fn address_pool(name: &str, cidr: &str, priority: i32, retain: Option<&str>) -> AddressPool {
    let mut spec = json!({"addresses": [cidr], "priority": priority});
    if let Some(retain) = retain {
        spec["retainAddresses"] = json!(retain);
    }
    serde_json::from_value(json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1",
        "kind": "AddressPool",
        "metadata": {"name": name, "uid": format!("pool-{name}"), "resourceVersion": "1"},
        "spec": spec,
    }))
    .unwrap()
}

/// Overlapping pools, the Service naming the one that retains addresses (not the first
/// holding its address): deleted, its address is retained as that pool says.
#[tokio::test]
async fn a_deleted_service_keeps_its_address_as_the_pool_it_named_says() {
    let mut s = Scenario::start_with_resources(
        vec![Pool::new(POOL, vec!["10.9.0.0/24".parse().unwrap()])],
        vec![
            address_pool("wide", "192.0.2.0/24", 10, None),
            address_pool("narrow", "192.0.2.128/25", 0, Some("1h")),
        ],
    )
    .await;
    let svc = selecting("narrow", new_service());
    s.seed_service(&svc);
    s.ready();
    s.reconcile(&svc).await.expect("the pass succeeds");
    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(
        (
            claims[0].spec.address.as_str(),
            claims[0].spec.pool.as_str()
        ),
        ("192.0.2.129", "narrow")
    );

    s.deliver_watch_events();
    let mut deleting = s
        .ctx
        .inputs
        .service(&svc)
        .expect("in the store")
        .as_ref()
        .clone();
    deleting.metadata.resource_version = Some("99".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);
    s.reconcile(&deleting).await.expect("the cleanup succeeds");

    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "retained, not deleted: {claims:?}");
    assert!(
        claims[0].spec.retain_until.is_some(),
        "kept until the pool's retention ends: {:?}",
        claims[0].spec
    );
    assert!(s.sim.rules().is_empty());
}

/// A deleted Service: its rule leaves loxilb before its claim is deleted, and taking our
/// finalizer off is the last call.
#[tokio::test]
async fn deleted_service_loses_its_rule_then_its_claim_then_its_finalizer() {
    let (mut s, svc) = served().await;
    s.api.forget_calls();
    let mut deleting = svc.clone();
    deleting.metadata.resource_version = Some("9".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);

    s.reconcile(&deleting).await.expect("the cleanup succeeds");
    s.flush_events().await;

    let claim_path = format!("{CLAIMS_PATH}/{}", claim_name(&VIP.parse().unwrap()));
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("DELETE {claim_path}"),
            format!("PATCH {SERVICE_PATH}")
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].rules_on_sim, 0,
        "the rule is gone before the claim"
    );
    assert_eq!(
        calls[1].summary, "finalizers=[]",
        "the finalizer comes off last"
    );
    assert!(s.sim.rules().is_empty());
    assert!(s.api.get::<AddressClaim>(&claim_path).is_none());
    let now: Service = s.api.get(SERVICE_PATH).unwrap();
    assert!(now.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        s.events().is_empty(),
        "no Event about a Service being deleted: {:?}",
        s.events()
    );
}

/// A deleted Service's rule leaves loxilb as soon as the watch shows the deletion, before any
/// API call (`service::teardown`). A cleanup that starts while that removal is under way
/// waits for it instead of sending its own DELETE, then deletes the claim and takes the
/// finalizer off, in that order; no Event about a Service that is going (a log line).
#[tokio::test]
async fn deleted_service_loses_its_rule_at_once_and_the_cleanup_waits_for_that() {
    let (mut s, svc) = served().await;
    s.api.forget_calls();
    let mut deleting = svc.clone();
    deleting.metadata.resource_version = Some("9".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);
    // Slow writes, so that the cleanup below starts while the early removal is under way.
    s.sim.set_write_latency(Duration::from_millis(300));
    let writes_before = s.sim.writes();

    let early =
        teardown::deleting(&s.ctx, &deleting).expect("a deleting Service of ours is removed early");
    assert!(
        teardown::deleting(&s.ctx, &deleting).is_none(),
        "one early removal per Service"
    );
    // The reconcile of the deletion comes while the DELETE is still on its way.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.sim.writes() == writes_before {
        assert!(tokio::time::Instant::now() < deadline, "no DELETE sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(s.api_calls().is_empty(), "{:#?}", s.api_calls());
    s.reconcile(&deleting).await.expect("the cleanup succeeds");
    tokio::time::timeout(TIMEOUT, early)
        .await
        .expect("the early removal ended")
        .expect("the early removal did not panic");
    s.flush_events().await;

    assert_eq!(
        s.sim.writes() - writes_before,
        1,
        "one DELETE: the cleanup waited for the early removal"
    );
    let claim_path = format!("{CLAIMS_PATH}/{}", claim_name(&VIP.parse().unwrap()));
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("DELETE {claim_path}"),
            format!("PATCH {SERVICE_PATH}")
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].rules_on_sim, 0,
        "the rule is gone before the claim"
    );
    assert_eq!(calls[1].summary, "finalizers=[]");
    assert!(s.sim.rules().is_empty());
    assert!(
        s.events().is_empty(),
        "no Event about a Service being deleted: {:?}",
        s.events()
    );
    // A late watch event of the same deletion starts nothing; the deletion's own event
    // drops what was kept about it.
    assert!(teardown::deleting(&s.ctx, &deleting).is_none());
    s.ctx
        .teardown
        .gone(deleting.metadata.uid.as_deref().unwrap());
    assert!(s.ctx.teardown.is_empty());
}
