//! One pass over every Gateway of ours: GatewayClass acceptance, each Gateway's finalizer,
//! address, rules and status, each route's parent entries, and the clean-up of Gateways
//! that are gone. Decisions come from `attach`, `rules` and `status`; this file gathers
//! their inputs and carries out what they decide.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, ObjectReference, Service, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use loxi_domain::pools::{LabelSelector, RawRequirement, RawSelector};
use loxi_domain::{ClusterId, Rule};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::attach::{
    self, Attachment, Backend, BackendIn, FromNamespaces, GrantIn, ListenerIn, ListenerVerdict,
    ParentIn, RouteIn, RouteKind,
};
use super::rules::{ListenerEndpoints, gateway_rules};
use super::status::{
    condition, listener_conditions, merged_parents, parent_entry, same_parents, supported_kinds,
};
use super::types::{
    GROUP, Gateway, GatewayClass, HasRouteStatus, L4RouteSpec, Listener, ParentRef,
};
use super::{FINALIZER, Handles, Settings, Stores, rule_owner};
use crate::ipam::{EnsureError, claims::ClaimedBy};
use crate::k8s::conditions::stamp_all;
use crate::k8s::view::endpoint_views;

/// A TCPRoute or UDPRoute as one pass sees it.
struct Route {
    kind: RouteKind,
    namespace: String,
    name: String,
    generation: Option<i64>,
    uid: Option<String>,
    /// As read: our status write carries it, so a concurrent write of another controller's
    /// entry is never overwritten (409, tried again at the next pass).
    resource_version: Option<String>,
    spec: L4RouteSpec,
    /// `spec.hostnames` (HTTPRoute only).
    hostnames: Vec<String>,
    /// `status.parents` as read (every controller's).
    parents: Vec<Value>,
}

impl Route {
    fn of<K>(r: &K, kind: RouteKind, spec: &L4RouteSpec, hostnames: &[String]) -> Route
    where
        K: Resource + HasRouteStatus,
    {
        Route {
            kind,
            namespace: r.namespace().unwrap_or_default(),
            name: r.name_any(),
            generation: r.meta().generation,
            uid: r.uid(),
            resource_version: r.resource_version(),
            spec: spec.clone(),
            hostnames: hostnames.to_vec(),
            parents: r
                .route_status()
                .map(|s| s.parents.clone())
                .unwrap_or_default(),
        }
    }

    fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(format!("{GROUP}/v1")),
            kind: Some(self.kind.kind().to_string()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }

    fn api(&self, client: &kube::Client) -> Api<kube::api::DynamicObject> {
        let resource = kube::api::ApiResource {
            group: GROUP.into(),
            version: "v1".into(),
            api_version: format!("{GROUP}/v1"),
            kind: self.kind.kind().into(),
            plural: format!("{}s", self.kind.kind().to_ascii_lowercase()),
        };
        Api::namespaced_with(client.clone(), &self.namespace, &resource)
    }
}

/// The Services backends name, read once per pass.
type Services = HashMap<(String, String), Option<Service>>;

pub(super) struct Pass {
    settings: Settings,
    h: Handles,
    stores: Stores,
    owner: ClusterId,
}

/// What became of one Gateway's rules.
enum Programmed {
    Yes,
    No {
        reason: &'static str,
        message: String,
    },
}

impl Pass {
    pub fn new(settings: Settings, h: Handles, stores: Stores) -> Pass {
        let owner = rule_owner(&h.cluster);
        Pass {
            settings,
            h,
            stores,
            owner,
        }
    }

