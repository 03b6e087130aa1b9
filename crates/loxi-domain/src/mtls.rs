//! kube-loxilb's mTLS annotations (`loxilb.io/mtls-*`), read and refused.
//!
//! kube-loxilb sends them as a rule's `mtls_frontend` / `mtls_backend` objects. The loxilb API
//! loxi-ccm is written against (`LoadbalanceEntry` in loxilb's swagger.yml, summarized in
//! docs/loxilb-api.md#mtls) has neither object nor any field they hold: loxilb cannot be told
//! to check client certificates, nor to verify its backends. Programming such a Service
//! without them would serve it without the mTLS its owner asked for, so a Service that asks
//! for mTLS is refused with a message naming the annotation (docs/annotations.md#mtls). Values
//! are checked first, so a misspelt value is named as such; `mtls-frontend-mode: disabled`
//! and `mtls-backend-verify: no` ask for nothing and are accepted.
//!
//! No Secret is read for these annotations, and they need no RBAC.

use std::collections::BTreeMap;

use crate::intent::{AnnotationError, invalid};

pub const ANN_MTLS_FRONTEND_MODE: &str = "loxilb.io/mtls-frontend-mode";
pub const ANN_MTLS_FRONTEND_SECRET: &str = "loxilb.io/mtls-frontend-secret";
pub const ANN_MTLS_FRONTEND_REQUIRE_CN: &str = "loxilb.io/mtls-frontend-require-cn";
pub const ANN_MTLS_FRONTEND_CN_PATTERN: &str = "loxilb.io/mtls-frontend-cn-pattern";
pub const ANN_MTLS_BACKEND_VERIFY: &str = "loxilb.io/mtls-backend-verify";
pub const ANN_MTLS_BACKEND_CA_SECRET: &str = "loxilb.io/mtls-backend-ca-secret";
pub const ANN_MTLS_BACKEND_CLIENT_SECRET: &str = "loxilb.io/mtls-backend-client-secret";

/// Why an mTLS request cannot be sent, appended to the annotation and its value.
pub const NO_MTLS_IN_LOXILB_API: &str = "loxilb's load-balancer rule API has no mTLS fields \
    (no mtls_frontend or mtls_backend object), so loxilb cannot be told to do this; the Service \
    is not programmed rather than served without the mTLS it asks for: remove the \
    loxilb.io/mtls-* annotations or terminate mTLS in the backends (docs/annotations.md#mtls)";

/// `loxilb.io/mtls-frontend-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendMode {
    Disabled,
    Optional,
    Required,
}

fn value<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations
        .get(key)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

fn flag(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<bool>, AnnotationError> {
    match value(annotations, key) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "yes" | "true" | "on" => Ok(Some(true)),
            "no" | "false" | "off" => Ok(Some(false)),
            _ => Err(invalid(key, v, "expected yes or no (true or false)")),
        },
    }
}

/// Checks the Service's `loxilb.io/mtls-*` annotations: `Ok` when they ask for nothing
/// (absent, empty, `disabled`, `no`), otherwise the first one asking for mTLS, refused.
pub fn check_mtls(annotations: &BTreeMap<String, String>) -> Result<(), AnnotationError> {
    let mode = match value(annotations, ANN_MTLS_FRONTEND_MODE) {
        None => None,
        Some(v) => Some(match v.to_ascii_lowercase().as_str() {
            "disabled" => FrontendMode::Disabled,
            "optional" => FrontendMode::Optional,
            "required" => FrontendMode::Required,
            _ => {
                return Err(invalid(
                    ANN_MTLS_FRONTEND_MODE,
                    v,
                    "expected disabled, optional or required",
                ));
            }
        }),
    };
    let require_cn = flag(annotations, ANN_MTLS_FRONTEND_REQUIRE_CN)?;
    let verify = flag(annotations, ANN_MTLS_BACKEND_VERIFY)?;
    let refuse = |key: &'static str| {
        Err(invalid(
            key,
            value(annotations, key).unwrap_or_default(),
            NO_MTLS_IN_LOXILB_API,
        ))
    };
    if matches!(mode, Some(FrontendMode::Optional | FrontendMode::Required)) {
        return refuse(ANN_MTLS_FRONTEND_MODE);
    }
    if require_cn == Some(true) {
        return refuse(ANN_MTLS_FRONTEND_REQUIRE_CN);
    }
    if verify == Some(true) {
        return refuse(ANN_MTLS_BACKEND_VERIFY);
    }
    for key in [
        ANN_MTLS_FRONTEND_SECRET,
        ANN_MTLS_FRONTEND_CN_PATTERN,
        ANN_MTLS_BACKEND_CA_SECRET,
        ANN_MTLS_BACKEND_CLIENT_SECRET,
    ] {
        if value(annotations, key).is_some() {
            return refuse(key);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn asking_for_nothing_is_accepted() {
        assert_eq!(check_mtls(&of(&[])), Ok(()));
        assert_eq!(
            check_mtls(&of(&[
                (ANN_MTLS_FRONTEND_MODE, "disabled"),
                (ANN_MTLS_FRONTEND_REQUIRE_CN, "false"),
                (ANN_MTLS_BACKEND_VERIFY, "no"),
                (ANN_MTLS_FRONTEND_SECRET, " "),
            ])),
            Ok(())
        );
    }

    #[test]
    fn every_request_is_refused_by_name() {
        for (key, v) in [
            (ANN_MTLS_FRONTEND_MODE, "required"),
            (ANN_MTLS_FRONTEND_MODE, "Optional"),
            (ANN_MTLS_FRONTEND_REQUIRE_CN, "true"),
            (ANN_MTLS_BACKEND_VERIFY, "yes"),
            (ANN_MTLS_FRONTEND_SECRET, "client-ca"),
            (ANN_MTLS_FRONTEND_CN_PATTERN, "*.corp"),
            (ANN_MTLS_BACKEND_CA_SECRET, "backend-ca"),
            (ANN_MTLS_BACKEND_CLIENT_SECRET, "loxilb-client"),
        ] {
            let e = check_mtls(&of(&[(key, v)])).unwrap_err();
            assert_eq!((e.annotation, e.value.as_str()), (key, v));
            assert_eq!(e.reason, NO_MTLS_IN_LOXILB_API);
            assert!(e.to_string().contains(key), "{e}");
        }
        // The mode is named first when several are set.
        let e = check_mtls(&of(&[
            (ANN_MTLS_FRONTEND_SECRET, "client-ca"),
            (ANN_MTLS_FRONTEND_MODE, "required"),
        ]))
        .unwrap_err();
        assert_eq!(e.annotation, ANN_MTLS_FRONTEND_MODE);
    }

    #[test]
    fn bad_values_are_named_before_the_refusal() {
        let e = check_mtls(&of(&[(ANN_MTLS_FRONTEND_MODE, "strict")])).unwrap_err();
        assert!(e.reason.contains("disabled, optional or required"), "{e}");
        let e = check_mtls(&of(&[(ANN_MTLS_BACKEND_VERIFY, "sometimes")])).unwrap_err();
        assert!(e.reason.contains("yes or no"), "{e}");
    }
}
