//! The planner: one Service + the cluster's nodes + the Service's endpoints + its addresses
//! -> the rules loxilb should hold for it. Pure: the same inputs always give the same rules.
//!
//! Endpoint modes (chosen by [`ServiceIntent::use_pod_network`]):
//! - **node** (default): every eligible Node's InternalIP, target = the port's NodePort.
//!   `loxilb.io/nodelabel` keeps only matching Nodes; `externalTrafficPolicy: Local` keeps
//!   only Nodes hosting a ready endpoint of the Service.
//! - **pod network**: the ready endpoints of the Service (from its EndpointSlices, also for
//!   selector-less Services with hand-made slices), target = the endpoint port whose name is
//!   the Service port's name. With `loxilb.io/multus-nets`, the endpoint's addresses on those
//!   Multus networks replace its pod IP.
//!
//! More than [`MAX_ENDPOINTS`] candidates: a stable subset is kept ([`crate::selection`]) and
//! the number left out is reported in [`Plan::endpoints_dropped`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use thiserror::Error;

use crate::intent::{ANN_LB_MODE, AnnotationError, ServiceIntent, invalid};
use crate::model::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use crate::naming::{ClusterId, RuleName};
use crate::selection::{stable_subset, stable_subset_endpoints};

/// loxilb's limit of endpoints per rule (docs/loxilb-api.md#limits).
pub const MAX_ENDPOINTS: usize = 32;
/// loxilb's limit of secondary IPs per rule (docs/loxilb-api.md#limits).
pub const MAX_SECONDARY_IPS: usize = 3;

/// One port of a Service, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServicePortView {
    /// `""` for the unnamed port of a single-port Service.
    pub name: String,
    pub port: u16,
    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub protocol: String,
    pub node_port: Option<u16>,
}

