//! Per-Service retry delays of failed reconciles: the reconcile context holds the book,
//! `reconcile::error_policy` asks it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;

/// Per-Service exponential backoff (0.5 s doubling to 5 min), reset on success.
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<ObjectRef<Service>, u32>>,
}

impl Backoff {
    /// The delay before retrying `svc` after one more failure.
    pub fn failed(&self, svc: &Service) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(ObjectRef::from_obj(svc)).or_insert(0);
        *n = n.saturating_add(1);
        loxi_domain::duration::retry_delay(*n)
    }

    pub fn succeeded(&self, svc: &Service) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(&ObjectRef::from_obj(svc));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes_and_resets_on_success() {
        let b = Backoff::default();
        let svc = Service {
            metadata: kube::api::ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(b.failed(&svc), Duration::from_millis(500));
        assert_eq!(b.failed(&svc), Duration::from_secs(1));
        for _ in 0..20 {
            b.failed(&svc);
        }
        assert_eq!(b.failed(&svc), Duration::from_secs(300));
        b.succeeded(&svc);
        assert_eq!(b.failed(&svc), Duration::from_millis(500));
    }
}