    pub async fn run(&self) {
        let classes: Vec<std::sync::Arc<GatewayClass>> = self
            .stores
            .classes
            .state()
            .into_iter()
            .filter(|c| c.spec.controller_name == self.settings.controller_name)
            .collect();
        for class in &classes {
            self.accept_class(class).await;
        }
        let class_names: HashSet<String> = classes.iter().map(|c| c.name_any()).collect();
        let routes = self.routes();
        let grants = self.grants();
        let services = self.backend_services(&routes);
        let mut entries: HashMap<(RouteKind, String, String), Vec<Value>> = HashMap::new();
        let mut live: HashSet<(String, String)> = HashSet::new();
        for gw in self.stores.gateways.state() {
            let ns = gw.namespace().unwrap_or_default();
            let name = gw.name_any();
            let ours = class_names.contains(&gw.spec.gateway_class_name);
            if gw.meta().deletion_timestamp.is_some() || !ours {
                if gw.finalizers().iter().any(|f| f == FINALIZER) {
                    self.clean_up(&gw).await;
                }
                continue;
            }
            live.insert((ns.clone(), name.clone()));
            self.gateway(&gw, &routes, &grants, &services, &mut entries)
                .await;
        }
        for route in &routes {
            let key = (route.kind, route.namespace.clone(), route.name.clone());
            self.write_route_status(route, entries.remove(&key).unwrap_or_default())
                .await;
        }
        self.collect_gone(&live).await;
    }

    async fn accept_class(&self, class: &GatewayClass) {
        let mut want = vec![
            condition("Accepted", true, "Accepted", "handled by loxi-ccm"),
            condition(
                "SupportedVersion",
                true,
                "SupportedVersion",
                "Gateway API v1 is supported",
            ),
        ];
        let have = class
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        stamp_all(&mut want, &have, class.meta().generation, &now());
        if same_conditions(&want, &have) {
            return;
        }
        let api: Api<GatewayClass> = Api::all(self.h.kube.clone());
        let patch = json!({"status": {"conditions": want}});
        if let Err(e) = api
            .patch_status(
                &class.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            warn!(class = %class.name_any(), error = %e, "could not write GatewayClass status");
        }
    }

    fn routes(&self) -> Vec<Route> {
        let tcp = self
            .stores
            .tcp_routes
            .state()
            .into_iter()
            .map(|r| Route::of(&*r, RouteKind::Tcp, &r.spec.l4, &[]));
        let udp = self
            .stores
            .udp_routes
            .state()
            .into_iter()
            .map(|r| Route::of(&*r, RouteKind::Udp, &r.spec.l4, &[]));
        let http = self
            .stores
            .http_routes
            .state()
            .into_iter()
            .map(|r| Route::of(&*r, RouteKind::Http, &r.spec.common, &r.spec.hostnames));
        let mut all: Vec<Route> = tcp.chain(udp).chain(http).collect();
        all.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
        all
    }

    fn grants(&self) -> Vec<GrantIn> {
        self.stores
            .grants
            .state()
            .iter()
            .map(|g| GrantIn {
                namespace: g.namespace().unwrap_or_default(),
                from: g
                    .spec
                    .from
                    .iter()
                    .map(|f| (f.group.clone(), f.kind.clone(), f.namespace.clone()))
                    .collect(),
                to: g
                    .spec
                    .to
                    .iter()
                    .map(|t| (t.group.clone(), t.kind.clone(), t.name.clone()))
                    .collect(),
            })
            .collect()
    }

    /// Every Service a route's backendRef names (whether or not it may reach it), from the
    /// controller's Service store (listed before any pass: a Service missing from it is gone).
    fn backend_services(&self, routes: &[Route]) -> Services {
        let mut out = Services::new();
        for route in routes {
            for b in route.spec.rules.iter().flat_map(|r| &r.backend_refs) {
                let ns = b
                    .namespace
                    .clone()
                    .unwrap_or_else(|| route.namespace.clone());
                let key = (ns, b.name.clone());
                if out.contains_key(&key) {
                    continue;
                }
                let found = self
                    .stores
                    .services
                    .get(&ObjectRef::new(&key.1).within(&key.0))
                    .map(|s| (*s).clone());
                out.insert(key, found);
            }
        }
        out
    }

