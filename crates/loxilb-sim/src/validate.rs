//! Request validation for `POST /config/loadbalancer`, in loxilb's order
//! (docs/loxilb-api.md#creating-a-rule):
//!
//! 1. [`decode_lb`]: Go-style decoding (400) and go-openapi schema checks
//!    (422 602 "required", 422 606 "enum").
//! 2. [`LbRequest::from_entry`]: what loxilb's handler does: unsigned
//!    truncations, dropping secondary IPs for non-sctp rules.
//! 3. [`core_check`]: the core's argument checks, returning the exact raw
//!    error strings whose statuses are derived by `errors::status_for`.

use std::net::IpAddr;

use serde_json::Value;

use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::ApiError;

pub(crate) const PROTOCOLS: &[&str] = &["tcp", "udp", "sctp", "icmp"];
const PROBE_TYPES_SCHEMA: &[&str] = &["tcp", "udp", "sctp", "http", "https", "ping", "none"];
pub(crate) const MAX_ENDPOINTS: usize = 32;
const MAX_SECONDARY_IPS: usize = 3;
const MAX_INACTIVE_TIMEOUT: u32 = 86_400;

/// Raw decoded `serviceArguments` (Go zero values for absent keys, `Option`
/// where the generated model uses a pointer because the field is required).
#[derive(Debug, Default)]
pub(crate) struct ServiceArgsIn {
    external_ip: Option<String>,
    port: Option<i64>,
    port_max: i64,
    protocol: String,
    sel: i64,
    mode: i64,
    security: i64,
    oper: i64,
    probetype: String,
    probeport: i64,
    probereq: String,
    proberesp: String,
    bgp: bool,
    monitor: bool,
    managed: bool,
    proxyprotocolv2: bool,
    egress: bool,
    block: i64,
    inactive_timeout: i64,
    probe_timeout: i64,
    probe_retries: i64,
    name: String,
    host: String,
    private_ip: String,
}

#[derive(Debug, Default)]
pub(crate) struct EndpointIn {
    ip: Option<String>,
    target_port: Option<i64>,
    weight: Option<i64>,
}

/// Decoded `LoadbalanceEntry` before schema validation.
#[derive(Debug, Default)]
pub(crate) struct LbEntryIn {
    sa: Option<ServiceArgsIn>,
    endpoints: Option<Vec<Option<EndpointIn>>>,
    secondary_ips: Vec<String>,
    allowed_sources: Vec<String>,
}

fn decode_service_args(o: &GoObj<'_>) -> Result<ServiceArgsIn, ApiError> {
    // `snat` is decoded (type-checked) but ignored on input (SPEC≠CODE).
    o.boolean("snat")?;
    Ok(ServiceArgsIn {
        external_ip: o.string("externalIP")?,
        port: o.int("port", GoInt::I64)?,
        port_max: o.int("portMax", GoInt::I64)?.unwrap_or(0),
        protocol: o.string("protocol")?.unwrap_or_default(),
        sel: o.int("sel", GoInt::I64)?.unwrap_or(0),
        mode: o.int("mode", GoInt::I32)?.unwrap_or(0),
        security: o.int("security", GoInt::I32)?.unwrap_or(0),
        oper: o.int("oper", GoInt::I32)?.unwrap_or(0),
        probetype: o.string("probetype")?.unwrap_or_default(),
        probeport: o.int("probeport", GoInt::U16)?.unwrap_or(0),
        probereq: o.string("probereq")?.unwrap_or_default(),
        proberesp: o.string("proberesp")?.unwrap_or_default(),
        bgp: o.boolean("bgp")?.unwrap_or(false),
        monitor: o.boolean("monitor")?.unwrap_or(false),
        managed: o.boolean("managed")?.unwrap_or(false),
        proxyprotocolv2: o.boolean("proxyprotocolv2")?.unwrap_or(false),
        egress: o.boolean("egress")?.unwrap_or(false),
        block: o.int("block", GoInt::U32)?.unwrap_or(0),
        inactive_timeout: o.int("inactiveTimeOut", GoInt::I32)?.unwrap_or(0),
        probe_timeout: o.int("probeTimeout", GoInt::U32)?.unwrap_or(0),
        probe_retries: o.int("probeRetries", GoInt::I32)?.unwrap_or(0),
        name: o.string("name")?.unwrap_or_default(),
        host: o.string("host")?.unwrap_or_default(),
        private_ip: o.string("privateIP")?.unwrap_or_default(),
    })
}

