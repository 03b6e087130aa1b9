//! The planner: one Service + the cluster's nodes + its addresses -> the rules loxilb should
//! hold for it. Pure: the same inputs always give the same rules.

use std::net::IpAddr;

use thiserror::Error;

use crate::intent::ServiceIntent;
use crate::model::{Endpoint, Protocol, Rule, RuleKey};
use crate::naming::{ClusterId, RuleName};
use crate::selection::stable_subset;

/// loxilb's limit of endpoints per rule (CONTRACT.md §5).
pub const MAX_ENDPOINTS: usize = 32;

/// One port of a Service, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortView {
    pub name: String,
    pub port: u16,
    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub protocol: String,
    pub node_port: Option<u16>,
}

/// A Service, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceView {
    pub namespace: String,
    pub name: String,
    pub ports: Vec<ServicePortView>,
}

/// A Node, as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

impl NodeView {
    fn eligible(&self) -> bool {
        !self.excluded && !self.deleting && self.ready
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("port {port}/{protocol} uses a protocol loxilb cannot balance")]
    UnsupportedProtocol { port: u16, protocol: String },
    #[error("port {port}/{protocol} has no NodePort to forward to")]
    NoNodePort { port: u16, protocol: String },
    #[error("no eligible node with an InternalIP to use as endpoint")]
    NoEndpoints,
}

impl PlanError {
    /// Stable category for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PlanError::UnsupportedProtocol { .. } => "UnsupportedProtocol",
            PlanError::NoNodePort { .. } => "NoNodePort",
            PlanError::NoEndpoints => "NoEndpoints",
        }
    }
}

/// The result of planning one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub rules: Vec<Rule>,
    /// Candidates left out because of loxilb's per-rule endpoint limit.
    pub endpoints_dropped: usize,
}

/// Plans one rule per address × port (default mode: node InternalIPs + NodePort).
pub fn plan_rules(
    cluster: &ClusterId,
    service: &ServiceView,
    nodes: &[NodeView],
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
        let node_port = p.node_port.ok_or_else(|| PlanError::NoNodePort {
            port: p.port,
            protocol: p.protocol.clone(),
        })?;
        ports.push((p.port, protocol, node_port));
    }

    let mut rules = Vec::with_capacity(addresses.len() * ports.len());
    let mut endpoints_dropped = 0;
    for vip in addresses {
        // An IPv4 VIP cannot forward to IPv6 endpoints (loxilb rejects nat46).
        let mut candidates: Vec<IpAddr> = nodes
            .iter()
            .filter(|n| n.eligible())
            .filter_map(|n| n.internal_ip)
            .filter(|ip| !(vip.is_ipv4() && ip.is_ipv6()))
            .collect();
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Err(PlanError::NoEndpoints);
        }
        let identity = format!("{}/{}", service.namespace, service.name);
        let chosen = stable_subset(&identity, &candidates, MAX_ENDPOINTS);
        endpoints_dropped = endpoints_dropped.max(candidates.len() - chosen.len());
        for (port, protocol, node_port) in &ports {
            let endpoints = chosen
                .iter()
                .map(|ip| Endpoint {
                    ip: *ip,
                    target_port: *node_port,
                    weight: 1,
                })
                .collect();
            rules.push(
                Rule {
                    key: RuleKey {
                        ip: *vip,
                        port: *port,
                        protocol: *protocol,
                    },
                    name: RuleName::new(
                        cluster,
                        &service.namespace,
                        &service.name,
                        *port,
                        *protocol,
                    )
                    .to_string(),
                    mode: intent.mode,
                    selection: intent.selection,
                    endpoints,
                    monitor: intent.monitor,
                    managed: true,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EndpointSelection, NatMode};

    fn intent() -> ServiceIntent {
        ServiceIntent {
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            monitor: false,
        }
    }

    fn node(name: &str, ip: &str) -> NodeView {
        NodeView {
            name: name.into(),
            internal_ip: Some(ip.parse().unwrap()),
            excluded: false,
            deleting: false,
            ready: true,
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
        }
    }

    #[test]
    fn one_rule_per_port_with_node_endpoints() {
        let cluster = ClusterId::new("c1").unwrap();
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
        let vip: IpAddr = "192.0.2.1".parse().unwrap();
        let plan = plan_rules(&cluster, &svc(), &nodes, &[vip], &intent()).unwrap();
        assert_eq!(plan.rules.len(), 2);
        let tcp = &plan.rules[0];
        assert_eq!(tcp.key.port, 80);
        assert_eq!(tcp.key.protocol, Protocol::Tcp);
        assert_eq!(tcp.name, "ccm-c1_default_web_80_tcp:llb-inst0");
        let eps: Vec<String> = tcp
            .endpoints
            .iter()
            .map(|e| format!("{}:{}", e.ip, e.target_port))
            .collect();
        assert_eq!(eps, ["10.0.0.1:30080", "10.0.0.2:30080"]);
        assert_eq!(plan.rules[1].key.protocol, Protocol::Udp);
        assert_eq!(plan.rules[1].endpoints[0].target_port, 30053);
    }

    #[test]
    fn errors_are_typed() {
        let cluster = ClusterId::new("c1").unwrap();
        let vip: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!(
            plan_rules(&cluster, &svc(), &[], &[vip], &intent()),
            Err(PlanError::NoEndpoints)
        );
        let mut s = svc();
        s.ports[0].node_port = None;
        assert!(matches!(
            plan_rules(&cluster, &s, &[node("n", "10.0.0.1")], &[vip], &intent()),
            Err(PlanError::NoNodePort { port: 80, .. })
        ));
        s.ports[0].protocol = "ICMP".into();
        assert!(matches!(
            plan_rules(&cluster, &s, &[node("n", "10.0.0.1")], &[vip], &intent()),
            Err(PlanError::UnsupportedProtocol { .. })
        ));
    }

    #[test]
    fn more_than_32_nodes_are_trimmed() {
        let cluster = ClusterId::new("c1").unwrap();
        let nodes: Vec<NodeView> = (1..=50)
            .map(|i| node(&format!("n{i}"), &format!("10.0.1.{i}")))
            .collect();
        let vip: IpAddr = "192.0.2.1".parse().unwrap();
        let plan = plan_rules(&cluster, &svc(), &nodes, &[vip], &intent()).unwrap();
        assert_eq!(plan.endpoints_dropped, 18);
        assert!(
            plan.rules
                .iter()
                .all(|r| r.endpoints.len() == MAX_ENDPOINTS)
        );
    }
}
