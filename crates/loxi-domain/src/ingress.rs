//! The form a Service's addresses are published in (`status.loadBalancer.ingress[]`), and
//! the `loxilb.io/ingress-mode` annotation that overrides it.
//!
//! Each form decides what kube-proxy does with in-cluster traffic to the address:
//!
//! - `ipMode: VIP`: kube-proxy short-circuits the address, pods and nodes reach the
//!   endpoints directly without going through loxilb.
//! - `ipMode: Proxy` (Kubernetes >= 1.30): kube-proxy leaves the address alone, in-cluster
//!   traffic goes to loxilb like external traffic does.
//! - `hostname: llb-<ip>`: kube-loxilb's form, for the same purpose on clusters older than
//!   1.30 (kube-proxy never programs a hostname). IPv6 addresses cannot be written so (a
//!   hostname may not contain `:`), they are published as `ipMode: Proxy` instead.

use std::collections::BTreeMap;

use crate::intent::{ANN_LB_MODE, AnnotationError, Defaults, invalid, parse_intent};
use crate::model::NatMode;

/// How the Service's addresses are published: `vip`, `proxy` or `hostname`.
pub const ANN_INGRESS_MODE: &str = "loxilb.io/ingress-mode";

/// The form of the Service's ingress entries (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IngressMode {
    /// `ip` with `ipMode: VIP`: kube-proxy serves in-cluster clients itself.
    #[default]
    Vip,
    /// `ip` with `ipMode: Proxy`: in-cluster clients go through loxilb too.
    Proxy,
    /// `hostname: llb-<ip>` (kube-loxilb's form): in-cluster clients go through loxilb, on
    /// any Kubernetes version.
    Hostname,
}

fn annotation<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations
        .get(key)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

impl IngressMode {
    /// The default for a NAT mode: `Proxy` wherever in-cluster clients would get something
    /// else than external ones if kube-proxy answered for loxilb.
    ///
    /// - `default` (DNAT): loxilb only rewrites the destination to an endpoint and keeps the
    ///   client's address, which is what kube-proxy does for the VIP too. `VIP` spares
    ///   in-cluster traffic a detour through loxilb.
    /// - `onearm`, `fullnat`: loxilb also rewrites the source to its own address and picks
    ///   endpoints by its own selection and health probes; the endpoints see (and answer)
    ///   loxilb. Short-circuited clients would get kube-proxy's behaviour instead: `Proxy`.
    /// - `dsr`: loxilb forwards the packet unchanged (destination still the VIP) to the
    ///   endpoint's node. If kube-proxy programmed the VIP, that node would load-balance the
    ///   packet a second time, possibly to another node: `Proxy` is required.
    /// - `fullproxy`: loxilb terminates connections (L7, TLS); a short-circuit would bypass
    ///   the proxy entirely: `Proxy`.
    /// - `hostonearm`: loxilb serves on the host's own addresses: `Proxy`.
    ///
    /// PROXY protocol v2 (`loxilb.io/useproxyprotov2`) forces `Proxy` in every mode: the
    /// endpoints expect the header loxilb adds, which short-circuited connections lack.
    pub fn for_nat_mode(mode: NatMode, proxy_protocol_v2: bool) -> IngressMode {
        match mode {
            NatMode::Default if !proxy_protocol_v2 => IngressMode::Vip,
            _ => IngressMode::Proxy,
        }
    }

    /// The annotation's value, if set. A bad value is an error to report on the Service.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<IngressMode>, AnnotationError> {
        let Some(raw) = annotation(annotations, ANN_INGRESS_MODE) else {
            return Ok(None);
        };
        match raw.to_ascii_lowercase().as_str() {
            "vip" => Ok(Some(IngressMode::Vip)),
            "proxy" => Ok(Some(IngressMode::Proxy)),
            "hostname" => Ok(Some(IngressMode::Hostname)),
            _ => Err(invalid(
                ANN_INGRESS_MODE,
                raw,
                "expected one of vip, proxy, hostname",
            )),
        }
    }

    /// The form for a Service with `annotations` that shows its addresses as `shown` now:
    /// the annotation, else its NAT mode's default. Never fails: with a bad annotation the
    /// form shown stays as it is (as rules do, until the owner fixes it; the error itself is
    /// reported by the reconcile).
    pub fn choose(
        annotations: &BTreeMap<String, String>,
        shown: Option<IngressMode>,
        defaults: Defaults,
    ) -> IngressMode {
        match IngressMode::from_annotations(annotations) {
            Ok(Some(mode)) => return mode,
            Ok(None) => {}
            Err(_) => {
                if let Some(shown) = shown {
                    return shown;
                }
            }
        }
        match parse_intent(annotations, defaults) {
            Ok(intent) => IngressMode::for_nat_mode(intent.mode, intent.proxy_protocol_v2),
            // Another annotation is bad: go by the NAT mode alone.
            Err(_) => {
                let mode = annotation(annotations, ANN_LB_MODE)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(defaults.mode);
                IngressMode::for_nat_mode(mode, false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_annotation_wins_and_a_bad_one_keeps_what_is_shown() {
        let defaults = Defaults::default();
        let a = annotations(&[(ANN_INGRESS_MODE, "Hostname")]);
        assert_eq!(
            IngressMode::choose(&a, None, defaults),
            IngressMode::Hostname
        );
        let bad = annotations(&[(ANN_INGRESS_MODE, "sideways")]);
        assert!(IngressMode::from_annotations(&bad).is_err());
        assert_eq!(
            IngressMode::choose(&bad, Some(IngressMode::Proxy), defaults),
            IngressMode::Proxy
        );
        let fullnat = annotations(&[(ANN_LB_MODE, "fullnat")]);
        assert_eq!(
            IngressMode::choose(&fullnat, None, defaults),
            IngressMode::Proxy
        );
        assert_eq!(
            IngressMode::choose(&BTreeMap::new(), None, defaults),
            IngressMode::Vip
        );
    }
}