fn decode_endpoint(o: &GoObj<'_>) -> Result<EndpointIn, ApiError> {
    // Output-only fields are still type-checked by Go's decoder.
    o.string("state")?;
    o.string("counter")?;
    Ok(EndpointIn {
        ip: o.string("endpointIP")?,
        target_port: o.int("targetPort", GoInt::I64)?,
        weight: o.int("weight", GoInt::I64)?,
    })
}

/// Full decode of the body (type errors win over schema errors because Go
/// decodes the whole body before go-openapi validates it).
fn decode_entry(bytes: &[u8]) -> Result<LbEntryIn, ApiError> {
    let Some(v) = parse_body(bytes)? else {
        return Err(ApiError::required("attr", "body"));
    };
    let map = body_object(&v, "LoadbalanceEntry")?;
    let top = GoObj::new(&map, "LoadbalanceEntry");
    let sa = top
        .object("serviceArguments", "LoadbalanceEntryServiceArguments")?
        .map(|o| decode_service_args(&o))
        .transpose()?;
    let endpoints = top
        .object_array("endpoints", "EndpointsItems0")?
        .map(|items| {
            items
                .iter()
                .map(|item| item.as_ref().map(decode_endpoint).transpose())
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    let secondary_ips = top
        .object_array("secondaryIPs", "SecondaryIPsItems0")?
        .unwrap_or_default()
        .iter()
        .map(|item| match item {
            Some(o) => o.string("secondaryIP").map(Option::unwrap_or_default),
            None => Ok(String::new()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let allowed_sources = top
        .object_array("allowedSources", "AllowedSourcesItems0")?
        .unwrap_or_default()
        .iter()
        .map(|item| match item {
            Some(o) => o.string("prefix").map(Option::unwrap_or_default),
            None => Ok(String::new()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LbEntryIn {
        sa,
        endpoints,
        secondary_ips,
        allowed_sources,
    })
}

fn check_enum_int(
    path: &str,
    v: i64,
    allowed: std::ops::RangeInclusive<i64>,
) -> Result<(), ApiError> {
    if allowed.contains(&v) {
        return Ok(());
    }
    let list = allowed.map(|i| i.to_string()).collect::<Vec<_>>().join(" ");
    Err(ApiError::enumeration(path, &Value::from(v), &list))
}

fn check_enum_str(path: &str, v: &str, allowed: &[&str]) -> Result<(), ApiError> {
    // go-swagger skips the enum check for zero values ("").
    if v.is_empty() || allowed.contains(&v) {
        return Ok(());
    }
    Err(ApiError::enumeration(
        path,
        &Value::from(v),
        &allowed.join(" "),
    ))
}

/// go-openapi schema validation of the decoded body, properties in the
/// generated (alphabetical) order; the first failure is reported.
fn schema_validate(e: &LbEntryIn) -> Result<(), ApiError> {
    let Some(endpoints) = &e.endpoints else {
        return Err(ApiError::required("endpoints", "body"));
    };
    for (i, ep) in endpoints.iter().enumerate() {
        // A `null` item is a nil pointer that go-swagger skips and loxilb's
        // handler would then dereference; report it as the missing field.
        let Some(ep) = ep else {
            return Err(ApiError::required(
                &format!("endpoints.{i}.endpointIP"),
                "body",
            ));
        };
        if ep.ip.is_none() {
            return Err(ApiError::required(
                &format!("endpoints.{i}.endpointIP"),
                "body",
            ));
        }
        if ep.target_port.is_none() {
            return Err(ApiError::required(
                &format!("endpoints.{i}.targetPort"),
                "body",
            ));
        }
        if ep.weight.is_none() {
            return Err(ApiError::required(&format!("endpoints.{i}.weight"), "body"));
        }
    }
    let Some(sa) = &e.sa else {
        return Err(ApiError::required("serviceArguments", "body"));
    };
    if sa.external_ip.is_none() {
        return Err(ApiError::required("serviceArguments.externalIP", "body"));
    }
    check_enum_int("serviceArguments.mode", sa.mode, 0..=5)?;
    check_enum_int("serviceArguments.oper", sa.oper, 0..=2)?;
    if sa.port.is_none() {
        return Err(ApiError::required("serviceArguments.port", "body"));
    }
    check_enum_str(
        "serviceArguments.probetype",
        &sa.probetype,
        PROBE_TYPES_SCHEMA,
    )?;
    check_enum_str("serviceArguments.protocol", &sa.protocol, PROTOCOLS)?;
    check_enum_int("serviceArguments.security", sa.security, 0..=2)?;
    check_enum_int("serviceArguments.sel", sa.sel, 0..=6)?;
    Ok(())
}

/// One endpoint after the handler's conversions.
#[derive(Debug, Clone)]
pub(crate) struct EndpointReq {
    pub ip: String,
    pub target_port: u16,
    pub weight: u8,
}

/// The request as loxilb's handler hands it to the core.
#[derive(Debug, Clone)]
pub(crate) struct LbRequest {
    pub external_ip: String,
    pub private_ip: String,
    pub port: u16,
    pub port_max: u16,
    pub protocol: String,
    pub sel: u8,
    pub mode: u8,
    pub security: u8,
    pub oper: u8,
    pub probetype: String,
    pub probeport: u16,
    pub probereq: String,
    pub proberesp: String,
    pub bgp: bool,
    pub monitor: bool,
    pub managed: bool,
    pub proxyprotocolv2: bool,
    pub egress: bool,
    pub block: u32,
    pub inactive_timeout: u32,
    pub probe_timeout: u32,
    pub probe_retries: i32,
    pub name: String,
    pub host: String,
    pub endpoints: Vec<EndpointReq>,
    pub secondary_ips: Vec<String>,
    pub allowed_sources: Vec<String>,
}

impl LbRequest {
    /// Handler conversions. Go integer conversions wrap (two's complement
    /// truncation); `as` does the same, which is the point here.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn from_entry(e: LbEntryIn) -> Self {
        let sa = e.sa.unwrap_or_default();
        let protocol = sa.protocol;
        // Secondary IPs are SCTP multihoming only: silently dropped otherwise.
        let secondary_ips = if protocol == "sctp" {
            e.secondary_ips
        } else {
            Vec::new()
        };
        let endpoints = e
            .endpoints
            .unwrap_or_default()
            .into_iter()
            .flatten()
            .map(|ep| EndpointReq {
                ip: ep.ip.unwrap_or_default(),
                target_port: ep.target_port.unwrap_or(0) as u16,
                weight: ep.weight.unwrap_or(0) as u8,
            })
            .collect();
        LbRequest {
            external_ip: sa.external_ip.unwrap_or_default(),
            private_ip: sa.private_ip,
            port: sa.port.unwrap_or(0) as u16,
            port_max: sa.port_max as u16,
            protocol,
            // Schema validation bounded these enums to small non-negative values.
            sel: sa.sel as u8,
            mode: sa.mode as u8,
            security: sa.security as u8,
            oper: sa.oper as u8,
            probetype: sa.probetype,
            probeport: sa.probeport as u16,
            probereq: sa.probereq,
            proberesp: sa.proberesp,
            bgp: sa.bgp,
            monitor: sa.monitor,
            managed: sa.managed,
            proxyprotocolv2: sa.proxyprotocolv2,
            egress: sa.egress,
            block: sa.block as u32,
            // int32 -> uint32: a negative value becomes huge and then fails
            // the 86400 limit, like on loxilb.
            inactive_timeout: sa.inactive_timeout as i32 as u32,
            probe_timeout: sa.probe_timeout as u32,
            probe_retries: sa.probe_retries as i32,
            name: sa.name,
            host: sa.host,
            endpoints,
            secondary_ips,
            allowed_sources: e.allowed_sources,
        }
    }

    /// DSR only works with hash selection; loxilb's handler answers this
    /// with HTTP 200 and an error text instead of an error status.
    pub(crate) fn dsr_quirk(&self) -> Option<&'static str> {
        (self.mode == 3 && self.sel != 1)
            .then_some("Error: Only Hash Selection criteria allowed for DSR mode")
    }
}

/// Steps 1 and 2: decode + schema + handler conversion.
pub(crate) fn decode_lb(bytes: &[u8]) -> Result<LbRequest, ApiError> {
    let entry = decode_entry(bytes)?;
    schema_validate(&entry)?;
    Ok(LbRequest::from_entry(entry))
}

/// Go `net.ParseIP` equivalent: IPv4-mapped IPv6 counts as IPv4.
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    match s.parse::<IpAddr>().ok()? {
        IpAddr::V6(v6) => Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)),
        v4 => Some(v4),
    }
}

/// Go `net.ParseCIDR`, returning the canonical network form ("10.0.0.0/24").
pub(crate) fn parse_cidr(s: &str) -> Option<String> {
    let (ip, len) = s.split_once('/')?;
    // Go accepts only plain decimal prefix lengths.
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) || len.len() > 3 {
        return None;
    }
    let len: u32 = len.parse().ok()?;
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(v4) if len <= 32 => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            let net = std::net::Ipv4Addr::from(u32::from(v4) & mask);
            Some(format!("{net}/{len}"))
        }
        IpAddr::V6(v6) if len <= 128 => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            let net = std::net::Ipv6Addr::from(u128::from(v6) & mask);
            Some(format!("{net}/{len}"))
        }
        _ => None,
    }
}