/// `spec.externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// A Service, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceView {
    pub namespace: String,
    pub name: String,
    pub ports: Vec<ServicePortView>,
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.loadBalancerSourceRanges`, verbatim (validated and canonicalized here).
    pub source_ranges: Vec<String>,
    /// Secondary VIPs for SCTP multihoming, as the controller decided them (sorted and passed
    /// through to SCTP rules only; at most 3, same family as the VIP).
    pub secondary_ips: Vec<IpAddr>,
}

/// A Node, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeView {
    pub name: String,
    pub internal_ip: Option<IpAddr>,
    /// Labelled `node.kubernetes.io/exclude-from-external-load-balancers`.
    pub excluded: bool,
    /// Has a deletion timestamp.
    pub deleting: bool,
    /// `false` only when the Ready condition says False or Unknown; a Node without a Ready
    /// condition yet counts as ready (nothing says otherwise).
    pub ready: bool,
    /// `metadata.labels` (for `loxilb.io/nodelabel`).
    pub labels: BTreeMap<String, String>,
}

impl NodeView {
    fn eligible(&self) -> bool {
        !self.excluded && !self.deleting && self.ready
    }
}

/// One port of an EndpointSlice (`ports[]`): `name` is the name of the Service port it
/// serves (`""` for an unnamed port), `port` the resolved target port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct EndpointPortView {
    pub name: String,
    pub port: u16,
    /// The Kubernetes spelling; empty means TCP.
    pub protocol: String,
}

/// One address of one endpoint of an EndpointSlice of the Service, with that slice's ports.
/// A pod listed in several slices (or with several addresses) appears several times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointView {
    pub ip: IpAddr,
    /// `endpoints[].nodeName` (absent in many hand-made slices).
    pub node_name: Option<String>,
    /// `endpoints[].conditions.ready`, with "unset" read as ready (the API's rule).
    pub ready: bool,
    pub ports: Vec<EndpointPortView>,
    /// Multus: the pod's addresses per attached network, keyed by network name as the pod's
    /// `k8s.v1.cni.cncf.io/network-status` annotation spells it (`namespace/name`). Empty when
    /// the pod has no such networks or the controller does not look them up.
    pub networks: BTreeMap<String, Vec<IpAddr>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("port {port}/{protocol} uses a protocol loxilb cannot balance")]
    UnsupportedProtocol { port: u16, protocol: String },
    #[error("port {port}/{protocol} has no NodePort to forward to")]
    NoNodePort { port: u16, protocol: String },
    #[error("no eligible node with an InternalIP to use as endpoint")]
    NoEndpoints,
    #[error("no eligible node matches loxilb.io/nodelabel {selector:?}")]
    NoMatchingNodes { selector: String },
    #[error("externalTrafficPolicy is Local and no eligible node hosts a ready endpoint")]
    NoLocalEndpoints,
    #[error("port {port}/{protocol} has no ready endpoint")]
    NoReadyEndpoints { port: u16, protocol: String },
    #[error("spec.loadBalancerSourceRanges entry {value:?} is not a CIDR")]
    InvalidSourceRange { value: String },
    #[error("secondary IPs {ips:?}: {reason}")]
    InvalidSecondaryIps { ips: Vec<IpAddr>, reason: String },
    /// An annotation that is valid alone but not for this Service's ports, VIPs or targets.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
}

impl PlanError {
    /// Stable category for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PlanError::UnsupportedProtocol { .. } => "UnsupportedProtocol",
            PlanError::NoNodePort { .. } => "NoNodePort",
            PlanError::NoEndpoints => "NoEndpoints",
            PlanError::NoMatchingNodes { .. } => "NoMatchingNodes",
            PlanError::NoLocalEndpoints => "NoLocalEndpoints",
            PlanError::NoReadyEndpoints { .. } => "NoReadyEndpoints",
            PlanError::InvalidSourceRange { .. } => "InvalidSourceRange",
            PlanError::InvalidSecondaryIps { .. } => "InvalidSecondaryIPs",
            PlanError::Annotation(e) => e.reason(),
        }
    }
}

/// The result of planning one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub rules: Vec<Rule>,
    /// Candidates left out because of loxilb's per-rule endpoint limit (the most of any rule).
    pub endpoints_dropped: usize,
}

struct PortPlan<'a> {
    view: &'a ServicePortView,
    protocol: Protocol,
}

/// Plans one rule per address × port.
pub fn plan_rules(
    cluster: &ClusterId,
    service: &ServiceView,
    nodes: &[NodeView],
    endpoints: &[EndpointView],
    addresses: &[IpAddr],
    intent: &ServiceIntent,
) -> Result<Plan, PlanError> {
    let mut ports = Vec::with_capacity(service.ports.len());
    for p in &service.ports {
        let protocol =
            Protocol::parse(&p.protocol).ok_or_else(|| PlanError::UnsupportedProtocol {
                port: p.port,
                protocol: p.protocol.clone(),
            })?;
        ports.push(PortPlan { view: p, protocol });
    }
    let typed: Vec<(u16, Protocol)> = ports.iter().map(|p| (p.view.port, p.protocol)).collect();
    intent.check_service(&typed, addresses)?;
    if !intent.use_pod_network {
        for p in &ports {
            if p.view.node_port.is_none() {
                return Err(PlanError::NoNodePort {
                    port: p.view.port,
                    protocol: p.view.protocol.clone(),
                });
            }
        }
    }
    let allowed_sources = source_ranges(&service.source_ranges)?;
    let secondary_ips = secondary_ips(service, &ports, addresses)?;

    let identity = format!("{}/{}", service.namespace, service.name);
    let mut rules = Vec::with_capacity(addresses.len() * ports.len());
    let mut endpoints_dropped = 0;
    for vip in addresses {
        // An IPv4 VIP cannot forward to IPv6 endpoints (loxilb rejects nat46).
        let family_ok = |ip: &IpAddr| !(vip.is_ipv4() && ip.is_ipv6());
        let node_ips = if intent.use_pod_network {
            Vec::new()
        } else {
            let candidates = node_candidates(service, nodes, endpoints, intent, &family_ok)?;
            let chosen = stable_subset(&identity, &candidates, MAX_ENDPOINTS);
            endpoints_dropped = endpoints_dropped.max(candidates.len() - chosen.len());
            chosen
        };
        for p in &ports {
            let targets: Vec<(IpAddr, u16)> = if intent.use_pod_network {
                let candidates = pod_candidates(service, p, endpoints, intent, &family_ok);
                if candidates.is_empty() {
                    return Err(PlanError::NoReadyEndpoints {
                        port: p.view.port,
                        protocol: p.view.protocol.clone(),
                    });
                }
                let chosen = stable_subset_endpoints(&identity, &candidates, MAX_ENDPOINTS);
                endpoints_dropped = endpoints_dropped.max(candidates.len() - chosen.len());
                chosen
            } else {
                let node_port = p.view.node_port.unwrap_or_default();
                node_ips.iter().map(|ip| (*ip, node_port)).collect()
            };
            check_dsr(intent, p, &targets)?;
            let weights = weights(intent, targets.len());
            let endpoints = targets
                .iter()
                .zip(weights)
                .map(|((ip, target_port), weight)| Endpoint {
                    ip: *ip,
                    target_port: *target_port,
                    weight,
                })
                .collect();
            rules.push(
                Rule {
                    key: RuleKey {
                        ip: *vip,
                        port: p.view.port,
                        protocol: p.protocol,
                    },
                    name: RuleName::new(
                        cluster,
                        &service.namespace,
                        &service.name,
                        p.view.port,
                        p.protocol,
                    )
                    .to_string(),
                    mode: intent.mode,
                    selection: intent.selection,
                    endpoints,
                    monitor: intent.monitor || intent.probe.kind.forces_monitor(),
                    managed: true,
                    probe: intent.probe.clone(),
                    inactive_timeout: intent.inactive_timeout,
                    proxy_protocol_v2: intent.proxy_protocol_v2,
                    egress: intent.egress,
                    allowed_sources: allowed_sources.clone(),
                    // Each VIP gets the secondary addresses of its own family (a
                    // dual-stack Service's other VIP has none).
                    secondary_ips: if p.protocol == Protocol::Sctp {
                        secondary_ips
                            .iter()
                            .copied()
                            .filter(|ip| ip.is_ipv4() == vip.is_ipv4())
                            .collect()
                    } else {
                        Vec::new()
                    },
                    // Set by the controller, which knows whether BGP is on and the pool's
                    // choice.
                    bgp: false,
                    // Set by the controller from `--privateCIDR`.
                    private_ip: None,
                }
                .normalized(),
            );
        }
    }
    Ok(Plan {
        rules,
        endpoints_dropped,
    })
}

/// Node endpoint mode: the InternalIPs of eligible Nodes, narrowed by `nodelabel` and by
/// `externalTrafficPolicy: Local`; sorted, unique.
fn node_candidates(
    service: &ServiceView,
    nodes: &[NodeView],
    endpoints: &[EndpointView],
    intent: &ServiceIntent,
    family_ok: &impl Fn(&IpAddr) -> bool,
) -> Result<Vec<IpAddr>, PlanError> {
    let mut eligible: Vec<&NodeView> = nodes
        .iter()
        .filter(|n| n.eligible() && n.internal_ip.as_ref().is_some_and(family_ok))
        .collect();
    if eligible.is_empty() {
        return Err(PlanError::NoEndpoints);
    }
    if let Some(selector) = &intent.node_selector {
        eligible.retain(|n| selector.matches(&n.labels));
        if eligible.is_empty() {
            return Err(PlanError::NoMatchingNodes {
                selector: selector.to_string(),
            });
        }
    }
    if service.external_traffic_policy == TrafficPolicy::Local {
        let hosting: BTreeSet<&str> = endpoints
            .iter()
            .filter(|e| e.ready)
            .filter_map(|e| e.node_name.as_deref())
            .collect();
        eligible.retain(|n| hosting.contains(n.name.as_str()));
        if eligible.is_empty() {
            return Err(PlanError::NoLocalEndpoints);
        }
    }
    let mut ips: Vec<IpAddr> = eligible.iter().filter_map(|n| n.internal_ip).collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// Pod-network mode: (address, target port) of every ready endpoint serving `port`; sorted,
/// unique.
fn pod_candidates(
    service: &ServiceView,
    port: &PortPlan<'_>,
    endpoints: &[EndpointView],
    intent: &ServiceIntent,
    family_ok: &impl Fn(&IpAddr) -> bool,
) -> Vec<(IpAddr, u16)> {
    // `name` means the network in the Service's namespace.
    let networks: Vec<(String, &str)> = intent
        .multus_networks
        .iter()
        .map(|n| {
            let qualified = if n.contains('/') {
                n.clone()
            } else {
                format!("{}/{n}", service.namespace)
            };
            (qualified, n.as_str())
        })
        .collect();
    let mut out = Vec::new();
    for ep in endpoints.iter().filter(|e| e.ready) {
        for ep_port in &ep.ports {
            let protocol = if ep_port.protocol.is_empty() {
                Some(Protocol::Tcp)
            } else {
                Protocol::parse(&ep_port.protocol)
            };
            if ep_port.name != port.view.name || protocol != Some(port.protocol) {
                continue;
            }
            if networks.is_empty() {
                out.push((ep.ip, ep_port.port));
            } else {
                for (qualified, raw) in &networks {
                    let addrs = ep.networks.get(qualified).or_else(|| ep.networks.get(*raw));
                    for ip in addrs.into_iter().flatten() {
                        out.push((*ip, ep_port.port));
                    }
                }
            }
        }
    }
    out.retain(|(ip, _)| family_ok(ip));
    out.sort();
    out.dedup();
    out
}

/// loxilb's DSR forwards without rewriting the destination port: every target must be the
/// service port (docs/loxilb-api.md#rule-fields), else loxilb rejects the rule.
fn check_dsr(
    intent: &ServiceIntent,
    port: &PortPlan<'_>,
    targets: &[(IpAddr, u16)],
) -> Result<(), AnnotationError> {
    if intent.mode != NatMode::Dsr {
        return Ok(());
    }
    let Some((ip, target)) = targets.iter().find(|(_, t)| *t != port.view.port) else {
        return Ok(());
    };
    let service_port = port.view.port;
    let reason = if intent.use_pod_network {
        format!(
            "dsr needs every endpoint's target port to equal the service port {service_port}, \
             but endpoint {ip} serves it on {target}: set the port's targetPort to \
             {service_port}"
        )
    } else {
        format!(
            "dsr needs every endpoint's target port to equal the service port {service_port}, \
             but in node endpoint mode loxilb forwards to the NodePort {target}; DSR needs \
             pod-network endpoints (loxilb.io/usepodnetwork: \"yes\") with targetPort == port"
        )
    };
    Err(invalid(ANN_LB_MODE, "dsr", &reason))
}

/// Endpoint weights in endpoint order (ascending address, port): 1 unless selection is
/// priority, where the listed percentages apply first and the rest of 100 is shared equally.
fn weights(intent: &ServiceIntent, n: usize) -> Vec<u8> {
    if intent.selection != EndpointSelection::Priority {
        return vec![1; n];
    }
    let listed = intent.prio_weights.len().min(n);
    let used: u32 = intent.prio_weights[..listed]
        .iter()
        .map(|w| u32::from(*w))
        .sum();
    let rest = n - listed;
    let share = if rest == 0 {
        0
    } else {
        u8::try_from(100u32.saturating_sub(used) / u32::try_from(rest).unwrap_or(u32::MAX))
            .unwrap_or(100)
    };
    let mut out = intent.prio_weights[..listed].to_vec();
    out.resize(n, share);
    out
}

fn source_ranges(ranges: &[String]) -> Result<Vec<IpNet>, PlanError> {
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let net: IpNet = r
            .trim()
            .parse()
            .map_err(|_| PlanError::InvalidSourceRange { value: r.clone() })?;
        out.push(net.trunc());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn secondary_ips(
    service: &ServiceView,
    ports: &[PortPlan<'_>],
    addresses: &[IpAddr],
) -> Result<Vec<IpAddr>, PlanError> {
    let mut ips = service.secondary_ips.clone();
    ips.sort();
    ips.dedup();
    if ips.is_empty() || !ports.iter().any(|p| p.protocol == Protocol::Sctp) {
        return Ok(ips);
    }
    if ips.len() > MAX_SECONDARY_IPS {
        return Err(PlanError::InvalidSecondaryIps {
            ips,
            reason: format!("loxilb allows at most {MAX_SECONDARY_IPS} per rule"),
        });
    }
    let families_served = ips
        .iter()
        .all(|ip| addresses.iter().any(|vip| vip.is_ipv4() == ip.is_ipv4()));
    if !families_served {
        return Err(PlanError::InvalidSecondaryIps {
            ips,
            reason: "a secondary IP must have the family of a VIP (an IPv4 VIP cannot have IPv6 secondary IPs)".into(),
        });
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::{Defaults, parse_intent};
    use crate::model::ProbeType;

    fn intent() -> ServiceIntent {
        ServiceIntent::from_defaults(Defaults::default())
    }

    fn intent_with(pairs: &[(&str, &str)]) -> ServiceIntent {
        let ann = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_intent(&ann, Defaults::default()).unwrap()
    }

    fn node(name: &str, ip: &str) -> NodeView {
        NodeView {
            name: name.into(),
            internal_ip: Some(ip.parse().unwrap()),
            ready: true,
            ..Default::default()
        }
    }

    fn svc() -> ServiceView {
        ServiceView {
            namespace: "default".into(),
            name: "web".into(),
            ports: vec![
                ServicePortView {
                    name: "http".into(),
                    port: 80,
                    protocol: "TCP".into(),
                    node_port: Some(30080),
                },
                ServicePortView {
                    name: "dns".into(),
                    port: 53,
                    protocol: "UDP".into(),
                    node_port: Some(30053),
                },
            ],
            ..Default::default()
        }
    }

    fn ep(ip: &str, node: Option<&str>, ready: bool, ports: &[(&str, u16, &str)]) -> EndpointView {
        EndpointView {
            ip: ip.parse().unwrap(),
            node_name: node.map(str::to_string),
            ready,
            ports: ports
                .iter()
                .map(|(name, port, protocol)| EndpointPortView {
                    name: name.to_string(),
                    port: *port,
                    protocol: protocol.to_string(),
                })
                .collect(),
            networks: BTreeMap::new(),
        }
    }

    fn cluster() -> ClusterId {
        ClusterId::new("c1").unwrap()
    }

    fn vip() -> IpAddr {
        "192.0.2.1".parse().unwrap()
    }

    fn eps(rule: &Rule) -> Vec<String> {
        rule.endpoints
            .iter()
            .map(|e| format!("{}:{}", e.ip, e.target_port))
            .collect()
    }

    #[test]
    fn one_rule_per_port_with_node_endpoints() {
        let mut excluded = node("n3", "10.0.0.3");
        excluded.excluded = true;
        let mut notready = node("n4", "10.0.0.4");
        notready.ready = false;
        let nodes = vec![
            node("n2", "10.0.0.2"),
            node("n1", "10.0.0.1"),
            excluded,
            notready,
        ];
        let plan = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &intent()).unwrap();
        assert_eq!(plan.rules.len(), 2);
        let tcp = &plan.rules[0];
        assert_eq!(tcp.key.port, 80);
        assert_eq!(tcp.key.protocol, Protocol::Tcp);
        assert_eq!(tcp.name, "ccm-c1_default_web_80_tcp:llb-inst0");
        assert_eq!(eps(tcp), ["10.0.0.1:30080", "10.0.0.2:30080"]);
        assert!(tcp.endpoints.iter().all(|e| e.weight == 1));
        assert_eq!(plan.rules[1].key.protocol, Protocol::Udp);
        assert_eq!(plan.rules[1].endpoints[0].target_port, 30053);
        assert_eq!(plan.endpoints_dropped, 0);
    }

    #[test]
    fn errors_are_typed() {
        let v = [vip()];
        assert_eq!(
            plan_rules(&cluster(), &svc(), &[], &[], &v, &intent()),
            Err(PlanError::NoEndpoints)
        );
        let mut s = svc();
        s.ports[0].node_port = None;
        let n = [node("n", "10.0.0.1")];
        assert!(matches!(
            plan_rules(&cluster(), &s, &n, &[], &v, &intent()),
            Err(PlanError::NoNodePort { port: 80, .. })
        ));
        s.ports[0].protocol = "ICMP".into();
        assert!(matches!(
            plan_rules(&cluster(), &s, &n, &[], &v, &intent()),
            Err(PlanError::UnsupportedProtocol { .. })
        ));
        let mut s = svc();
        s.source_ranges = vec!["10.0.0.0/8".into(), "not-a-cidr".into()];
        let e = plan_rules(&cluster(), &s, &n, &[], &v, &intent()).unwrap_err();
        assert_eq!(
            e,
            PlanError::InvalidSourceRange {
                value: "not-a-cidr".into()
            }
        );
        assert_eq!(e.reason(), "InvalidSourceRange");
    }

    #[test]
    fn more_than_32_nodes_are_trimmed() {
        let nodes: Vec<NodeView> = (1..=50)
            .map(|i| node(&format!("n{i}"), &format!("10.0.1.{i}")))
            .collect();
        let plan = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &intent()).unwrap();
        assert_eq!(plan.endpoints_dropped, 18);
        assert!(
            plan.rules
                .iter()
                .all(|r| r.endpoints.len() == MAX_ENDPOINTS)
        );
        // Both ports get the same node subset.
        let ips = |r: &Rule| r.endpoints.iter().map(|e| e.ip).collect::<Vec<_>>();
        assert_eq!(ips(&plan.rules[0]), ips(&plan.rules[1]));
    }

    #[test]
    fn node_label_keeps_matching_nodes_only() {
        let mut edge = node("n2", "10.0.0.2");
        edge.labels.insert("edge".into(), "true".into());
        let mut other = node("n3", "10.0.0.3");
        other.labels.insert("edge".into(), "false".into());
        let nodes = vec![node("n1", "10.0.0.1"), edge, other];
        let i = intent_with(&[("loxilb.io/nodelabel", "edge=true")]);
        let plan = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap();
        assert_eq!(eps(&plan.rules[0]), ["10.0.0.2:30080"]);
        let i = intent_with(&[("loxilb.io/nodelabel", "edge")]);
        let plan = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap();
        assert_eq!(eps(&plan.rules[0]), ["10.0.0.2:30080", "10.0.0.3:30080"]);
        let i = intent_with(&[("loxilb.io/nodelabel", "gpu")]);
        let e = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap_err();
        assert_eq!(
            e,
            PlanError::NoMatchingNodes {
                selector: "gpu".into()
            }
        );
    }

    #[test]
    fn local_traffic_policy_uses_nodes_with_ready_endpoints() {
        let nodes = vec![
            node("n1", "10.0.0.1"),
            node("n2", "10.0.0.2"),
            node("n3", "10.0.0.3"),
        ];
        let endpoints = vec![
            ep("10.244.1.5", Some("n1"), true, &[("http", 8080, "TCP")]),
            ep("10.244.2.5", Some("n2"), false, &[("http", 8080, "TCP")]),
            ep("10.244.9.5", Some("gone"), true, &[("http", 8080, "TCP")]),
        ];
        let mut s = svc();
        s.external_traffic_policy = TrafficPolicy::Local;
        let plan = plan_rules(&cluster(), &s, &nodes, &endpoints, &[vip()], &intent()).unwrap();
        // Still the NodePort: kube-proxy on that node delivers locally.
        assert_eq!(eps(&plan.rules[0]), ["10.0.0.1:30080"]);
        assert_eq!(eps(&plan.rules[1]), ["10.0.0.1:30053"]);
        // Cluster policy ignores endpoints.
        let plan = plan_rules(&cluster(), &svc(), &nodes, &endpoints, &[vip()], &intent());
        assert_eq!(plan.unwrap().rules[0].endpoints.len(), 3);
        let none_ready = [ep(
            "10.244.2.5",
            Some("n2"),
            false,
            &[("http", 8080, "TCP")],
        )];
        assert_eq!(
            plan_rules(&cluster(), &s, &nodes, &none_ready, &[vip()], &intent()),
            Err(PlanError::NoLocalEndpoints)
        );
    }

    #[test]
    fn pod_network_uses_ready_endpoints_and_their_target_ports() {
        let endpoints = vec![
            ep(
                "10.244.1.5",
                Some("n1"),
                true,
                &[("http", 8080, "TCP"), ("dns", 5353, "UDP")],
            ),
            // A named targetPort may resolve differently per pod.
            ep("10.244.2.7", Some("n2"), true, &[("http", 9090, "TCP")]),
            ep("10.244.3.9", Some("n3"), false, &[("http", 8080, "TCP")]),
            // Same name, other protocol: not this port.
            ep("10.244.4.1", None, true, &[("http", 8080, "UDP")]),
        ];
        let i = intent_with(&[("loxilb.io/usepodnetwork", "yes")]);
        let mut s = svc();
        // NodePorts are not needed in pod-network mode.
        s.ports[0].node_port = None;
        let plan = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        assert_eq!(eps(&plan.rules[0]), ["10.244.1.5:8080", "10.244.2.7:9090"]);
        assert_eq!(eps(&plan.rules[1]), ["10.244.1.5:5353"]);

        // The global default selects the mode too.
        let d = Defaults {
            use_pod_network: true,
            ..Defaults::default()
        };
        let by_default = ServiceIntent::from_defaults(d);
        let plan2 = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &by_default).unwrap();
        assert_eq!(plan2.rules, plan.rules);

        let only_http = &endpoints[1..2];
        assert_eq!(
            plan_rules(&cluster(), &s, &[], only_http, &[vip()], &i),
            Err(PlanError::NoReadyEndpoints {
                port: 53,
                protocol: "UDP".into()
            })
        );
    }

    #[test]
    fn selectorless_service_with_unnamed_port_and_manual_slice() {
        let s = ServiceView {
            namespace: "ext".into(),
            name: "db".into(),
            ports: vec![ServicePortView {
                name: String::new(),
                port: 5432,
                protocol: "TCP".into(),
                node_port: Some(31432),
            }],
            ..Default::default()
        };
        // Hand-made slice: no node names, protocol left empty (TCP).
        let endpoints = vec![
            ep("198.51.100.10", None, true, &[("", 5432, "")]),
            ep("198.51.100.11", None, true, &[("", 5432, "")]),
        ];
        let i = intent_with(&[("loxilb.io/usepodnetwork", "yes")]);
        let plan = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        assert_eq!(
            eps(&plan.rules[0]),
            ["198.51.100.10:5432", "198.51.100.11:5432"]
        );
    }

    #[test]
    fn multus_addresses_replace_pod_ips() {
        let mut a = ep("10.244.1.5", Some("n1"), true, &[("http", 8080, "TCP")]);
        a.networks.insert(
            "default/macvlan1".into(),
            vec!["172.16.0.5".parse().unwrap()],
        );
        a.networks
            .insert("other/net".into(), vec!["172.17.0.5".parse().unwrap()]);
        let mut b = ep("10.244.2.5", Some("n2"), true, &[("http", 8080, "TCP")]);
        b.networks.insert(
            "default/macvlan1".into(),
            vec![
                "172.16.0.6".parse().unwrap(),
                "2001:db8::6".parse().unwrap(),
            ],
        );
        // No address on the network: not an endpoint.
        let c = ep("10.244.3.5", Some("n3"), true, &[("http", 8080, "TCP")]);
        let mut s = svc();
        s.ports.truncate(1);
        // `macvlan1` means the network in the Service's namespace.
        let i = intent_with(&[("loxilb.io/multus-nets", "macvlan1")]);
        assert!(i.use_pod_network);
        let endpoints = [a, b, c];
        let plan = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        // The IPv6 address cannot serve an IPv4 VIP.
        assert_eq!(eps(&plan.rules[0]), ["172.16.0.5:8080", "172.16.0.6:8080"]);
        let i = intent_with(&[("loxilb.io/multus-nets", "default/macvlan1,other/net")]);
        let plan = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        assert_eq!(
            eps(&plan.rules[0]),
            ["172.16.0.5:8080", "172.16.0.6:8080", "172.17.0.5:8080"]
        );
    }

    #[test]
    fn more_than_32_pods_are_trimmed() {
        let endpoints: Vec<EndpointView> = (1..=40)
            .map(|i| {
                ep(
                    &format!("10.244.0.{i}"),
                    None,
                    true,
                    &[("http", 8080, "TCP")],
                )
            })
            .collect();
        let mut s = svc();
        s.ports.truncate(1);
        let i = intent_with(&[("loxilb.io/usepodnetwork", "yes")]);
        let plan = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        assert_eq!(plan.endpoints_dropped, 8);
        assert_eq!(plan.rules[0].endpoints.len(), MAX_ENDPOINTS);
        let again = plan_rules(&cluster(), &s, &[], &endpoints, &[vip()], &i).unwrap();
        assert_eq!(again, plan);
    }

    #[test]
    fn dsr_needs_target_port_equal_to_port() {
        let dsr = [("loxilb.io/lbmode", "dsr"), ("loxilb.io/epselect", "hash")];
        let i = intent_with(&dsr);
        let nodes = [node("n1", "10.0.0.1")];
        let e = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap_err();
        let PlanError::Annotation(a) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (a.annotation, a.value.as_str()),
            ("loxilb.io/lbmode", "dsr")
        );
        assert!(a.reason.contains("NodePort 30080"), "{a}");
        assert!(a.reason.contains("usepodnetwork"), "{a}");
        assert_eq!(e.reason(), "InvalidAnnotation");

        let mut pod = dsr.to_vec();
        pod.push(("loxilb.io/usepodnetwork", "yes"));
        let i = intent_with(&pod);
        let mut s = svc();
        s.ports.truncate(1);
        let good = [ep("10.244.1.5", None, true, &[("http", 80, "TCP")])];
        let plan = plan_rules(&cluster(), &s, &[], &good, &[vip()], &i).unwrap();
        assert_eq!(plan.rules[0].mode, NatMode::Dsr);
        assert_eq!(plan.rules[0].selection, EndpointSelection::Hash);
        let bad = [ep("10.244.1.5", None, true, &[("http", 8080, "TCP")])];
        let e = plan_rules(&cluster(), &s, &[], &bad, &[vip()], &i).unwrap_err();
        assert!(e.to_string().contains("targetPort"), "{e}");
    }

    #[test]
    fn priority_weights_follow_endpoint_order() {
        let nodes = [
            node("n3", "10.0.0.3"),
            node("n1", "10.0.0.1"),
            node("n2", "10.0.0.2"),
            node("n4", "10.0.0.4"),
        ];
        let weights = |pairs: &[(&str, &str)]| {
            let plan = plan_rules(
                &cluster(),
                &svc(),
                &nodes,
                &[],
                &[vip()],
                &intent_with(pairs),
            )
            .unwrap();
            assert_eq!(plan.rules[0].selection, EndpointSelection::Priority);
            plan.rules[0]
                .endpoints
                .iter()
                .map(|e| e.weight)
                .collect::<Vec<_>>()
        };
        let prio = ("loxilb.io/epselect", "prio");
        assert_eq!(
            weights(&[prio, ("loxilb.io/prio-weights", "50,30,20")]),
            [50, 30, 20, 0]
        );
        assert_eq!(
            weights(&[prio, ("loxilb.io/prio-weights", "40")]),
            [40, 20, 20, 20]
        );
        assert_eq!(weights(&[prio]), [25, 25, 25, 25]);
        assert_eq!(
            weights(&[prio, ("loxilb.io/prio-weights", "10,10,10,10,10,10")]),
            [10, 10, 10, 10]
        );
    }

    #[test]
    fn annotation_options_flow_into_rules() {
        let i = intent_with(&[
            ("loxilb.io/probetype", "tcp"),
            ("loxilb.io/probeport", "30080"),
            ("loxilb.io/probereq", "ping"),
            ("loxilb.io/probetimeout", "10"),
            ("loxilb.io/proberetries", "3"),
            ("loxilb.io/timeout", "600"),
            ("loxilb.io/lbmode", "fullnat"),
            ("loxilb.io/prefLocalPod", "yes"),
        ]);
        let mut s = svc();
        s.ports[1].protocol = "SCTP".into();
        s.source_ranges = vec!["10.1.2.3/8".into(), " 192.168.0.0/16".into()];
        s.secondary_ips = vec!["192.0.2.30".parse().unwrap(), "192.0.2.20".parse().unwrap()];
        let nodes = [node("n1", "10.0.0.1")];
        let plan = plan_rules(&cluster(), &s, &nodes, &[], &[vip()], &i).unwrap();
        let tcp = &plan.rules[0];
        assert_eq!(tcp.mode, NatMode::FullNat);
        assert!(tcp.monitor);
        assert_eq!(tcp.probe.kind, ProbeType::Tcp);
        assert_eq!(tcp.probe.port, 30080);
        assert_eq!(tcp.probe.request, "ping");
        assert_eq!((tcp.probe.timeout, tcp.probe.retries), (10, 3));
        assert_eq!(tcp.inactive_timeout, 600);
        let srcs: Vec<String> = tcp.allowed_sources.iter().map(|n| n.to_string()).collect();
        assert_eq!(srcs, ["10.0.0.0/8", "192.168.0.0/16"]);
        assert!(tcp.secondary_ips.is_empty(), "only sctp rules get them");
        let sctp = &plan.rules[1];
        assert_eq!(sctp.key.protocol, Protocol::Sctp);
        let sec: Vec<String> = sctp.secondary_ips.iter().map(|i| i.to_string()).collect();
        assert_eq!(sec, ["192.0.2.20", "192.0.2.30"]);
        assert_eq!(sctp.allowed_sources, tcp.allowed_sources);
        // prefLocalPod is recorded but changes nothing in the plan.
        let mut without = i.clone();
        without.prefer_local_pod = false;
        assert_eq!(
            plan_rules(&cluster(), &s, &nodes, &[], &[vip()], &without).unwrap(),
            plan
        );
    }

    #[test]
    fn secondary_ip_limits() {
        let mut s = svc();
        s.ports[1].protocol = "SCTP".into();
        let nodes = [node("n1", "10.0.0.1")];
        s.secondary_ips = (1..=4)
            .map(|i| format!("192.0.2.{i}").parse().unwrap())
            .collect();
        let e = plan_rules(&cluster(), &s, &nodes, &[], &[vip()], &intent()).unwrap_err();
        assert_eq!(e.reason(), "InvalidSecondaryIPs");
        s.secondary_ips = vec!["2001:db8::1".parse().unwrap()];
        let e = plan_rules(&cluster(), &s, &nodes, &[], &[vip()], &intent()).unwrap_err();
        assert!(e.to_string().contains("IPv6"), "{e}");
        // No SCTP port: nothing to check, nothing used.
        let plan = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &intent()).unwrap();
        assert!(plan.rules.iter().all(|r| r.secondary_ips.is_empty()));
    }

    #[test]
    fn service_level_annotation_checks_surface_as_plan_errors() {
        let nodes = [node("n1", "10.0.0.1")];
        let i = intent_with(&[("loxilb.io/useproxyprotov2", "yes")]);
        let e = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap_err();
        let PlanError::Annotation(a) = e else {
            panic!()
        };
        assert_eq!(a.annotation, "loxilb.io/useproxyprotov2");
        let mut tcp_only = svc();
        tcp_only.ports.truncate(1);
        let plan = plan_rules(&cluster(), &tcp_only, &nodes, &[], &[vip()], &i).unwrap();
        assert!(plan.rules[0].proxy_protocol_v2);
        let i = intent_with(&[("loxilb.io/lbmode", "hostonearm")]);
        let e = plan_rules(&cluster(), &svc(), &nodes, &[], &[vip()], &i).unwrap_err();
        assert_eq!(e.reason(), "InvalidAnnotation");
    }
}
