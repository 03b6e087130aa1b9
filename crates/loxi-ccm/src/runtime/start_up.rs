//! Start-up: stores synced, then, on the leader, the address index rebuilt before anything
//! is allocated, and node initialization started.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::runtime::reflector;
use tracing::warn;

use super::{Shared, Stop};

/// Waits for the stores, then (on the leader) rebuilds the address index from the claims and
/// what Services show, before anything is allocated (`docs/architecture.md#invariants`);
/// then starts node initialization, which writes too.
pub async fn start_up(shared: Arc<Shared>, stop: Stop) {
    let ctx = &shared.service;
    if wait_store(&ctx.inputs.services).await.is_err()
        || wait_store(&ctx.inputs.nodes).await.is_err()
    {
        warn!("store writer dropped before sync");
        return;
    }
    shared.synced.store(true, Ordering::Relaxed);
    // Standbys stop here with warm stores; the index is rebuilt by whoever leads, from the
    // cluster as it is at that moment.
    let mut leader = ctx.gate.leader();
    if leader.wait_for(|l| *l).await.is_err() {
        return;
    }
    let pools = ctx.ipam.pools();
    if wait_store(&ctx.inputs.endpoint_slices).await.is_err()
        || wait_store(ctx.ipam.claim_store()).await.is_err()
        || wait_store(&pools.namespaces).await.is_err()
    {
        warn!("a store writer dropped before sync");
        return;
    }
    if let Some(store) = &pools.store
        && wait_store(store).await.is_err()
    {
        warn!("address pool store writer dropped before sync");
        return;
    }
    let services = ctx.inputs.services.state();
    ctx.ipam.rebuild(
        services.iter().map(|s| s.as_ref()).filter(|svc| {
            ctx.selection.serves(svc) || !ctx.selection.our_finalizers(svc).is_empty()
        }),
    );
    ctx.gate.set_ready();
    let node_init = shared.node_init.clone();
    let client = ctx.kube.clone();
    tokio::spawn(async move {
        if let Err(e) = crate::node_init::run(client, node_init, stop.wait()).await {
            warn!(error = %e, "node initialization stopped");
        }
    });
}

/// Waits until a store has seen its first full listing. kube-runtime 5's readiness signal
/// keeps a single waker, and the controller's own applier waits on the service store too, so
/// a lone `wait_until_ready().await` can sleep forever; re-polling briefly sidesteps that.
pub async fn wait_store<K>(
    store: &reflector::Store<K>,
) -> Result<(), reflector::store::WriterDropped>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_millis(100), store.wait_until_ready()).await {
            Ok(result) => return result,
            Err(_elapsed) => continue,
        }
    }
}
