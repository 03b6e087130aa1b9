//! Error classification (docs/loxilb-api.md: Answers and errors, Authentication).

use thiserror::Error;

#[derive(Debug, Clone, Error)]
pub enum ClientError {
    /// Connection refused, reset, DNS: loxilb is not there. Retryable.
    #[error("loxilb at {url} is unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    /// The TLS handshake failed: loxilb's certificate was refused (another CA than
    /// `--loxilb-ca-file`'s, expired, naming another host) or TLS itself failed. loxilb is
    /// as unusable as when it is unreachable, but waiting does not help: someone must fix
    /// the certificate or the CA, so it is not retried within a call.
    #[error("loxilb at {url}: {detail}")]
    Tls { url: String, detail: String },
    /// No answer within the per-call timeout. Retryable.
    #[error("loxilb at {url} did not answer within {timeout_ms} ms")]
    Timeout { url: String, timeout_ms: u64 },
    /// A 4xx (or a 200 carrying an error `result`) for a request loxilb will never accept as
    /// sent: retrying it unchanged cannot help.
    #[error("loxilb rejected the request (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },
    /// 403 for a limit such as the 2048-rule high-water mark (docs/loxilb-api.md#limits).
    #[error("loxilb capacity exceeded (HTTP {status}): {message}")]
    Capacity { status: u16, message: String },
    /// 403 `loxilb BGP mode is disabled`: loxilb runs without BGP (`-b`), so no BGP call can
    /// work until it is restarted with it (docs/loxilb-api.md#bgp).
    #[error("loxilb runs without BGP (HTTP {status}): {message}")]
    BgpDisabled { status: u16, message: String },
    /// 401, or the 500 loxilb's token validators answer with.
    #[error("loxilb refused the credentials (HTTP {status}): {message}")]
    Unauthorized { status: u16, message: String },
    /// 5xx: loxilb failed or is in maintenance. Retryable with backoff.
    #[error("loxilb failed (HTTP {status}): {message}")]
    Server { status: u16, message: String },
    /// An answer that does not follow the API (not JSON, unexpected shape).
    #[error("unexpected answer from loxilb: {0}")]
    BadResponse(String),
    /// The client itself could not be built (bad URL, unreadable CA).
    #[error("invalid loxilb client configuration: {0}")]
    Config(String),
    /// Not sent: the write gate said this process may not write (it no longer leads),
    /// before the request was written. (Also when the gate closed while the answer was
    /// awaited: the write may then have been applied, but nothing more is sent or read.)
    #[error("write to loxilb at {url} not sent: this replica may no longer write")]
    WritesStopped { url: String },
}

impl ClientError {
    /// Whether the same call may succeed later without any change.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. }
                | ClientError::Timeout { .. }
                | ClientError::Server { .. }
        )
    }

    /// The call did not reach loxilb's API (unreachable, no answer in time, TLS refused):
    /// the instance is unusable as a whole, not this one request.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::Timeout { .. } | ClientError::Tls { .. }
        )
    }

    /// Stable, low-cardinality category: used as Event reason and metric label.
    pub fn category(&self) -> &'static str {
        match self {
            ClientError::Unreachable { .. } => "LoxilbUnreachable",
            ClientError::Tls { .. } => "LoxilbTLSError",
            ClientError::Timeout { .. } => "LoxilbTimeout",
            ClientError::Rejected { .. } => "LoxilbRejected",
            ClientError::Capacity { .. } => "CapacityExceeded",
            ClientError::BgpDisabled { .. } => "LoxilbBgpDisabled",
            ClientError::Unauthorized { .. } => "LoxilbUnauthorized",
            ClientError::Server { .. } => "LoxilbServerError",
            ClientError::BadResponse(_) => "LoxilbBadResponse",
            ClientError::Config(_) => "LoxilbConfig",
            ClientError::WritesStopped { .. } => "NotLeader",
        }
    }
}

