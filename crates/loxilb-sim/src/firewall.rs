//! loxilb's firewall (`/config/firewall`, docs/loxilb-api.md#firewall): rules matching
//! source and destination prefixes, source and destination port ranges, an IP protocol
//! number and an incoming port name, ordered by preference, each with one action (allow,
//! drop, redirect, trap or SNAT). Everything here is loxilb state, wiped by a restart.
//!
//! Identity: every matching field and the preference; a second POST of the same identity
//! answers 409 `fwrule-exists error`, whatever its options. Order: higher preference
//! first; among equal preferences, the rule added first. A packet takes the action of the
//! first rule it matches (the traffic model in `traffic.rs`).

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::ApiError;

/// loxilb's firewall table size (its mark counter), shared with the rules loxilb makes
/// itself for `allowedSources`.
pub(crate) const MAX_FW_RULES: usize = 8192;
/// The implicit SNAT LB rule of a `doSnat` firewall rule is made with this bit in its
/// `block`, the firewall rule's number in the low bits (docs/loxilb-api.md#firewall).
pub(crate) const SNAT_BLOCK_BIT: u32 = 0x1000;

/// A port range as loxilb keys it: `(0, 0)` any port, `(p, p)` one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortRange {
    pub min: u16,
    pub max: u16,
}

impl PortRange {
    /// loxilb's reading of a (min, max) pair: equal values are one port (0: any), else the
    /// range between them, whichever is larger.
    fn from_wire(min: u16, max: u16) -> PortRange {
        PortRange {
            min: min.min(max),
            max: min.max(max),
        }
    }

    pub(crate) fn matches(self, port: u16) -> bool {
        (self.min == 0 && self.max == 0) || (self.min..=self.max).contains(&port)
    }
}

/// What a matching packet gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum FwAction {
    Allow,
    Drop,
    Redirect {
        port_name: String,
    },
    Trap,
    /// Source NAT to `to_ip` (`toPort` 0: ports kept): loxilb's egress.
    Snat {
        to_ip: String,
        to_port: u16,
    },
}

/// One stored firewall rule, as loxilb holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimFwRule {
    /// Canonical network form, e.g. `10.0.0.0/8`, `0.0.0.0/0`.
    pub source: String,
    pub destination: String,
    pub source_ports: PortRange,
    pub destination_ports: PortRange,
    /// IP protocol number; 0 = any.
    pub protocol: u8,
    /// Incoming interface name; empty = any.
    pub port_name: String,
    pub preference: u32,
    pub action: FwAction,
    /// Set on matching packets. loxilb also uses it as the `block` when it looks up the
    /// load-balancer rule of a packet (so a non-zero mark misses block-0 rules).
    pub fw_mark: u32,
    pub record: bool,
    /// "Trigger only on default cases": only for traffic no LB rule takes.
    pub on_default: bool,
    /// loxilb's rule number (its mark counter), from 1.
    pub number: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FwKey {
    source: IpNet,
    destination: IpNet,
    source_ports: PortRange,
    destination_ports: PortRange,
    protocol: u8,
    port_name: String,
    preference: u32,
}

#[derive(Debug, Clone)]
struct StoredFw {
    key: FwKey,
    rule: SimFwRule,
    /// Insertion order, for equal preferences.
    seq: u64,
}

/// The firewall table.
#[derive(Debug, Default)]
pub(crate) struct FwState {
    rules: HashMap<FwKey, StoredFw>,
    seq: u64,
    next_number: u32,
    free_numbers: Vec<u32>,
}

/// A decoded `FirewallEntry` (POST body) or DELETE query, before loxilb's checks.
#[derive(Debug, Default, Clone)]
pub(crate) struct FwRequest {
    source: String,
    destination: String,
    source_ports: (i64, i64),
    destination_ports: (i64, i64),
    protocol: i64,
    port_name: String,
    preference: i64,
    allow: bool,
    drop: bool,
    redirect: bool,
    redirect_port_name: String,
    trap: bool,
    record: bool,
    fw_mark: i64,
    do_snat: bool,
    to_ip: String,
    to_port: i64,
    on_default: bool,
}

