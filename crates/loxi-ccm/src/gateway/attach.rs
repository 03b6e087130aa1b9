//! How routes attach to a Gateway's listeners and what their backends resolve to, by the
//! Gateway API rules: pure functions on plain data, no I/O (the controller in
//! `controller.rs` gathers the inputs and writes what these decide).
//!
//! The reasons are the spec's standard ones (`Accepted`, `NotAllowedByListeners`,
//! `NoMatchingListenerHostname`, `NoMatchingParent`, `RefNotPermitted`, `InvalidKind`,
//! `BackendNotFound`; for listeners `UnsupportedProtocol`, `ProtocolConflict`,
//! `HostnameConflict`, `InvalidRouteKinds`).

use std::collections::BTreeMap;

use loxi_domain::Protocol;
use loxi_domain::pools::LabelSelector;

use super::types::GROUP;

/// The route kinds loxi-ccm serves: each goes straight to loxilb rules of one protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    Tcp,
    Udp,
    /// HTTPRoute, on HTTP and HTTPS listeners: each attached route becomes an Ingress for
    /// loxilb-ingress, the listener a rule to its pods (`http`, docs/gateway-api.md#http).
    Http,
}

impl RouteKind {
    pub fn kind(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Udp => "UDPRoute",
            RouteKind::Http => "HTTPRoute",
        }
    }

    /// The listener protocol this kind attaches to.
    pub fn listener_protocol(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCP",
            RouteKind::Udp => "UDP",
            RouteKind::Http => "HTTP",
        }
    }

    /// The transport of the listener's loxilb rule.
    pub fn protocol(self) -> Protocol {
        match self {
            RouteKind::Tcp | RouteKind::Http => Protocol::Tcp,
            RouteKind::Udp => Protocol::Udp,
        }
    }

    /// Whether loxi-ccm puts the listener's traffic on loxilb: TCP and UDP straight to the
    /// backends, HTTP and HTTPS to the loxilb-ingress pods (`http`).
    pub fn programmed_on_loxilb(self) -> bool {
        matches!(self, RouteKind::Tcp | RouteKind::Udp | RouteKind::Http)
    }

    /// The kind a listener of `protocol` takes by default (none: not served).
    pub fn of_listener(protocol: &str) -> Option<RouteKind> {
        match protocol {
            "TCP" => Some(RouteKind::Tcp),
            "UDP" => Some(RouteKind::Udp),
            "HTTP" | "HTTPS" => Some(RouteKind::Http),
            _ => None,
        }
    }

    fn of(group: Option<&str>, kind: &str) -> Option<RouteKind> {
        if group.is_some_and(|g| g != GROUP) {
            return None;
        }
        match kind {
            "TCPRoute" => Some(RouteKind::Tcp),
            "UDPRoute" => Some(RouteKind::Udp),
            "HTTPRoute" => Some(RouteKind::Http),
            _ => None,
        }
    }
}

/// `allowedRoutes.namespaces.from` of a listener.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FromNamespaces {
    /// The Gateway's own namespace (the default).
    #[default]
    Same,
    All,
    Selector(LabelSelector),
    /// `Selector` without a valid selector: nothing is allowed (the message says why).
    Invalid(String),
}

/// A listener as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListenerIn {
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub hostname: Option<String>,
    pub from: FromNamespaces,
    /// `allowedRoutes.kinds` as (group, kind); empty: the protocol's default kinds.
    pub kinds: Vec<(Option<String>, String)>,
}

/// What loxi-ccm makes of one listener.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListenerVerdict {
    /// The kind its protocol carries (none: the protocol is not served).
    pub protocol_kind: Option<RouteKind>,
    /// `UnsupportedProtocol` when loxi-ccm does not serve its protocol (TLS passthrough
    /// for now: docs/gateway-api.md#http).
    pub unsupported: Option<String>,
    /// `ProtocolConflict` or `HostnameConflict`, with another listener on its port.
    pub conflict: Option<&'static str>,
    /// The kinds it takes (its status' `supportedKinds`).
    pub kinds: Vec<RouteKind>,
    /// Kinds asked for that it cannot take (`ResolvedRefs=False`, `InvalidRouteKinds`).
    pub invalid_kinds: Vec<String>,
}