/// What an answer relayed from loxilb's goBGP says about goBGP itself
/// (docs/loxilb-api.md#the-global-configuration): loxilb answers all three with a 500 whose
/// text is goBGP's, so only the text tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GobgpAnswer {
    /// goBGP does not listen yet (`... connect: connection refused`), for some seconds after
    /// loxilb starts: the same call succeeds later.
    Starting,
    /// goBGP runs without its global configuration (`hasn't started yet`): loxilb restarted
    /// or was never configured; the global settings must be sent first.
    Unconfigured,
    /// The global configuration sent is the one goBGP holds (`action 3 is already set`).
    AlreadyConfigured,
}

impl ClientError {
    /// What the error says about goBGP, if it is one of goBGP's answers ([`GobgpAnswer`]).
    pub fn gobgp(&self) -> Option<GobgpAnswer> {
        let (ClientError::Server { message, .. } | ClientError::Rejected { message, .. }) = self
        else {
            return None;
        };
        let lower = message.to_ascii_lowercase();
        if lower.contains("hasn't started yet") {
            Some(GobgpAnswer::Unconfigured)
        } else if lower.contains("is already set") {
            Some(GobgpAnswer::AlreadyConfigured)
        } else if matches!(self, ClientError::Server { .. }) && lower.contains("connection refused")
        {
            Some(GobgpAnswer::Starting)
        } else {
            None
        }
    }
}

/// goBGP refusals loxilb answers with 500 (docs/loxilb-api.md#bgp): the same request fails
/// the same way until something else changes, so they are not retried.
const DETERMINISTIC_500: &[&str] = &[
    "can't delete a peer configuration",
    "already defined",
    "duplicated policy",
    "doesn't have per peer policy",
    "is in use",
    "gobgp is already started",
    "is already set",
    "hasn't started yet",
    "unsupported type",
];

/// Classifies a non-success answer from its status and body text.
pub(crate) fn classify(
    status: u16,
    message: Option<String>,
    result: Option<String>,
) -> ClientError {
    // The raw loxilb error string is the most specific text; the framework's `message` next.
    let text = result
        .clone()
        .filter(|r| !r.is_empty())
        .or(message)
        .unwrap_or_else(|| format!("HTTP {status}"));
    let lower = text.to_ascii_lowercase();
    match status {
        401 => ClientError::Unauthorized {
            status,
            message: text,
        },
        403 if lower.contains("bgp mode is disabled") => ClientError::BgpDisabled {
            status,
            message: text,
        },
        403 => ClientError::Capacity {
            status,
            message: text,
        },
        500 if lower.contains("invalid token") || lower.contains("token not found") => {
            ClientError::Unauthorized {
                status,
                message: text,
            }
        }
        // Deterministic core errors loxilb reports as 500 (docs/loxilb-api.md#handler-errors):
        // the same request will fail the same way.
        500 if lower.contains("modify error")
            || lower.contains("not tcp service")
            || DETERMINISTIC_500.iter().any(|t| lower.contains(t)) =>
        {
            ClientError::Rejected {
                status,
                message: text,
            }
        }
        500..=599 => ClientError::Server {
            status,
            message: text,
        },
        _ => ClientError::Rejected {
            status,
            message: text,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gobgp_answers_are_told_apart_by_their_text() {
        let server = |m: &str| classify(500, None, Some(m.into()));
        assert_eq!(
            server("rpc error: code = Unavailable desc = dial tcp 127.0.0.1:50052: connect: connection refused").gobgp(),
            Some(GobgpAnswer::Starting)
        );
        assert_eq!(
            server("gobgp hasn't started yet").gobgp(),
            Some(GobgpAnswer::Unconfigured)
        );
        assert_eq!(
            server("action 3 is already set").gobgp(),
            Some(GobgpAnswer::AlreadyConfigured)
        );
        assert_eq!(server("something else").gobgp(), None);
        // Not retried: the same call fails the same way until the global settings are sent.
        assert!(!server("gobgp hasn't started yet").is_retryable());
        // A transport failure is not goBGP's answer, whatever its text.
        let unreachable = ClientError::Unreachable {
            url: "http://l".into(),
            detail: "connection refused".into(),
        };
        assert_eq!(unreachable.gobgp(), None);
    }
}
