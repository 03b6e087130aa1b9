//! Kubernetes metadata sent to one loxilb (`--enableK8sMetadata`, `crate::k8s_metadata`
//! decides what).

use std::time::Instant;

use loxi_domain::k8s_metadata::Message;
use loxilb_client::ClientError;

use super::Instance;
use crate::metrics::Metrics;

impl Instance {
    /// `POST /config/k8smeta` with `body`, counted in `loxi_ccm_loxilb_calls_total` (op
    /// `k8smeta`). Like every write, it waits for nothing but asks the write Lease.
    pub async fn send_k8s_metadata(
        &self,
        body: &Message,
        metrics: &Metrics,
    ) -> Result<(), ClientError> {
        let started = Instant::now();
        let sent = self.client.post_k8s_metadata(body).await;
        metrics.loxilb_call(
            self.url(),
            "k8smeta",
            started.elapsed(),
            sent.as_ref().err(),
        );
        sent
    }
}
