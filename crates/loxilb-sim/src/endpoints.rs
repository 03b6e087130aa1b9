//! Endpoint health: loxilb's per-endpoint probe objects (`/config/endpoint`) and the
//! `active`/`inactive` state of rule endpoints (docs/loxilb-api.md#endpoint-health).
//!
//! A real loxilb probes endpoints itself; the simulator has no network to probe, so a test
//! says which endpoint addresses are unreachable (an admin call), and the state is computed
//! when it is read: an endpoint of a rule with `monitor` on turns `inactive` once it has been
//! unreachable for the probe interval times the retries (loxilb's defaults: 60 s and 2), and
//! is `active` again as soon as it is reachable. Computed on read rather than by timers, so
//! the answer depends only on the clock and the marks.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use crate::decode::{GoInt, GoObj, body_object, parse_body};
use crate::errors::ApiError;

/// loxilb's probe interval when a rule gives none (`probeTimeout` 0).
const DEFAULT_PROBE_INTERVAL_S: u64 = 60;
/// loxilb's failed probes before an endpoint is inactive (`probeRetries` 0).
const DEFAULT_PROBE_RETRIES: u64 = 2;
const PROBE_TYPES: &[&str] = &["tcp", "udp", "sctp", "ping", "http", "https", "none"];
const MAX_RETRIES: i64 = 100;
const MAX_DURATION_S: i64 = 86_400;

/// Endpoint addresses a test marked unreachable, with the moment it did. Not loxilb state
/// (a restart keeps it): it stands for the network the probes would cross.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    unreachable_since: HashMap<IpAddr, Instant>,
}

impl Reachability {
    pub(crate) fn set(&mut self, ip: IpAddr, reachable: bool) {
        if reachable {
            self.unreachable_since.remove(&ip);
        } else {
            self.unreachable_since
                .entry(ip)
                .or_insert_with(Instant::now);
        }
    }

    /// Whether probes every `interval_s` with `retries` failures allowed have given up on
    /// `ip` by `now` (0 means loxilb's default for both).
    pub(crate) fn failed(&self, ip: &IpAddr, interval_s: u64, retries: u64, now: Instant) -> bool {
        let interval = if interval_s == 0 {
            DEFAULT_PROBE_INTERVAL_S
        } else {
            interval_s
        };
        let retries = if retries == 0 {
            DEFAULT_PROBE_RETRIES
        } else {
            retries
        };
        self.unreachable_since.get(ip).is_some_and(|since| {
            now.saturating_duration_since(*since) >= Duration::from_secs(interval * retries)
        })
    }
}

/// A probe object posted with `POST /config/endpoint`.
#[derive(Debug, Clone)]
pub(crate) struct EpObject {
    pub(crate) host: IpAddr,
    pub(crate) probe_type: String,
    pub(crate) probe_port: u16,
    pub(crate) probe_req: String,
    pub(crate) probe_resp: String,
    pub(crate) duration_s: u32,
    pub(crate) retries: u32,
}

/// The probe object a rule creates for one of its endpoints.
#[derive(Debug, Clone)]
pub(crate) struct ImplicitEp {
    pub(crate) key: String,
    pub(crate) host: IpAddr,
    /// `None` when probing is off for the rule (`monitor` false).
    pub(crate) probe: Option<(String, u16, u32, u32)>,
}

/// The key loxilb gives the probe object of a rule endpoint: `<ip>_<proto>_<port>`, and
/// `<ip>_ping_0` for icmp rules.
pub(crate) fn implicit_key(ip: &IpAddr, protocol: &str, target_port: u16) -> String {
    if protocol == "icmp" {
        format!("{ip}_ping_0")
    } else {
        format!("{ip}_{protocol}_{target_port}")
    }
}