    async fn gateway(
        &self,
        gw: &Gateway,
        routes: &[Route],
        grants: &[GrantIn],
        services: &Services,
        entries: &mut HashMap<(RouteKind, String, String), Vec<Value>>,
    ) {
        let ns = gw.namespace().unwrap_or_default();
        let name = gw.name_any();
        if !gw.finalizers().iter().any(|f| f == FINALIZER)
            && let Err(e) = self.set_finalizer(gw, true).await
        {
            warn!(gateway = %format!("{ns}/{name}"), error = %e, "could not add the finalizer");
            return;
        }
        let listeners: Vec<ListenerIn> = gw.spec.listeners.iter().map(listener_in).collect();
        let verdicts = attach::listeners(&listeners);
        let mut attached = vec![0i64; listeners.len()];
        let mut backends: Vec<Vec<Backend>> = vec![Vec::new(); listeners.len()];
        for route in routes {
            let mut counted = vec![false; listeners.len()];
            for parent in &route.spec.parent_refs {
                if !names_gateway(parent, &route.namespace, &ns, &name) {
                    continue;
                }
                let labels = self.h.ipam.pools().namespace_labels(&route.namespace);
                let route_in = RouteIn {
                    kind: route.kind,
                    namespace: &route.namespace,
                    namespace_labels: &labels,
                    hostnames: &route.hostnames,
                };
                let parent_in = ParentIn {
                    section_name: parent.section_name.clone(),
                    port: parent.port,
                };
                let attachment = attach::attach(&ns, &listeners, &verdicts, &route_in, &parent_in);
                let (resolved, problem) = resolve_all(route, grants, services);
                let accepted = match &attachment {
                    Attachment::Accepted(at) => {
                        for &l in at {
                            if !counted[l] {
                                counted[l] = true;
                                attached[l] += 1;
                            }
                            backends[l].extend(resolved.iter().cloned());
                        }
                        condition("Accepted", true, "Accepted", "attached")
                    }
                    Attachment::Refused { reason, message } => {
                        condition("Accepted", false, reason, message.clone())
                    }
                };
                let resolved_refs = match &problem {
                    None => condition(
                        "ResolvedRefs",
                        true,
                        "ResolvedRefs",
                        "all references resolved",
                    ),
                    Some(p) => condition("ResolvedRefs", false, p.reason, p.message.clone()),
                };
                let parent_json = serde_json::to_value(parent).unwrap_or_default();
                let mut want = vec![accepted, resolved_refs];
                let have =
                    our_conditions(&route.parents, &parent_json, &self.settings.controller_name);
                for c in want.iter().filter(|c| c.status == "False") {
                    self.warn_once(route.object_ref(), &have, &c.reason, &c.message);
                }
                stamp_all(&mut want, &have, route.generation, &now());
                entries
                    .entry((route.kind, route.namespace.clone(), route.name.clone()))
                    .or_default()
                    .push(parent_entry(
                        &parent_json,
                        &self.settings.controller_name,
                        &want,
                    ));
            }
        }
        let valid = verdicts.iter().filter(|v| v.usable()).count();
        let shown = gw
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let address = requested_address(gw);
        let (addresses, programmed) = match &address {
            Err(message) => (
                Vec::new(),
                Programmed::No {
                    reason: "AddressNotUsable",
                    message: message.clone(),
                },
            ),
            Ok(requested) => match self
                .h
                .ipam
                .ensure_gateway(&as_service(gw, *requested))
                .await
            {
                Ok(held) => {
                    let listeners_eps =
                        self.endpoints(&gw.spec.listeners, &verdicts, &backends, services);
                    let rules = gateway_rules(
                        &self.owner,
                        &ns,
                        &name,
                        &held.addresses,
                        &listeners_eps,
                        self.settings.style,
                    );
                    self.h.decided.set(&ns, &name, &rules);
                    (held.addresses.clone(), self.apply(&ns, &name, &rules).await)
                }
                Err(EnsureError::Problem(p)) => {
                    self.warn_once(gw.object_ref(&()), &shown, p.reason(), &p.to_string());
                    (
                        Vec::new(),
                        Programmed::No {
                            reason: "AddressNotAssigned",
                            message: p.to_string(),
                        },
                    )
                }
                Err(e) => (
                    self.h.ipam.gateway_addresses(&ns, &name),
                    Programmed::No {
                        reason: "Pending",
                        message: e.to_string(),
                    },
                ),
            },
        };
        let accepted = match (&address, valid) {
            (Err(message), _) => {
                self.warn_once(gw.object_ref(&()), &shown, "UnsupportedAddress", message);
                condition("Accepted", false, "UnsupportedAddress", message.clone())
            }
            (Ok(_), 0) => condition(
                "Accepted",
                false,
                "ListenersNotValid",
                "no listener is valid",
            ),
            (Ok(_), v) if v < verdicts.len() => condition(
                "Accepted",
                true,
                "ListenersNotValid",
                "some listeners are not valid (see their conditions)",
            ),
            (Ok(_), _) => condition("Accepted", true, "Accepted", "accepted by loxi-ccm"),
        };
        let is_programmed = matches!(programmed, Programmed::Yes);
        let programmed = match programmed {
            Programmed::Yes => condition(
                "Programmed",
                true,
                "Programmed",
                "rules are on every loxilb of the group",
            ),
            Programmed::No { reason, message } => condition("Programmed", false, reason, message),
        };
        self.write_gateway_status(
            gw,
            &addresses,
            vec![accepted, programmed],
            &verdicts,
            &attached,
            is_programmed,
        )
        .await;
    }

