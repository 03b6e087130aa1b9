//! What a Service asks for, read from its `loxilb.io/*` annotations (kube-loxilb's names and
//! spellings) on top of the operator's global defaults. Every bad value becomes a typed error
//! naming the annotation and the value, so it can be reported on the Service as it is.
//!
//! Two stages:
//! - [`parse_intent`] reads the annotations alone: each value, and the checks that need only
//!   annotations (DSR needs hash, probe type vs probe port, priority weights, ...).
//! - [`ServiceIntent::check_service`] checks the intent against the Service's ports and VIPs
//!   (proxy protocol v2 and n3 by protocol, host-one-arm vs allocated VIPs). The planner runs
//!   it; DSR's "target port == port" is checked there too, once targets are known.
//!
//! The user documentation of every annotation is `docs/annotations.md`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use thiserror::Error;

use crate::model::{EndpointSelection, NatMode, Probe, ProbeType, Protocol};

pub const ANN_LB_MODE: &str = "loxilb.io/lbmode";
pub const ANN_EP_SELECT: &str = "loxilb.io/epselect";
/// loxi-ccm's own: weights (percent) for `epselect: prio`. kube-loxilb has no equivalent.
pub const ANN_PRIO_WEIGHTS: &str = "loxilb.io/prio-weights";
pub const ANN_LIVENESS: &str = "loxilb.io/liveness";
pub const ANN_TIMEOUT: &str = "loxilb.io/timeout";
pub const ANN_PROBE_TYPE: &str = "loxilb.io/probetype";
pub const ANN_PROBE_PORT: &str = "loxilb.io/probeport";
pub const ANN_PROBE_REQ: &str = "loxilb.io/probereq";
pub const ANN_PROBE_RESP: &str = "loxilb.io/proberesp";
pub const ANN_PROBE_TIMEOUT: &str = "loxilb.io/probetimeout";
pub const ANN_PROBE_RETRIES: &str = "loxilb.io/proberetries";
pub const ANN_USE_POD_NETWORK: &str = "loxilb.io/usepodnetwork";
pub const ANN_MULTUS_NETS: &str = "loxilb.io/multus-nets";
pub const ANN_NODE_LABEL: &str = "loxilb.io/nodelabel";
pub const ANN_PREF_LOCAL_POD: &str = "loxilb.io/prefLocalPod";
pub const ANN_PROXY_PROTOCOL_V2: &str = "loxilb.io/useproxyprotov2";
/// kube-loxilb's name (its flag of this name never took effect): the Service's endpoints
/// are the addresses and ports of its EndpointSlices, also hand-made slices of a
/// selector-less Service pointing outside the cluster.
pub const ANN_USE_EXTERNAL_ENDPOINT: &str = "loxilb.io/useExternalEndpoint";
/// kube-loxilb's per-Service egress flag (`yes`/`no`): loxilb's rule field `egress`.
pub const ANN_EGRESS: &str = "loxilb.io/egress";

/// loxilb's upper bound for `inactiveTimeOut` and (silently) `probeTimeout`
/// (docs/loxilb-api.md#limits).
pub const MAX_TIMEOUT_SECS: u32 = 86_400;
/// Above this loxilb silently creates no prober (docs/loxilb-api.md#limits).
pub const MAX_PROBE_RETRIES: u32 = 100;
/// loxilb's endpoint limit, and so the most weights that can mean anything.
const MAX_WEIGHTS: usize = 32;

/// Operator-wide defaults (flags); annotations override them per Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Defaults {
    /// `--setLBMode`; overridden by `loxilb.io/lbmode`.
    pub mode: NatMode,
    /// `--monitor`: every Service's endpoints are probed. As in kube-loxilb,
    /// `loxilb.io/liveness` can turn probing on for a Service, never off while this is set.
    pub monitor: bool,
    /// `--usePodNetwork`; overridden by `loxilb.io/usepodnetwork`.
    pub use_pod_network: bool,
}

/// `loxilb.io/nodelabel`: `key` (label present, any value) or `key=value`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeLabelSelector {
    pub key: String,
    pub value: Option<String>,
}

impl NodeLabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match (&self.value, labels.get(&self.key)) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(want), Some(have)) => want == have,
        }
    }
}

impl std::fmt::Display for NodeLabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            None => f.write_str(&self.key),
            Some(v) => write!(f, "{}={v}", self.key),
        }
    }
}

