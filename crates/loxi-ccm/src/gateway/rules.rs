//! A Gateway's loxilb rules: one per address and usable listener that has ready endpoints,
//! named like a Service's rules under the Gateway's own rule-owner id (`mod.rs`), with the
//! same stable 32-endpoint subset as Services (`loxi_domain::plan::MAX_ENDPOINTS`). Pure.

use std::net::IpAddr;

use loxi_domain::model::{Endpoint, RuleKey};
use loxi_domain::plan::MAX_ENDPOINTS;
use loxi_domain::selection::stable_subset_endpoints;
use loxi_domain::{ClusterId, NatMode, Protocol, Rule, RuleName};

/// A listener with the endpoints of every backend attached to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerEndpoints {
    pub port: u16,
    pub protocol: Protocol,
    /// (pod address, target port), any family: each address takes those of its own.
    pub endpoints: Vec<(IpAddr, u16)>,
}

/// How the Gateway's rules are written (the operator's defaults, as for Services).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleStyle {
    pub mode: NatMode,
    /// BGP is on: the rules advertise their address.
    pub advertise: bool,
}

/// The rules of the Gateway `namespace/name` on `addresses`.
pub fn gateway_rules(
    owner: &ClusterId,
    namespace: &str,
    name: &str,
    addresses: &[IpAddr],
    listeners: &[ListenerEndpoints],
    style: RuleStyle,
) -> Vec<Rule> {
    let mut rules = Vec::new();
    for vip in addresses {
        for l in listeners {
            let candidates: Vec<(IpAddr, u16)> = {
                let mut c: Vec<(IpAddr, u16)> = l
                    .endpoints
                    .iter()
                    .copied()
                    .filter(|(ip, _)| ip.is_ipv4() == vip.is_ipv4())
                    .collect();
                c.sort();
                c.dedup();
                c
            };
            if candidates.is_empty() {
                continue;
            }
            let identity = format!("{namespace}/{name}/{vip}/{}/{}", l.port, l.protocol);
            let chosen = stable_subset_endpoints(&identity, &candidates, MAX_ENDPOINTS);
            let rule = Rule {
                key: RuleKey {
                    ip: *vip,
                    port: l.port,
                    protocol: l.protocol,
                },
                name: RuleName::new(owner, namespace, name, l.port, l.protocol).to_string(),
                mode: style.mode,
                selection: Default::default(),
                endpoints: chosen
                    .into_iter()
                    .map(|(ip, target_port)| Endpoint {
                        ip,
                        target_port,
                        weight: 1,
                    })
                    .collect(),
                monitor: false,
                managed: true,
                probe: Default::default(),
                inactive_timeout: 0,
                proxy_protocol_v2: false,
                allowed_sources: Vec::new(),
                secondary_ips: Vec::new(),
                bgp: style.advertise,
                // --privateCIDR is for Services (elastic-IP HA of a Service's address).
                private_ip: None,
                egress: false,
            };
            rules.push(rule.normalized());
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_rule_per_address_and_listener_with_endpoints_of_its_family() {
        let owner = ClusterId::new("abc").unwrap();
        let listeners = vec![
            ListenerEndpoints {
                port: 80,
                protocol: Protocol::Tcp,
                endpoints: vec![
                    (ip("10.0.0.2"), 8080),
                    (ip("10.0.0.1"), 8080),
                    (ip("fd00::1"), 8080),
                ],
            },
            ListenerEndpoints {
                port: 53,
                protocol: Protocol::Udp,
                endpoints: vec![(ip("10.0.0.3"), 5353)],
            },
            // No endpoints: no rule.
            ListenerEndpoints {
                port: 81,
                protocol: Protocol::Tcp,
                endpoints: vec![],
            },
        ];
        let rules = gateway_rules(
            &owner,
            "ns",
            "gw",
            &[ip("192.0.2.1")],
            &listeners,
            RuleStyle::default(),
        );
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].key.port, 80);
        let eps: Vec<IpAddr> = rules[0].endpoints.iter().map(|e| e.ip).collect();
        assert_eq!(eps, vec![ip("10.0.0.1"), ip("10.0.0.2")]);
        assert_eq!(rules[1].key.protocol, Protocol::Udp);
        assert_eq!(rules[1].endpoints[0].target_port, 5353);
        let name = RuleName::parse(&rules[0].name).unwrap();
        assert_eq!(
            (
                name.cluster.as_str(),
                name.namespace.as_str(),
                name.service.as_str()
            ),
            ("abc", "ns", "gw")
        );
    }

    #[test]
    fn at_most_the_endpoint_limit_stably() {
        let owner = ClusterId::new("abc").unwrap();
        let many: Vec<(IpAddr, u16)> = (1..=60u8)
            .map(|i| (IpAddr::from([10, 0, 1, i]), 80))
            .collect();
        let mut reversed = many.clone();
        reversed.reverse();
        let rules_of = |endpoints: Vec<(IpAddr, u16)>| {
            gateway_rules(
                &owner,
                "ns",
                "gw",
                &[ip("192.0.2.1")],
                &[ListenerEndpoints {
                    port: 80,
                    protocol: Protocol::Tcp,
                    endpoints,
                }],
                RuleStyle::default(),
            )
        };
        let a = rules_of(many);
        assert_eq!(a[0].endpoints.len(), MAX_ENDPOINTS);
        assert_eq!(a, rules_of(reversed));
    }
}