    /// The ready endpoints of each usable listener's backends, of the backend's port.
    fn endpoints(
        &self,
        listeners: &[Listener],
        verdicts: &[ListenerVerdict],
        backends: &[Vec<Backend>],
        services: &Services,
    ) -> Vec<ListenerEndpoints> {
        let slices = self.stores.slices.state();
        listeners
            .iter()
            .zip(verdicts)
            .zip(backends)
            .filter_map(|((l, v), bs)| {
                let kind = v.protocol_kind.filter(|k| k.programmed_on_loxilb())?;
                let port = u16::try_from(l.port).ok().filter(|_| v.usable())?;
                let mut endpoints = Vec::new();
                for b in bs.iter().filter(|b| b.weight > 0) {
                    let Some(Some(svc)) = services.get(&(b.namespace.clone(), b.name.clone()))
                    else {
                        continue;
                    };
                    let Some(port_name) = service_port_name(svc, b.port) else {
                        continue;
                    };
                    let of_service = slices.iter().filter(|s| {
                        s.namespace().as_deref() == Some(b.namespace.as_str())
                            && s.labels().get("kubernetes.io/service-name") == Some(&b.name)
                    });
                    for view in endpoint_views(of_service.map(|s| &**s), |_, _| BTreeMap::new()) {
                        if !view.ready {
                            continue;
                        }
                        if let Some(p) = view.ports.iter().find(|p| p.name == port_name) {
                            endpoints.push((view.ip, p.port));
                        }
                    }
                }
                Some(ListenerEndpoints {
                    port,
                    protocol: kind.protocol(),
                    endpoints,
                })
            })
            .collect()
    }

    /// Puts `rules` (exactly) on every loxilb of the group that serves.
    async fn apply(&self, ns: &str, name: &str, rules: &[Rule]) -> Programmed {
        let group = &self.settings.group;
        let instances = self.h.instances.instances();
        let mut problems = Vec::new();
        let mut reached = 0;
        for inst in instances
            .iter()
            .filter(|i| i.group() == group.as_str() && i.takes_passes())
        {
            if !inst.is_healthy() {
                problems.push(format!("loxilb {} is down", inst.url()));
                continue;
            }
            reached += 1;
            match inst
                .apply_service(&self.owner, ns, name, rules, &self.h.metrics, None)
                .await
            {
                Ok(report) if report.complete() => {}
                Ok(report) => {
                    let mut why: Vec<String> =
                        report.blocked.iter().map(ToString::to_string).collect();
                    why.extend(report.failed.iter().map(|(k, e)| format!("{k}: {e}")));
                    why.extend(
                        report
                            .conflicts
                            .iter()
                            .map(|(k, owner)| format!("{k} is held by {owner}")),
                    );
                    problems.push(format!("loxilb {}: {}", inst.url(), why.join("; ")));
                }
                Err(e) => problems.push(format!("loxilb {}: {e}", inst.url())),
            }
        }
        if reached == 0 && problems.is_empty() {
            problems.push(format!("no loxilb of group {group} serves (yet)"));
        }
        if problems.is_empty() {
            Programmed::Yes
        } else {
            Programmed::No {
                reason: "Pending",
                message: problems.join("; "),
            }
        }
    }

