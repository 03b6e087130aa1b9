//! Between the domain's [`Rule`] and the wire's [`LoadbalanceEntry`].
//!
//! `to_entry` sends everything a rule holds. `from_entry` reads what a listing shows, which
//! is less (docs/loxilb-api.md#listing-rules): never the probe request/response/timeout/
//! retries (read as empty/0), and the effective `inactiveTimeOut`/`monitor`. loxilb's default
//! `inactiveTimeOut` reads back as 0 ("loxilb's default", as it was most likely sent), so a
//! rule POSTed with 0 reads back equal. The diff compares [`Rule::observable`] forms, which
//! account for the rest.

use loxi_domain::model::{Probe, ProbeType, default_inactive_timeout};
use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};

use crate::dto::{AllowedSource, EndpointEntry, LoadbalanceEntry, SecondaryIp, ServiceArguments};

/// The complete POST body for a desired rule (`oper` 0: add/replace, docs/loxilb-api.md#updates).
pub fn to_entry(rule: &Rule) -> LoadbalanceEntry {
    LoadbalanceEntry {
        service_arguments: ServiceArguments {
            external_ip: ip_text(&rule.key.ip),
            port: rule.key.port,
            protocol: rule.key.protocol.as_loxilb().to_string(),
            sel: rule.selection.wire(),
            mode: rule.mode.wire(),
            monitor: rule.monitor,
            managed: rule.managed,
            name: rule.name.clone(),
            probetype: rule.probe.kind.as_loxilb().to_string(),
            probeport: rule.probe.port,
            probereq: rule.probe.request.clone(),
            proberesp: rule.probe.response.clone(),
            probe_timeout: rule.probe.timeout,
            probe_retries: i32::try_from(rule.probe.retries).unwrap_or(i32::MAX),
            inactive_timeout: rule.inactive_timeout,
            proxyprotocolv2: rule.proxy_protocol_v2,
            egress: rule.egress,
            bgp: rule.bgp,
            private_ip: rule.private_ip.as_ref().map(ip_text).unwrap_or_default(),
            ..Default::default()
        },
        endpoints: rule
            .endpoints
            .iter()
            .map(|e| EndpointEntry {
                endpoint_ip: ip_text(&e.ip),
                target_port: e.target_port,
                weight: e.weight,
                ..Default::default()
            })
            .collect(),
        secondary_ips: rule
            .secondary_ips
            .iter()
            .map(|ip| SecondaryIp {
                secondary_ip: ip.to_string(),
            })
            .collect(),
        allowed_sources: rule
            .allowed_sources
            .iter()
            .map(|net| AllowedSource {
                prefix: net.to_string(),
            })
            .collect(),
    }
}

/// The text of an address, as `IpAddr`'s `Display` writes it. IPv4 addresses are written
/// digit by digit: a Node change re-sends every rule that forwards to that Node, each with up
/// to 32 endpoint addresses, and the standard formatter (padding, width checks, a write per
/// piece) cost about a tenth of the controller's CPU in that path (callgrind,
/// docs/BENCHMARKS.md).
pub fn ip_text(ip: &std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut text = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text.push('.');
                }
                if octet >= 100 {
                    text.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    text.push(char::from(b'0' + octet / 10 % 10));
                }
                text.push(char::from(b'0' + octet % 10));
            }
            text
        }
        std::net::IpAddr::V6(v6) => v6.to_string(),
    }
}

