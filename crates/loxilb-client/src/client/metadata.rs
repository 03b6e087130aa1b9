//! kube-loxilb's Kubernetes metadata call (`--enableK8sMetadata`), which loxilb's published
//! spec does not have (docs/loxilb-api.md#kubernetes-metadata).

use loxi_domain::k8s_metadata::Message;
use reqwest::Method;

use super::LoxilbClient;
use crate::error::ClientError;

impl LoxilbClient {
    /// `POST /config/k8smeta` with kube-loxilb's body (`K8sMetaModel`: `pods`, `services`,
    /// `nodes`); success is 200 `{"result":"Success"}` like every loxilb write.
    pub async fn post_k8s_metadata(&self, body: &Message) -> Result<(), ClientError> {
        let url = self.url_of(&["config", "k8smeta"])?;
        self.write_url(Method::POST, url, Some(body)).await
    }
}