    async fn write_gateway_status(
        &self,
        gw: &Gateway,
        addresses: &[IpAddr],
        mut conditions: Vec<Condition>,
        verdicts: &[ListenerVerdict],
        attached: &[i64],
        programmed: bool,
    ) {
        let old = gw.status.clone().unwrap_or_default();
        let generation = gw.meta().generation;
        stamp_all(&mut conditions, &old.conditions, generation, &now());
        let listeners: Vec<Value> = gw
            .spec
            .listeners
            .iter()
            .zip(verdicts)
            .zip(attached)
            .map(|((l, v), n)| {
                let mut c = listener_conditions(v, programmed);
                let have = old
                    .listeners
                    .iter()
                    .find(|s| s.name == l.name)
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                stamp_all(&mut c, &have, generation, &now());
                json!({
                    "name": l.name,
                    "supportedKinds": supported_kinds(&v.kinds),
                    "attachedRoutes": n,
                    "conditions": c,
                })
            })
            .collect();
        let addresses: Vec<Value> = addresses
            .iter()
            .map(|ip| json!({"type": "IPAddress", "value": ip.to_string()}))
            .collect();
        let want = json!({
            "addresses": addresses,
            "conditions": conditions,
            "listeners": listeners,
        });
        let have = serde_json::to_value(&old).unwrap_or_default();
        if same_parents(&[have], std::slice::from_ref(&want)) {
            return;
        }
        let api: Api<Gateway> =
            Api::namespaced(self.h.kube.clone(), &gw.namespace().unwrap_or_default());
        if let Err(e) = api
            .patch_status(
                &gw.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": want})),
            )
            .await
        {
            warn!(gateway = %gw.name_any(), error = %e, "could not write Gateway status");
        }
    }

    async fn write_route_status(&self, route: &Route, ours: Vec<Value>) {
        let controller = &self.settings.controller_name;
        let had_ours = route
            .parents
            .iter()
            .any(|p| p["controllerName"] == controller.as_str());
        if ours.is_empty() && !had_ours {
            return;
        }
        let merged = merged_parents(&route.parents, controller, ours);
        if same_parents(&merged, &route.parents) {
            return;
        }
        let patch = json!({
            "metadata": {"resourceVersion": route.resource_version},
            "status": {"parents": merged},
        });
        if let Err(e) = route
            .api(&self.h.kube)
            .patch_status(&route.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            warn!(route = %format!("{}/{}", route.namespace, route.name), kind = route.kind.kind(), error = %e, "could not write route status");
        }
    }

    /// Removes the Gateway's rules from every loxilb of the group, then its address, then
    /// the finalizer; what fails is tried again at the next pass.
    async fn clean_up(&self, gw: &Gateway) {
        let ns = gw.namespace().unwrap_or_default();
        let name = gw.name_any();
        if !self.remove_rules(&ns, &name).await {
            return;
        }
        self.h.decided.forget(&ns, &name);
        if let Err(e) = self.h.ipam.release_gateway(&ns, &name).await {
            warn!(gateway = %format!("{ns}/{name}"), error = %e, "could not release the Gateway's address");
            return;
        }
        if let Err(e) = self.set_finalizer(gw, false).await {
            warn!(gateway = %format!("{ns}/{name}"), error = %e, "could not remove the finalizer");
            return;
        }
        info!(gateway = %format!("{ns}/{name}"), "Gateway cleaned up");
    }

    /// True once no loxilb of the group can hold the Gateway's rules any more.
    async fn remove_rules(&self, ns: &str, name: &str) -> bool {
        let mut done = true;
        for inst in self.h.instances.instances().iter() {
            if inst.group() != self.settings.group.as_str() {
                continue;
            }
            if !inst.is_healthy() {
                debug!(
                    instance = inst.url(),
                    "Gateway rules kept until the loxilb is back"
                );
                done = false;
                continue;
            }
            if let Err(e) = inst
                .remove_service(&self.owner, ns, name, &self.h.metrics)
                .await
            {
                warn!(instance = inst.url(), error = %e, "could not remove a Gateway's rules");
                done = false;
            }
        }
        done
    }

