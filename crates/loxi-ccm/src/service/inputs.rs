//! Step 1 of a Service reconcile: everything it reads, from the watch stores only (no API
//! calls), turned into the domain's plain views.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use loxi_domain::{EndpointView, NodeView};

use crate::k8s::view::{
    NETWORK_STATUS_ANNOTATION, SERVICE_NAME_LABEL, endpoint_views, multus_networks, node_view,
};

/// The watch stores a reconcile reads, and the planner's view of the Nodes.
pub struct Inputs {
    pub services: Store<Service>,
    pub nodes: Store<Node>,
    pub endpoint_slices: Store<EndpointSlice>,
    /// Pod metadata (Multus network-status), only with `--multus`.
    pub pods: Option<Store<PartialObjectMeta<Pod>>>,
    /// The planner's view of the Nodes, built once per Node change rather than per
    /// reconcile: (generation it was built at, views).
    node_views: Mutex<(u64, Arc<Vec<NodeView>>)>,
    /// Counts Node changes.
    node_generation: AtomicU64,
}

impl Inputs {
    pub fn new(
        services: Store<Service>,
        nodes: Store<Node>,
        endpoint_slices: Store<EndpointSlice>,
        pods: Option<Store<PartialObjectMeta<Pod>>>,
    ) -> Inputs {
        Inputs {
            services,
            nodes,
            endpoint_slices,
            pods,
            node_views: Mutex::default(),
            node_generation: AtomicU64::new(0),
        }
    }

    /// The Service as the store holds it now.
    pub fn service(&self, svc: &Service) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::from_obj(svc))
    }

    /// A Node changed: the next reconcile builds the views again.
    pub fn nodes_changed(&self) {
        self.node_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The planner's view of every Node, as the store holds them now.
    pub fn node_views(&self) -> Arc<Vec<NodeView>> {
        // Read before the store: a change landing meanwhile bumps it, so what is built here
        // is never kept as current for a newer generation.
        let generation = self.node_generation.load(Ordering::SeqCst);
        if let Ok(cached) = self.node_views.lock()
            && cached.0 == generation
            && generation > 0
        {
            return cached.1.clone();
        }
        let views: Arc<Vec<_>> =
            Arc::new(self.nodes.state().iter().map(|n| node_view(n)).collect());
        if let Ok(mut cached) = self.node_views.lock() {
            *cached = (generation, views.clone());
        }
        views
    }

    /// The endpoints of the Service's EndpointSlices (with Multus addresses of their pods).
    pub fn endpoints_of(&self, svc: &Service) -> Vec<EndpointView> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let slices = self.endpoint_slices.state();
        let slices = slices.iter().map(|s| s.as_ref()).filter(|s| {
            s.metadata.namespace.as_deref() == Some(ns.as_str())
                && s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL))
                    .is_some_and(|n| *n == name)
        });
        endpoint_views(slices, |pod_ns, pod_name| {
            self.pods
                .as_ref()
                .and_then(|pods| pods.get(&ObjectRef::new(pod_name).within(pod_ns)))
                .and_then(|p| {
                    p.metadata
                        .annotations
                        .as_ref()?
                        .get(NETWORK_STATUS_ANNOTATION)
                        .map(|a| multus_networks(a))
                })
                .unwrap_or_default()
        })
    }
}

/// The watches behind the stores a reconcile reads besides the Services', and their events.
pub struct InputWatches {
    pub node_store: Store<Node>,
    pub node_events: BoxStream<'static, Result<watcher::Event<Node>, watcher::Error>>,
    pub slice_store: Store<EndpointSlice>,
    pub slice_events: BoxStream<'static, Result<EndpointSlice, watcher::Error>>,
    /// Only with `--multus`.
    pub pod_store: Option<Store<PartialObjectMeta<Pod>>>,
    pub pod_events: Option<BoxStream<'static, Result<PartialObjectMeta<Pod>, watcher::Error>>>,
}

/// Starts the watches of Nodes, EndpointSlices (of `namespace`, or all) and, with `multus`,
/// Pod metadata; nothing is read before the events are polled.
pub fn watch(client: &kube::Client, namespace: Option<&str>, multus: bool) -> InputWatches {
    let (node_store, node_writer) = reflector::store::<Node>();
    // Whole watch events, not touched objects: a deletion must be told from an update, and a
    // listing from single changes (crates/loxi-ccm/src/runtime/node_watch.rs).
    let node_events = reflector(
        node_writer,
        watcher(
            Api::<Node>::all(client.clone()),
            crate::k8s::trim::list_config(),
        )
        .modify(crate::k8s::trim::node),
    )
    .default_backoff()
    .boxed();

    // EndpointSlices: backends for externalTrafficPolicy Local and pod-network mode.
    let slices_api: Api<EndpointSlice> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (slice_store, slice_writer) = reflector::store::<EndpointSlice>();
    let slice_events = reflector(
        slice_writer,
        watcher(slices_api, crate::k8s::trim::list_config())
            .modify(crate::k8s::trim::endpoint_slice),
    )
    .default_backoff()
    .touched_objects()
    .boxed();

    // Pod metadata only (annotations), and only when Multus addresses are wanted.
    let (pod_store, pod_events) = if multus {
        // An Api over PartialObjectMeta makes metadata-only requests.
        let pods: Api<PartialObjectMeta<Pod>> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store::<PartialObjectMeta<Pod>>();
        let events = reflector(writer, watcher(pods, crate::k8s::trim::list_config()))
            .default_backoff()
            .touched_objects()
            .boxed();
        (Some(store), Some(events))
    } else {
        (None, None)
    };
    InputWatches {
        node_store,
        node_events,
        slice_store,
        slice_events,
        pod_store,
        pod_events,
    }
}
