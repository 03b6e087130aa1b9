//! The load-balancer rule as loxi-ccm reasons about it: the subset of loxilb's
//! `LoadbalanceEntry` that a Kubernetes Service can ask for, with strong types.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Transport protocol of a rule. loxilb spells them lower-case on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn as_loxilb(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`) or loxilb's lower-case one.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_loxilb())
    }
}

/// loxilb NAT mode (`serviceArguments.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum NatMode {
    #[default]
    Default,
    OneArm,
    FullNat,
    Dsr,
    FullProxy,
    HostOneArm,
}

impl NatMode {
    pub fn wire(self) -> u8 {
        match self {
            NatMode::Default => 0,
            NatMode::OneArm => 1,
            NatMode::FullNat => 2,
            NatMode::Dsr => 3,
            NatMode::FullProxy => 4,
            NatMode::HostOneArm => 5,
        }
    }

    pub fn from_wire(v: u8) -> Option<NatMode> {
        Some(match v {
            0 => NatMode::Default,
            1 => NatMode::OneArm,
            2 => NatMode::FullNat,
            3 => NatMode::Dsr,
            4 => NatMode::FullProxy,
            5 => NatMode::HostOneArm,
            _ => return None,
        })
    }
}

impl FromStr for NatMode {
    type Err = ();
    /// kube-loxilb's spellings for `loxilb.io/lbmode` and `--setLBMode`.
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "default" | "0" => NatMode::Default,
            "onearm" | "1" => NatMode::OneArm,
            "fullnat" | "2" => NatMode::FullNat,
            "dsr" | "3" => NatMode::Dsr,
            "fullproxy" | "4" => NatMode::FullProxy,
            "hostonearm" | "5" => NatMode::HostOneArm,
            _ => return Err(()),
        })
    }
}

/// loxilb endpoint selection (`serviceArguments.sel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum EndpointSelection {
    #[default]
    RoundRobin,
    Hash,
    Priority,
    Persist,
    LeastConnections,
    N2,
    N3,
}

impl EndpointSelection {
    pub fn wire(self) -> u8 {
        match self {
            EndpointSelection::RoundRobin => 0,
            EndpointSelection::Hash => 1,
            EndpointSelection::Priority => 2,
            EndpointSelection::Persist => 3,
            EndpointSelection::LeastConnections => 4,
            EndpointSelection::N2 => 5,
            EndpointSelection::N3 => 6,
        }
    }

    pub fn from_wire(v: u8) -> Option<EndpointSelection> {
        Some(match v {
            0 => EndpointSelection::RoundRobin,
            1 => EndpointSelection::Hash,
            2 => EndpointSelection::Priority,
            3 => EndpointSelection::Persist,
            4 => EndpointSelection::LeastConnections,
            5 => EndpointSelection::N2,
            6 => EndpointSelection::N3,
            _ => return None,
        })
    }
}

impl FromStr for EndpointSelection {
    type Err = ();
    /// kube-loxilb's spellings for `loxilb.io/epselect`.
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "rr" | "roundrobin" => EndpointSelection::RoundRobin,
            "hash" => EndpointSelection::Hash,
            "prio" | "priority" => EndpointSelection::Priority,
            "persist" => EndpointSelection::Persist,
            "lc" => EndpointSelection::LeastConnections,
            "n2" => EndpointSelection::N2,
            "n3" => EndpointSelection::N3,
            _ => return Err(()),
        })
    }
}

/// The identity of a rule in loxilb (CONTRACT.md §2.3). loxi-ccm never uses `host`, port
/// ranges or `block`, so those are always empty / 0 for rules it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RuleKey {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for RuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}/{}", self.port, self.protocol),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}/{}", self.port, self.protocol),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub target_port: u16,
    pub weight: u8,
}

/// A complete desired (or observed) rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub key: RuleKey,
    pub name: String,
    pub mode: NatMode,
    pub selection: EndpointSelection,
    /// Kept sorted so comparison does not depend on the order loxilb lists them in.
    pub endpoints: Vec<Endpoint>,
    pub monitor: bool,
    pub managed: bool,
}

impl Rule {
    /// Puts the rule in the canonical form used for comparisons.
    pub fn normalized(mut self) -> Rule {
        self.endpoints.sort();
        self.endpoints.dedup();
        self
    }
}
