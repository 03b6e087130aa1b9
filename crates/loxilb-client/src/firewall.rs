//! Wire types of loxilb's firewall (`/config/firewall`, docs/loxilb-api.md#firewall) and
//! their conversion from and to the domain's firewall rules (`loxi_domain::firewall`).
//!
//! Requests carry every field with the spec's spellings (as kube-loxilb sends them); the
//! listing omits zero values, so every field defaults and unknown ones are ignored.

use std::net::IpAddr;

use ipnet::IpNet;
use loxi_domain::egress::SnatRule;
use loxi_domain::firewall::{FwAction, FwRule, Preferences, protocol_number, protocol_of};
use serde::{Deserialize, Serialize};

/// `ruleArguments` (`FirewallRuleEntry`): what a rule matches, and its preference. All of
/// it is the rule's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FirewallMatch {
    /// A CIDR; empty is "any" of the destination's family.
    #[serde(rename = "sourceIP")]
    pub source_ip: String,
    /// A CIDR; empty is "any" of the source's family.
    #[serde(rename = "destinationIP")]
    pub destination_ip: String,
    /// Equal bounds are one port, both 0 any port.
    #[serde(rename = "minSourcePort")]
    pub min_source_port: u16,
    #[serde(rename = "maxSourcePort")]
    pub max_source_port: u16,
    #[serde(rename = "minDestinationPort")]
    pub min_destination_port: u16,
    #[serde(rename = "maxDestinationPort")]
    pub max_destination_port: u16,
    /// IP protocol number; 0 = any.
    pub protocol: u8,
    /// Incoming interface; empty = any.
    #[serde(rename = "portName")]
    pub port_name: String,
    /// Higher first (docs/loxilb-api.md#firewall).
    pub preference: u16,
}

/// `opts` (`FirewallOptionEntry`): the action. loxilb takes the first of allow, drop,
/// redirect, trap, SNAT that is set; none set is drop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FirewallOptions {
    pub allow: bool,
    pub drop: bool,
    pub trap: bool,
    pub redirect: bool,
    #[serde(rename = "redirectPortName")]
    pub redirect_port_name: String,
    pub record: bool,
    /// Set on matching packets; loxilb also looks the LB rule up with it as the `block`.
    /// Must be 0 with `doSnat`.
    #[serde(rename = "fwMark")]
    pub fw_mark: u32,
    #[serde(rename = "doSnat")]
    pub do_snat: bool,
    /// The SNAT address (an IP, not a CIDR).
    #[serde(rename = "toIP")]
    pub to_ip: String,
    #[serde(rename = "toPort")]
    pub to_port: u16,
    /// Only for traffic no LB rule takes (egress).
    #[serde(rename = "onDefault")]
    pub on_default: bool,
    /// `<packets>:<bytes>`, listed only.
    #[serde(skip_serializing)]
    pub counter: String,
}

/// One firewall rule, as POSTed and as listed (`FirewallEntry`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FirewallEntry {
    #[serde(rename = "ruleArguments")]
    pub rule_arguments: FirewallMatch,
    pub opts: FirewallOptions,
}

/// `GET /config/firewall/all`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct FirewallList {
    #[serde(rename = "fwAttr", deserialize_with = "null_as_default")]
    pub rules: Vec<FirewallEntry>,
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl FirewallMatch {
    /// The query of `DELETE /config/firewall` that names this rule: every field, so that
    /// loxilb rebuilds exactly this identity.
    pub fn delete_query(&self) -> Vec<(&'static str, String)> {
        let mut q = vec![
            ("sourceIP", self.source_ip.clone()),
            ("destinationIP", self.destination_ip.clone()),
            ("minSourcePort", self.min_source_port.to_string()),
            ("maxSourcePort", self.max_source_port.to_string()),
            ("minDestinationPort", self.min_destination_port.to_string()),
            ("maxDestinationPort", self.max_destination_port.to_string()),
            ("protocol", self.protocol.to_string()),
            ("preference", self.preference.to_string()),
        ];
        if !self.port_name.is_empty() {
            q.push(("portName", self.port_name.clone()));
        }
        q
    }
}

/// The wire form of a domain firewall rule.
pub fn to_firewall_entry(rule: &FwRule) -> FirewallEntry {
    FirewallEntry {
        rule_arguments: FirewallMatch {
            source_ip: rule.source.to_string(),
            destination_ip: rule.destination_prefix().to_string(),
            min_destination_port: rule.port,
            max_destination_port: rule.port,
            protocol: protocol_number(rule.protocol),
            preference: rule.preference,
            ..FirewallMatch::default()
        },
        opts: FirewallOptions {
            allow: rule.action == FwAction::Allow,
            drop: rule.action == FwAction::Drop,
            ..FirewallOptions::default()
        },
    }
}

