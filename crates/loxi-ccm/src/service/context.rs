//! What a Service reconcile works with: the handles of the subsystems it orchestrates.
//! Each handle owns its state; the reconcile only calls their methods.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::{ClusterId, Defaults};
use tokio::sync::mpsc;

use super::departures::Departures;
use super::inputs::Inputs;
use super::reconcile::Backoff;
use super::report::Report;
use super::teardown::RulesFirst;
use crate::ipam::Ipam;
use crate::k8s::view::Selection;
use crate::leader::Gate;
use crate::loxilb::{Fleet, Requeue, RuleOwner};

/// The operator's settings the Service reconcile follows.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Annotation defaults from flags (`--setLBMode`, `--monitor`, ...).
    pub defaults: Defaults,
    /// `--source-ranges`: put `loadBalancerSourceRanges` in loxilb's rules (loxilb issue
    /// #1036: `docs/annotations.md`).
    pub enforce_source_ranges: bool,
    /// `--namespace`: only Services of this namespace are ours.
    pub namespace: Option<String>,
    /// BGP is on (`--bgp-local-as`): rules advertise their addresses.
    pub advertise: bool,
    /// The HA instances a Service can be given (`--num-zone-instances`).
    pub ha_instances: Vec<String>,
}

pub struct Context {
    pub kube: kube::Client,
    pub settings: Settings,
    pub selection: Selection,
    pub cluster: ClusterId,
    pub inputs: Inputs,
    pub ipam: Arc<Ipam>,
    pub fleet: Fleet,
    pub report: Report,
    pub gate: Arc<Gate>,
    pub backoff: Backoff,
    /// Asks the controller to reconcile a Service now.
    pub requeue: mpsc::UnboundedSender<ObjectRef<Service>>,
    /// The same queue, as the loxilb subsystem re-queues a Service waiting for room.
    pub room_requeue: Requeue,
    /// Services that left type LoadBalancer while carrying our finalizer.
    pub departures: Departures,
    /// Deleted Services' rules removed ahead of their cleanup (`teardown`).
    pub teardown: RulesFirst,
}

impl Context {
    /// Re-queues every Service this controller serves (after node changes or a loxilb replay).
    pub fn requeue_all_served(&self) {
        for svc in self.inputs.services.state() {
            if self.selection.serves(&svc) {
                let _ = self.requeue.send(ObjectRef::from_obj(&*svc));
            }
        }
    }

    pub fn services_api(&self, svc: &Service) -> Api<Service> {
        Api::namespaced(self.kube.clone(), &svc.namespace().unwrap_or_default())
    }
}

/// The loxilb subsystem's way back to the Service queue: a Service waiting for room on an
/// instance is re-queued by its rule owner key.
pub fn room_requeue(tx: mpsc::UnboundedSender<ObjectRef<Service>>) -> Requeue {
    Requeue::new(move |owner: &RuleOwner| {
        let _ = tx.send(ObjectRef::new(&owner.name).within(&owner.namespace));
    })
}

/// The rule owner key of a Service (what loxilb rule names carry).
pub fn rule_owner(svc: &Service) -> RuleOwner {
    RuleOwner::new(&svc.namespace().unwrap_or_default(), &svc.name_any())
}
