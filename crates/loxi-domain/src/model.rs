//! The load-balancer rule as loxi-ccm reasons about it: the subset of loxilb's
//! `LoadbalanceEntry` that a Kubernetes Service can ask for, with strong types.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
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

/// The identity of a rule in loxilb (docs/loxilb-api.md#rule-identity). loxi-ccm never uses
/// `host`, port ranges or `block`, so those are always empty / 0 for rules it owns.
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
    /// Sent as is. loxilb reads it only with [`EndpointSelection::Priority`], as a percentage
    /// (each endpoint gets `weight * 16 / 100` of 16 slots); otherwise loxi-ccm sends 1.
    pub weight: u8,
}

/// How loxilb probes the endpoints of a rule (`serviceArguments.probetype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ProbeType {
    /// Nothing sent: loxilb probes each endpoint with the rule's protocol on its target port.
    #[default]
    Default,
    Tcp,
    Udp,
    Sctp,
    Ping,
    /// Probing off.
    None,
}

impl ProbeType {
    /// The wire spelling; empty for [`ProbeType::Default`] (then the field is not sent).
    pub fn as_loxilb(self) -> &'static str {
        match self {
            ProbeType::Default => "",
            ProbeType::Tcp => "tcp",
            ProbeType::Udp => "udp",
            ProbeType::Sctp => "sctp",
            ProbeType::Ping => "ping",
            ProbeType::None => "none",
        }
    }

    /// Reads the wire spelling (as listed by loxilb). `http`/`https` are not accepted: loxilb
    /// rejects them for rules (docs/loxilb-api.md#rule-fields), so they never appear in a listing.
    pub fn from_loxilb(s: &str) -> Option<ProbeType> {
        Some(match s {
            "" => ProbeType::Default,
            "tcp" => ProbeType::Tcp,
            "udp" => ProbeType::Udp,
            "sctp" => ProbeType::Sctp,
            "ping" => ProbeType::Ping,
            "none" => ProbeType::None,
            _ => return None,
        })
    }

    /// tcp, udp and sctp probes need a probe port; the others must not have one.
    pub fn needs_port(self) -> bool {
        matches!(self, ProbeType::Tcp | ProbeType::Udp | ProbeType::Sctp)
    }

    /// loxilb forces `monitor` on when a probe type other than `none` is set explicitly.
    pub fn forces_monitor(self) -> bool {
        !matches!(self, ProbeType::Default | ProbeType::None)
    }
}

/// Endpoint health probing of a rule. Only `kind` and `port` are ever listed back by loxilb;
/// the others are write-only (docs/loxilb-api.md#listing-rules).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Probe {
    pub kind: ProbeType,
    /// 0 = none (required non-zero for tcp/udp/sctp, must be 0 otherwise).
    pub port: u16,
    /// Request payload (`probereq`); write-only.
    pub request: String,
    /// Expected response payload (`proberesp`); write-only.
    pub response: String,
    /// Probe interval in seconds (`probeTimeout`), 0 = loxilb's 60; write-only.
    pub timeout: u32,
    /// Failures before an endpoint is marked inactive (`probeRetries`), 0 = loxilb's 2;
    /// write-only.
    pub retries: u32,
}

/// loxilb's effective idle-session timeout when 0 is sent (docs/loxilb-api.md#rule-fields).
pub fn default_inactive_timeout(protocol: Protocol) -> u32 {
    match protocol {
        Protocol::Tcp | Protocol::Sctp => 240,
        Protocol::Udp => 20,
    }
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
    pub probe: Probe,
    /// Idle-session timeout in seconds (`inactiveTimeOut`); 0 = loxilb's default
    /// ([`default_inactive_timeout`]), which is what loxilb then lists.
    pub inactive_timeout: u32,
    /// Send a PROXY protocol v2 header to endpoints (tcp only).
    pub proxy_protocol_v2: bool,
    /// `loxilb.io/egress`: loxilb's rule flag `egress` (the endpoints' own outgoing traffic
    /// leaves with the rule's address). Fixed at creation: loxilb refuses to change it.
    pub egress: bool,
    /// Source allow-list (`allowedSources`), from `spec.loadBalancerSourceRanges`. Empty =
    /// no restriction. Canonical (network) form, sorted.
    pub allowed_sources: Vec<IpNet>,
    /// Additional VIPs for SCTP multihoming (`secondaryIPs`), sorted. loxilb drops them for
    /// other protocols.
    pub secondary_ips: Vec<IpAddr>,
    /// Advertise the rule's addresses over BGP (`bgp`). loxilb sets it only when the rule is
    /// created, and counts advertisements per address (docs/loxilb-api.md#bgp).
    #[serde(default)]
    pub bgp: bool,
    /// The private address loxilb plumbs for the VIP (`privateIP`, `--privateCIDR`: a cloud
    /// elastic IP is the VIP, this the instance's address behind it). Write-only: loxilb
    /// never lists it and only sets it when the rule is created (docs/loxilb-api.md).
    #[serde(default)]
    pub private_ip: Option<IpAddr>,
}

