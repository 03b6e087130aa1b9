//! The two error producers of the real loxilb API server (docs/loxilb-api.md#answers-and-errors).
//!
//! * Framework errors come from go-openapi (routing, auth, content type,
//!   decoding, schema validation) and have the body `{"code","message"}`.
//! * Handler errors carry a raw loxilb core error string; the HTTP status is
//!   *derived from that string* by substring matching. The simulator keeps the
//!   same indirection ([`status_for`]) instead of choosing statuses by hand, so
//!   a wrong string would surface as a wrong status exactly like on loxilb.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// go-openapi validation codes (go-openapi/errors).
pub(crate) const CODE_INVALID_TYPE: i64 = 601;
pub(crate) const CODE_REQUIRED: i64 = 602;
pub(crate) const CODE_ENUM: i64 = 606;

/// Status table of docs/loxilb-api.md#handler-errors: `(http status, message,
/// triggers)`, checked in order, first hit wins. A `None` message means "the raw string itself".
const STATUS_TABLE: &[(u16, Option<&str>, &[&str])] = &[
    (
        404,
        Some("Resource not found"),
        &[
            "not-exists",
            " not exists",
            "not found",
            "no such",
            "host-notfound",
            "ephost-notfound",
            "no-rule error",
        ],
    ),
    (
        401,
        Some("Invalid authentication credentials"),
        &[
            "invalid token",
            "token is expired",
            "token not fou",
            "authentication failed",
            "user not found",
        ],
    ),
    (
        409,
        Some("Resource conflict: Resource already exists OR dependency not found"),
        &[
            "lbrule-exist error",
            "lbrule-exists error",
            "fwrule-exists",
            " existing ",
            " exists",
            "already created",
            "lb rule-referred",
            "cant modify",
        ],
    ),
    (
        400,
        Some("Malformed arguments for API call"),
        &[
            "malformed",
            "parse error",
            "invalid ",
            "range",
            "overflow",
            "service-args error",
            "secondaryip-args",
            "non-udp-n3-args error",
            "rule-allowed-src error",
            "host-args error",
            "hostarm-args error",
            "unknown ep-host-state",
            "host-args unknown probe",
            "mask format is wrong",
        ],
    ),
    (
        403,
        Some("Capacity insufficient"),
        &[
            "capacity",
            " hwm",
            "rule-hwm",
            "loxilb bgp mode is disabled",
            "running in bgp only mode",
        ],
    ),
    (
        503,
        Some("Maintenance mode"),
        &["not-ready", "timeout", "maintenance"],
    ),
];

/// Maps a raw loxilb core error string to `(HTTP status, message)` exactly
/// like loxilb's handler does (lower-cased substring match, first row wins,
/// fallback 500 with the raw string as message).
pub fn status_for(raw: &str) -> (u16, String) {
    let lower = raw.to_lowercase();
    for (status, message, triggers) in STATUS_TABLE {
        if triggers.iter().any(|t| lower.contains(t)) {
            let message = message.map_or_else(|| raw.to_string(), str::to_string);
            return (*status, message);
        }
    }
    (500, raw.to_string())
}

/// Every non-success answer of the API side of the simulator.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ApiError {
    /// go-openapi error: `{"code","message"}`; `allow` is set for 405.
    Framework {
        status: u16,
        code: i64,
        message: String,
        allow: Option<String>,
    },
    /// loxilb handler error: status derived from the raw string.
    Handler(String),
    /// Injected by the fault knob: handler shape with a forced status.
    Injected(u16),
    /// loxilb's handler crashed (a nil pointer): Go's HTTP server closes the connection without
    /// answering. The response carries [`DropConnection`], which the listener turns into a
    /// closed connection (see `server.rs`).
    Crash(&'static str),
}

/// Marks a response that must not be sent: the connection is closed instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropConnection;

impl ApiError {
    pub(crate) fn framework(status: u16, code: i64, message: impl Into<String>) -> Self {
        ApiError::Framework {
            status,
            code,
            message: message.into(),
            allow: None,
        }
    }

