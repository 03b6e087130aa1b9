//! What a Service asks for, read from its `loxilb.io/*` annotations (kube-loxilb's names and
//! spellings) on top of the operator's global defaults. Every bad value becomes a typed error
//! naming the annotation and the value, so it can be reported on the Service as it is.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::model::{EndpointSelection, NatMode};

pub const ANN_LB_MODE: &str = "loxilb.io/lbmode";
pub const ANN_EP_SELECT: &str = "loxilb.io/epselect";
pub const ANN_LIVENESS: &str = "loxilb.io/liveness";

/// Operator-wide defaults (flags); annotations override them per Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Defaults {
    pub mode: NatMode,
    pub monitor: bool,
}

/// The typed intent of one Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceIntent {
    pub mode: NatMode,
    pub selection: EndpointSelection,
    pub monitor: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {annotation}={value:?} is invalid: {reason}")]
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

fn invalid(annotation: &'static str, value: &str, reason: &str) -> AnnotationError {
    AnnotationError {
        annotation,
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// Parses the annotations this slice of loxi-ccm understands. Unknown `loxilb.io/*` keys are
/// ignored (they may belong to features of a newer version or to kube-loxilb).
pub fn parse_intent(
    annotations: &BTreeMap<String, String>,
    defaults: Defaults,
) -> Result<ServiceIntent, AnnotationError> {
    let mode = match annotations.get(ANN_LB_MODE) {
        None => defaults.mode,
        Some(v) => v.trim().parse().map_err(|()| {
            invalid(
                ANN_LB_MODE,
                v,
                "expected one of default, onearm, fullnat, dsr, fullproxy, hostonearm",
            )
        })?,
    };
    let selection = match annotations.get(ANN_EP_SELECT) {
        None => EndpointSelection::RoundRobin,
        Some(v) => v.trim().parse().map_err(|()| {
            invalid(
                ANN_EP_SELECT,
                v,
                "expected one of rr, hash, persist, lc, n2, n3, prio",
            )
        })?,
    };
    let monitor = match annotations.get(ANN_LIVENESS).map(|v| v.trim()) {
        None => defaults.monitor,
        Some("yes" | "true" | "on") => true,
        Some("no" | "false" | "off") => false,
        Some(v) => return Err(invalid(ANN_LIVENESS, v, "expected yes or no")),
    };
    // loxilb accepts DSR only with hash selection (CONTRACT.md §2.4); say so here instead of
    // letting loxilb answer 200 with an error inside.
    if mode == NatMode::Dsr && selection != EndpointSelection::Hash {
        let value = annotations
            .get(ANN_EP_SELECT)
            .cloned()
            .unwrap_or_else(|| "rr".to_string());
        return Err(invalid(
            ANN_EP_SELECT,
            &value,
            "lbmode dsr requires epselect hash",
        ));
    }
    Ok(ServiceIntent {
        mode,
        selection,
        monitor,
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

    #[test]
    fn defaults_apply_without_annotations() {
        let d = Defaults {
            mode: NatMode::FullNat,
            monitor: true,
        };
        let i = parse_intent(&BTreeMap::new(), d).unwrap();
        assert_eq!(i.mode, NatMode::FullNat);
        assert!(i.monitor);
        assert_eq!(i.selection, EndpointSelection::RoundRobin);
    }

    #[test]
    fn annotations_override() {
        let i = parse_intent(
            &ann(&[
                (ANN_LB_MODE, "dsr"),
                (ANN_EP_SELECT, "hash"),
                (ANN_LIVENESS, "no"),
            ]),
            Defaults {
                mode: NatMode::Default,
                monitor: true,
            },
        )
        .unwrap();
        assert_eq!(i.mode, NatMode::Dsr);
        assert_eq!(i.selection, EndpointSelection::Hash);
        assert!(!i.monitor);
    }

    #[test]
    fn bad_values_name_annotation_and_value() {
        let e = parse_intent(&ann(&[(ANN_LB_MODE, "fastest")]), Defaults::default()).unwrap_err();
        assert_eq!(e.annotation, ANN_LB_MODE);
        assert_eq!(e.value, "fastest");
        assert!(e.to_string().contains("loxilb.io/lbmode=\"fastest\""));
        let e = parse_intent(&ann(&[(ANN_EP_SELECT, "random")]), Defaults::default()).unwrap_err();
        assert_eq!(e.annotation, ANN_EP_SELECT);
        let e = parse_intent(&ann(&[(ANN_LIVENESS, "maybe")]), Defaults::default()).unwrap_err();
        assert_eq!(e.annotation, ANN_LIVENESS);
        let e = parse_intent(&ann(&[(ANN_LB_MODE, "dsr")]), Defaults::default()).unwrap_err();
        assert_eq!(e.annotation, ANN_EP_SELECT);
    }
}