impl ListenerVerdict {
    /// Routes attach to it and it becomes rules.
    pub fn usable(&self) -> bool {
        self.unsupported.is_none() && self.conflict.is_none()
    }
}

/// L4 protocols share a port when one is TCP-carried and the other UDP.
fn transport(protocol: &str) -> &'static str {
    if protocol == "UDP" { "udp" } else { "tcp" }
}

/// Every listener's verdict, in order.
pub fn listeners(all: &[ListenerIn]) -> Vec<ListenerVerdict> {
    all.iter()
        .map(|l| {
            let default_kind = RouteKind::of_listener(&l.protocol);
            let unsupported = default_kind.is_none().then(|| {
                format!(
                    "protocol {} is not served by loxi-ccm yet (TCP, UDP, HTTP and HTTPS are)",
                    l.protocol
                )
            });
            let mut kinds = Vec::new();
            let mut invalid_kinds = Vec::new();
            if l.kinds.is_empty() {
                kinds.extend(default_kind);
            } else {
                for (group, kind) in &l.kinds {
                    match RouteKind::of(group.as_deref(), kind) {
                        Some(k) if Some(k) == default_kind => {
                            if !kinds.contains(&k) {
                                kinds.push(k);
                            }
                        }
                        _ => invalid_kinds.push(kind.clone()),
                    }
                }
            }
            let mut conflict = None;
            for other in all.iter().filter(|o| o.name != l.name && o.port == l.port) {
                if transport(&other.protocol) != transport(&l.protocol) {
                    continue;
                }
                // HTTP listeners share a port when their hostnames differ (the spec's
                // hostname-based virtual hosting).
                if other.protocol == l.protocol
                    && (l.protocol == "HTTP" || l.protocol == "HTTPS")
                    && other.hostname != l.hostname
                {
                    continue;
                }
                conflict = Some(if other.protocol == l.protocol {
                    "HostnameConflict"
                } else {
                    "ProtocolConflict"
                });
                if conflict == Some("ProtocolConflict") {
                    break;
                }
            }
            ListenerVerdict {
                protocol_kind: default_kind,
                unsupported,
                conflict,
                kinds,
                invalid_kinds,
            }
        })
        .collect()
}

/// The route side of an attachment.
#[derive(Debug, Clone, Copy)]
pub struct RouteIn<'a> {
    pub kind: RouteKind,
    pub namespace: &'a str,
    /// Its namespace's labels (for `from: Selector`).
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// `spec.hostnames` (none for TCP and UDP routes).
    pub hostnames: &'a [String],
}

/// A parentRef already known to name this Gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParentIn {
    pub section_name: Option<String>,
    pub port: Option<i32>,
}

/// Whether a route attaches through one of its parentRefs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    /// To these listeners (indices into the Gateway's listeners).
    Accepted(Vec<usize>),
    Refused {
        reason: &'static str,
        message: String,
    },
}

fn refused(reason: &'static str, message: impl Into<String>) -> Attachment {
    Attachment::Refused {
        reason,
        message: message.into(),
    }
}

