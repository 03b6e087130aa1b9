//! HTTP and HTTPS listeners, kube-loxilb's way (docs/gateway-api.md#http), pure: the
//! Gateway's LoadBalancer Service `<gateway>-ingress-service` in front of the loxilb-ingress
//! pods (`app=loxilb-ingress`, the listeners' ports, the Gateway's address), the Ingress of
//! class `loxilb` each attached HTTPRoute becomes, and the HTTPS listeners' certificate
//! references. `ingress` writes them; the listeners' loxilb rules go to the ready endpoints
//! of the ingress Service (`plan::endpoints`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, IngressTLS, ServiceBackendPort,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::attach::{GrantIn, RouteKind};
use super::plan::{Route, Services, service_port_name};
pub use super::plan::{ingress_service_name, port_name};
use super::types::{GROUP, Gateway, Listener};

/// The selector of the loxilb-ingress pods (kube-loxilb's).
pub const INGRESS_APP: (&str, &str) = ("app", "loxilb-ingress");
/// The class loxilb-ingress serves.
pub const INGRESS_CLASS: &str = "loxilb";
/// The class of the ingress Service: no Service controller serves it (the Gateway's address
/// is the Gateway's claim, and its rules are the Gateway's), so nothing claims a second
/// address for it; the Gateway controller writes its status.
pub const INGRESS_SERVICE_CLASS: &str = "loxi-ccm.loxilb.io/gateway";
/// The label on every Ingress this controller made (its clean-up finds them by it).
pub const MANAGED_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "loxi-ccm-gateway");
/// kube-loxilb's annotations on the Ingresses it makes, kept for its users' tooling.
pub const ANN_CONTROLLER: &str = "gateway-api-controller";
pub const ANN_PARENT_ROUTE: &str = "parent-http-route";

/// The port loxilb-ingress listens on for a listener's protocol.
fn target_port(protocol: &str) -> i32 {
    if protocol == "HTTPS" { 443 } else { 80 }
}