/// A listed rule as one of ours (`prefs`), or `None` when it is not ours (module docs of
/// `loxi_domain::firewall`): those are never touched.
pub fn owned_firewall_rule(entry: &FirewallEntry, prefs: Preferences) -> Option<FwRule> {
    let m = &entry.rule_arguments;
    let o = &entry.opts;
    let action = if o.allow {
        FwAction::Allow
    } else if o.drop && !o.trap && !o.redirect && !o.do_snat {
        FwAction::Drop
    } else {
        return None;
    };
    let source: IpNet = m.source_ip.parse().ok()?;
    let destination: IpNet = m.destination_ip.parse().ok()?;
    let host = destination.prefix_len() == destination.max_prefix_len();
    let plain = m.min_source_port == 0
        && m.max_source_port == 0
        && m.port_name.is_empty()
        && o.fw_mark == 0
        && m.min_destination_port == m.max_destination_port
        && m.min_destination_port != 0;
    if !prefs.owns(m.preference, action, host, plain) {
        return None;
    }
    let destination: IpAddr = destination.addr();
    Some(FwRule {
        source: source.trunc(),
        destination,
        port: m.min_destination_port,
        protocol: protocol_of(m.protocol)?,
        preference: m.preference,
        action,
    })
}

/// The wire form of an egress SNAT rule (kube-loxilb's shape: source only, `doSnat` to the
/// vip with `onDefault`, ports kept), at our preference.
pub fn to_snat_entry(rule: &SnatRule) -> FirewallEntry {
    FirewallEntry {
        rule_arguments: FirewallMatch {
            source_ip: rule.source.to_string(),
            preference: rule.preference,
            ..FirewallMatch::default()
        },
        opts: FirewallOptions {
            do_snat: true,
            to_ip: rule.to.to_string(),
            on_default: true,
            ..FirewallOptions::default()
        },
    }
}

/// A listed rule as one of our SNAT rules (`preference`: `loxi_domain::egress::snat_preference`),
/// or `None`.
pub fn owned_snat_rule(entry: &FirewallEntry, preference: u16) -> Option<SnatRule> {
    let m = &entry.rule_arguments;
    let o = &entry.opts;
    let plain = m.preference == preference
        && o.do_snat
        && o.on_default
        && o.to_port == 0
        && !o.allow
        && !o.drop
        && m.protocol == 0
        && m.port_name.is_empty()
        && [
            m.min_source_port,
            m.max_source_port,
            m.min_destination_port,
            m.max_destination_port,
        ]
        .iter()
        .all(|p| *p == 0);
    if !plain {
        return None;
    }
    // Any destination: listed as `0.0.0.0/0` or `::/0`, sent empty.
    if !m.destination_ip.is_empty() {
        let destination: IpNet = m.destination_ip.parse().ok()?;
        if destination.prefix_len() != 0 {
            return None;
        }
    }
    Some(SnatRule {
        source: m.source_ip.parse::<IpNet>().ok()?.trunc(),
        to: o.to_ip.parse().ok()?,
        preference,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::model::Protocol;

    #[test]
    fn round_trip_and_ownership() {
        let prefs = Preferences {
            drop: 40_000,
            allow: 40_001,
        };
        let rule = FwRule {
            source: "198.51.100.0/24".parse().unwrap(),
            destination: "192.0.2.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
            preference: 40_001,
            action: FwAction::Allow,
        };
        let wire = to_firewall_entry(&rule);
        assert_eq!(wire.rule_arguments.destination_ip, "192.0.2.10/32");
        let json = serde_json::to_value(&wire).unwrap();
        assert!(json["opts"].get("counter").is_none());
        assert_eq!(json["ruleArguments"]["minDestinationPort"], 80);
        assert_eq!(owned_firewall_rule(&wire, prefs), Some(rule));
        let mut marked = wire.clone();
        marked.opts.fw_mark = 3;
        assert_eq!(owned_firewall_rule(&marked, prefs), None);
        let other = Preferences {
            drop: 41_000,
            allow: 41_001,
        };
        assert_eq!(owned_firewall_rule(&wire, other), None);
        // The listing omits zero values.
        let listed: FirewallEntry = serde_json::from_value(serde_json::json!({
            "ruleArguments": {"sourceIP": "0.0.0.0/0", "destinationIP": "192.0.2.10/32",
                "minDestinationPort": 80, "maxDestinationPort": 80, "protocol": 6,
                "preference": 40000},
            "opts": {"drop": true, "counter": "0:0"}
        }))
        .unwrap();
        assert_eq!(
            owned_firewall_rule(&listed, prefs).map(|r| r.action),
            Some(FwAction::Drop)
        );
    }
}
