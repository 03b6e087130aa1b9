//! How a Service reconcile fails. Its own module: the steps that fail (`reconcile`,
//! `cleanup`, `report`) all name it, and none of them is the others' home.

use loxilb_client::ClientError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// loxilb failed in a way that may pass (unreachable, timeout, 5xx, refused credentials):
    /// retried with backoff. `at`: the loxilb the call went to (and the rule, when one rule
    /// failed).
    #[error("loxilb: {at}: {error}")]
    Loxilb { at: String, error: ClientError },
    /// A deleted Service's rules may remain on loxilbs that do not answer: its address and
    /// finalizer are kept, and the cleanup retried, until they answer (`cleanup`).
    #[error("loxilb: {0}")]
    LoxilbUnavailable(String),
    /// This replica no longer holds the leader Lease: nothing more is written or retried.
    #[error("no longer the leader")]
    NotLeader,
}

impl ReconcileError {
    /// A stable, low-cardinality name of what failed, for the reconcile metric's `category`
    /// label: loxilb's errors keep the client's classification (`LoxilbTimeout`,
    /// `LoxilbServerError`, ...: `loxilb_client::ClientError::category`).
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::Kube(_) => "KubernetesAPI",
            ReconcileError::Loxilb { error, .. } => error.category(),
            ReconcileError::LoxilbUnavailable(_) => "LoxilbUnavailable",
            ReconcileError::NotLeader => "NotLeader",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loxilb_error_keeps_the_clients_category() {
        let timeout = ReconcileError::Loxilb {
            at: "http://10.0.0.1:11111".into(),
            error: ClientError::Timeout {
                url: "http://10.0.0.1:11111".into(),
                timeout_ms: 2000,
            },
        };
        assert_eq!(timeout.category(), "LoxilbTimeout");
        assert_eq!(
            timeout.to_string(),
            "loxilb: http://10.0.0.1:11111: loxilb at http://10.0.0.1:11111 did not answer within 2000 ms"
        );
        let server = ReconcileError::Loxilb {
            at: "u".into(),
            error: ClientError::Server {
                status: 503,
                message: "maintenance".into(),
            },
        };
        assert_eq!(server.category(), "LoxilbServerError");
        assert_eq!(
            ReconcileError::LoxilbUnavailable("x".into()).category(),
            "LoxilbUnavailable"
        );
        assert_eq!(ReconcileError::NotLeader.category(), "NotLeader");
    }
}