fn owner(api_version: &str, kind: &str, name: &str, uid: Option<String>) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: uid.unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The ingress Service of the Gateway for its usable HTTP and HTTPS listeners (`http`:
/// their indexes); `None` when it has none.
pub fn ingress_service(gw: &Gateway, http: &[usize], address: Option<IpAddr>) -> Option<Service> {
    let mut ports: BTreeMap<i32, ServicePort> = BTreeMap::new();
    for &i in http {
        let l = &gw.spec.listeners[i];
        ports.entry(l.port).or_insert_with(|| ServicePort {
            name: Some(port_name(&l.protocol, l.port)),
            port: l.port,
            protocol: Some("TCP".into()),
            target_port: Some(IntOrString::Int(target_port(&l.protocol))),
            ..ServicePort::default()
        });
    }
    if ports.is_empty() {
        return None;
    }
    let name = gw.name_any();
    Some(Service {
        metadata: ObjectMeta {
            name: Some(ingress_service_name(&name)),
            namespace: gw.namespace(),
            labels: Some(BTreeMap::from([(
                MANAGED_LABEL.0.to_string(),
                MANAGED_LABEL.1.to_string(),
            )])),
            owner_references: Some(vec![owner(
                &format!("{GROUP}/v1"),
                "Gateway",
                &name,
                gw.uid(),
            )]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_class: Some(INGRESS_SERVICE_CLASS.into()),
            load_balancer_ip: address.map(|ip| ip.to_string()),
            selector: Some(BTreeMap::from([(
                INGRESS_APP.0.to_string(),
                INGRESS_APP.1.to_string(),
            )])),
            ports: Some(ports.into_values().collect()),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// An HTTPS listener's Secrets (namespace, name) or why they do not resolve; `None`: not
/// an HTTPS listener.
pub type ListenerCertificates = Option<Result<Vec<(String, String)>, CertificateProblem>>;

/// What a pass found of a Secret a listener names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretFound {
    Missing,
    /// It exists but cannot serve TLS (`tls::problem` says why).
    Unusable(String),
    Usable,
}

/// Why a listener's certificate references do not resolve (its `ResolvedRefs=False`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateProblem {
    pub reason: &'static str,
    pub message: String,
}

/// An HTTPS listener's Secrets (namespace, name): core `Secret`s only; of another namespace
/// only with a ReferenceGrant there from Gateways of `gw_ns` (`RefNotPermitted`); each
/// must exist and hold a certificate and its key (`found`, else `InvalidCertificateRef`);
/// at least one.
pub fn certificates(
    l: &Listener,
    gw_ns: &str,
    grants: &[GrantIn],
    found: impl Fn(&str, &str) -> SecretFound,
) -> Result<Vec<(String, String)>, CertificateProblem> {
    let refs = l
        .tls
        .as_ref()
        .map(|t| t.certificate_refs.as_slice())
        .unwrap_or_default();
    if refs.is_empty() {
        return Err(CertificateProblem {
            reason: "InvalidCertificateRef",
            message: "an HTTPS listener needs tls.certificateRefs".into(),
        });
    }
    let mut out = Vec::new();
    for r in refs {
        let group = r.group.as_deref().unwrap_or("");
        let kind = r.kind.as_deref().unwrap_or("Secret");
        if !group.is_empty() || kind != "Secret" {
            return Err(CertificateProblem {
                reason: "InvalidCertificateRef",
                message: format!("certificateRef {group}/{kind} {} is not a Secret", r.name),
            });
        }
        let ns = r.namespace.clone().unwrap_or_else(|| gw_ns.to_string());
        if ns != gw_ns {
            let granted = grants.iter().any(|g| {
                g.namespace == ns
                    && g.from
                        .iter()
                        .any(|(fg, fk, fns)| fg == GROUP && fk == "Gateway" && fns == gw_ns)
                    && g.to.iter().any(|(tg, tk, tn)| {
                        tg.is_empty() && tk == "Secret" && tn.as_ref().is_none_or(|n| n == &r.name)
                    })
            });
            if !granted {
                return Err(CertificateProblem {
                    reason: "RefNotPermitted",
                    message: format!(
                        "Secret {ns}/{} is in another namespace and no ReferenceGrant there lets Gateways of {gw_ns} in",
                        r.name
                    ),
                });
            }
        }
        let message = match found(&ns, &r.name) {
            SecretFound::Usable => None,
            SecretFound::Missing => Some(format!("Secret {ns}/{} does not exist", r.name)),
            SecretFound::Unusable(why) => {
                Some(format!("Secret {ns}/{} cannot serve TLS: {why}", r.name))
            }
        };
        if let Some(message) = message {
            return Err(CertificateProblem {
                reason: "InvalidCertificateRef",
                message,
            });
        }
        out.push((ns, r.name.clone()));
    }
    Ok(out)
}

/// The hostnames an Ingress rule gets for a route on a listener: the route's hostnames that
/// intersect the listener's (the more specific of each pair), the listener's when the route
/// has none, none (any host) when neither has any.
pub fn hosts(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let Some(l) = listener else {
        return route.to_vec();
    };
    if route.is_empty() {
        return vec![l.to_string()];
    }
    let matches = |pattern: &str, host: &str| match pattern.strip_prefix('*') {
        Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
        None => pattern == host,
    };
    let mut out = BTreeSet::new();
    for r in route {
        if r == l || matches(l, r) {
            out.insert(r.clone());
        } else if matches(r, l) {
            out.insert(l.to_string());
        }
    }
    out.into_iter().collect()
}

/// An attached listener as an Ingress sees it: its hostname, and its Secrets for `tls`
/// (HTTPS with resolved references).
pub struct IngressListener {
    pub hostname: Option<String>,
    pub secrets: Vec<(String, String)>,
}

/// The Ingress an HTTPRoute attached to `listeners` becomes (`None`: no path with a usable
/// backend). Backends must be Services of the route's namespace that exist with the
/// port (an Ingress names no other namespace); `weight: 0` takes one out. Path matches:
/// `PathPrefix` (the default) and `Exact`; a `RegularExpression` match is left out.
pub fn ingress(
    route: &Route,
    listeners: &[IngressListener],
    services: &Services,
    controller: &str,
) -> Option<Ingress> {
    debug_assert_eq!(route.kind, RouteKind::Http);
    let mut paths = Vec::new();
    for rule in &route.spec.rules {
        let backends: Vec<(String, i32)> = rule
            .backend_refs
            .iter()
            .filter(|b| b.object.group.as_deref().unwrap_or("").is_empty())
            .filter(|b| b.object.kind.as_deref().unwrap_or("Service") == "Service")
            .filter(|b| {
                b.object
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| ns == &route.namespace)
            })
            .filter(|b| b.weight.unwrap_or(1) > 0)
            .filter_map(|b| {
                let port = b.port?;
                let svc = services
                    .get(&(route.namespace.clone(), b.object.name.clone()))?
                    .as_ref()?;
                service_port_name(svc, u16::try_from(port).ok()?)?;
                Some((b.object.name.clone(), port))
            })
            .collect();
        let matches: Vec<(String, &str)> = if rule.matches.is_empty() {
            vec![("/".to_string(), "Prefix")]
        } else {
            rule.matches
                .iter()
                .filter_map(|m| {
                    let path = m.path.clone().unwrap_or_default();
                    let value = path.value.unwrap_or_else(|| "/".into());
                    match path.type_.as_deref().unwrap_or("PathPrefix") {
                        "PathPrefix" => Some((value, "Prefix")),
                        "Exact" => Some((value, "Exact")),
                        _ => None,
                    }
                })
                .collect()
        };
        for (path, type_) in &matches {
            for (name, port) in &backends {
                paths.push(HTTPIngressPath {
                    path: Some(path.clone()),
                    path_type: type_.to_string(),
                    backend: IngressBackend {
                        service: Some(IngressServiceBackend {
                            name: name.clone(),
                            port: Some(ServiceBackendPort {
                                number: Some(*port),
                                name: None,
                            }),
                        }),
                        resource: None,
                    },
                });
            }
        }
    }
    if paths.is_empty() {
        return None;
    }
    let mut host_set: BTreeSet<Option<String>> = BTreeSet::new();
    let mut tls = Vec::new();
    for l in listeners {
        let hs = hosts(l.hostname.as_deref(), &route.hostnames);
        if hs.is_empty() {
            host_set.insert(None);
        }
        for h in &hs {
            host_set.insert(Some(h.clone()));
        }
        for (ns, secret) in &l.secrets {
            // An Ingress names Secrets of its own namespace only.
            if ns == &route.namespace {
                tls.push(IngressTLS {
                    hosts: (!hs.is_empty()).then(|| hs.clone()),
                    secret_name: Some(secret.clone()),
                });
            }
        }
    }
    let rules = host_set
        .into_iter()
        .map(|host| IngressRule {
            host,
            http: Some(HTTPIngressRuleValue {
                paths: paths.clone(),
            }),
        })
        .collect();
    Some(Ingress {
        metadata: ObjectMeta {
            name: Some(route.name.clone()),
            namespace: Some(route.namespace.clone()),
            labels: Some(BTreeMap::from([(
                MANAGED_LABEL.0.to_string(),
                MANAGED_LABEL.1.to_string(),
            )])),
            annotations: Some(BTreeMap::from([
                (ANN_CONTROLLER.to_string(), controller.to_string()),
                (ANN_PARENT_ROUTE.to_string(), route.name.clone()),
            ])),
            owner_references: Some(vec![owner(
                &format!("{GROUP}/v1"),
                "HTTPRoute",
                &route.name,
                route.uid.clone(),
            )]),
            ..ObjectMeta::default()
        },
        spec: Some(IngressSpec {
            ingress_class_name: Some(INGRESS_CLASS.into()),
            rules: Some(rules),
            tls: (!tls.is_empty()).then_some(tls),
            default_backend: None,
        }),
        status: None,
    })
}

/// `more`'s rules and TLS added to `ingress` (one route on several Gateways).
pub fn merge(ingress: &mut Ingress, more: Ingress) {
    let (Some(spec), Some(more)) = (ingress.spec.as_mut(), more.spec) else {
        return;
    };
    let rules = spec.rules.get_or_insert_with(Vec::new);
    for r in more.rules.unwrap_or_default() {
        if !rules.contains(&r) {
            rules.push(r);
        }
    }
    if let Some(tls) = more.tls {
        let have = spec.tls.get_or_insert_with(Vec::new);
        for t in tls {
            if !have.contains(&t) {
                have.push(t);
            }
        }
    }
}

/// A listener whose certificate references do not resolve: `ResolvedRefs=False` with the
/// reason, and not programmed.
pub fn unresolved_certificates(
    conditions: &mut [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    problem: &CertificateProblem,
) {
    for c in conditions.iter_mut() {
        let (status, reason, message) = match c.type_.as_str() {
            "ResolvedRefs" => ("False", problem.reason, problem.message.clone()),
            "Programmed" => (
                "False",
                "Invalid",
                format!("not programmed: {}", problem.message),
            ),
            _ => continue,
        };
        c.status = status.into();
        c.reason = reason.into();
        c.message = message;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::types::{ListenerTls, ObjectReference};

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ingress_hosts_are_the_intersection() {
        assert_eq!(
            hosts(None, &names(&["a.example.com"])),
            names(&["a.example.com"])
        );
        assert_eq!(hosts(Some("x.example.com"), &[]), names(&["x.example.com"]));
        assert_eq!(
            hosts(
                Some("*.example.com"),
                &names(&["a.example.com", "b.example.org"])
            ),
            names(&["a.example.com"])
        );
        assert_eq!(
            hosts(Some("a.example.com"), &names(&["*.example.com"])),
            names(&["a.example.com"])
        );
        assert!(hosts(None, &[]).is_empty());
    }

    fn https(refs: Vec<ObjectReference>) -> Listener {
        Listener {
            name: "https".into(),
            port: 443,
            protocol: "HTTPS".into(),
            tls: Some(ListenerTls {
                mode: None,
                certificate_refs: refs,
            }),
            ..Listener::default()
        }
    }

    fn secret(name: &str, ns: Option<&str>) -> ObjectReference {
        ObjectReference {
            name: name.into(),
            namespace: ns.map(String::from),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn certificates_need_a_grant_across_namespaces_and_must_exist() {
        let exists = |ns: &str, name: &str| match (ns, name) {
            ("gw", "missing") => SecretFound::Missing,
            ("gw", "malformed") => SecretFound::Unusable("it has no tls.crt".into()),
            _ => SecretFound::Usable,
        };
        let same = certificates(&https(vec![secret("cert", None)]), "gw", &[], exists);
        assert_eq!(same, Ok(vec![("gw".to_string(), "cert".to_string())]));
        let missing = certificates(&https(vec![secret("missing", None)]), "gw", &[], exists);
        assert_eq!(missing.unwrap_err().reason, "InvalidCertificateRef");
        let malformed = certificates(&https(vec![secret("malformed", None)]), "gw", &[], exists);
        let p = malformed.unwrap_err();
        assert_eq!(p.reason, "InvalidCertificateRef");
        assert!(p.message.contains("no tls.crt"), "{}", p.message);
        let other = https(vec![secret("cert", Some("certs"))]);
        assert_eq!(
            certificates(&other, "gw", &[], exists).unwrap_err().reason,
            "RefNotPermitted"
        );
        let grant = GrantIn {
            namespace: "certs".into(),
            from: vec![(GROUP.into(), "Gateway".into(), "gw".into())],
            to: vec![(String::new(), "Secret".into(), None)],
        };
        assert!(certificates(&other, "gw", std::slice::from_ref(&grant), exists).is_ok());
        // A grant for HTTPRoutes is not one for Gateways.
        let wrong = GrantIn {
            from: vec![(GROUP.into(), "HTTPRoute".into(), "gw".into())],
            ..grant
        };
        assert!(certificates(&other, "gw", &[wrong], exists).is_err());
        let none = Listener {
            tls: None,
            ..https(vec![])
        };
        assert_eq!(
            certificates(&none, "gw", &[], exists).unwrap_err().reason,
            "InvalidCertificateRef"
        );
    }
}