/// Decodes and checks a `POST /config/endpoint` body: its key and the object.
pub(crate) fn decode_post(bytes: &[u8]) -> Result<(String, EpObject), ApiError> {
    let Some(v) = parse_body(bytes)? else {
        return Err(ApiError::required("attr", "body"));
    };
    let map = body_object(&v, "EndPoint")?;
    let o = GoObj::new(&map, "EndPoint");
    let host = o.string("hostName")?;
    let name = o.string("name")?.unwrap_or_default();
    let probe_type = o.string("probeType")?.unwrap_or_default();
    let probe_port = o.int("probePort", GoInt::I64)?.unwrap_or(0);
    let probe_req = o.string("probeReq")?.unwrap_or_default();
    let probe_resp = o.string("probeResp")?.unwrap_or_default();
    let duration = o.int("probeDuration", GoInt::I64)?.unwrap_or(0);
    let retries = o.int("inactiveReTries", GoInt::I64)?.unwrap_or(0);
    // go-openapi: the required field first, then the enum (an empty string skips it).
    let Some(host) = host else {
        return Err(ApiError::required("hostName", "body"));
    };
    if !probe_type.is_empty() && !PROBE_TYPES.contains(&probe_type.as_str()) {
        return Err(ApiError::enumeration(
            "probeType",
            &Value::from(probe_type.as_str()),
            &PROBE_TYPES.join(" "),
        ));
    }
    // loxilb's own checks.
    let host: IpAddr = host
        .parse()
        .map_err(|_| ApiError::handler("host-parse error"))?;
    if probe_type.is_empty() {
        return Err(ApiError::handler("host-args unknown probe type"));
    }
    if matches!(probe_type.as_str(), "tcp" | "udp" | "sctp") && probe_port == 0 {
        return Err(ApiError::handler("host-args error: probe port needed"));
    }
    if !(0..=MAX_RETRIES).contains(&retries) || !(0..=MAX_DURATION_S).contains(&duration) {
        return Err(ApiError::handler("host-args error: retries or duration"));
    }
    let probe_port = u16::try_from(probe_port)
        .map_err(|_| ApiError::handler("host-args error: probe port out of range"))?;
    let key = if name.is_empty() {
        format!("{host}_{probe_type}_{probe_port}")
    } else {
        name
    };
    let object = EpObject {
        host,
        probe_type,
        probe_port,
        probe_req,
        probe_resp,
        duration_s: u32::try_from(duration).unwrap_or(0),
        retries: u32::try_from(retries).unwrap_or(0),
    };
    Ok((key, object))
}

/// `GET /config/endpoint/all`: the objects rules created (first rule per key), then the
/// posted ones (a posted object with the key of an implicit one replaces its options).
pub(crate) fn list(
    implicit: &[ImplicitEp],
    posted: &BTreeMap<String, EpObject>,
    reach: &Reachability,
    now: Instant,
) -> Value {
    let mut attrs: BTreeMap<String, Value> = BTreeMap::new();
    for ep in implicit {
        if attrs.contains_key(&ep.key) {
            continue;
        }
        let mut m = Map::new();
        m.insert("hostName".into(), json!(ep.host.to_string()));
        m.insert("name".into(), json!(ep.key));
        let ok = match &ep.probe {
            Some((kind, port, duration, retries)) => {
                m.insert("probeType".into(), json!(kind));
                m.insert("probePort".into(), json!(port));
                m.insert("probeDuration".into(), json!(effective(*duration, 60)));
                m.insert("inactiveReTries".into(), json!(effective(*retries, 2)));
                !reach.failed(&ep.host, (*duration).into(), (*retries).into(), now)
            }
            None => {
                m.insert("probeType".into(), json!("none"));
                true
            }
        };
        m.insert("currState".into(), json!(if ok { "ok" } else { "nok" }));
        attrs.insert(ep.key.clone(), Value::Object(m));
    }
    for (key, o) in posted {
        let probing = o.probe_type != "none";
        let ok = !probing || !reach.failed(&o.host, o.duration_s.into(), o.retries.into(), now);
        let mut m = Map::new();
        m.insert("hostName".into(), json!(o.host.to_string()));
        m.insert("name".into(), json!(key));
        m.insert("probeType".into(), json!(o.probe_type));
        if o.probe_port != 0 {
            m.insert("probePort".into(), json!(o.probe_port));
        }
        if !o.probe_req.is_empty() {
            m.insert("probeReq".into(), json!(o.probe_req));
        }
        if !o.probe_resp.is_empty() {
            m.insert("probeResp".into(), json!(o.probe_resp));
        }
        if probing {
            m.insert("probeDuration".into(), json!(effective(o.duration_s, 60)));
            m.insert("inactiveReTries".into(), json!(effective(o.retries, 2)));
        }
        m.insert("currState".into(), json!(if ok { "ok" } else { "nok" }));
        attrs.insert(key.clone(), Value::Object(m));
    }
    json!({ "Attr": attrs.into_values().collect::<Vec<_>>() })
}

fn effective(v: u32, default: u32) -> u32 {
    if v == 0 { default } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_fails_after_interval_times_retries() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut r = Reachability::default();
        let t0 = Instant::now();
        assert!(!r.failed(&ip, 1, 1, t0));
        r.set(ip, false);
        assert!(!r.failed(&ip, 2, 3, t0));
        assert!(r.failed(&ip, 2, 3, t0 + Duration::from_secs(7)));
        assert!(!r.failed(&ip, 0, 0, t0 + Duration::from_secs(119)));
        r.set(ip, true);
        assert!(!r.failed(&ip, 2, 3, t0 + Duration::from_secs(7)));
    }

    #[test]
    fn keys_follow_loxilb() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(implicit_key(&ip, "tcp", 8080), "10.0.0.1_tcp_8080");
        assert_eq!(implicit_key(&ip, "icmp", 0), "10.0.0.1_ping_0");
    }
}