impl Rule {
    /// Puts the rule in the canonical form used for comparisons.
    pub fn normalized(mut self) -> Rule {
        self.endpoints.sort();
        self.endpoints.dedup();
        for net in &mut self.allowed_sources {
            *net = net.trunc();
        }
        self.allowed_sources.sort();
        self.allowed_sources.dedup();
        self.secondary_ips.sort();
        self.secondary_ips.dedup();
        self
    }

    /// The `inactiveTimeOut` loxilb really applies (and lists).
    pub fn effective_inactive_timeout(&self) -> u32 {
        if self.inactive_timeout == 0 {
            default_inactive_timeout(self.key.protocol)
        } else {
            self.inactive_timeout
        }
    }

    /// The `monitor` loxilb really stores (and lists).
    pub fn effective_monitor(&self) -> bool {
        self.monitor || self.probe.kind.forces_monitor()
    }

    /// The rule as `GET /config/loadbalancer/all` would show it after POSTing it: normalized,
    /// write-only fields cleared (probe request/response/timeout/retries), effective
    /// `inactiveTimeOut` and `monitor`, secondary IPs only for sctp. Two rules with the same
    /// observable form cannot be told apart by listing loxilb, so the diff compares these.
    pub fn observable(&self) -> Rule {
        let mut r = self.clone().normalized();
        r.inactive_timeout = self.effective_inactive_timeout();
        r.monitor = self.effective_monitor();
        r.probe = Probe {
            kind: self.probe.kind,
            port: self.probe.port,
            ..Probe::default()
        };
        if r.key.protocol != Protocol::Sctp {
            r.secondary_ips.clear();
        }
        r.private_ip = None;
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(protocol: Protocol) -> Rule {
        Rule {
            key: RuleKey {
                ip: "192.0.2.1".parse().unwrap(),
                port: 80,
                protocol,
            },
            name: "r".into(),
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            endpoints: vec![],
            monitor: false,
            managed: true,
            probe: Probe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: vec![],
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
        }
    }

    #[test]
    fn observable_form_matches_what_loxilb_lists() {
        let mut r = rule(Protocol::Udp);
        r.probe = Probe {
            kind: ProbeType::Ping,
            port: 0,
            request: "hi".into(),
            response: "ho".into(),
            timeout: 10,
            retries: 3,
        };
        r.allowed_sources = vec!["10.1.2.3/8".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        r.secondary_ips = vec!["192.0.2.9".parse().unwrap()];
        let o = r.observable();
        assert_eq!(o.inactive_timeout, 20);
        assert!(o.monitor, "ping forces monitor");
        assert_eq!(o.probe.kind, ProbeType::Ping);
        assert!(o.probe.request.is_empty() && o.probe.timeout == 0 && o.probe.retries == 0);
        assert_eq!(
            o.allowed_sources,
            vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
        );
        assert!(o.secondary_ips.is_empty(), "dropped for non-sctp");
        r.private_ip = Some("10.10.0.1".parse().unwrap());
        assert_eq!(r.observable().private_ip, None, "never listed");
        assert_eq!(rule(Protocol::Tcp).observable().inactive_timeout, 240);
        assert_eq!(rule(Protocol::Sctp).observable().inactive_timeout, 240);
        let mut s = rule(Protocol::Sctp);
        s.secondary_ips = vec!["192.0.2.9".parse().unwrap(), "192.0.2.8".parse().unwrap()];
        assert_eq!(s.observable().secondary_ips.len(), 2);
        assert_eq!(s.observable().secondary_ips[0].to_string(), "192.0.2.8");
    }

    #[test]
    fn probe_type_wire_round_trip() {
        for t in [
            ProbeType::Default,
            ProbeType::Tcp,
            ProbeType::Udp,
            ProbeType::Sctp,
            ProbeType::Ping,
            ProbeType::None,
        ] {
            assert_eq!(ProbeType::from_loxilb(t.as_loxilb()), Some(t));
        }
        assert_eq!(ProbeType::from_loxilb("http"), None);
        assert!(!ProbeType::None.forces_monitor() && !ProbeType::Default.forces_monitor());
    }
}
