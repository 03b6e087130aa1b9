//! What one Gateway should be, from the objects read (pure): which routes attach to which of
//! its listeners with which conditions, the backends each listener reaches, their ready
//! endpoints and the rules that follow. The controller's pass (`pass`) carries it out and
//! reports it; `loxi-ccm audit` (`crate::audit`) checks the loxilbs against it, so both
//! judge a Gateway the same way.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, ResourceExt};
use loxi_domain::pools::{LabelSelector, RawRequirement, RawSelector};
use loxi_domain::{ClusterId, Rule};
use serde_json::Value;

use super::attach::{
    self, Attachment, Backend, BackendIn, FromNamespaces, GrantIn, ListenerIn, ListenerVerdict,
    ParentIn, RouteIn, RouteKind,
};
use super::rules::{ListenerEndpoints, RuleStyle, gateway_rules};
use super::status::condition;
use super::types::{
    GROUP, Gateway, HTTPRoute, HasRouteStatus, L4RouteSpec, Listener, ParentRef, ReferenceGrant,
    TCPRoute, UDPRoute,
};
use crate::k8s::view::endpoint_views;

/// A TCPRoute, UDPRoute or HTTPRoute as one pass sees it.
pub struct Route {
    pub kind: RouteKind,
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub uid: Option<String>,
    /// As read: our status write carries it, so a concurrent write of another controller's
    /// entry is never overwritten (409, tried again at the next pass).
    pub resource_version: Option<String>,
    pub spec: L4RouteSpec,
    /// `spec.hostnames` (HTTPRoute only).
    pub hostnames: Vec<String>,
    /// `status.parents` as read (every controller's).
    pub parents: Vec<Value>,
}

impl Route {
    pub fn of<K>(r: &K, kind: RouteKind, spec: &L4RouteSpec, hostnames: &[String]) -> Route
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
}

/// Every route of the three kinds, in a stable order.
pub fn routes<'a>(
    tcp: impl IntoIterator<Item = &'a TCPRoute>,
    udp: impl IntoIterator<Item = &'a UDPRoute>,
    http: impl IntoIterator<Item = &'a HTTPRoute>,
) -> Vec<Route> {
    let tcp = tcp
        .into_iter()
        .map(|r| Route::of(r, RouteKind::Tcp, &r.spec.l4, &[]));
    let udp = udp
        .into_iter()
        .map(|r| Route::of(r, RouteKind::Udp, &r.spec.l4, &[]));
    let http = http
        .into_iter()
        .map(|r| Route::of(r, RouteKind::Http, &r.spec.common, &r.spec.hostnames));
    let mut all: Vec<Route> = tcp.chain(udp).chain(http).collect();
    all.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    all
}

/// The ReferenceGrants as `attach` reads them.
pub fn grants<'a>(all: impl IntoIterator<Item = &'a ReferenceGrant>) -> Vec<GrantIn> {
    all.into_iter()
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

/// The Services backends name, by (namespace, name); `None`: it does not exist.
pub type Services = HashMap<(String, String), Option<Service>>;

/// Every Service a route's backendRef names (whether or not it may reach it), found by
/// `lookup(namespace, name)`.
pub fn backend_services(
    routes: &[Route],
    lookup: impl Fn(&str, &str) -> Option<Service>,
) -> Services {
    let mut out = Services::new();
    for route in routes {
        let objects = route.spec.rules.iter().flat_map(|r| &r.backend_refs);
        for b in objects.map(|b| &b.object) {
            let ns = b
                .namespace
                .clone()
                .unwrap_or_else(|| route.namespace.clone());
            let key = (ns, b.name.clone());
            if out.contains_key(&key) {
                continue;
            }
            let found = lookup(&key.0, &key.1);
            out.insert(key, found);
        }
    }
    out
}

/// What a Gateway's pass reads besides the Gateway.
pub struct Inputs<'a> {
    pub routes: &'a [Route],
    pub grants: &'a [GrantIn],
    pub services: &'a Services,
    /// A namespace's labels (for `allowedRoutes.namespaces.from: Selector`).
    pub namespace_labels: &'a (dyn Fn(&str) -> BTreeMap<String, String> + Sync),
}