    /// Malformed JSON or a JSON type mismatch (decoding failed).
    pub(crate) fn parse(reason: impl std::fmt::Display) -> Self {
        Self::framework(
            400,
            400,
            format!("parsing attr body from \"\" failed, because {reason}"),
        )
    }

    pub(crate) fn required(path: &str, in_: &str) -> Self {
        Self::framework(422, CODE_REQUIRED, format!("{path} in {in_} is required"))
    }

    pub(crate) fn enumeration(path: &str, value: &Value, allowed: &str) -> Self {
        Self::framework(
            422,
            CODE_ENUM,
            format!("{path} in body should be one of [{allowed}], got {value}"),
        )
    }

    pub(crate) fn handler(raw: impl Into<String>) -> Self {
        ApiError::Handler(raw.into())
    }

    pub(crate) fn not_found_path(path: &str) -> Self {
        Self::framework(404, 404, format!("path {path} was not found"))
    }
}

fn json_response(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Framework {
                status,
                code,
                message,
                allow,
            } => {
                let mut resp = json_response(status, json!({"code": code, "message": message}));
                if let Some(allow) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
                    resp.headers_mut().insert(header::ALLOW, allow);
                }
                resp
            }
            ApiError::Handler(raw) => {
                let (status, message) = status_for(&raw);
                json_response(
                    status,
                    json!({"code": status, "message": message, "fields": null, "result": raw}),
                )
            }
            ApiError::Crash(why) => {
                tracing::debug!(why, "simulated handler crash: closing the connection");
                // Only seen if the router is served without the simulator's listener.
                let mut resp = json_response(
                    500,
                    json!({"code": 500, "message": format!("loxilb-sim: handler crash ({why})")}),
                );
                resp.extensions_mut().insert(DropConnection);
                resp
            }
            ApiError::Injected(status) => {
                let raw = "simulated fault (loxilb-sim fault injection)";
                json_response(
                    status,
                    json!({"code": status, "message": raw, "fields": null, "result": raw}),
                )
            }
        }
    }
}

/// `200 {"result":"Success"}`: the only success body of POST/DELETE (docs/loxilb-api.md#success).
pub(crate) fn success() -> Response {
    json_response(200, json!({"result": "Success"}))
}

/// 200 with an arbitrary `result` text (the DSR quirk,
/// docs/loxilb-api.md#rejections-inside-a-200).
pub(crate) fn result_200(result: &str) -> Response {
    json_response(200, json!({"result": result}))
}

pub(crate) fn ok_json(body: Value) -> Response {
    json_response(200, body)
}

#[cfg(test)]
mod tests {
    use super::status_for;

    #[test]
    fn table_order_and_fallback() {
        assert_eq!(status_for("no-rule error").0, 404);
        assert_eq!(status_for("lbrule not-exists error").0, 404);
        assert_eq!(status_for("lbrule-exists error").0, 409);
        assert_eq!(
            status_for("lbrule-exist error: cant modify rule security mode").0,
            409
        );
        assert_eq!(status_for("endpoints-range error").0, 400);
        assert_eq!(status_for("serv-port-args range error").0, 400);
        assert_eq!(status_for("secondaryIP-args len error").0, 400);
        assert_eq!(status_for("rule-allowed-src error").0, 400);
        assert_eq!(status_for("invalid cluster-state").0, 400);
        assert_eq!(status_for("rule-hwm error").0, 403);
        assert_eq!(status_for("loxilb BGP mode is disabled").0, 403);
        let (s, m) = status_for("secIP modify error");
        assert_eq!((s, m.as_str()), (500, "secIP modify error"));
        assert_eq!(status_for("proxy-proto-v2 not tcp service error").0, 500);
        // "user not found" is unreachable for 401: "not found" wins first.
        assert_eq!(status_for("user not found").0, 404);
    }
}
