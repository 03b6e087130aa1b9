//! The traffic model: what loxilb would do with a new connection from a source address to
//! a service address, port and protocol, from the rules it holds. Not a datapath: it
//! answers which rule decides, so that tests can check that a configuration blocks what it
//! should and nothing else (docs/loxilb-api.md#firewall, #source-ranges).
//!
//! In loxilb's order: the firewall first (rules by preference, first match; `onDefault`
//! rules only for traffic no LB rule takes, so never for a balanced service), then the LB
//! rule looked up with the packet's mark as its `block` (a firewall rule's `fwMark` makes
//! block-0 rules miss), then loxilb issue #1036 (while any rule carries `allowedSources`,
//! no load-balanced traffic passes), then the rule's own `allowedSources`, then its
//! endpoints.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::Simulator;
use crate::firewall::{FwAction, FwState, SimFwRule};

/// What happens to a new connection in the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "verdict")]
pub enum Traffic {
    /// Load-balanced by the LB rule of this name to an active endpoint.
    Balanced { rule: String },
    /// Dropped by the firewall rule of this preference (explicit drop, or no action).
    DroppedByFirewall { preference: u32 },
    /// Taken by a firewall rule whose action is not allow or drop (trap, redirect, SNAT).
    DivertedByFirewall { preference: u32 },
    /// No LB rule for that address, port and protocol (for the packet's mark).
    NoRule,
    /// loxilb issue #1036: some rule carries `allowedSources`, so nothing is balanced.
    Issue1036,
    /// The LB rule's `allowedSources` do not include the source.
    NotAnAllowedSource,
    /// The LB rule has no active endpoint.
    NoEndpoint,
}

impl Traffic {
    pub fn is_balanced(&self) -> bool {
        matches!(self, Traffic::Balanced { .. })
    }
}

/// The IP protocol number of a protocol name as LB rules spell it (0: unknown).
fn protocol_number(protocol: &str) -> u8 {
    match protocol {
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        _ => 0,
    }
}

fn prefix_contains(prefix: &str, ip: IpAddr) -> bool {
    prefix
        .parse::<ipnet::IpNet>()
        .is_ok_and(|n| n.contains(&ip))
}

impl crate::Shared {
    pub(crate) fn firewall_capacity(&self) -> usize {
        self.fw_capacity.load(Ordering::Relaxed)
    }
}

impl Simulator {
    /// What loxilb would do with a new connection from `src` to `vip:port` over `protocol`
    /// (`tcp`, `udp`, `sctp`), from the rules held now.
    pub fn traffic(&self, src: IpAddr, vip: IpAddr, port: u16, protocol: &str) -> Traffic {
        let shared = &self.inner.shared;
        let reach = shared.reachability();
        let state = shared.state();
        let number = protocol_number(protocol);
        let mut mark = 0;
        let hit = state
            .firewall
            .ordered()
            .into_iter()
            .find(|r| !r.on_default && FwState::matches(r, src, vip, port, number));
        if let Some(rule) = hit {
            match rule.action {
                FwAction::Allow => mark = rule.fw_mark,
                FwAction::Drop => {
                    return Traffic::DroppedByFirewall {
                        preference: rule.preference,
                    };
                }
                _ => {
                    return Traffic::DivertedByFirewall {
                        preference: rule.preference,
                    };
                }
            }
        }
        let Some((name, active, sources)) = state.lb_lookup(vip, port, protocol, mark, &reach)
        else {
            return Traffic::NoRule;
        };
        if shared.issue_1036.load(Ordering::Relaxed) && state.any_allowed_sources() {
            return Traffic::Issue1036;
        }
        if !sources.is_empty() && !sources.iter().any(|p| prefix_contains(p, src)) {
            return Traffic::NotAnAllowedSource;
        }
        if !active {
            return Traffic::NoEndpoint;
        }
        Traffic::Balanced { rule: name }
    }

    /// The firewall rules loxilb holds, in match order (higher preference first, then the
    /// older), including the number loxilb gave each.
    pub fn firewall_rules(&self) -> Vec<SimFwRule> {
        self.inner
            .shared
            .state()
            .firewall
            .ordered()
            .into_iter()
            .cloned()
            .collect()
    }

    /// How many firewall rules loxilb takes (8192, its table size; smaller to test a full
    /// table): a POST beyond it is refused with loxilb's `rule-mark error` (500).
    pub fn set_firewall_capacity(&self, rules: usize) {
        self.inner
            .shared
            .fw_capacity
            .store(rules.min(crate::firewall::MAX_FW_RULES), Ordering::Relaxed);
    }

    /// Whether the traffic model reproduces loxilb issue #1036 (on by default, as loxilb
    /// 0.9.8 behaves): while any rule carries `allowedSources`, no load-balanced traffic
    /// passes. Off, `allowedSources` work as documented.
    pub fn set_issue_1036(&self, on: bool) {
        self.inner.shared.issue_1036.store(on, Ordering::Relaxed);
    }
}