/// The request after the core's checks, with parsed addresses and
/// effective values.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    pub vip: IpAddr,
    pub private_ip: Option<IpAddr>,
    /// 0 for single-port rules (`portMax == port` is the same as 0).
    pub port_max: u16,
    pub inactive_timeout: u32,
    pub monitor: bool,
    pub endpoints: Vec<(IpAddr, u16, u8)>,
    /// Sorted ascending.
    pub secondary_ips: Vec<IpAddr>,
    /// Canonical CIDRs, request order.
    pub allowed_sources: Vec<String>,
}

/// Step 3: core argument checks in loxilb's order. Errors are raw core
/// strings (status derived later by the substring table).
pub(crate) fn core_check(r: &LbRequest) -> Result<Checked, String> {
    let err = |s: &str| Err(s.to_string());
    let Some(vip) = parse_ip(&r.external_ip) else {
        return err("malformed-service error");
    };
    let private_ip = if r.private_ip.is_empty() {
        None
    } else {
        match parse_ip(&r.private_ip) {
            Some(ip) => Some(ip),
            None => return err("malformed-service privateIP error"),
        }
    };
    if r.inactive_timeout > MAX_INACTIVE_TIMEOUT {
        return err("service-args error");
    }
    let inactive_timeout = match (r.inactive_timeout, r.protocol.as_str()) {
        (0, "tcp" | "sctp") => 240,
        (0, _) => 20,
        (t, _) => t,
    };
    match r.probetype.as_str() {
        "tcp" | "udp" | "sctp" if r.probeport == 0 => return err("malformed-service-pport error"),
        "tcp" | "udp" | "sctp" => {}
        "" | "ping" | "none" if r.probeport != 0 => return err("malformed-service-pport error"),
        "" | "ping" | "none" => {}
        // http/https pass the schema but the core rejects them (SPEC≠CODE).
        _ => return err("malformed-service-ptype error"),
    }
    if r.endpoints.is_empty() || r.endpoints.len() > MAX_ENDPOINTS {
        return err("endpoints-range error");
    }
    if r.protocol == "icmp" && (r.port != 0 || r.port_max != 0) {
        return err("malformed-service icmp-port error");
    }
    if r.proxyprotocolv2 && r.protocol != "tcp" {
        return err("proxy-proto-v2 not tcp service error");
    }
    if !PROTOCOLS.contains(&r.protocol.as_str()) {
        return err("malformed-proto error");
    }
    // Unreachable through the handler (it drops them), kept for fidelity.
    if !r.secondary_ips.is_empty() && r.protocol != "sctp" {
        return err("secondaryIP-args error");
    }
    if r.sel == 6 && r.protocol != "udp" {
        return err("non-udp-n3-args error");
    }
    if r.secondary_ips.len() > MAX_SECONDARY_IPS {
        return err("secondaryIP-args len error");
    }
    let port_max = if r.port_max == r.port { 0 } else { r.port_max };
    if port_max != 0 && port_max < r.port {
        return err("serv-port-args range error");
    }
    let mut secondary_ips = Vec::with_capacity(r.secondary_ips.len());
    for s in &r.secondary_ips {
        let Some(ip) = parse_ip(s) else {
            return err("malformed-secIP error");
        };
        if vip.is_ipv4() && ip.is_ipv6() {
            return err("malformed-secIP nat46 error");
        }
        secondary_ips.push(ip);
    }
    secondary_ips.sort();
    if r.mode == 5 && !vip.is_unspecified() {
        return err("hostarm-args error");
    }
    let mut endpoints = Vec::with_capacity(r.endpoints.len());
    for ep in &r.endpoints {
        let Some(ip) = parse_ip(&ep.ip) else {
            return err("malformed-lbep error");
        };
        if vip.is_ipv4() && ip.is_ipv6() {
            return err("malformed-lbep nat46 error");
        }
        if r.protocol == "icmp" && ep.target_port != 0 {
            return err("malformed-lbep icmp-port error");
        }
        if r.mode == 3 && ep.target_port != r.port {
            return err("malformed-lbep dsr-port error");
        }
        endpoints.push((ip, ep.target_port, ep.weight));
    }
    let mut allowed_sources = Vec::with_capacity(r.allowed_sources.len());
    for p in &r.allowed_sources {
        match parse_cidr(p) {
            Some(c) => allowed_sources.push(c),
            None => return err("rule-allowed-src error"),
        }
    }
    Ok(Checked {
        vip,
        private_ip,
        port_max,
        inactive_timeout,
        monitor: r.monitor || !(r.probetype.is_empty() || r.probetype == "none"),
        endpoints,
        secondary_ips,
        allowed_sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_canonical() {
        assert_eq!(parse_cidr("10.1.2.3/8").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(parse_cidr("0.0.0.0/0").as_deref(), Some("0.0.0.0/0"));
        assert_eq!(
            parse_cidr("2001:db8::1/32").as_deref(),
            Some("2001:db8::/32")
        );
        assert!(parse_cidr("10.0.0.1").is_none());
        assert!(parse_cidr("10.0.0.1/33").is_none());
        assert!(parse_cidr("10.0.0.1/+3").is_none());
    }

    #[test]
    fn mapped_v6_is_v4() {
        assert!(parse_ip("::ffff:1.2.3.4").unwrap().is_ipv4());
        assert!(parse_ip("010.0.0.1").is_none());
    }
}