/// The typed intent of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceIntent {
    pub mode: NatMode,
    pub selection: EndpointSelection,
    /// With [`EndpointSelection::Priority`] only: percentages for the endpoints in ascending
    /// (address, port) order; endpoints past the list share what is left of 100 equally.
    /// Empty = all endpoints share 100 equally.
    pub prio_weights: Vec<u8>,
    /// Effective: on when liveness says so or when an explicit probe type forces it.
    pub monitor: bool,
    /// `inactiveTimeOut` seconds; 0 = loxilb's default (240 tcp/sctp, 20 udp).
    pub inactive_timeout: u32,
    pub probe: Probe,
    /// Endpoints are pod addresses from EndpointSlices instead of node InternalIP:NodePort.
    /// Always true when `multus_networks` is non-empty.
    pub use_pod_network: bool,
    /// Multus network names (`namespace/name`, or `name` = in the Service's namespace), in
    /// annotation order; endpoint addresses are taken from these networks.
    pub multus_networks: Vec<String>,
    /// Only nodes matching this are endpoints (node endpoint mode only).
    pub node_selector: Option<NodeLabelSelector>,
    /// `loxilb.io/prefLocalPod`. Recorded only: the planner has no locality information
    /// about loxilb instances, so it does not change endpoint choice (docs/annotations.md).
    pub prefer_local_pod: bool,
    pub proxy_protocol_v2: bool,
    /// `loxilb.io/egress`.
    pub egress: bool,
}

impl ServiceIntent {
    /// The intent of a Service without annotations.
    pub fn from_defaults(defaults: Defaults) -> ServiceIntent {
        ServiceIntent {
            mode: defaults.mode,
            selection: EndpointSelection::RoundRobin,
            prio_weights: Vec::new(),
            monitor: defaults.monitor,
            inactive_timeout: 0,
            probe: Probe::default(),
            use_pod_network: defaults.use_pod_network,
            multus_networks: Vec::new(),
            node_selector: None,
            prefer_local_pod: false,
            proxy_protocol_v2: false,
            egress: false,
        }
    }

