//! The Service watch that drives the reconcile: Services trimmed as they arrive
//! (`crate::k8s::trim`), only those of type LoadBalancer where the API server can filter
//! them (`super::departures`, whose placeholders enter through the same stream), a re-listed
//! Service triggering its reconcile only once the re-list is in the store
//! (`crate::k8s::triggers`), and deletions handed at once to the early rule removal
//! (`super::teardown`), which must not wait for a Service's turn in the reconcile queue.

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::Context;
use super::departures::{self, Injected, Relisted};
use crate::k8s::view::Selection;

/// The Service watch and what it connects to.
pub struct ServiceWatch {
    /// The watch's events, for the reconcile loop (`kube::runtime::Controller::for_stream`).
    pub events: BoxStream<'static, Result<Service, watcher::Error>>,
    pub store: Store<Service>,
    /// The watch filters by type (`departures::TYPE_SELECTOR`).
    pub filtered: bool,
    /// Placeholders of Services that left type LoadBalancer (`departures`).
    pub inject: mpsc::UnboundedSender<Injected>,
    /// Told after every full listing (`departures::sweep_loop`).
    pub relisted: Relisted,
    /// What [`deletions`] hands to the early rule removal.
    pub deletions: mpsc::UnboundedReceiver<Deletion>,
}

/// What the Service watch tells the early rule removal.
pub enum Deletion {
    /// The Service (in the store) shows a deletionTimestamp.
    Deleting(ObjectRef<Service>),
    /// The Service with this uid is gone.
    Gone(String),
}

/// Starts watching `services` (module docs); nothing is read before the events are polled.
pub async fn watch(services: &Api<Service>, selection: &Selection) -> ServiceWatch {
    let selection = selection.clone();
    // Our own reflector (rather than Controller::new's) so that the cache keeps trimmed
    // objects (crate::k8s::trim).
    let (service_store, service_writer) = reflector::store::<Service>();
    // Only Services of type LoadBalancer where the API server can filter them (crate::
    // departures); the others would cost memory and CPU for nothing.
    let filtered = departures::type_selector_supported(services).await;
    let (inject_tx, inject_rx) = mpsc::unbounded_channel::<Injected>();
    let (deletions_tx, deletions_rx) = mpsc::unbounded_channel::<Deletion>();
    let relisted = Relisted::default();
    let service_events = {
        let selection = selection.clone();
        let list = if filtered {
            crate::k8s::trim::list_config().fields(departures::TYPE_SELECTOR)
        } else {
            crate::k8s::trim::list_config()
        };
        let watched = watcher(services.clone(), list)
            .default_backoff()
            .modify({
                let selection = selection.clone();
                move |svc| crate::k8s::trim::service(svc, &selection)
            })
            .map_ok(move |event| {
                if filtered {
                    departures::on_watch_event(event, &selection)
                } else {
                    event
                }
            });
        // Placeholders enter and leave through the stream, checked against the store right
        // before it applies them.
        let reader = service_store.clone();
        let injected = channel_stream(inject_rx).filter_map(move |event| {
            let current = reader.get(&event.key());
            let admitted = departures::admit(&event, current.as_deref());
            futures::future::ready(admitted.then(|| Ok(departures::into_event(event))))
        });
        let relisted = relisted.clone();
        let deletion_tx = deletions_tx;
        let events = reflector(service_writer, futures::stream::select(watched, injected))
            .inspect_ok(move |event| {
                if filtered && matches!(event, watcher::Event::InitDone) {
                    relisted.notify();
                }
                // Deletions go to the early rule removal (crate::service::teardown), which
                // must not wait for this Service's turn in the reconcile queue.
                match event {
                    watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)
                        if svc.metadata.deletion_timestamp.is_some() =>
                    {
                        let _ = deletion_tx.send(Deletion::Deleting(ObjectRef::from_obj(svc)));
                    }
                    watcher::Event::Delete(svc) => {
                        if let Some(uid) = &svc.metadata.uid {
                            let _ = deletion_tx.send(Deletion::Gone(uid.clone()));
                        }
                    }
                    _ => {}
                }
            });
        crate::k8s::triggers::applied_objects(events).boxed()
    };
    ServiceWatch {
        events: service_events,
        store: service_store,
        filtered,
        inject: inject_tx,
        relisted,
        deletions: deletions_rx,
    }
}

/// Hands the Service watch's deletions to `super::teardown`.
pub async fn deletions(ctx: Arc<Context>, mut rx: mpsc::UnboundedReceiver<Deletion>) {
    while let Some(deletion) = rx.recv().await {
        match deletion {
            Deletion::Deleting(svc_ref) => {
                // Its writes still waiting for a loxilb go unsent: a Service deleted while
                // its create waited costs no write at all.
                let namespace = svc_ref.namespace.clone().unwrap_or_default();
                for inst in ctx.fleet.instances().iter() {
                    inst.drop_queued(&namespace, &svc_ref.name);
                }
                if let Some(svc) = ctx.inputs.services.get(&svc_ref) {
                    super::teardown::deleting(&ctx, &svc);
                }
            }
            Deletion::Gone(uid) => ctx.teardown.gone(&uid),
        }
    }
}

/// A channel's receiver as a stream.
pub fn channel_stream<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