/// One parentRef of a route that names the Gateway, and what loxi-ccm says of it.
pub struct ParentVerdict {
    /// The route's index in [`Inputs::routes`].
    pub route: usize,
    /// The parentRef as the route wrote it.
    pub parent_ref: Value,
    /// `Accepted` and `ResolvedRefs`, unstamped.
    pub conditions: Vec<Condition>,
}

/// What becomes of one Gateway's listeners and the routes naming it.
pub struct GatewayPlan {
    pub listeners: Vec<ListenerIn>,
    pub verdicts: Vec<ListenerVerdict>,
    /// Per listener: the routes attached to it.
    pub attached: Vec<i64>,
    /// Per listener: the backends of the routes attached to it.
    pub backends: Vec<Vec<Backend>>,
    /// Per listener: the routes attached to it, as indexes in [`Inputs::routes`].
    pub attached_routes: Vec<Vec<usize>>,
    pub parents: Vec<ParentVerdict>,
}

/// Attaches every route naming the Gateway to its listeners (`attach`).
pub fn plan(gw: &Gateway, inputs: &Inputs<'_>) -> GatewayPlan {
    let ns = gw.namespace().unwrap_or_default();
    let name = gw.name_any();
    let listeners: Vec<ListenerIn> = gw.spec.listeners.iter().map(listener_in).collect();
    let verdicts = attach::listeners(&listeners);
    let mut attached = vec![0i64; listeners.len()];
    let mut backends: Vec<Vec<Backend>> = vec![Vec::new(); listeners.len()];
    let mut attached_routes: Vec<Vec<usize>> = vec![Vec::new(); listeners.len()];
    let mut parents = Vec::new();
    for (index, route) in inputs.routes.iter().enumerate() {
        for parent in &route.spec.parent_refs {
            if !names_gateway(parent, &route.namespace, &ns, &name) {
                continue;
            }
            let labels = (inputs.namespace_labels)(&route.namespace);
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
            let (resolved, problem) = resolve_all(route, inputs.grants, inputs.services);
            let accepted = match &attachment {
                Attachment::Accepted(at) => {
                    for &l in at {
                        if !attached_routes[l].contains(&index) {
                            attached_routes[l].push(index);
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
            parents.push(ParentVerdict {
                route: index,
                parent_ref: serde_json::to_value(parent).unwrap_or_default(),
                conditions: vec![accepted, resolved_refs],
            });
        }
    }
    GatewayPlan {
        listeners,
        verdicts,
        attached,
        backends,
        attached_routes,
        parents,
    }
}

/// The ready endpoints of each usable listener (one entry per port and protocol): a TCP or
/// UDP listener's are its backends' (of the backend's port); an HTTP or HTTPS listener's are
/// the loxilb-ingress pods behind the Gateway's ingress Service (`http`), of its port.
/// `certified(i)`: listener `i`'s certificate references resolve (an HTTPS listener whose
/// do not gets no rule; one port's rule stays while another listener on it is served).
pub fn endpoints(
    gw: &Gateway,
    plan: &GatewayPlan,
    services: &Services,
    slices: &[&EndpointSlice],
    certified: &dyn Fn(usize) -> bool,
) -> Vec<ListenerEndpoints> {
    let ready = |ns: &str, service: &str, port_name: &str, out: &mut Vec<(IpAddr, u16)>| {
        let of_service = slices.iter().copied().filter(|s| {
            s.namespace().as_deref() == Some(ns)
                && s.labels()
                    .get("kubernetes.io/service-name")
                    .map(String::as_str)
                    == Some(service)
        });
        for view in endpoint_views(of_service, |_, _| BTreeMap::new()) {
            if !view.ready {
                continue;
            }
            if let Some(p) = view.ports.iter().find(|p| p.name == port_name) {
                out.push((view.ip, p.port));
            }
        }
    };
    let ns = gw.namespace().unwrap_or_default();
    let ingress_service = ingress_service_name(&gw.name_any());
    let mut out: Vec<ListenerEndpoints> = Vec::new();
    for (i, ((l, v), bs)) in gw
        .spec
        .listeners
        .iter()
        .zip(&plan.verdicts)
        .zip(&plan.backends)
        .enumerate()
    {
        let Some(kind) = v.protocol_kind.filter(|k| k.programmed_on_loxilb()) else {
            continue;
        };
        if !certified(i) {
            continue;
        }
        let Some(port) = u16::try_from(l.port).ok().filter(|_| v.usable()) else {
            continue;
        };
        let mut endpoints = Vec::new();
        if kind == RouteKind::Http {
            let name = port_name(&l.protocol, l.port);
            ready(&ns, &ingress_service, &name, &mut endpoints);
        } else {
            for b in bs.iter().filter(|b| b.weight > 0) {
                let Some(Some(svc)) = services.get(&(b.namespace.clone(), b.name.clone())) else {
                    continue;
                };
                let Some(port_name) = service_port_name(svc, b.port) else {
                    continue;
                };
                ready(&b.namespace, &b.name, &port_name, &mut endpoints);
            }
        }
        // HTTP listeners sharing a port by hostname are one rule.
        match out
            .iter_mut()
            .find(|e| e.port == port && e.protocol == kind.protocol())
        {
            Some(e) => e.endpoints.extend(endpoints),
            None => out.push(ListenerEndpoints {
                port,
                protocol: kind.protocol(),
                endpoints,
            }),
        }
    }
    out
}

/// The name of a Gateway's ingress Service (kube-loxilb's, `http`).
pub fn ingress_service_name(gateway: &str) -> String {
    format!("{gateway}-ingress-service")
}

/// The ingress Service's port name for a listener port (its EndpointSlices carry it).
pub fn port_name(protocol: &str, port: i32) -> String {
    format!("{}-{port}", protocol.to_ascii_lowercase())
}

/// The rules the Gateway should have on `addresses` (its claim's): the whole decision, for
/// the audit, which reads no Secrets: an HTTPS listener whose status shows its certificate
/// references unresolved (`certificates_refused`) is taken as the controller judged it.
pub fn desired_rules(
    owner: &ClusterId,
    gw: &Gateway,
    addresses: &[IpAddr],
    inputs: &Inputs<'_>,
    slices: &[&EndpointSlice],
    style: RuleStyle,
) -> Vec<Rule> {
    let plan = plan(gw, inputs);
    let certified = |i: usize| !certificates_refused(gw, i);
    let listeners = endpoints(gw, &plan, inputs.services, slices, &certified);
    gateway_rules(
        owner,
        &gw.namespace().unwrap_or_default(),
        &gw.name_any(),
        addresses,
        &listeners,
        style,
    )
}

/// The Gateway's status shows listener `i` as an HTTPS listener whose certificate
/// references do not resolve (`ResolvedRefs=False` for a certificate reason).
pub fn certificates_refused(gw: &Gateway, i: usize) -> bool {
    let Some(l) = gw.spec.listeners.get(i).filter(|l| l.protocol == "HTTPS") else {
        return false;
    };
    gw.status
        .iter()
        .flat_map(|s| &s.listeners)
        .filter(|s| s.name == l.name)
        .flat_map(|s| &s.conditions)
        .any(|c| {
            c.type_ == "ResolvedRefs"
                && c.status == "False"
                && matches!(
                    c.reason.as_str(),
                    "InvalidCertificateRef" | "RefNotPermitted"
                )
        })
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
            group: b.object.group.clone(),
            kind: b.object.kind.clone(),
            namespace: b
                .object
                .namespace
                .clone()
                .unwrap_or_else(|| route.namespace.clone()),
            name: b.object.name.clone(),
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
pub fn service_port_name(svc: &Service, port: u16) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_takes_an_https_listeners_refused_certificates_from_the_status() {
        let gw: Gateway = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "ns"},
            "spec": {"gatewayClassName": "loxilb", "listeners": [
                {"name": "bad", "port": 443, "protocol": "HTTPS"},
                {"name": "good", "port": 8443, "protocol": "HTTPS"},
                {"name": "kinds", "port": 80, "protocol": "HTTP"}
            ]},
            "status": {"listeners": [
                {"name": "bad", "conditions": [{"type": "ResolvedRefs", "status": "False",
                    "reason": "InvalidCertificateRef", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                {"name": "good", "conditions": [{"type": "ResolvedRefs", "status": "True",
                    "reason": "ResolvedRefs", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                {"name": "kinds", "conditions": [{"type": "ResolvedRefs", "status": "False",
                    "reason": "InvalidRouteKinds", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
            ]}
        }))
        .unwrap();
        let refused: Vec<bool> = (0..4).map(|i| certificates_refused(&gw, i)).collect();
        assert_eq!(refused, vec![true, false, false, false]);
    }
}