/// Attaches `route` through `parent` to the listeners of a Gateway in `gateway_namespace`.
pub fn attach(
    gateway_namespace: &str,
    listeners: &[ListenerIn],
    verdicts: &[ListenerVerdict],
    route: &RouteIn<'_>,
    parent: &ParentIn,
) -> Attachment {
    let named: Vec<usize> = (0..listeners.len())
        .filter(|&i| {
            parent
                .section_name
                .as_ref()
                .is_none_or(|s| *s == listeners[i].name)
                && parent.port.is_none_or(|p| p == listeners[i].port)
        })
        .collect();
    if named.is_empty() {
        return refused(
            "NoMatchingParent",
            match (&parent.section_name, parent.port) {
                (Some(s), _) => format!("the Gateway has no listener named {s}"),
                (None, Some(p)) => format!("the Gateway has no listener on port {p}"),
                (None, None) => "the Gateway has no listeners".to_string(),
            },
        );
    }
    let usable: Vec<usize> = named
        .into_iter()
        .filter(|&i| verdicts[i].usable())
        .collect();
    if usable.is_empty() {
        return refused(
            "NoMatchingParent",
            "no listener it names is valid (see the Gateway's listener conditions)",
        );
    }
    let kind_ok: Vec<usize> = usable
        .into_iter()
        .filter(|&i| verdicts[i].kinds.contains(&route.kind))
        .collect();
    if kind_ok.is_empty() {
        return refused(
            "NotAllowedByListeners",
            format!("no listener it names takes {}", route.kind.kind()),
        );
    }
    let ns_ok: Vec<usize> = kind_ok
        .into_iter()
        .filter(|&i| match &listeners[i].from {
            FromNamespaces::Same => route.namespace == gateway_namespace,
            FromNamespaces::All => true,
            FromNamespaces::Selector(s) => s.matches(route.namespace_labels),
            FromNamespaces::Invalid(_) => false,
        })
        .collect();
    if ns_ok.is_empty() {
        return refused(
            "NotAllowedByListeners",
            format!(
                "no listener it names allows routes from namespace {}",
                route.namespace
            ),
        );
    }
    let host_ok: Vec<usize> = ns_ok
        .into_iter()
        .filter(|&i| hostnames_intersect(listeners[i].hostname.as_deref(), route.hostnames))
        .collect();
    if host_ok.is_empty() {
        return refused(
            "NoMatchingListenerHostname",
            "none of its hostnames matches a listener's hostname",
        );
    }
    Attachment::Accepted(host_ok)
}

/// Whether a listener's hostname and a route's hostnames have a name in common: no
/// hostname on either side matches everything; `*.example.com` matches any name below
/// `example.com` (not `example.com` itself), from either side.
pub fn hostnames_intersect(listener: Option<&str>, route: &[String]) -> bool {
    let Some(listener) = listener else {
        return true;
    };
    route.is_empty()
        || route
            .iter()
            .any(|r| host_matches(listener, r) || host_matches(r, listener))
}

/// `pattern` (maybe a wildcard) covers `name`.
fn host_matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.to_ascii_lowercase(), name.to_ascii_lowercase());
    match p.strip_prefix("*.") {
        None => p == n,
        Some(suffix) => {
            let name_rest = n.strip_prefix("*.").unwrap_or(&n);
            name_rest
                .strip_suffix(suffix)
                .is_some_and(|head| head.ends_with('.') && head.len() > 1)
                || (n.starts_with("*.") && name_rest == suffix)
        }
    }
}

/// A backendRef as written, with the route's namespace filled in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackendIn {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: String,
    pub name: String,
    pub port: Option<i32>,
    pub weight: Option<i32>,
}

/// A ReferenceGrant in `namespace`: (group, kind, namespace) it lets in, (group, kind,
/// name) it lets them reach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GrantIn {
    pub namespace: String,
    pub from: Vec<(String, String, String)>,
    pub to: Vec<(String, String, Option<String>)>,
}

/// A backend the rules use: a Service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    pub namespace: String,
    pub name: String,
    pub port: u16,
    pub weight: u32,
}

/// Why a backendRef is not used (the route's `ResolvedRefs=False`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendProblem {
    pub reason: &'static str,
    pub message: String,
}