    /// Checks the intent against the Service's ports (number, protocol) and its VIPs.
    pub fn check_service(
        &self,
        ports: &[(u16, Protocol)],
        addresses: &[IpAddr],
    ) -> Result<(), AnnotationError> {
        if self.proxy_protocol_v2
            && let Some((port, protocol)) = ports.iter().find(|(_, p)| *p != Protocol::Tcp)
        {
            return Err(invalid(
                ANN_PROXY_PROTOCOL_V2,
                "yes",
                &format!(
                    "PROXY protocol v2 works only on TCP ports (loxilb rejects it otherwise), \
                     but port {port}/{} is not TCP",
                    protocol.as_loxilb().to_uppercase()
                ),
            ));
        }
        if self.selection == EndpointSelection::N3
            && let Some((port, protocol)) = ports.iter().find(|(_, p)| *p != Protocol::Udp)
        {
            return Err(invalid(
                ANN_EP_SELECT,
                "n3",
                &format!(
                    "n3 (GTP-U) selection works only on UDP ports (loxilb: non-udp-n3-args \
                     error), but port {port}/{} is not UDP",
                    protocol.as_loxilb().to_uppercase()
                ),
            ));
        }
        if self.mode == NatMode::HostOneArm
            && let Some(vip) = addresses.iter().find(|a| !a.is_unspecified())
        {
            return Err(invalid(
                ANN_LB_MODE,
                "hostonearm",
                &format!(
                    "hostonearm needs the unspecified VIP (0.0.0.0 or ::) and loxilb rejects it \
                     for any other (hostarm-args error); this Service has the allocated VIP \
                     {vip}, so hostonearm is not supported here (if the mode comes from \
                     --setLBMode, set loxilb.io/lbmode on the Service)"
                ),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {annotation}={} is invalid: {reason}", crate::text::shown(.value))]
pub struct AnnotationError {
    pub annotation: &'static str,
    pub value: String,
    pub reason: String,
}

impl AnnotationError {
    /// Stable category for Events and metrics.
    pub fn reason(&self) -> &'static str {
        "InvalidAnnotation"
    }
}

pub(crate) fn invalid(annotation: &'static str, value: &str, reason: &str) -> AnnotationError {
    AnnotationError {
        annotation,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// The value of an annotation, trimmed; an empty value counts as absent (kube-loxilb's rule).
fn get<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations
        .get(key)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// Like [`get`] but untrimmed: probe payloads may need their whitespace.
fn get_raw<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations
        .get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
}

fn yes_no(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<bool>, AnnotationError> {
    match get(annotations, key) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "yes" | "true" | "on" => Ok(Some(true)),
            "no" | "false" | "off" => Ok(Some(false)),
            _ => Err(invalid(key, v, "expected yes or no")),
        },
    }
}

fn number(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
    min: u32,
    max: u32,
    what: &str,
) -> Result<Option<u32>, AnnotationError> {
    let Some(v) = get(annotations, key) else {
        return Ok(None);
    };
    match v.parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ => Err(invalid(
            key,
            v,
            &format!("expected {what}: a whole number from {min} to {max}"),
        )),
    }
}

/// Parses the Service's annotations over `defaults`. Unknown `loxilb.io/*` keys are ignored
/// (they may belong to features of a newer version or to kube-loxilb).
pub fn parse_intent(
    annotations: &BTreeMap<String, String>,
    defaults: Defaults,
) -> Result<ServiceIntent, AnnotationError> {
    let mut intent = ServiceIntent::from_defaults(defaults);

    if let Some(v) = get(annotations, ANN_LB_MODE) {
        intent.mode = v.parse().map_err(|()| {
            invalid(
                ANN_LB_MODE,
                v,
                "expected one of default, onearm, fullnat, dsr, fullproxy, hostonearm",
            )
        })?;
    }

    if let Some(v) = get(annotations, ANN_EP_SELECT) {
        intent.selection = v.parse().map_err(|()| {
            invalid(
                ANN_EP_SELECT,
                v,
                "expected one of rr, roundrobin, hash, persist, lc, n2, n3, prio",
            )
        })?;
    }
    if let Some(v) = get(annotations, ANN_PRIO_WEIGHTS) {
        if intent.selection != EndpointSelection::Priority {
            return Err(invalid(
                ANN_PRIO_WEIGHTS,
                v,
                "weights are used only with loxilb.io/epselect: prio",
            ));
        }
        intent.prio_weights = parse_weights(v)?;
    }
    // loxilb accepts DSR only with hash selection and answers 200 with an error inside otherwise
    // (docs/loxilb-api.md#rejections-inside-a-200). Without `loxilb.io/epselect` hash is the
    // selection (the only one there is: `--lb-mode=dsr` alone must not fail every Service,
    // for an annotation none of them has); another selection asked for is refused here.
    if intent.mode == NatMode::Dsr && intent.selection != EndpointSelection::Hash {
        match get(annotations, ANN_EP_SELECT) {
            None => intent.selection = EndpointSelection::Hash,
            Some(value) => {
                return Err(invalid(
                    ANN_EP_SELECT,
                    value,
                    "lbmode dsr requires epselect hash",
                ));
            }
        }
    }

    if let Some(t) = number(
        annotations,
        ANN_TIMEOUT,
        0,
        MAX_TIMEOUT_SECS,
        "an idle timeout in seconds",
    )? {
        intent.inactive_timeout = t;
    }

    intent.probe = parse_probe(annotations)?;
    let liveness = yes_no(annotations, ANN_LIVENESS)?;
    if liveness == Some(false) && intent.probe.kind.forces_monitor() {
        return Err(invalid(
            ANN_LIVENESS,
            get(annotations, ANN_LIVENESS).unwrap_or("no"),
            &format!(
                "conflicts with {ANN_PROBE_TYPE}: {} (loxilb turns monitoring on for every \
                 probe type except none)",
                intent.probe.kind.as_loxilb()
            ),
        ));
    }
    intent.monitor = monitored(defaults.monitor, liveness, intent.probe.kind);

    let pod_network = yes_no(annotations, ANN_USE_POD_NETWORK)?;
    if let Some(v) = get(annotations, ANN_MULTUS_NETS) {
        intent.multus_networks = parse_networks(v)?;
        if pod_network == Some(false) {
            return Err(invalid(
                ANN_MULTUS_NETS,
                v,
                &format!(
                    "Multus endpoints are pod addresses, which conflicts with \
                     {ANN_USE_POD_NETWORK}: no"
                ),
            ));
        }
    }
    intent.use_pod_network =
        !intent.multus_networks.is_empty() || pod_network.unwrap_or(defaults.use_pod_network);
    if yes_no(annotations, ANN_USE_EXTERNAL_ENDPOINT)? == Some(true) {
        if pod_network == Some(false) {
            return Err(invalid(
                ANN_USE_EXTERNAL_ENDPOINT,
                get(annotations, ANN_USE_EXTERNAL_ENDPOINT).unwrap_or("yes"),
                &format!(
                    "endpoints from the EndpointSlices are what {ANN_USE_POD_NETWORK}: yes \
                     means, which conflicts with {ANN_USE_POD_NETWORK}: no"
                ),
            ));
        }
        intent.use_pod_network = true;
    }

    if let Some(v) = get(annotations, ANN_NODE_LABEL) {
        intent.node_selector = Some(parse_node_label(v)?);
    }
    intent.prefer_local_pod = yes_no(annotations, ANN_PREF_LOCAL_POD)?.unwrap_or(false);
    intent.proxy_protocol_v2 = yes_no(annotations, ANN_PROXY_PROTOCOL_V2)?.unwrap_or(false);
    crate::mtls::check_mtls(annotations)?;
    intent.egress = yes_no(annotations, ANN_EGRESS)?.unwrap_or(false);
    Ok(intent)
}

/// Whether the Service's endpoints are probed. kube-loxilb's rule, so that manifests move
/// over unchanged: `--monitor` probes every Service and `loxilb.io/liveness` can only add
/// probing (`yes`), never take it away (`no` counts only without `--monitor`); an explicit
/// probe type other than `none` always probes (loxilb turns monitoring on for it).
pub fn monitored(flag: bool, liveness: Option<bool>, probe: ProbeType) -> bool {
    flag || liveness == Some(true) || probe.forces_monitor()
}

fn parse_weights(v: &str) -> Result<Vec<u8>, AnnotationError> {
    let mut weights = Vec::new();
    for part in v.split(',') {
        let part = part.trim();
        match part.parse::<u8>() {
            Ok(w) if w <= 100 => weights.push(w),
            _ => {
                return Err(invalid(
                    ANN_PRIO_WEIGHTS,
                    v,
                    &format!(
                        "{} is not a percentage: expected a comma-separated list of \
                         whole numbers from 0 to 100",
                        crate::text::entry_of(v, part)
                    ),
                ));
            }
        }
    }
    if weights.len() > MAX_WEIGHTS {
        return Err(invalid(
            ANN_PRIO_WEIGHTS,
            v,
            &format!("at most {MAX_WEIGHTS} weights (loxilb's endpoint limit)"),
        ));
    }
    let sum: u32 = weights.iter().map(|w| u32::from(*w)).sum();
    if sum > 100 {
        return Err(invalid(
            ANN_PRIO_WEIGHTS,
            v,
            &format!("weights are percentages and must add up to at most 100, not {sum}"),
        ));
    }
    Ok(weights)
}

fn parse_probe(annotations: &BTreeMap<String, String>) -> Result<Probe, AnnotationError> {
    let kind = match get(annotations, ANN_PROBE_TYPE) {
        None => ProbeType::Default,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "tcp" => ProbeType::Tcp,
            "udp" => ProbeType::Udp,
            "sctp" => ProbeType::Sctp,
            "ping" => ProbeType::Ping,
            "none" => ProbeType::None,
            "http" | "https" => {
                return Err(invalid(
                    ANN_PROBE_TYPE,
                    v,
                    "loxilb does not support http/https probes on load-balancer rules: its \
                     API schema lists them, but the rule code rejects them (400 \
                     malformed-service-ptype error); use tcp (optionally with \
                     loxilb.io/probereq and loxilb.io/proberesp), udp, sctp, ping or none",
                ));
            }
            _ => {
                return Err(invalid(
                    ANN_PROBE_TYPE,
                    v,
                    "expected one of tcp, udp, sctp, ping, none",
                ));
            }
        },
    };
    let port = number(annotations, ANN_PROBE_PORT, 1, 65_535, "a port")?;
    let port = match (kind.needs_port(), port) {
        (true, Some(p)) => u16::try_from(p).unwrap_or(u16::MAX),
        (true, None) => {
            return Err(invalid(
                ANN_PROBE_PORT,
                "",
                &format!(
                    "required when {ANN_PROBE_TYPE} is {}: loxilb needs the port to probe",
                    kind.as_loxilb()
                ),
            ));
        }
        (false, None) => 0,
        (false, Some(_)) => {
            return Err(invalid(
                ANN_PROBE_PORT,
                get(annotations, ANN_PROBE_PORT).unwrap_or_default(),
                &format!(
                    "only allowed with {ANN_PROBE_TYPE} tcp, udp or sctp (loxilb rejects a \
                     probe port for ping, none or no probe type)"
                ),
            ));
        }
    };
    let payload = |key: &'static str| -> Result<String, AnnotationError> {
        match get_raw(annotations, key) {
            None => Ok(String::new()),
            Some(v) if kind.needs_port() => Ok(v.to_string()),
            Some(v) => Err(invalid(
                key,
                v,
                &format!("only used by {ANN_PROBE_TYPE} tcp, udp or sctp"),
            )),
        }
    };
    let request = payload(ANN_PROBE_REQ)?;
    let response = payload(ANN_PROBE_RESP)?;
    let timeout = number(
        annotations,
        ANN_PROBE_TIMEOUT,
        0,
        MAX_TIMEOUT_SECS,
        "a probe interval in seconds (0 = loxilb's 60)",
    )?
    .unwrap_or(0);
    let retries = number(
        annotations,
        ANN_PROBE_RETRIES,
        0,
        MAX_PROBE_RETRIES,
        "a number of retries (0 = loxilb's 2)",
    )?
    .unwrap_or(0);
    Ok(Probe {
        kind,
        port,
        request,
        response,
        timeout,
        retries,
    })
}

/// DNS-1123 label: what Kubernetes allows for namespace and NetworkAttachmentDefinition
/// names.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn parse_networks(v: &str) -> Result<Vec<String>, AnnotationError> {
    let mut nets: Vec<String> = Vec::new();
    for part in v.split(',') {
        let part = part.trim();
        let ok = match part.split_once('/') {
            Some((ns, name)) => is_dns_label(ns) && is_dns_label(name),
            None => is_dns_label(part),
        };
        if !ok {
            return Err(invalid(
                ANN_MULTUS_NETS,
                v,
                &format!(
                    "{} is not a network name: expected a comma-separated list of \
                     namespace/name (or name, in the Service's namespace)",
                    crate::text::entry_of(v, part)
                ),
            ));
        }
        if !nets.iter().any(|n| n == part) {
            nets.push(part.to_string());
        }
    }
    Ok(nets)
}

