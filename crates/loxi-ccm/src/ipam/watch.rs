//! The watches the address index follows: `AddressClaim`s (required: without their CRD
//! nothing can be allocated safely), `AddressPool`s (optional: without their CRD the pools
//! from flags are used alone) and Namespace labels (a pool's `namespaceSelector`). What their
//! events change is handed over in crates/loxi-ccm/src/runtime/watches.rs.

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::warn;

use super::address_pools::AddressPool;
use super::claims::AddressClaim;

/// A watch's events, as its reflector passes them on.
pub type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// The stores and event streams of the address index's watches.
pub struct Watches {
    pub claims_api: Api<AddressClaim>,
    pub claim_store: Store<AddressClaim>,
    pub claim_events: Events<AddressClaim>,
    pub pools_api: Api<AddressPool>,
    /// `None`: no `AddressPool` CRD.
    pub pool_store: Option<Store<AddressPool>>,
    pub pool_events: Option<Events<AddressPool>>,
    pub namespace_store: Store<PartialObjectMeta<Namespace>>,
    pub namespace_events: Events<PartialObjectMeta<Namespace>>,
}

/// Starts the watches (module docs); fails, saying what to install, without the
/// `AddressClaim` CRD.
pub async fn watch(client: &kube::Client) -> Result<Watches, String> {
    let claims_api: Api<AddressClaim> = Api::all(client.clone());
    // Without the CRD nothing can be allocated safely: say so at once instead of waiting.
    if let Err(e) = claims_api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        return Err(format!(
            "cannot list AddressClaims ({e}); install the CRD (kubectl apply -f deploy/05-crd-addressclaims.yaml) and grant the RBAC in deploy/"
        ));
    }
    let (claim_store, claim_writer) = reflector::store::<AddressClaim>();
    let claim_events = reflector(
        claim_writer,
        watcher(claims_api.clone(), crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::meta::<AddressClaim>),
    )
    .default_backoff()
    .boxed();

    // AddressPool resources are optional: without their CRD (an upgrade that did not apply
    // deploy/06-crd-addresspools.yaml) the pools from flags are used alone.
    let pools_api: Api<AddressPool> = Api::all(client.clone());
    let (pool_store, pool_events) = match pools_api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => {
            let (store, writer) = reflector::store::<AddressPool>();
            let events = reflector(
                writer,
                watcher(pools_api.clone(), crate::k8s::trim::list_config()),
            )
            .default_backoff()
            .boxed();
            (Some(store), Some(events))
        }
        Err(e) => {
            warn!(error = %e, "AddressPool resources unavailable: using the pools from flags only (kubectl apply -f deploy/06-crd-addresspools.yaml and the RBAC in deploy/)");
            (None, None)
        }
    };
    // Namespace labels (metadata only) decide which Services a pool's namespaceSelector
    // admits.
    let namespaces_api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let (namespace_store, namespace_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let namespace_events = reflector(
        namespace_writer,
        watcher(namespaces_api, crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::meta::<PartialObjectMeta<Namespace>>),
    )
    .default_backoff()
    .boxed();
    Ok(Watches {
        claims_api,
        claim_store,
        claim_events,
        pools_api,
        pool_store,
        pool_events,
        namespace_store,
        namespace_events,
    })
}