/// Reads a listed rule back into the domain model. `None` for rules loxi-ccm never creates
/// (host rules, port ranges, icmp, non-zero `block`, unparseable addresses or prefixes,
/// unknown probe types): those can never be ours, so the diff need not see them.
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
    let secondary_ips = entry
        .secondary_ips
        .iter()
        .map(|s| s.secondary_ip.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    let protocol = Protocol::parse(&sa.protocol)?;
    let allowed_sources = entry
        .allowed_sources
        .iter()
        .map(|s| s.prefix.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    Some(
        Rule {
            key: RuleKey {
                ip: sa.external_ip.parse().ok()?,
                port: sa.port,
                protocol,
            },
            name: sa.name.clone(),
            mode: NatMode::from_wire(sa.mode)?,
            selection: EndpointSelection::from_wire(sa.sel)?,
            endpoints,
            monitor: sa.monitor,
            managed: sa.managed,
            probe: Probe {
                kind: ProbeType::from_loxilb(&sa.probetype)?,
                port: sa.probeport,
                // Never listed; whatever a listing carries is read as given.
                request: sa.probereq.clone(),
                response: sa.proberesp.clone(),
                timeout: sa.probe_timeout,
                retries: u32::try_from(sa.probe_retries).unwrap_or(0),
            },
            inactive_timeout: if sa.inactive_timeout == default_inactive_timeout(protocol) {
                0
            } else {
                sa.inactive_timeout
            },
            proxy_protocol_v2: sa.proxyprotocolv2,
            egress: sa.egress,
            allowed_sources,
            secondary_ips,
            bgp: sa.bgp,
            // Never listed (docs/loxilb-api.md#listing-rules); read when present.
            private_ip: sa.private_ip.parse().ok(),
        }
        .normalized(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_writes_what_display_writes() {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        for a in [0u8, 1, 9, 10, 99, 100, 101, 199, 200, 255] {
            for b in [0u8, 7, 10, 100, 255] {
                let ip = IpAddr::V4(Ipv4Addr::new(a, b, 255 - a, a / 3));
                assert_eq!(ip_text(&ip), ip.to_string());
            }
        }
        for ip in [
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            "2001:db8::1".parse().unwrap(),
            "::ffff:10.0.0.1".parse().unwrap(),
        ] {
            assert_eq!(ip_text(&ip), ip.to_string());
        }
    }
    use loxi_domain::{Action, diff_rules};

    fn full_rule() -> Rule {
        Rule {
            key: RuleKey {
                ip: "192.0.2.7".parse().unwrap(),
                port: 38412,
                protocol: Protocol::Sctp,
            },
            name: "ccm-x_ns_svc_38412_sctp:llb-inst0".into(),
            mode: NatMode::FullNat,
            selection: EndpointSelection::Priority,
            endpoints: vec![
                Endpoint {
                    ip: "10.0.0.1".parse().unwrap(),
                    target_port: 38412,
                    weight: 70,
                },
                Endpoint {
                    ip: "10.0.0.2".parse().unwrap(),
                    target_port: 38412,
                    weight: 30,
                },
            ],
            monitor: true,
            managed: true,
            probe: Probe {
                kind: ProbeType::Sctp,
                port: 38412,
                request: "req".into(),
                response: "resp".into(),
                timeout: 10,
                retries: 3,
            },
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: vec!["10.0.0.0/8".parse().unwrap()],
            secondary_ips: vec!["192.0.2.20".parse().unwrap(), "192.0.2.30".parse().unwrap()],
            bgp: true,
            private_ip: Some("10.10.0.1".parse().unwrap()),
        }
    }

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
            probe: Probe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: vec![],
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
        };
        assert_eq!(from_entry(&to_entry(&rule)), Some(rule));
        let full = full_rule();
        assert_eq!(from_entry(&to_entry(&full)), Some(full.clone()));
        let mut explicit = full;
        explicit.inactive_timeout = 600;
        assert_eq!(from_entry(&to_entry(&explicit)), Some(explicit));
    }

    #[test]
    fn every_field_goes_on_the_wire() {
        let mut rule = full_rule();
        rule.inactive_timeout = 600;
        let e = to_entry(&rule);
        let sa = &e.service_arguments;
        assert_eq!(sa.sel, 2);
        assert_eq!(sa.mode, 2);
        assert_eq!(sa.probetype, "sctp");
        assert_eq!(sa.probeport, 38412);
        assert_eq!(
            (sa.probereq.as_str(), sa.proberesp.as_str()),
            ("req", "resp")
        );
        assert_eq!((sa.probe_timeout, sa.probe_retries), (10, 3));
        assert_eq!(sa.inactive_timeout, 600);
        assert!(sa.monitor && sa.managed && !sa.proxyprotocolv2);
        assert_eq!(e.endpoints[0].weight, 70);
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v["secondaryIPs"],
            serde_json::json!([{"secondaryIP": "192.0.2.20"}, {"secondaryIP": "192.0.2.30"}])
        );
        assert_eq!(
            v["allowedSources"],
            serde_json::json!([{"prefix": "10.0.0.0/8"}])
        );
        assert_eq!(v["serviceArguments"]["privateIP"], "10.10.0.1");
        // The default probe type is not sent at all, nor an absent private address.
        let mut plain = full_rule();
        plain.probe = Probe::default();
        plain.private_ip = None;
        let v = serde_json::to_value(to_entry(&plain)).unwrap();
        assert!(v["serviceArguments"].get("probetype").is_none());
        assert!(v["serviceArguments"].get("privateIP").is_none());
        assert_eq!(v["serviceArguments"]["probeport"], 0);
    }

    #[test]
    fn listing_of_a_posted_rule_needs_no_action() {
        // As loxilb lists `full_rule()` after it was POSTed (docs/loxilb-api.md#listing-rules):
        // no write-only probe fields, effective inactiveTimeOut, endpoints and secondaries sorted.
        let body = r#"{"serviceArguments":{"externalIP":"192.0.2.7","port":38412,
            "protocol":"sctp","sel":2,"mode":2,"monitor":true,"managed":true,
            "inactiveTimeOut":240,"probetype":"sctp","probeport":38412,
            "name":"ccm-x_ns_svc_38412_sctp:llb-inst0","bgp":true},
          "endpoints":[{"endpointIP":"10.0.0.2","targetPort":38412,"weight":30,"state":"active"},
                       {"endpointIP":"10.0.0.1","targetPort":38412,"weight":70,"state":"active"}],
          "secondaryIPs":[{"secondaryIP":"192.0.2.30"},{"secondaryIP":"192.0.2.20"}],
          "allowedSources":[{"prefix":"10.0.0.0/8"}]}"#;
        let entry: LoadbalanceEntry = serde_json::from_str(body).unwrap();
        let listed = from_entry(&entry).unwrap();
        assert_eq!(listed.inactive_timeout, 0, "loxilb's default reads as 0");
        assert_eq!(listed.observable().inactive_timeout, 240);
        assert!(listed.probe.request.is_empty());
        let owned = |_: &Rule| true;
        assert!(diff_rules(&[full_rule()], std::slice::from_ref(&listed), owned).is_empty());
        // A real difference in a listed field is still seen.
        let mut moved = full_rule();
        moved.endpoints[1].weight = 20;
        assert!(matches!(
            diff_rules(&[moved], &[listed], owned)[..],
            [Action::Update(_)]
        ));
    }

    /// Applies a diff the way the controller does (`crates/loxi-ccm/src/loxilb`): POST, or DELETE then POST.
    async fn apply(client: &crate::LoxilbClient, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Create(r) | Action::Update(r) => {
                    client.apply_rule(&to_entry(&r)).await.unwrap();
                }
                Action::Recreate(r) => {
                    let k = r.key;
                    let ip = k.ip.to_string();
                    client
                        .delete_rule(&ip, k.port, k.protocol.as_loxilb(), false)
                        .await
                        .unwrap();
                    client.apply_rule(&to_entry(&r)).await.unwrap();
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn listed(client: &crate::LoxilbClient) -> Vec<Rule> {
        let entries = client.list_rules().await.unwrap();
        entries.iter().filter_map(from_entry).collect()
    }

    /// Every field through the simulator (which follows docs/loxilb-api.md): what is POSTed reads
    /// back without a difference, and every kind of change converges in one pass.
    #[tokio::test]
    async fn every_field_converges_through_the_simulator() {
        let addr = "127.0.0.1:0".parse().unwrap();
        let sim = loxilb_sim::Simulator::start(addr, loxilb_sim::SimConfig::default())
            .await
            .unwrap();
        let client = crate::LoxilbClient::new(crate::ClientConfig::new(&sim.url())).unwrap();
        let mut tcp = full_rule();
        tcp.key.protocol = Protocol::Tcp;
        tcp.key.port = 443;
        tcp.name = "ccm-x_ns_svc_443_tcp:llb-inst0".into();
        tcp.secondary_ips.clear();
        tcp.selection = EndpointSelection::Hash;
        tcp.probe = Probe {
            kind: ProbeType::Ping,
            ..Probe::default()
        };
        tcp.monitor = false; // loxilb turns it on because of the probe type
        tcp.proxy_protocol_v2 = true;
        tcp.inactive_timeout = 600;
        tcp.allowed_sources = vec!["192.168.7.9/24".parse().unwrap()];
        let mut desired = vec![full_rule(), tcp];
        let owned = |_: &Rule| true;

        apply(&client, diff_rules(&desired, &[], owned)).await;
        assert!(diff_rules(&desired, &listed(&client).await, owned).is_empty());

        // In place: weights, selection, probe, proxy protocol.
        desired[0].endpoints[0].weight = 60;
        desired[1].selection = EndpointSelection::RoundRobin;
        desired[1].proxy_protocol_v2 = false;
        let actions = diff_rules(&desired, &listed(&client).await, owned);
        assert!(actions.iter().all(|a| matches!(a, Action::Update(_))));
        apply(&client, actions).await;
        assert!(diff_rules(&desired, &listed(&client).await, owned).is_empty());

        // Needs a new rule: secondary IPs; the idle timeout alone with the source list
        // (loxilb does not apply a source-list change reliably in place).
        desired[0].secondary_ips.pop();
        desired[1].inactive_timeout = 0;
        desired[1].allowed_sources.clear();
        let actions = diff_rules(&desired, &listed(&client).await, owned);
        assert!(actions.iter().all(|a| matches!(a, Action::Recreate(_))));
        assert_eq!(actions.len(), 2);
        apply(&client, actions).await;
        let now = listed(&client).await;
        assert!(diff_rules(&desired, &now, owned).is_empty(), "{now:#?}");
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
        e.service_arguments.host.clear();
        e.service_arguments.probetype = "http".into();
        assert_eq!(from_entry(&e), None);
        e.service_arguments.probetype.clear();
        e.allowed_sources = vec![AllowedSource {
            prefix: "nonsense".into(),
        }];
        assert_eq!(from_entry(&e), None);
        e.allowed_sources.clear();
        assert!(from_entry(&e).is_some());
    }
}
