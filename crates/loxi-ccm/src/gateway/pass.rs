//! One pass over every Gateway of ours: GatewayClass acceptance, each Gateway's finalizer,
//! address, rules and status, each route's parent entries, and the clean-up of Gateways
//! that are gone. Decisions come from `plan`, `rules` and `status`; this file gathers
//! their inputs and carries out what they decide.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, ObjectReference, Service, ServiceSpec, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use loxi_domain::{ClusterId, Rule};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::attach::{GrantIn, ListenerVerdict, RouteKind};
use super::http::{self, ListenerCertificates};
use super::ingress;
use super::plan::{self, Route, Services};
use super::rules::gateway_rules;
use super::status::{
    condition, listener_conditions, merged_parents, parent_entry, same_parents, supported_kinds,
};
use super::types::{GROUP, Gateway, GatewayClass};
use super::{FINALIZER, Handles, Settings, Stores, rule_owner};
use crate::ipam::{EnsureError, claims::ClaimedBy};
use crate::k8s::conditions::stamp_all;

fn route_ref(route: &Route) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{GROUP}/v1")),
        kind: Some(route.kind.kind().to_string()),
        namespace: Some(route.namespace.clone()),
        name: Some(route.name.clone()),
        uid: route.uid.clone(),
        ..ObjectReference::default()
    }
}

fn route_api(route: &Route, client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: GROUP.into(),
        version: "v1".into(),
        api_version: format!("{GROUP}/v1"),
        kind: route.kind.kind().into(),
        plural: format!("{}s", route.kind.kind().to_ascii_lowercase()),
    };
    Api::namespaced_with(client.clone(), &route.namespace, &resource)
}

pub(super) struct Pass {
    settings: Settings,
    h: Handles,
    stores: Stores,
    owner: ClusterId,
}

