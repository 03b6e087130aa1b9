//! Between the domain's [`Rule`] and the wire's [`LoadbalanceEntry`].

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};

use crate::dto::{EndpointEntry, LoadbalanceEntry, ServiceArguments};

/// The complete POST body for a desired rule (`oper` 0: add/replace, CONTRACT.md §2.5).
pub fn to_entry(rule: &Rule) -> LoadbalanceEntry {
    LoadbalanceEntry {
        service_arguments: ServiceArguments {
            external_ip: rule.key.ip.to_string(),
            port: rule.key.port,
            protocol: rule.key.protocol.as_loxilb().to_string(),
            sel: rule.selection.wire(),
            mode: rule.mode.wire(),
            monitor: rule.monitor,
            managed: rule.managed,
            name: rule.name.clone(),
            ..Default::default()
        },
        endpoints: rule
            .endpoints
            .iter()
            .map(|e| EndpointEntry {
                endpoint_ip: e.ip.to_string(),
                target_port: e.target_port,
                weight: e.weight,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Reads a listed rule back into the domain model. `None` for rules loxi-ccm never creates
/// (host rules, port ranges, icmp, non-zero `block`, unparseable addresses): those can never
/// be ours, so the diff need not see them.
pub fn from_entry(entry: &LoadbalanceEntry) -> Option<Rule> {
    let sa = &entry.service_arguments;
    if !sa.host.is_empty() || sa.block != 0 || (sa.port_max != 0 && sa.port_max != sa.port) {
        return None;
    }
    let endpoints = entry
        .endpoints
        .iter()
        .map(|e| {
            Some(Endpoint {
                ip: e.endpoint_ip.parse().ok()?,
                target_port: e.target_port,
                weight: e.weight,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(
        Rule {
            key: RuleKey {
                ip: sa.external_ip.parse().ok()?,
                port: sa.port,
                protocol: Protocol::parse(&sa.protocol)?,
            },
            name: sa.name.clone(),
            mode: NatMode::from_wire(sa.mode)?,
            selection: EndpointSelection::from_wire(sa.sel)?,
            endpoints,
            monitor: sa.monitor,
            managed: sa.managed,
        }
        .normalized(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let rule = Rule {
            key: RuleKey {
                ip: "192.0.2.7".parse().unwrap(),
                port: 53,
                protocol: Protocol::Udp,
            },
            name: "ccm-x_ns_svc_53_udp:llb-inst0".into(),
            mode: NatMode::FullNat,
            selection: EndpointSelection::Hash,
            endpoints: vec![Endpoint {
                ip: "10.0.0.1".parse().unwrap(),
                target_port: 30053,
                weight: 1,
            }],
            monitor: true,
            managed: true,
        };
        assert_eq!(from_entry(&to_entry(&rule)), Some(rule));
    }

    #[test]
    fn foreign_shapes_are_skipped() {
        let mut e = LoadbalanceEntry::default();
        e.service_arguments.external_ip = "192.0.2.1".into();
        e.service_arguments.protocol = "icmp".into();
        assert_eq!(from_entry(&e), None);
        e.service_arguments.protocol = "tcp".into();
        e.service_arguments.host = "example.com".into();
        assert_eq!(from_entry(&e), None);
    }
}
