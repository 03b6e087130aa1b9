//! The harness itself: the control plane starts, RBAC is on, and it stops.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn control_plane_starts_with_rbac() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let client = cp.admin_client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    assert!(
        list.items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("default"))
    );

    // An unknown token is rejected: authentication is really on.
    let path = cp.dir().join("nobody.kubeconfig");
    cp.write_kubeconfig(&path, "not-a-valid-token").unwrap();
    let anon: Api<Namespace> = Api::all(cp.client_for_kubeconfig(&path).await.unwrap());
    let err = anon.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 401),
        "{err:?}"
    );
    cp.stop();
}
