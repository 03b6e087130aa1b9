//! Shared state of the running controller.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use loxi_domain::{Allocator, ClusterId};
use tokio::sync::{mpsc, watch};

use crate::claims::AddressClaim;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::kube_view::Selection;
use crate::metrics::Metrics;

pub struct Context {
    pub client: kube::Client,
    pub cfg: Config,
    pub selection: Selection,
    pub cluster: ClusterId,
    pub services: Store<Service>,
    pub nodes: Store<Node>,
    pub endpoint_slices: Store<EndpointSlice>,
    /// Pod metadata (Multus network-status), only with `--multus`.
    pub pods: Option<Store<PartialObjectMeta<Pod>>>,
    /// Durable address claims (the record the allocator index is rebuilt from).
    pub claims: Store<AddressClaim>,
    pub claims_api: kube::Api<AddressClaim>,
    /// In-memory index of address ownership, rebuilt from the cluster before any allocation.
    pub ipam: Mutex<Allocator>,
    /// Address pools in effect (flags and AddressPool resources) and namespace labels.
    pub pools: crate::pools::Pools,
    pub fleet: Fleet,
    pub recorder: crate::events::EventRecorder,
    pub metrics: Metrics,
    /// Stores synced (standbys too: their caches are warm).
    pub synced: AtomicBool,
    /// This replica leads, its stores are synced and its address index is rebuilt.
    pub ready: AtomicBool,
    pub ready_rx: watch::Receiver<bool>,
    /// True while this replica holds the leader Lease.
    pub leader_rx: watch::Receiver<bool>,
    /// Asked right before every write: whether the Lease is still held at this moment
    /// (`crate::leader::WriteLease`).
    pub write_lease: crate::leader::WriteLease,
    /// The reconcile loop is running (for /healthz).
    pub running: AtomicBool,
    /// Consecutive failures per Service, for per-object exponential backoff reset on success.
    pub failures: Mutex<HashMap<ObjectRef<Service>, u32>>,
    /// Candidate endpoints left out per Service (loxilb's 32-per-rule limit), and their sum
    /// (kept up to date as it changes, so that no reconcile sums over every Service).
    pub endpoints_dropped: Mutex<(HashMap<String, usize>, usize)>,
    /// Services waiting for an address to free up.
    pub waiting_for_address: Mutex<HashSet<ObjectRef<Service>>>,
    /// Per Service, the resourceVersion our last status write was based on: a reconcile that
    /// gets exactly that version again runs on a store that has not seen our write yet, and
    /// would only repeat it (with a 409 when it publishes an address). Skipped: the write's
    /// own watch event brings the current version right after.
    pub superseded: Mutex<HashMap<ObjectRef<Service>, String>>,
    /// The planner's view of the Nodes, built once per Node change rather than per reconcile:
    /// (generation it was built at, views). `node_generation` counts Node changes.
    pub node_views: Mutex<(u64, Arc<Vec<loxi_domain::NodeView>>)>,
    pub node_generation: std::sync::atomic::AtomicU64,
    /// Asks the controller to reconcile a Service now.
    pub requeue: mpsc::UnboundedSender<ObjectRef<Service>>,
    /// Services that left type LoadBalancer (crate::departures).
    pub departures: crate::departures::Departures,
}

impl Context {
    /// Waits until the stores are synced and the address index rebuilt: nothing is allocated
    /// or programmed before (docs/architecture.md#invariants).
    pub async fn wait_ready(&self) {
        let mut rx = self.ready_rx.clone();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// The planner's view of every Node, as the store holds them now.
    pub fn node_views(&self) -> Arc<Vec<loxi_domain::NodeView>> {
        use std::sync::atomic::Ordering;
        // Read before the store: a change landing meanwhile bumps it, so what is built here
        // is never kept as current for a newer generation.
        let generation = self.node_generation.load(Ordering::SeqCst);
        if let Ok(cached) = self.node_views.lock()
            && cached.0 == generation
            && generation > 0
        {
            return cached.1.clone();
        }
        let views: Arc<Vec<_>> = Arc::new(
            self.nodes
                .state()
                .iter()
                .map(|n| crate::kube_view::node_view(n))
                .collect(),
        );
        if let Ok(mut cached) = self.node_views.lock() {
            *cached = (generation, views.clone());
        }
        views
    }

    /// Re-queues every Service this controller serves (after node changes or a loxilb replay).
    pub fn requeue_all_served(&self) {
        for svc in self.services.state() {
            if self.selection.serves(&svc) {
                let _ = self.requeue.send(ObjectRef::from_obj(&*svc));
            }
        }
    }

    /// An address was freed: Services waiting for one try again.
    pub fn wake_address_waiters(&self) {
        let waiting: Vec<_> = match self.waiting_for_address.lock() {
            Ok(mut w) => w.drain().collect(),
            Err(_) => return,
        };
        for r in waiting {
            let _ = self.requeue.send(r);
        }
    }
}