/// Resolves one backendRef of a route of `kind` in `route_namespace`; `exists` says whether
/// a Service exists. Order of the checks: kind, then the grant of a cross-namespace
/// reference, then existence (a Service another namespace did not grant is never looked at).
pub fn resolve_backend(
    kind: RouteKind,
    route_namespace: &str,
    backend: &BackendIn,
    grants: &[GrantIn],
    exists: impl Fn(&str, &str) -> bool,
) -> Result<Backend, BackendProblem> {
    let group = backend.group.as_deref().unwrap_or("");
    let k = backend.kind.as_deref().unwrap_or("Service");
    if !(group.is_empty() || group == "core") || k != "Service" {
        return Err(BackendProblem {
            reason: "InvalidKind",
            message: format!(
                "backendRef {} is a {k} of group {:?}; only Services are served",
                backend.name, group
            ),
        });
    }
    if backend.namespace != route_namespace {
        let granted = grants.iter().any(|g| {
            g.namespace == backend.namespace
                && g.from
                    .iter()
                    .any(|(fg, fk, fns)| fg == GROUP && fk == kind.kind() && fns == route_namespace)
                && g.to.iter().any(|(tg, tk, tn)| {
                    tg.is_empty()
                        && tk == "Service"
                        && tn.as_ref().is_none_or(|n| *n == backend.name)
                })
        });
        if !granted {
            return Err(BackendProblem {
                reason: "RefNotPermitted",
                message: format!(
                    "backendRef {}/{}: no ReferenceGrant in {} lets {} of {} reach it",
                    backend.namespace,
                    backend.name,
                    backend.namespace,
                    kind.kind(),
                    route_namespace
                ),
            });
        }
    }
    let port = match backend.port.map(u16::try_from) {
        Some(Ok(p)) if p > 0 => p,
        _ => {
            return Err(BackendProblem {
                reason: "BackendNotFound",
                message: format!("backendRef {} names no valid port", backend.name),
            });
        }
    };
    if !exists(&backend.namespace, &backend.name) {
        return Err(BackendProblem {
            reason: "BackendNotFound",
            message: format!(
                "Service {}/{} does not exist",
                backend.namespace, backend.name
            ),
        });
    }
    Ok(Backend {
        namespace: backend.namespace.clone(),
        name: backend.name.clone(),
        port,
        weight: backend.weight.map_or(1, |w| w.max(0) as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::pools::RawSelector;

    fn listener(name: &str, port: i32, protocol: &str) -> ListenerIn {
        ListenerIn {
            name: name.into(),
            port,
            protocol: protocol.into(),
            ..ListenerIn::default()
        }
    }

    fn route<'a>(
        kind: RouteKind,
        ns: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> RouteIn<'a> {
        RouteIn {
            kind,
            namespace: ns,
            namespace_labels: labels,
            hostnames: &[],
        }
    }

    fn reason(a: &Attachment) -> &'static str {
        match a {
            Attachment::Accepted(_) => "Accepted",
            Attachment::Refused { reason, .. } => reason,
        }
    }

    #[test]
    fn tcp_and_udp_listeners_take_their_own_kind_only() {
        let ls = vec![listener("tcp", 80, "TCP"), listener("udp", 53, "UDP")];
        let v = listeners(&ls);
        assert_eq!(v[0].kinds, vec![RouteKind::Tcp]);
        assert_eq!(v[1].kinds, vec![RouteKind::Udp]);
        let labels = BTreeMap::new();
        let tcp = route(RouteKind::Tcp, "gw", &labels);
        let udp = route(RouteKind::Udp, "gw", &labels);
        assert_eq!(
            attach("gw", &ls, &v, &tcp, &ParentIn::default()),
            Attachment::Accepted(vec![0])
        );
        assert_eq!(
            attach("gw", &ls, &v, &udp, &ParentIn::default()),
            Attachment::Accepted(vec![1])
        );
        // A UDPRoute naming the TCP listener is not allowed by it.
        let to_tcp = ParentIn {
            section_name: Some("tcp".into()),
            port: None,
        };
        assert_eq!(
            reason(&attach("gw", &ls, &v, &udp, &to_tcp)),
            "NotAllowedByListeners"
        );
    }

    #[test]
    fn section_name_and_port_must_name_a_listener() {
        let ls = vec![listener("tcp", 80, "TCP")];
        let v = listeners(&ls);
        let labels = BTreeMap::new();
        let r = route(RouteKind::Tcp, "gw", &labels);
        for parent in [
            ParentIn {
                section_name: Some("nope".into()),
                port: None,
            },
            ParentIn {
                section_name: None,
                port: Some(81),
            },
            ParentIn {
                section_name: Some("tcp".into()),
                port: Some(81),
            },
        ] {
            assert_eq!(
                reason(&attach("gw", &ls, &v, &r, &parent)),
                "NoMatchingParent"
            );
        }
        let both = ParentIn {
            section_name: Some("tcp".into()),
            port: Some(80),
        };
        assert_eq!(
            attach("gw", &ls, &v, &r, &both),
            Attachment::Accepted(vec![0])
        );
    }

    #[test]
    fn namespaces_same_all_and_selector() {
        let mut same = listener("same", 80, "TCP");
        same.from = FromNamespaces::Same;
        let mut all = listener("all", 81, "TCP");
        all.from = FromNamespaces::All;
        let raw = RawSelector {
            match_labels: [("team".to_string(), "a".to_string())].into(),
            match_expressions: vec![],
        };
        let mut sel = listener("sel", 82, "TCP");
        sel.from = FromNamespaces::Selector(LabelSelector::parse(&raw).unwrap());
        let mut bad = listener("bad", 83, "TCP");
        bad.from = FromNamespaces::Invalid("no selector".into());
        let ls = vec![same, all, sel, bad];
        let v = listeners(&ls);
        let none = BTreeMap::new();
        let team_a: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
        let at = |section: &str, ns: &str, labels: &BTreeMap<String, String>| {
            let parent = ParentIn {
                section_name: Some(section.into()),
                port: None,
            };
            reason(&attach(
                "gw",
                &ls,
                &v,
                &route(RouteKind::Tcp, ns, labels),
                &parent,
            ))
        };
        assert_eq!(at("same", "gw", &none), "Accepted");
        assert_eq!(at("same", "other", &none), "NotAllowedByListeners");
        assert_eq!(at("all", "other", &none), "Accepted");
        assert_eq!(at("sel", "other", &team_a), "Accepted");
        assert_eq!(at("sel", "other", &none), "NotAllowedByListeners");
        assert_eq!(at("bad", "gw", &team_a), "NotAllowedByListeners");
        // Without a sectionName, the route attaches to every listener that allows it.
        let all_of_them = attach(
            "gw",
            &ls,
            &v,
            &route(RouteKind::Tcp, "gw", &team_a),
            &ParentIn::default(),
        );
        assert_eq!(all_of_them, Attachment::Accepted(vec![0, 1, 2]));
    }

    #[test]
    fn kinds_a_listener_cannot_take_are_invalid() {
        let mut l = listener("tcp", 80, "TCP");
        l.kinds = vec![
            (Some(GROUP.into()), "TCPRoute".into()),
            (Some(GROUP.into()), "UDPRoute".into()),
            (None, "HTTPRoute".into()),
        ];
        let v = listeners(&[l]);
        assert_eq!(v[0].kinds, vec![RouteKind::Tcp]);
        assert_eq!(v[0].invalid_kinds, vec!["UDPRoute", "HTTPRoute"]);
        let mut only_udp = listener("tcp", 80, "TCP");
        only_udp.kinds = vec![(None, "UDPRoute".into())];
        let ls = [only_udp];
        let v = listeners(&ls);
        assert!(v[0].kinds.is_empty());
        let labels = BTreeMap::new();
        assert_eq!(
            reason(&attach(
                "gw",
                &ls,
                &v,
                &route(RouteKind::Tcp, "gw", &labels),
                &ParentIn::default()
            )),
            "NotAllowedByListeners"
        );
    }

    #[test]
    fn conflicts_and_unsupported_protocols() {
        let ls = vec![
            listener("a", 80, "TCP"),
            listener("b", 80, "TCP"),
            listener("c", 80, "UDP"),
            listener("d", 443, "HTTPS"),
            listener("e", 443, "TCP"),
            listener("f", 8080, "TLS"),
        ];
        let v = listeners(&ls);
        assert_eq!(v[0].conflict, Some("HostnameConflict"));
        assert_eq!(v[1].conflict, Some("HostnameConflict"));
        // UDP beside TCP on one port is no conflict.
        assert_eq!(v[2].conflict, None);
        assert_eq!(v[3].conflict, Some("ProtocolConflict"));
        assert_eq!(v[4].conflict, Some("ProtocolConflict"));
        assert!(v[5].unsupported.is_some() && v[5].conflict.is_none());
        assert!(v[2].usable() && !v[0].usable() && !v[5].usable());
        // A route naming only conflicted listeners attaches nowhere.
        let labels = BTreeMap::new();
        let parent = ParentIn {
            section_name: None,
            port: Some(443),
        };
        assert_eq!(
            reason(&attach(
                "gw",
                &ls,
                &v,
                &route(RouteKind::Tcp, "gw", &labels),
                &parent
            )),
            "NoMatchingParent"
        );
    }

    #[test]
    fn hostnames() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(hostnames_intersect(None, &names(&["a.example.com"])));
        assert!(hostnames_intersect(Some("a.example.com"), &[]));
        assert!(hostnames_intersect(
            Some("*.example.com"),
            &names(&["a.example.com"])
        ));
        assert!(hostnames_intersect(
            Some("a.example.com"),
            &names(&["*.example.com"])
        ));
        assert!(hostnames_intersect(
            Some("*.example.com"),
            &names(&["*.example.com"])
        ));
        assert!(hostnames_intersect(
            Some("*.example.com"),
            &names(&["*.a.example.com"])
        ));
        assert!(!hostnames_intersect(
            Some("*.example.com"),
            &names(&["example.com"])
        ));
        assert!(!hostnames_intersect(
            Some("a.example.com"),
            &names(&["b.example.com"])
        ));
        assert!(!hostnames_intersect(
            Some("*.example.com"),
            &names(&["a.example.org"])
        ));
        let mut l = listener("h", 80, "TCP");
        l.hostname = Some("a.example.com".into());
        let ls = [l];
        let v = listeners(&ls);
        let labels = BTreeMap::new();
        let hosts = names(&["b.example.com"]);
        let r = RouteIn {
            hostnames: &hosts,
            ..route(RouteKind::Tcp, "gw", &labels)
        };
        assert_eq!(
            reason(&attach("gw", &ls, &v, &r, &ParentIn::default())),
            "NoMatchingListenerHostname"
        );
    }

    #[test]
    fn http_listeners_take_http_routes_by_hostname() {
        let host = |name: &str, port: i32, h: Option<&str>| ListenerIn {
            hostname: h.map(String::from),
            ..listener(name, port, "HTTP")
        };
        let ls = vec![
            host("a", 80, Some("a.example.com")),
            host("wild", 80, Some("*.example.org")),
            host("dup1", 81, Some("x.example.com")),
            host("dup2", 81, Some("x.example.com")),
            listener("tcp", 82, "TCP"),
            host("http82", 82, None),
            listener("https", 443, "HTTPS"),
        ];
        let v = listeners(&ls);
        // Different hostnames on one port: no conflict; the same hostname: a conflict.
        assert_eq!((v[0].conflict, v[1].conflict), (None, None));
        assert_eq!(v[2].conflict, Some("HostnameConflict"));
        assert_eq!(v[3].conflict, Some("HostnameConflict"));
        // HTTP and TCP on one port: both carried by TCP, different protocols.
        assert_eq!(v[4].conflict, Some("ProtocolConflict"));
        assert_eq!(v[5].conflict, Some("ProtocolConflict"));
        assert_eq!(v[0].kinds, vec![RouteKind::Http]);
        // HTTPS takes HTTPRoutes too (docs/gateway-api.md#http).
        assert!(v[6].unsupported.is_none() && v[6].kinds == vec![RouteKind::Http]);
        assert!(RouteKind::Http.protocol() == Protocol::Tcp);
        assert!(RouteKind::Http.programmed_on_loxilb());

        let labels = BTreeMap::new();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let at = |hosts: &[String], section: Option<&str>| {
            let r = RouteIn {
                hostnames: hosts,
                ..route(RouteKind::Http, "gw", &labels)
            };
            let parent = ParentIn {
                section_name: section.map(String::from),
                port: None,
            };
            attach("gw", &ls, &v, &r, &parent)
        };
        // The HTTPS listener (no hostname) takes HTTPRoutes too.
        assert_eq!(
            at(&names(&["a.example.com"]), None),
            Attachment::Accepted(vec![0, 6])
        );
        assert_eq!(
            at(&names(&["b.example.org", "a.example.com"]), None),
            Attachment::Accepted(vec![0, 1, 6])
        );
        // No hostname on the route: every HTTP listener it names that allows it.
        assert_eq!(at(&[], Some("wild")), Attachment::Accepted(vec![1]));
        assert_eq!(
            reason(&at(&names(&["b.example.com"]), Some("a"))),
            "NoMatchingListenerHostname"
        );
        // A TCPRoute naming an HTTP listener is not allowed by it, nor an HTTPRoute a TCP one.
        let tcp = route(RouteKind::Tcp, "gw", &labels);
        let to_a = ParentIn {
            section_name: Some("a".into()),
            port: None,
        };
        assert_eq!(
            reason(&attach("gw", &ls, &v, &tcp, &to_a)),
            "NotAllowedByListeners"
        );
        let mut only_tcp = listener("t", 90, "TCP");
        only_tcp.kinds = vec![(Some(GROUP.into()), "HTTPRoute".into())];
        let v2 = listeners(std::slice::from_ref(&only_tcp));
        assert!(v2[0].kinds.is_empty());
        assert_eq!(v2[0].invalid_kinds, vec!["HTTPRoute"]);
    }

    fn backend(ns: &str, name: &str) -> BackendIn {
        BackendIn {
            namespace: ns.into(),
            name: name.into(),
            port: Some(8080),
            ..BackendIn::default()
        }
    }

    #[test]
    fn backends_of_another_namespace_need_a_grant() {
        let exists = |_: &str, _: &str| true;
        let b = backend("db", "pg");
        let err = resolve_backend(RouteKind::Tcp, "app", &b, &[], exists).unwrap_err();
        assert_eq!(err.reason, "RefNotPermitted");
        let grant = |from_kind: &str, from_ns: &str, to_name: Option<&str>| GrantIn {
            namespace: "db".into(),
            from: vec![(GROUP.into(), from_kind.into(), from_ns.into())],
            to: vec![(String::new(), "Service".into(), to_name.map(String::from))],
        };
        for wrong in [
            grant("UDPRoute", "app", None),
            grant("TCPRoute", "other", None),
            grant("TCPRoute", "app", Some("mysql")),
        ] {
            let err = resolve_backend(RouteKind::Tcp, "app", &b, &[wrong], exists).unwrap_err();
            assert_eq!(err.reason, "RefNotPermitted");
        }
        for right in [
            grant("TCPRoute", "app", None),
            grant("TCPRoute", "app", Some("pg")),
        ] {
            let ok = resolve_backend(RouteKind::Tcp, "app", &b, &[right], exists).unwrap();
            assert_eq!((ok.namespace.as_str(), ok.port, ok.weight), ("db", 8080, 1));
        }
        // The same namespace needs no grant.
        assert!(resolve_backend(RouteKind::Tcp, "db", &b, &[], exists).is_ok());
    }

    #[test]
    fn backend_kind_and_existence() {
        let mut b = backend("app", "web");
        b.kind = Some("ConfigMap".into());
        let err = resolve_backend(RouteKind::Udp, "app", &b, &[], |_, _| true).unwrap_err();
        assert_eq!(err.reason, "InvalidKind");
        let mut b = backend("app", "web");
        b.group = Some("example.com".into());
        let err = resolve_backend(RouteKind::Udp, "app", &b, &[], |_, _| true).unwrap_err();
        assert_eq!(err.reason, "InvalidKind");
        let b = backend("app", "web");
        let err = resolve_backend(RouteKind::Udp, "app", &b, &[], |_, _| false).unwrap_err();
        assert_eq!(err.reason, "BackendNotFound");
        // Another namespace's missing Service without a grant: not permitted, not "not found".
        let b = backend("db", "gone");
        let err = resolve_backend(RouteKind::Udp, "app", &b, &[], |_, _| false).unwrap_err();
        assert_eq!(err.reason, "RefNotPermitted");
        let mut b = backend("app", "web");
        b.weight = Some(5);
        let ok = resolve_backend(RouteKind::Udp, "app", &b, &[], |_, _| true).unwrap();
        assert_eq!(ok.weight, 5);
    }
}