    /// Gateways that hold claims but are gone (deleted while no controller ran, or their
    /// finalizer removed by hand): their rules and addresses go too.
    async fn collect_gone(&self, live: &HashSet<(String, String)>) {
        let owners: Vec<ClaimedBy> = self.h.ipam.gateway_owners();
        for o in owners {
            if live.contains(&(o.namespace.clone(), o.name.clone())) {
                continue;
            }
            let api: Api<Gateway> = Api::namespaced(self.h.kube.clone(), &o.namespace);
            match api.get_opt(&o.name).await {
                // Still there (not ours any more, or being deleted): its finalizer's
                // clean-up handles it.
                Ok(Some(gw)) if gw.uid().as_deref() == Some(o.uid.as_str()) => continue,
                Ok(_) => {}
                Err(e) => {
                    debug!(error = %e, "could not check a Gateway");
                    continue;
                }
            }
            if !self.remove_rules(&o.namespace, &o.name).await {
                continue;
            }
            self.h.decided.forget(&o.namespace, &o.name);
            if let Err(e) = self.h.ipam.release_gateway(&o.namespace, &o.name).await
            {
                warn!(gateway = %o.key(), error = %e, "could not release a gone Gateway's address");
            }
        }
    }

    async fn set_finalizer(&self, gw: &Gateway, present: bool) -> kube::Result<()> {
        let mut finalizers: Vec<String> = gw
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if present {
            finalizers.push(FINALIZER.to_string());
        }
        let api: Api<Gateway> =
            Api::namespaced(self.h.kube.clone(), &gw.namespace().unwrap_or_default());
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": gw.resource_version(),
        }});
        api.patch(
            &gw.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// A Warning Event about bad input, once: not again while the object's status already
    /// shows the problem (`shown`: a False condition with the same message), so a pass
    /// every few seconds does not repeat it.
    fn warn_once(
        &self,
        regarding: ObjectReference,
        shown: &[Condition],
        reason: &str,
        message: &str,
    ) {
        if shown
            .iter()
            .any(|c| c.status == "False" && c.message == message)
        {
            return;
        }
        self.h.recorder.publish(
            Event {
                type_: EventType::Warning,
                reason: reason.to_string(),
                note: Some(crate::k8s::events::note_text(message)),
                action: "Reconcile".to_string(),
                secondary: None,
            },
            regarding,
        );
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    let key = |c: &Condition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            c.observed_generation,
        )
    };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| key(x) == key(y))
}

/// Our conditions of the route's entry for `parent` (for their transition times).
fn our_conditions(parents: &[Value], parent: &Value, controller: &str) -> Vec<Condition> {
    parents
        .iter()
        .find(|p| p["controllerName"] == controller && p["parentRef"] == *parent)
        .and_then(|p| serde_json::from_value(p["conditions"].clone()).ok())
        .unwrap_or_default()
}

/// The parentRef names the Gateway `ns/name`.
fn names_gateway(p: &ParentRef, route_ns: &str, ns: &str, name: &str) -> bool {
    p.group.as_deref().unwrap_or(GROUP) == GROUP
        && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
        && p.namespace.as_deref().unwrap_or(route_ns) == ns
        && p.name == name
}

/// Every backendRef of the route resolved, and the first problem met.
fn resolve_all(
    route: &Route,
    grants: &[GrantIn],
    services: &Services,
) -> (Vec<Backend>, Option<attach::BackendProblem>) {
    let mut resolved = Vec::new();
    let mut problem = None;
    for b in route.spec.rules.iter().flat_map(|r| &r.backend_refs) {
        let backend = BackendIn {
            group: b.group.clone(),
            kind: b.kind.clone(),
            namespace: b
                .namespace
                .clone()
                .unwrap_or_else(|| route.namespace.clone()),
            name: b.name.clone(),
            port: b.port,
            weight: b.weight,
        };
        let exists = |ns: &str, name: &str| {
            services
                .get(&(ns.to_string(), name.to_string()))
                .is_some_and(|s| {
                    s.as_ref().is_some_and(|s| {
                        b.port
                            .and_then(|p| u16::try_from(p).ok())
                            .is_some_and(|p| service_port_name(s, p).is_some())
                    })
                })
        };
        match attach::resolve_backend(route.kind, &route.namespace, &backend, grants, exists) {
            Ok(r) => resolved.push(r),
            Err(p) => {
                problem.get_or_insert(p);
            }
        }
    }
    (resolved, problem)
}

