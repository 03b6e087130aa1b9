//! The Gateway controller's watches and loop: every change of a watched kind (and every
//! `Settings::resync`) asks for a pass over all Gateways of ours (`pass`), one at a time,
//! by the leader only, once start-up has rebuilt the address index.

use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use tracing::{debug, info};

use super::pass::Pass;
use super::{Handles, Settings, Stores};

/// A change of some watched object (the pass reads the stores, not the event).
type Changes = SelectAll<BoxStream<'static, ()>>;

fn follow<K>(api: Api<K>, kind: &'static str, changes: &mut Changes) -> Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store::<K>();
    let events = reflector(
        writer,
        watcher(api, crate::k8s::trim::list_config()).modify(crate::k8s::trim::meta::<K>),
    )
    .default_backoff()
    .touched_objects();
    changes.push(to_changes(events, kind));
    store
}

fn to_changes<K: Send + 'static>(
    events: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    kind: &'static str,
) -> BoxStream<'static, ()> {
    events
        .filter_map(move |e| async move {
            match e {
                Ok(_) => Some(()),
                Err(e) => {
                    // A kind whose CRD is not installed yet is asked for again with back-off.
                    debug!(kind, error = %e, "Gateway API watch");
                    None
                }
            }
        })
        .boxed()
}

/// Runs the Gateway controller until the process stops.
pub async fn run(settings: Settings, handles: Handles) {
    let client = handles.kube.clone();
    let mut changes = Changes::default();
    let stores = Stores {
        classes: follow(Api::all(client.clone()), "GatewayClass", &mut changes),
        gateways: follow(Api::all(client.clone()), "Gateway", &mut changes),
        tcp_routes: follow(Api::all(client.clone()), "TCPRoute", &mut changes),
        udp_routes: follow(Api::all(client.clone()), "UDPRoute", &mut changes),
        http_routes: follow(Api::all(client.clone()), "HTTPRoute", &mut changes),
        grants: follow(Api::all(client.clone()), "ReferenceGrant", &mut changes),
        services: follow(Api::all(client.clone()), "Service", &mut changes),
        slices: {
            // EndpointSlices of Services only (the backends), trimmed as the Services' are.
            let (store, writer) = reflector::store::<EndpointSlice>();
            let config = crate::k8s::trim::list_config().labels("kubernetes.io/service-name");
            let events = reflector(
                writer,
                watcher(Api::<EndpointSlice>::all(client.clone()), config)
                    .modify(crate::k8s::trim::endpoint_slice),
            )
            .default_backoff()
            .touched_objects();
            changes.push(to_changes(events, "EndpointSlice"));
            store
        },
    };
    let pass = Pass::new(settings.clone(), handles.clone(), stores.clone());
    // The address index must be rebuilt from the claims before anything is claimed.
    handles.gate.wait_ready().await;
    info!(controller = %settings.controller_name, "Gateway API controller started");
    let mut tick = tokio::time::interval(settings.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // A loxilb was replayed: a pass reaches it now that it takes passes again.
            _ = handles.decided.replayed() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            change = changes.next() => {
                if change.is_none() {
                    return;
                }
                // A burst of changes (a listing, a rollout) makes one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
                while let Some(Some(())) = changes.next().now_or_never() {}
            }
        }
        // Nothing is decided from a Gateway or class store before its first listing (a
        // Gateway missing from it would look deleted); the watches are polled meanwhile.
        let listed = |ready: Option<Result<(), reflector::store::WriterDropped>>| {
            matches!(ready, Some(Ok(())))
        };
        if !*handles.gate.leader().borrow()
            || !listed(stores.classes.wait_until_ready().now_or_never())
            || !listed(stores.gateways.wait_until_ready().now_or_never())
            || !listed(stores.services.wait_until_ready().now_or_never())
        {
            continue;
        }
        pass.run().await;
    }
}