/// A Kubernetes label name: 1..=63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_label(prefix) && is_label_name(name),
        None => is_label_name(s),
    }
}

fn parse_node_label(v: &str) -> Result<NodeLabelSelector, AnnotationError> {
    let (key, value) = match v.split_once('=') {
        Some((k, val)) => (k.trim(), Some(val.trim())),
        None => (v, None),
    };
    if !is_label_key(key) {
        return Err(invalid(
            ANN_NODE_LABEL,
            v,
            &format!("{key:?} is not a label key: expected key or key=value"),
        ));
    }
    if let Some(val) = value
        && !val.is_empty()
        && !is_label_name(val)
    {
        return Err(invalid(
            ANN_NODE_LABEL,
            v,
            &format!("{val:?} is not a label value"),
        ));
    }
    Ok(NodeLabelSelector {
        key: key.to_string(),
        value: value.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<ServiceIntent, AnnotationError> {
        parse_intent(&ann(pairs), Defaults::default())
    }

    fn err(pairs: &[(&str, &str)]) -> AnnotationError {
        parse(pairs).unwrap_err()
    }

    #[test]
    fn defaults_apply_without_annotations() {
        let d = Defaults {
            mode: NatMode::FullNat,
            monitor: true,
            use_pod_network: true,
        };
        let i = parse_intent(&BTreeMap::new(), d).unwrap();
        assert_eq!(i, ServiceIntent::from_defaults(d));
        assert_eq!(i.mode, NatMode::FullNat);
        assert!(i.monitor && i.use_pod_network);
        assert_eq!(i.selection, EndpointSelection::RoundRobin);
        assert_eq!(i.probe, Probe::default());
        assert_eq!(i.inactive_timeout, 0);
    }

    #[test]
    fn annotations_override() {
        let i = parse_intent(
            &ann(&[
                (ANN_LB_MODE, "dsr"),
                (ANN_EP_SELECT, "hash"),
                (ANN_LIVENESS, "no"),
                (ANN_USE_POD_NETWORK, "no"),
            ]),
            Defaults {
                mode: NatMode::Default,
                monitor: true,
                use_pod_network: true,
            },
        )
        .unwrap();
        assert_eq!(i.mode, NatMode::Dsr);
        assert_eq!(i.selection, EndpointSelection::Hash);
        assert!(!i.use_pod_network);
    }

    /// kube-loxilb's rule: `--monitor` probes every Service whatever `loxilb.io/liveness`
    /// says; the annotation turns probing on, and off only where `--monitor` is not set.
    #[test]
    fn liveness_no_does_not_turn_monitor_off() {
        let with = |monitor: bool, liveness: &str| {
            let d = Defaults {
                monitor,
                ..Defaults::default()
            };
            parse_intent(&ann(&[(ANN_LIVENESS, liveness)]), d)
                .unwrap()
                .monitor
        };
        assert!(with(true, "no"), "--monitor wins over liveness: no");
        assert!(with(true, "yes"));
        assert!(with(false, "yes"));
        assert!(!with(false, "no"));
        assert!(monitored(false, None, ProbeType::Ping));
        assert!(!monitored(false, None, ProbeType::Default));
    }

    #[test]
    fn every_annotation_parses() {
        let i = parse(&[
            (ANN_LB_MODE, "fullnat"),
            (ANN_EP_SELECT, "prio"),
            (ANN_PRIO_WEIGHTS, "50, 30,20"),
            (ANN_TIMEOUT, "600"),
            (ANN_PROBE_TYPE, "TCP"),
            (ANN_PROBE_PORT, "8080"),
            (ANN_PROBE_REQ, "GET /health HTTP/1.0\r\n\r\n"),
            (ANN_PROBE_RESP, "200 OK"),
            (ANN_PROBE_TIMEOUT, "10"),
            (ANN_PROBE_RETRIES, "3"),
            (ANN_MULTUS_NETS, "default/macvlan1, net2"),
            (ANN_NODE_LABEL, "node-role.kubernetes.io/edge=true"),
            (ANN_PREF_LOCAL_POD, "yes"),
            (ANN_PROXY_PROTOCOL_V2, "yes"),
            (ANN_EGRESS, "yes"),
            ("loxilb.io/somethingnew", "whatever"),
        ])
        .unwrap();
        assert_eq!(i.mode, NatMode::FullNat);
        assert_eq!(i.selection, EndpointSelection::Priority);
        assert_eq!(i.prio_weights, vec![50, 30, 20]);
        assert_eq!(i.inactive_timeout, 600);
        assert_eq!(
            i.probe,
            Probe {
                kind: ProbeType::Tcp,
                port: 8080,
                request: "GET /health HTTP/1.0\r\n\r\n".into(),
                response: "200 OK".into(),
                timeout: 10,
                retries: 3,
            }
        );
        assert!(i.monitor, "an explicit probe type forces monitoring");
        assert!(i.use_pod_network, "multus implies pod-network endpoints");
        assert_eq!(i.multus_networks, vec!["default/macvlan1", "net2"]);
        assert_eq!(
            i.node_selector,
            Some(NodeLabelSelector {
                key: "node-role.kubernetes.io/edge".into(),
                value: Some("true".into())
            })
        );
        assert!(i.prefer_local_pod && i.proxy_protocol_v2 && i.egress);
        // Every epselect spelling.
        for (v, sel) in [
            ("rr", EndpointSelection::RoundRobin),
            ("roundrobin", EndpointSelection::RoundRobin),
            ("hash", EndpointSelection::Hash),
            ("persist", EndpointSelection::Persist),
            ("lc", EndpointSelection::LeastConnections),
            ("n2", EndpointSelection::N2),
            ("n3", EndpointSelection::N3),
            ("prio", EndpointSelection::Priority),
        ] {
            assert_eq!(parse(&[(ANN_EP_SELECT, v)]).unwrap().selection, sel, "{v}");
        }
        for (v, mode) in [
            ("default", NatMode::Default),
            ("onearm", NatMode::OneArm),
            ("fullnat", NatMode::FullNat),
            ("fullproxy", NatMode::FullProxy),
            ("hostonearm", NatMode::HostOneArm),
        ] {
            assert_eq!(parse(&[(ANN_LB_MODE, v)]).unwrap().mode, mode, "{v}");
        }
        // An empty value counts as absent, like kube-loxilb.
        assert_eq!(parse(&[(ANN_LB_MODE, "")]).unwrap().mode, NatMode::Default);
        let key_only = parse(&[(ANN_NODE_LABEL, "edge")]).unwrap().node_selector;
        assert_eq!(key_only.as_ref().map(|s| s.value.is_none()), Some(true));
        assert_eq!(parse(&[(ANN_PROBE_TYPE, "none")]).unwrap().probe.port, 0);
        let ping = parse(&[(ANN_PROBE_TYPE, "ping")]).unwrap();
        assert!(ping.monitor && ping.probe.kind == ProbeType::Ping);
    }

    #[test]
    fn bad_values_name_annotation_and_value() {
        let e = err(&[(ANN_LB_MODE, "fastest")]);
        assert_eq!(e.annotation, ANN_LB_MODE);
        assert_eq!(e.value, "fastest");
        assert!(e.to_string().contains("loxilb.io/lbmode=\"fastest\""));
        for (key, value) in [
            (ANN_EP_SELECT, "random"),
            (ANN_LIVENESS, "maybe"),
            (ANN_TIMEOUT, "86401"),
            (ANN_TIMEOUT, "-1"),
            (ANN_TIMEOUT, "1h"),
            (ANN_PROBE_TYPE, "grpc"),
            (ANN_PROBE_TIMEOUT, "86401"),
            (ANN_PROBE_RETRIES, "101"),
            (ANN_USE_POD_NETWORK, "sometimes"),
            (ANN_MULTUS_NETS, "ns/Bad_Name"),
            (ANN_MULTUS_NETS, "a,,b"),
            (ANN_NODE_LABEL, "=x"),
            (ANN_NODE_LABEL, "k=bad value"),
            (ANN_PREF_LOCAL_POD, "1x"),
            (ANN_PROXY_PROTOCOL_V2, "v2"),
        ] {
            let e = err(&[(key, value)]);
            assert_eq!((e.annotation, e.value.as_str()), (key, value), "{e}");
        }
    }

    #[test]
    fn http_probes_are_rejected_citing_loxilb() {
        for v in ["http", "https"] {
            let e = err(&[(ANN_PROBE_TYPE, v), (ANN_PROBE_PORT, "80")]);
            assert_eq!(e.annotation, ANN_PROBE_TYPE);
            assert_eq!(e.value, v);
            assert!(e.reason.contains("malformed-service-ptype"), "{e}");
        }
    }

    #[test]
    fn probe_port_rules() {
        for t in ["tcp", "udp", "sctp"] {
            let e = err(&[(ANN_PROBE_TYPE, t)]);
            assert_eq!(e.annotation, ANN_PROBE_PORT, "{t}");
            assert!(e.reason.contains("required"));
        }
        for t in ["ping", "none"] {
            let e = err(&[(ANN_PROBE_TYPE, t), (ANN_PROBE_PORT, "80")]);
            assert_eq!((e.annotation, e.value.as_str()), (ANN_PROBE_PORT, "80"));
        }
        assert_eq!(err(&[(ANN_PROBE_PORT, "80")]).annotation, ANN_PROBE_PORT);
        for p in ["0", "65536", "http"] {
            let e = err(&[(ANN_PROBE_TYPE, "tcp"), (ANN_PROBE_PORT, p)]);
            assert_eq!((e.annotation, e.value.as_str()), (ANN_PROBE_PORT, p));
        }
        assert_eq!(
            err(&[(ANN_PROBE_TYPE, "ping"), (ANN_PROBE_REQ, "x")]).annotation,
            ANN_PROBE_REQ
        );
        assert_eq!(err(&[(ANN_PROBE_RESP, "x")]).annotation, ANN_PROBE_RESP);
        let e = err(&[
            (ANN_PROBE_TYPE, "tcp"),
            (ANN_PROBE_PORT, "80"),
            (ANN_LIVENESS, "no"),
        ]);
        assert_eq!(e.annotation, ANN_LIVENESS);
    }

    /// Found by fuzzing (tests/fuzz_parsers.rs): `--lb-mode=dsr` made every Service without
    /// annotations fail, blamed on a `loxilb.io/epselect` none of them had.
    #[test]
    fn dsr_by_flag_selects_hash_for_services_without_epselect() {
        let defaults = Defaults {
            mode: NatMode::Dsr,
            ..Defaults::default()
        };
        let intent = parse_intent(&BTreeMap::new(), defaults).unwrap();
        assert_eq!(intent.mode, NatMode::Dsr);
        assert_eq!(intent.selection, EndpointSelection::Hash);
        let asked = BTreeMap::from([(ANN_EP_SELECT.to_string(), "rr".to_string())]);
        assert_eq!(
            parse_intent(&asked, defaults).unwrap_err().annotation,
            ANN_EP_SELECT
        );
    }

    #[test]
    fn combinations() {
        // DSR needs hash (loxilb answers 200 with an error otherwise): the selection when
        // none is asked for, refused when another one is.
        let dsr = parse_intent(
            &BTreeMap::from([(ANN_LB_MODE.to_string(), "dsr".to_string())]),
            Defaults::default(),
        )
        .unwrap();
        assert_eq!(dsr.selection, EndpointSelection::Hash);
        let e = err(&[(ANN_LB_MODE, "dsr"), (ANN_EP_SELECT, "lc")]);
        assert_eq!((e.annotation, e.value.as_str()), (ANN_EP_SELECT, "lc"));
        // Weights only with prio, as percentages.
        assert_eq!(
            err(&[(ANN_PRIO_WEIGHTS, "50,50")]).annotation,
            ANN_PRIO_WEIGHTS
        );
        for w in ["60,50", "101", "50,x", "50,", "-1"] {
            let e = err(&[(ANN_EP_SELECT, "prio"), (ANN_PRIO_WEIGHTS, w)]);
            assert_eq!((e.annotation, e.value.as_str()), (ANN_PRIO_WEIGHTS, w));
        }
        // Multus endpoints are pod addresses.
        let e = err(&[(ANN_MULTUS_NETS, "net1"), (ANN_USE_POD_NETWORK, "no")]);
        assert_eq!(e.annotation, ANN_MULTUS_NETS);
    }

    #[test]
    fn external_endpoints_come_from_the_slices() {
        let with = |pairs: &[(&str, &str)], defaults: Defaults| {
            let a = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            parse_intent(&a, defaults)
        };
        let on = with(&[(ANN_USE_EXTERNAL_ENDPOINT, "yes")], Defaults::default()).unwrap();
        assert!(on.use_pod_network);
        let on = with(&[(ANN_USE_EXTERNAL_ENDPOINT, "true")], Defaults::default()).unwrap();
        assert!(on.use_pod_network);
        // "no" takes nothing away from --usePodNetwork.
        let pods = Defaults {
            use_pod_network: true,
            ..Defaults::default()
        };
        assert!(
            with(&[(ANN_USE_EXTERNAL_ENDPOINT, "no")], pods)
                .unwrap()
                .use_pod_network
        );
        assert!(
            !with(&[(ANN_USE_EXTERNAL_ENDPOINT, "no")], Defaults::default())
                .unwrap()
                .use_pod_network
        );
        let e = err(&[
            (ANN_USE_EXTERNAL_ENDPOINT, "yes"),
            (ANN_USE_POD_NETWORK, "no"),
        ]);
        assert_eq!(e.annotation, ANN_USE_EXTERNAL_ENDPOINT);
        let e = err(&[(ANN_USE_EXTERNAL_ENDPOINT, "maybe")]);
        assert_eq!(e.annotation, ANN_USE_EXTERNAL_ENDPOINT);
    }

    #[test]
    fn mtls_requests_are_refused_on_the_service() {
        let e = err(&[(crate::mtls::ANN_MTLS_FRONTEND_MODE, "required")]);
        assert_eq!(e.annotation, crate::mtls::ANN_MTLS_FRONTEND_MODE);
        assert_eq!(e.reason(), "InvalidAnnotation");
    }

    #[test]
    fn service_checks() {
        let vip: IpAddr = "192.0.2.1".parse().unwrap();
        let tcp = [(80, Protocol::Tcp)];
        let mixed = [(80, Protocol::Tcp), (53, Protocol::Udp)];
        let i = parse(&[(ANN_PROXY_PROTOCOL_V2, "yes")]).unwrap();
        assert_eq!(i.check_service(&tcp, &[vip]), Ok(()));
        let e = i.check_service(&mixed, &[vip]).unwrap_err();
        assert_eq!(e.annotation, ANN_PROXY_PROTOCOL_V2);
        assert!(e.reason.contains("53/UDP"), "{e}");

        let i = parse(&[(ANN_EP_SELECT, "n3")]).unwrap();
        assert_eq!(i.check_service(&[(2152, Protocol::Udp)], &[vip]), Ok(()));
        let e = i.check_service(&mixed, &[vip]).unwrap_err();
        assert_eq!((e.annotation, e.value.as_str()), (ANN_EP_SELECT, "n3"));

        let i = parse(&[(ANN_LB_MODE, "hostonearm")]).unwrap();
        let e = i.check_service(&tcp, &[vip]).unwrap_err();
        assert_eq!(
            (e.annotation, e.value.as_str()),
            (ANN_LB_MODE, "hostonearm")
        );
        assert!(e.reason.contains("192.0.2.1"));
        assert_eq!(i.check_service(&tcp, &["0.0.0.0".parse().unwrap()]), Ok(()));
    }

    #[test]
    fn node_label_selector_matches() {
        let labels: BTreeMap<String, String> = [("edge".to_string(), "true".to_string())]
            .into_iter()
            .collect();
        let key = |k: &str, v: Option<&str>| NodeLabelSelector {
            key: k.into(),
            value: v.map(str::to_string),
        };
        assert!(key("edge", None).matches(&labels));
        assert!(key("edge", Some("true")).matches(&labels));
        assert!(!key("edge", Some("false")).matches(&labels));
        assert!(!key("core", None).matches(&labels));
        assert_eq!(key("edge", Some("true")).to_string(), "edge=true");
    }
}