/// The name of the Service's port `port` ("" when unnamed), which EndpointSlices use.
fn service_port_name(svc: &Service, port: u16) -> Option<String> {
    svc.spec
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.port == i32::from(port))
        .map(|p| p.name.clone().unwrap_or_default())
}

fn listener_in(l: &Listener) -> ListenerIn {
    let allowed = l.allowed_routes.clone().unwrap_or_default();
    let namespaces = allowed.namespaces.unwrap_or_default();
    let from = match namespaces.from.as_deref().unwrap_or("Same") {
        "All" => FromNamespaces::All,
        "Selector" => match &namespaces.selector {
            None => FromNamespaces::Invalid("from: Selector without a selector".into()),
            Some(s) => {
                let raw = RawSelector {
                    match_labels: s.match_labels.clone().unwrap_or_default(),
                    match_expressions: s
                        .match_expressions
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|e| RawRequirement {
                            key: e.key,
                            operator: e.operator,
                            values: e.values.unwrap_or_default(),
                        })
                        .collect(),
                };
                match LabelSelector::parse(&raw) {
                    Ok(s) => FromNamespaces::Selector(s),
                    Err(problems) => FromNamespaces::Invalid(problems.join("; ")),
                }
            }
        },
        _ => FromNamespaces::Same,
    };
    ListenerIn {
        name: l.name.clone(),
        port: l.port,
        protocol: l.protocol.clone(),
        hostname: l.hostname.clone(),
        from,
        kinds: allowed
            .kinds
            .iter()
            .map(|k| (k.group.clone(), k.kind.clone()))
            .collect(),
    }
}

/// The address `spec.addresses` asks for: none, or one IP address (more, or a hostname,
/// are not served: the message says so).
fn requested_address(gw: &Gateway) -> Result<Option<IpAddr>, String> {
    match gw.spec.addresses.as_slice() {
        [] => Ok(None),
        [one] => {
            let type_ = one.type_.as_deref().unwrap_or("IPAddress");
            if type_ != "IPAddress" {
                return Err(format!(
                    "address type {type_} is not supported (IPAddress is)"
                ));
            }
            one.value
                .parse::<IpAddr>()
                .map(Some)
                .map_err(|_| format!("{:?} is not an IP address", one.value))
        }
        _ => Err("loxi-ccm gives a Gateway one address: spec.addresses lists more".to_string()),
    }
}

/// The Gateway as IPAM sees an owner: its namespace, name, uid and annotations
/// (`loxilb.io/poolSelect`, `loxilb.io/staticIP`, `loxilb.io/ipam` work as on a Service),
/// the address it asks for, and the addresses it shows (kept across restarts).
fn as_service(gw: &Gateway, requested: Option<IpAddr>) -> Service {
    let shown: Vec<LoadBalancerIngress> = gw
        .status
        .as_ref()
        .map(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.value.parse::<IpAddr>().is_ok())
        .map(|a| LoadBalancerIngress {
            ip: Some(a.value),
            ..LoadBalancerIngress::default()
        })
        .collect();
    Service {
        metadata: kube::api::ObjectMeta {
            namespace: gw.namespace(),
            name: Some(gw.name_any()),
            uid: gw.uid(),
            annotations: gw.metadata.annotations.clone(),
            labels: gw.metadata.labels.clone(),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_ip: requested.map(|ip| ip.to_string()),
            ip_families: requested
                .filter(IpAddr::is_ipv6)
                .map(|_| vec!["IPv6".to_string()]),
            ..Default::default()
        }),
        status: Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(shown),
            }),
            ..Default::default()
        }),
    }
}
