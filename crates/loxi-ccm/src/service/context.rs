//! What a Service reconcile works with: the handles of the subsystems it orchestrates.
//! Each handle owns its state; the reconcile only calls their methods.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::{ClusterId, Defaults};
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::departures::Departures;
use super::inputs::Inputs;
use super::reporter::Report;
use super::rules_first::RulesFirst;
use crate::fleet::placement::Placement;
use crate::ipam::Ipam;
use crate::k8s::view::Selection;
use crate::leader::Gate;
use crate::loxilb::{Fleet, Requeue, RuleOwner};

/// The operator's settings the Service reconcile follows.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Annotation defaults from flags (`--setLBMode`, `--monitor`, ...).
    pub defaults: Defaults,
    /// `--source-ranges`: put `loadBalancerSourceRanges` in loxilb's rules (loxilb issue
    /// #1036: `docs/annotations.md`).
    pub enforce_source_ranges: bool,
    /// `--source-ranges=firewall`: enforced by loxilb's firewall rules instead of the rules'
    /// `allowedSources` (`crate::loxilb::Instance::program_service`).
    pub source_ranges_firewall: bool,
    /// `--namespace`: only Services of this namespace are ours.
    pub namespace: Option<String>,
    /// BGP is on (`--bgp-local-as`): rules advertise their addresses.
    pub advertise: bool,
    /// The default group of loxilbs (`--zone`): the group of a Service that names none
    /// while there is only that group.
    pub zone: String,
    /// HA instances per group (`--num-zone-instances`): `<group>-inst0`, ...
    pub zone_instances: u16,
    /// `--privateCIDR`: the `privateIP` of the rules (`loxi_domain::private_address`).
    pub private_ip: Option<std::net::IpAddr>,
    /// `--appendEPs`: rules shared with other controllers, our endpoints attached and
    /// detached (`crate::loxilb::Instance::recall_shared`, docs/configuration.md#shared-rules).
    pub shared_rules: bool,
}

impl Settings {
    /// The settings a configuration gives (the controller's, and the auditor's reading the
    /// same flags).
    pub fn of(cfg: &crate::config::Config) -> Settings {
        Settings {
            defaults: cfg.defaults,
            enforce_source_ranges: cfg.enforce_source_ranges,
            source_ranges_firewall: cfg.source_ranges_firewall,
            namespace: cfg.namespace.clone(),
            advertise: cfg.bgp.is_some(),
            zone: cfg.zone.clone(),
            zone_instances: cfg.zone_instances,
            private_ip: cfg.private_ip,
            shared_rules: cfg.append_endpoints,
        }
    }
}

impl Default for Settings {
    /// The flags' defaults: one group, `llb`, with one HA instance.
    fn default() -> Settings {
        Settings {
            defaults: Defaults::default(),
            enforce_source_ranges: false,
            source_ranges_firewall: false,
            namespace: None,
            advertise: false,
            zone: loxi_domain::roles::DEFAULT_ZONE.to_string(),
            zone_instances: 1,
            private_ip: None,
            shared_rules: false,
        }
    }
}

impl Settings {
    /// The HA instances a Service of `group` can be given.
    pub fn instances_of(&self, group: &str) -> Vec<String> {
        loxi_domain::roles::instance_names(group, self.zone_instances)
    }

    /// The group of loxilbs `svc` is recorded on (`loxilb.io/zoneselect`), else the default
    /// group (a Service placed before there were several groups, or while there is one).
    pub fn group_of<'a>(&'a self, svc: &'a Service) -> &'a str {
        recorded_group(svc).unwrap_or(&self.zone)
    }
}

/// The Service's `loxilb.io/zoneselect`, unless empty (empty counts as absent).
pub fn recorded_group(svc: &Service) -> Option<&str> {
    svc.annotations()
        .get(loxi_domain::placement::ZONE_SELECT_ANNOTATION)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
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
    /// Deleted Services' rules removed ahead of their cleanup (`teardown`, `rules_first`).
    pub teardown: RulesFirst,
    /// Which group of loxilbs each Service goes to: the fleet's placement book
    /// (`crate::fleet::placement`, asked through `placing`).
    pub placement: Placement<ObjectRef<Service>>,
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