/// The result of a firewall POST that created a SNAT rule: the LB rule loxilb makes for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImplicitSnat {
    pub block: u32,
    pub to_ip: IpAddr,
    pub to_port: u16,
}

/// `POST /config/firewall` body: Go decoding (400), the schema's required objects (422 602).
pub(crate) fn decode_post(bytes: &[u8]) -> Result<FwRequest, ApiError> {
    let Some(v) = parse_body(bytes)? else {
        return Err(ApiError::required("attr", "body"));
    };
    let map = body_object(&v, "FirewallEntry")?;
    let o = GoObj::new(&map, "FirewallEntry");
    let args = o.object("ruleArguments", "FirewallRuleEntry")?;
    let opts = o.object("opts", "FirewallOptionEntry")?;
    let (Some(args), Some(opts)) = (args, opts) else {
        let missing = if o.raw("ruleArguments").is_none() {
            "ruleArguments"
        } else {
            "opts"
        };
        return Err(ApiError::required(missing, "body"));
    };
    let int = |o: &GoObj<'_>, k: &str| o.int(k, GoInt::I64).map(Option::unwrap_or_default);
    let string = |o: &GoObj<'_>, k: &str| o.string(k).map(Option::unwrap_or_default);
    let flag = |o: &GoObj<'_>, k: &str| o.boolean(k).map(Option::unwrap_or_default);
    Ok(FwRequest {
        source: string(&args, "sourceIP")?,
        destination: string(&args, "destinationIP")?,
        source_ports: (int(&args, "minSourcePort")?, int(&args, "maxSourcePort")?),
        destination_ports: (
            int(&args, "minDestinationPort")?,
            int(&args, "maxDestinationPort")?,
        ),
        protocol: int(&args, "protocol")?,
        port_name: string(&args, "portName")?,
        preference: int(&args, "preference")?,
        allow: flag(&opts, "allow")?,
        drop: flag(&opts, "drop")?,
        redirect: flag(&opts, "redirect")?,
        redirect_port_name: string(&opts, "redirectPortName")?,
        trap: flag(&opts, "trap")?,
        record: flag(&opts, "record")?,
        fw_mark: int(&opts, "fwMark")?,
        do_snat: flag(&opts, "doSnat")?,
        to_ip: string(&opts, "toIP")?,
        to_port: int(&opts, "toPort")?,
        on_default: flag(&opts, "onDefault")?,
    })
}

/// `DELETE /config/firewall?...`: the rule's identity from the query (numbers already
/// bound as go-openapi integers by the caller).
pub(crate) fn delete_request(
    strings: impl Fn(&str) -> Option<String>,
    ints: impl Fn(&str) -> Option<i64>,
) -> FwRequest {
    FwRequest {
        source: strings("sourceIP").unwrap_or_default(),
        destination: strings("destinationIP").unwrap_or_default(),
        source_ports: (
            ints("minSourcePort").unwrap_or(0),
            ints("maxSourcePort").unwrap_or(0),
        ),
        destination_ports: (
            ints("minDestinationPort").unwrap_or(0),
            ints("maxDestinationPort").unwrap_or(0),
        ),
        protocol: ints("protocol").unwrap_or(0),
        port_name: strings("portName").unwrap_or_default(),
        preference: ints("preference").unwrap_or(0),
        ..FwRequest::default()
    }
}

fn is_ipv4_text(s: &str) -> bool {
    s.split('/')
        .next()
        .and_then(|a| a.parse::<IpAddr>().ok())
        .is_some_and(|a| a.is_ipv4())
}

/// Go's `net.ParseCIDR`: `address/length`, the network part kept (host bits cleared).
fn parse_cidr(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let len: u8 = len.parse().ok()?;
    IpNet::new(addr, len).ok().map(|n| n.trunc())
}