/// What each listener of a Gateway reports.
struct ListenersOutcome<'a> {
    verdicts: &'a [ListenerVerdict],
    attached: &'a [i64],
    certificates: &'a [ListenerCertificates],
    /// The Gateway's rules are on every loxilb of the group.
    programmed: bool,
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
        let mut ingresses: BTreeMap<(String, String), Ingress> = BTreeMap::new();
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
            self.http(&gw, &routes, &grants, &services, &mut ingresses)
                .await;
        }
        // Ingresses of routes no Gateway wants are removed: only once the HTTPRoutes were
        // listed (a route missing from an unlisted store is not gone).
        if matches!(
            self.stores.http_routes.wait_until_ready().now_or_never(),
            Some(Ok(()))
        ) {
            ingress::sync(&self.h.kube, &ingresses).await;
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
        let tcp = self.stores.tcp_routes.state();
        let udp = self.stores.udp_routes.state();
        let http = self.stores.http_routes.state();
        plan::routes(
            tcp.iter().map(|r| &**r),
            udp.iter().map(|r| &**r),
            http.iter().map(|r| &**r),
        )
    }

    fn grants(&self) -> Vec<GrantIn> {
        plan::grants(self.stores.grants.state().iter().map(|g| &**g))
    }

    /// Every Service a route's backendRef names, from the controller's Service store
    /// (listed before any pass: a Service missing from it is gone).
    fn backend_services(&self, routes: &[Route]) -> Services {
        plan::backend_services(routes, |ns, name| {
            self.stores
                .services
                .get(&ObjectRef::new(name).within(ns))
                .map(|s| (*s).clone())
        })
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
        let namespace_labels = |ns: &str| self.h.ipam.pools().namespace_labels(ns);
        let inputs = plan::Inputs {
            routes,
            grants,
            services,
            namespace_labels: &namespace_labels,
        };
        let planned = plan::plan(gw, &inputs);
        for p in &planned.parents {
            let route = &routes[p.route];
            let mut want = p.conditions.clone();
            let have = our_conditions(
                &route.parents,
                &p.parent_ref,
                &self.settings.controller_name,
            );
            for c in want.iter().filter(|c| c.status == "False") {
                self.warn_once(route_ref(route), &have, &c.reason, &c.message);
            }
            stamp_all(&mut want, &have, route.generation, &now());
            entries
                .entry((route.kind, route.namespace.clone(), route.name.clone()))
                .or_default()
                .push(parent_entry(
                    &p.parent_ref,
                    &self.settings.controller_name,
                    &want,
                ));
        }
        let verdicts = &planned.verdicts;
        let attached = &planned.attached;
        let valid = verdicts.iter().filter(|v| v.usable()).count();
        let shown = gw
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        // Before the rules: an HTTPS listener whose certificates do not resolve gets none.
        let certificates = self.certificates(gw, verdicts, grants).await;
        let certified = |i: usize| !matches!(certificates.get(i), Some(Some(Err(_))));
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
                    let slices = self.stores.slices.state();
                    let slices: Vec<&EndpointSlice> = slices.iter().map(|s| &**s).collect();
                    let listeners_eps =
                        plan::endpoints(gw, &planned, services, &slices, &certified);
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
        for (l, certs) in gw.spec.listeners.iter().zip(&certificates) {
            if let Some(Err(p)) = certs {
                let shown = listener_shown(gw, &l.name);
                self.warn_once(gw.object_ref(&()), &shown, p.reason, &p.message);
            }
        }
        let outcome = ListenersOutcome {
            verdicts,
            attached,
            certificates: &certificates,
            programmed: is_programmed,
        };
        self.write_gateway_status(gw, &addresses, vec![accepted, programmed], &outcome)
            .await;
    }

    /// Each HTTPS listener's Secrets, or why they do not resolve (`None`: not HTTPS).
    async fn certificates(
        &self,
        gw: &Gateway,
        verdicts: &[ListenerVerdict],
        grants: &[GrantIn],
    ) -> Vec<ListenerCertificates> {
        let ns = gw.namespace().unwrap_or_default();
        let https = |i: usize| gw.spec.listeners[i].protocol == "HTTPS" && verdicts[i].usable();
        let wanted: BTreeSet<(String, String)> = (0..gw.spec.listeners.len())
            .filter(|&i| https(i))
            .flat_map(|i| gw.spec.listeners[i].tls.iter())
            .flat_map(|t| &t.certificate_refs)
            .map(|r| {
                (
                    r.namespace.clone().unwrap_or_else(|| ns.clone()),
                    r.name.clone(),
                )
            })
            .collect();
        let found = ingress::secrets(&self.h.kube, &wanted).await;
        (0..gw.spec.listeners.len())
            .map(|i| {
                https(i).then(|| {
                    http::certificates(&gw.spec.listeners[i], &ns, grants, |n, m| {
                        found
                            .get(&(n.to_string(), m.to_string()))
                            .cloned()
                            .unwrap_or(http::SecretFound::Missing)
                    })
                })
            })
            .collect()
    }

    /// The Gateway's ingress Service and its HTTPRoutes' Ingresses (added to `ingresses`,
    /// written after every Gateway was passed over).
    async fn http(
        &self,
        gw: &Gateway,
        routes: &[Route],
        grants: &[GrantIn],
        services: &Services,
        ingresses: &mut BTreeMap<(String, String), Ingress>,
    ) {
        let ns = gw.namespace().unwrap_or_default();
        let name = gw.name_any();
        let namespace_labels = |n: &str| self.h.ipam.pools().namespace_labels(n);
        let inputs = plan::Inputs {
            routes,
            grants,
            services,
            namespace_labels: &namespace_labels,
        };
        let planned = plan::plan(gw, &inputs);
        let http_listeners: Vec<usize> = (0..planned.verdicts.len())
            .filter(|&i| {
                planned.verdicts[i].usable()
                    && planned.verdicts[i].protocol_kind == Some(RouteKind::Http)
            })
            .collect();
        let addresses = self.h.ipam.gateway_addresses(&ns, &name);
        match http::ingress_service(gw, &http_listeners, addresses.first().copied()) {
            Some(svc) => ingress::apply_service(&self.h.kube, &svc, &addresses).await,
            None => {
                let key = ObjectRef::new(&http::ingress_service_name(&name)).within(&ns);
                if self.stores.services.get(&key).is_some() {
                    ingress::delete_service(&self.h.kube, &ns, &name).await;
                }
            }
        }
        let certificates = self.certificates(gw, &planned.verdicts, grants).await;
        let mut per_route: BTreeMap<usize, Vec<http::IngressListener>> = BTreeMap::new();
        for &l in &http_listeners {
            let secrets = match &certificates[l] {
                Some(Ok(s)) => s.clone(),
                // Not served: its hosts stay out of the routes' Ingresses.
                Some(Err(_)) => continue,
                None => Vec::new(),
            };
            for &r in &planned.attached_routes[l] {
                per_route.entry(r).or_default().push(http::IngressListener {
                    hostname: gw.spec.listeners[l].hostname.clone(),
                    secrets: secrets.clone(),
                });
            }
        }
        for (r, listeners) in per_route {
            let route = &routes[r];
            let Some(ing) =
                http::ingress(route, &listeners, services, &self.settings.controller_name)
            else {
                continue;
            };
            let key = (route.namespace.clone(), route.name.clone());
            match ingresses.get_mut(&key) {
                // A route on several Gateways: one Ingress with all their hosts.
                Some(have) => http::merge(have, ing),
                None => {
                    ingresses.insert(key, ing);
                }
            }
        }
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
        outcome: &ListenersOutcome<'_>,
    ) {
        let ListenersOutcome {
            verdicts,
            attached,
            certificates,
            programmed,
        } = *outcome;
        let old = gw.status.clone().unwrap_or_default();
        let generation = gw.meta().generation;
        stamp_all(&mut conditions, &old.conditions, generation, &now());
        let listeners: Vec<Value> = gw
            .spec
            .listeners
            .iter()
            .zip(verdicts)
            .zip(attached)
            .zip(certificates)
            .map(|(((l, v), n), certs)| {
                let mut c = listener_conditions(v, programmed);
                if let Some(Err(p)) = certs {
                    http::unresolved_certificates(&mut c, p);
                }
                let have = listener_shown(gw, &l.name);
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
        if let Err(e) = route_api(route, &self.h.kube)
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
        if !self.remove_rules(&ns, &name).await
            || !ingress::delete_service(&self.h.kube, &ns, &name).await
        {
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
            if let Err(e) = self.h.ipam.release_gateway(&o.namespace, &o.name).await {
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

/// The conditions the Gateway's status shows for its listener `name`.
fn listener_shown(gw: &Gateway, name: &str) -> Vec<Condition> {
    gw.status
        .iter()
        .flat_map(|s| &s.listeners)
        .find(|l| l.name == name)
        .map(|l| l.conditions.clone())
        .unwrap_or_default()
}

/// Our conditions of the route's entry for `parent` (for their transition times).
fn our_conditions(parents: &[Value], parent: &Value, controller: &str) -> Vec<Condition> {
    parents
        .iter()
        .find(|p| p["controllerName"] == controller && p["parentRef"] == *parent)
        .and_then(|p| serde_json::from_value(p["conditions"].clone()).ok())
        .unwrap_or_default()
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