fn in_range(v: i64, max: i64) -> bool {
    (0..=max).contains(&v)
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn u16_of(v: i64) -> u16 {
    v as u16
}

impl FwRequest {
    /// loxilb's handler checks (out-of-range numbers are refused, not truncated) and its
    /// defaults (an empty prefix is "any" of the other prefix's family), then the core's
    /// parse of both prefixes. Errors are loxilb's raw strings.
    fn key(&self) -> Result<FwKey, String> {
        let (smin, smax) = self.source_ports;
        let (dmin, dmax) = self.destination_ports;
        if ![smin, smax, dmin, dmax].iter().all(|&p| in_range(p, 65535)) {
            return Err("invalid firewall port: out of range 0-65535".into());
        }
        if !in_range(self.protocol, 255) {
            return Err("invalid firewall protocol: out of range 0-255".into());
        }
        if !in_range(self.preference, 65535) {
            return Err("invalid firewall preference: out of range 0-65535".into());
        }
        let any_of = |other: &str| {
            if other.is_empty() || is_ipv4_text(other) {
                "0.0.0.0/0".to_string()
            } else {
                "::/0".to_string()
            }
        };
        let destination = if self.destination.is_empty() {
            any_of(&self.source)
        } else {
            self.destination.clone()
        };
        let source = if self.source.is_empty() {
            any_of(&destination)
        } else {
            self.source.clone()
        };
        let (Some(destination), Some(source)) = (parse_cidr(&destination), parse_cidr(&source))
        else {
            return Err("malformed-rule error".into());
        };
        Ok(FwKey {
            source,
            destination,
            source_ports: PortRange::from_wire(u16_of(smin), u16_of(smax)),
            destination_ports: PortRange::from_wire(u16_of(dmin), u16_of(dmax)),
            protocol: u8::try_from(self.protocol).unwrap_or_default(),
            port_name: self.port_name.clone(),
            preference: u32::try_from(self.preference).unwrap_or_default(),
        })
    }

    /// The action, in loxilb's order of precedence; none set means drop.
    fn action(&self) -> Result<FwAction, String> {
        if !in_range(self.to_port, 65535) {
            return Err("invalid firewall toPort: out of range 0-65535".into());
        }
        Ok(if self.allow {
            FwAction::Allow
        } else if self.drop {
            FwAction::Drop
        } else if self.redirect {
            FwAction::Redirect {
                port_name: self.redirect_port_name.clone(),
            }
        } else if self.trap {
            FwAction::Trap
        } else if self.do_snat {
            if self.to_ip.parse::<IpAddr>().is_err() {
                return Err("malformed-args error".into());
            }
            if self.fw_mark != 0 {
                return Err("malformed-args fwmark !=0 for snat-error".into());
            }
            FwAction::Snat {
                to_ip: self.to_ip.clone(),
                to_port: u16_of(self.to_port),
            }
        } else {
            FwAction::Drop
        })
    }
}

impl FwState {
    fn alloc_number(&mut self, capacity: usize) -> Option<u32> {
        if self.rules.len() >= capacity {
            return None;
        }
        if let Some(n) = self.free_numbers.pop() {
            return Some(n);
        }
        if self.next_number as usize >= MAX_FW_RULES {
            return None;
        }
        self.next_number += 1;
        Some(self.next_number)
    }

    /// `POST /config/firewall`. A SNAT rule also needs its implicit LB rule, which the
    /// caller makes (it lives in the LB table).
    /// `capacity`: the table's size, [`MAX_FW_RULES`] unless a test makes it smaller
    /// (`Simulator::set_firewall_capacity`).
    pub(crate) fn add(
        &mut self,
        req: &FwRequest,
        capacity: usize,
    ) -> Result<Option<ImplicitSnat>, String> {
        let key = req.key()?;
        let action = req.action()?;
        if self.rules.contains_key(&key) {
            return Err("fwrule-exists error".into());
        }
        let Some(number) = self.alloc_number(capacity) else {
            return Err("rule-mark error".into());
        };
        let snat = match &action {
            FwAction::Snat { to_ip, to_port } => Some(ImplicitSnat {
                block: number | SNAT_BLOCK_BIT,
                to_ip: to_ip.parse().map_err(|_| "malformed-args error")?,
                to_port: *to_port,
            }),
            _ => None,
        };
        // A SNAT rule's packets carry the mark of its implicit LB rule.
        let fw_mark = snat
            .as_ref()
            .map_or(u32::try_from(req.fw_mark).unwrap_or_default(), |s| s.block);
        let rule = SimFwRule {
            source: key.source.to_string(),
            destination: key.destination.to_string(),
            source_ports: key.source_ports,
            destination_ports: key.destination_ports,
            protocol: key.protocol,
            port_name: key.port_name.clone(),
            preference: key.preference,
            action,
            fw_mark,
            record: req.record,
            on_default: req.on_default,
            number,
        };
        self.seq += 1;
        let seq = self.seq;
        self.rules.insert(key.clone(), StoredFw { key, rule, seq });
        Ok(snat)
    }

    /// `DELETE /config/firewall`: the removed rule's implicit SNAT LB block, if any.
    pub(crate) fn delete(&mut self, req: &FwRequest) -> Result<Option<u32>, String> {
        let key = req.key()?;
        let Some(stored) = self.rules.remove(&key) else {
            return Err("no-rule error".into());
        };
        self.free_numbers.push(stored.rule.number);
        Ok(match stored.rule.action {
            FwAction::Snat { .. } => Some(stored.rule.number | SNAT_BLOCK_BIT),
            _ => None,
        })
    }

    /// The rules in match order: higher preference first, then the older first.
    pub(crate) fn ordered(&self) -> Vec<&SimFwRule> {
        let mut v: Vec<&StoredFw> = self.rules.values().collect();
        v.sort_by_key(|s| (std::cmp::Reverse(s.key.preference), s.seq));
        v.into_iter().map(|s| &s.rule).collect()
    }

    /// Does this stored rule match the packet (protocol number, addresses, ports)?
    pub(crate) fn matches(
        rule: &SimFwRule,
        src: IpAddr,
        dst: IpAddr,
        dport: u16,
        protocol: u8,
    ) -> bool {
        let net = |s: &str| s.parse::<IpNet>().ok();
        net(&rule.source).is_some_and(|n| n.contains(&src))
            && net(&rule.destination).is_some_and(|n| n.contains(&dst))
            && (rule.protocol == 0 || rule.protocol == protocol)
            && rule.destination_ports.matches(dport)
            // The model's packets have no source port: only "any" matches.
            && rule.source_ports.matches(0)
            && rule.port_name.is_empty()
    }

    /// `{"fwAttr":[...]}` as loxilb lists it: zero values omitted, the counter always shown.
    pub(crate) fn list_api(&self) -> Value {
        let attrs: Vec<Value> = self.ordered().into_iter().map(to_api).collect();
        json!({ "fwAttr": attrs })
    }
}

fn to_api(r: &SimFwRule) -> Value {
    let mut args = Map::new();
    let put = |m: &mut Map<String, Value>, k: &str, v: Value, present: bool| {
        if present {
            m.insert(k.into(), v);
        }
    };
    put(&mut args, "sourceIP", json!(r.source), true);
    put(&mut args, "destinationIP", json!(r.destination), true);
    let (s, d) = (r.source_ports, r.destination_ports);
    put(&mut args, "minSourcePort", json!(s.min), s.min != 0);
    put(&mut args, "maxSourcePort", json!(s.max), s.max != 0);
    put(&mut args, "minDestinationPort", json!(d.min), d.min != 0);
    put(&mut args, "maxDestinationPort", json!(d.max), d.max != 0);
    put(&mut args, "protocol", json!(r.protocol), r.protocol != 0);
    put(
        &mut args,
        "portName",
        json!(r.port_name),
        !r.port_name.is_empty(),
    );
    put(
        &mut args,
        "preference",
        json!(r.preference),
        r.preference != 0,
    );
    let mut opts = Map::new();
    match &r.action {
        FwAction::Allow => put(&mut opts, "allow", json!(true), true),
        FwAction::Drop => put(&mut opts, "drop", json!(true), true),
        FwAction::Redirect { port_name } => {
            put(&mut opts, "redirect", json!(true), true);
            put(
                &mut opts,
                "redirectPortName",
                json!(port_name),
                !port_name.is_empty(),
            );
        }
        FwAction::Trap => put(&mut opts, "trap", json!(true), true),
        FwAction::Snat { to_ip, to_port } => {
            put(&mut opts, "doSnat", json!(true), true);
            put(&mut opts, "toIP", json!(to_ip), true);
            put(&mut opts, "toPort", json!(to_port), *to_port != 0);
        }
    }
    // loxilb lists a SNAT rule's mark only for other actions.
    let mark_shown = !matches!(r.action, FwAction::Snat { .. }) && r.fw_mark != 0;
    put(&mut opts, "fwMark", json!(r.fw_mark), mark_shown);
    put(&mut opts, "record", json!(true), r.record);
    put(&mut opts, "onDefault", json!(true), r.on_default);
    opts.insert("counter".into(), json!("0:0"));
    json!({ "ruleArguments": args, "opts": opts })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(src: &str, dst: &str, pref: i64) -> FwRequest {
        FwRequest {
            source: src.into(),
            destination: dst.into(),
            preference: pref,
            allow: true,
            ..FwRequest::default()
        }
    }

    impl FwState {
        fn add_all(&mut self, req: &FwRequest) -> Result<Option<ImplicitSnat>, String> {
            self.add(req, MAX_FW_RULES)
        }
    }

    #[test]
    fn identity_includes_preference_and_order_is_by_preference() {
        let mut fw = FwState::default();
        fw.add_all(&req("10.0.0.0/8", "192.0.2.1/32", 10)).unwrap();
        assert_eq!(
            fw.add_all(&req("10.1.2.3/8", "192.0.2.1/32", 10)),
            Err("fwrule-exists error".into()),
            "the prefix is compared as a network"
        );
        fw.add_all(&req("10.0.0.0/8", "192.0.2.1/32", 20)).unwrap();
        fw.add_all(&req("", "192.0.2.2/32", 20)).unwrap();
        let order: Vec<(u32, &str)> = fw
            .ordered()
            .iter()
            .map(|r| (r.preference, r.destination.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (20, "192.0.2.1/32"),
                (20, "192.0.2.2/32"),
                (10, "192.0.2.1/32")
            ]
        );
        assert_eq!(fw.ordered()[1].source, "0.0.0.0/0");
    }

    #[test]
    fn bad_prefixes_and_ranges_are_refused_with_loxilbs_words() {
        let mut fw = FwState::default();
        assert_eq!(
            fw.add_all(&req("10.0.0.1", "", 0)),
            Err("malformed-rule error".into())
        );
        let mut r = req("", "", 70_000);
        assert!(fw.add_all(&r).unwrap_err().starts_with("invalid firewall"));
        r.preference = 1;
        r.allow = false;
        r.do_snat = true;
        r.to_ip = "nope".into();
        assert_eq!(fw.add_all(&r), Err("malformed-args error".into()));
        r.to_ip = "192.0.2.9".into();
        let snat = fw.add_all(&r).unwrap().unwrap();
        assert_eq!(snat.block, 1 | SNAT_BLOCK_BIT);
        assert_eq!(fw.delete(&r), Ok(Some(1 | SNAT_BLOCK_BIT)));
        assert_eq!(fw.delete(&r), Err("no-rule error".into()));
    }

    #[test]
    fn port_ranges() {
        assert!(PortRange::from_wire(0, 0).matches(443));
        assert!(PortRange::from_wire(80, 80).matches(80));
        assert!(!PortRange::from_wire(80, 80).matches(81));
        assert!(PortRange::from_wire(90, 80).matches(85));
    }
}
