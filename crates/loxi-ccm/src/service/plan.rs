//! Step 3 of a Service reconcile: the rules it should have, from the domain's planner over
//! the inputs read in step 1. The drift check and the replay ask the same question for
//! every served Service ([`desired`]).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use loxi_domain::ingress::IngressMode;
use loxi_domain::naming::{DEFAULT_INSTANCE, RuleName};
use loxi_domain::placement::PlacementError;
use loxi_domain::plan::Plan;
use loxi_domain::private_address::private_ip_for;
use loxi_domain::roles::{UnknownInstance, ZONE_INSTANCE_ANNOTATION, parse_instance};
use loxi_domain::{
    AnnotationError, ClusterId, EndpointView, NodeView, PlanError, TrafficPolicy, parse_intent,
    plan_rules,
};
use thiserror::Error;

use super::context::{Context, Settings};
use crate::ipam::AddressProblem;
use crate::k8s::view::service_view;

/// Why a Service cannot have rules right now; each becomes a Warning Event and a condition.
#[derive(Debug, Error)]
pub enum Problem {
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error(transparent)]
    Address(#[from] AddressProblem),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Instance(#[from] UnknownInstance),
    #[error(transparent)]
    Placement(#[from] PlacementError),
}

impl Problem {
    /// Stable category, for the condition reason, the Event reason and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::Annotation(e) => e.reason(),
            Problem::Address(e) => e.reason(),
            Problem::Plan(e) => e.reason(),
            Problem::Instance(_) => "InvalidAnnotation",
            Problem::Placement(e) => e.reason(),
        }
    }
}

/// The rules for `svc` on the VIPs `addresses`, SCTP rules with `secondaries`; `None`
/// without an address.
pub fn rules_for(
    svc: &Service,
    ctx: &Context,
    addresses: &[IpAddr],
    secondaries: &[IpAddr],
) -> Result<Option<Plan>, Problem> {
    let nodes = ctx.inputs.node_views();
    let pools = ctx.ipam.pool_set();
    let world = PlanWorld {
        settings: &ctx.settings,
        cluster: &ctx.cluster,
        nodes: &nodes,
        advertises: &|ip| pools.advertises(ip),
    };
    plan_from(
        svc,
        &world,
        || ctx.inputs.endpoints_of(svc),
        addresses,
        secondaries,
    )
}

/// What every Service's plan is made against: the reconcile's settings, the cluster identity,
/// the Nodes' views, and whether an address's pool lets BGP announce it.
#[derive(Clone, Copy)]
pub struct PlanWorld<'a> {
    pub settings: &'a Settings,
    pub cluster: &'a ClusterId,
    pub nodes: &'a [NodeView],
    pub advertises: &'a dyn Fn(&IpAddr) -> bool,
}

/// [`rules_for`] over plain inputs: the [`PlanWorld`] and the Service's endpoints (asked for
/// only when the plan reads them). Pure; `loxi-ccm audit` (`crate::audit`) computes the
/// rules a Service should have with it, exactly as the controller does.
pub fn plan_from(
    svc: &Service,
    world: &PlanWorld<'_>,
    endpoints_of: impl FnOnce() -> Vec<EndpointView>,
    addresses: &[IpAddr],
    secondaries: &[IpAddr],
) -> Result<Option<Plan>, Problem> {
    let PlanWorld {
        settings,
        cluster,
        nodes,
        advertises,
    } = *world;
    let intent = parse_intent(svc.annotations(), settings.defaults)?;
    IngressMode::from_annotations(svc.annotations())?;
    let ha_instance = ha_instance(svc, settings)?;
    if addresses.is_empty() {
        return Ok(None);
    }
    let mut view = service_view(svc);
    view.secondary_ips = secondaries.to_vec();
    if !settings.enforce_source_ranges {
        // --source-ranges=ignore: said on the Service (conditions::source_ranges).
        view.source_ranges.clear();
    }
    // Only externalTrafficPolicy Local and pod-network mode read endpoints: the others are
    // planned from Nodes alone, without a pass over every EndpointSlice.
    let needs_endpoints =
        view.external_traffic_policy == TrafficPolicy::Local || intent.use_pod_network;
    let endpoints = if needs_endpoints {
        endpoints_of()
    } else {
        Vec::new()
    };
    let mut plan = plan_rules(cluster, &view, nodes, &endpoints, addresses, &intent)?;
    if settings.advertise {
        // Per pool: a pool with `bgpAdvertise: false` keeps its addresses unannounced.
        for rule in &mut plan.rules {
            rule.bgp = advertises(&rule.key.ip);
        }
    }
    if settings.private_ip.is_some() {
        let lb_ip = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref());
        for rule in &mut plan.rules {
            rule.private_ip =
                private_ip_for(settings.private_ip, svc.annotations(), lb_ip, rule.key.ip);
        }
    }
    if ha_instance != DEFAULT_INSTANCE {
        for rule in &mut plan.rules {
            if let Some(mut name) = RuleName::parse(&rule.name) {
                name.instance = ha_instance.clone();
                rule.name = name.to_string();
            }
        }
    }
    Ok(Some(plan))
}

/// The HA instance of a Service (docs/fleet.md#ha-instances), among those of its group: the
/// one its `loxilb.io/zoneinstance` names, else the first (the only one unless
/// `--num-zone-instances` is above 1, where the reconcile gives each Service one before
/// planning: [`instance_to_pin`]).
pub fn ha_instance(svc: &Service, settings: &Settings) -> Result<String, UnknownInstance> {
    let instances = settings.instances_of(settings.group_of(svc));
    match pinned_instance(svc) {
        Some(value) => parse_instance(value, &instances),
        None => Ok(instances
            .first()
            .cloned()
            .unwrap_or_else(|| DEFAULT_INSTANCE.to_string())),
    }
}

/// The Service's `loxilb.io/zoneinstance`, unless empty (empty counts as absent).
fn pinned_instance(svc: &Service) -> Option<&str> {
    svc.annotations()
        .get(ZONE_INSTANCE_ANNOTATION)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// The HA instance to record on a Service of `group` that has none yet, when there are
/// several: a Service already ours (programmed before there were several) keeps the first,
/// the one its rules name; a new one gets the least used of its group
/// (`loxi_domain::roles::pick_instance`).
pub fn instance_to_pin(
    svc: &Service,
    ctx: &Context,
    already_ours: bool,
    group: &str,
) -> Option<String> {
    let instances = ctx.settings.instances_of(group);
    if instances.len() <= 1 || pinned_instance(svc).is_some() {
        return None;
    }
    if already_ours {
        return instances.first().cloned();
    }
    let mut counts = std::collections::BTreeMap::new();
    for other in ctx.inputs.services.state() {
        if ctx.settings.group_of(&other) != group {
            continue;
        }
        if let Some(Ok(inst)) = pinned_instance(&other).map(|v| parse_instance(v, &instances)) {
            *counts.entry(inst).or_insert(0) += 1;
        }
    }
    Some(loxi_domain::roles::pick_instance(&instances, &counts))
}

/// What a whole-instance pass (drift check, replay) should hold for one served Service.
pub enum Desired {
    Rules(Plan),
    /// No address yet: no rules.
    Nothing,
    /// Leave its rules as they are: it has a problem only its owner can fix, or an address
    /// that no claim in the store backs yet (being claimed, or refused).
    Keep,
}

/// The rules a served Service should have, from the stores only (no allocation). Only
/// addresses backed by a claim that lists the Service are ever programmed from here.
pub fn desired(svc: &Service, ctx: &Context) -> Desired {
    let Some((addresses, secondaries)) = ctx.ipam.backed_addresses(svc) else {
        return Desired::Keep;
    };
    match rules_for(svc, ctx, &addresses, &secondaries) {
        Ok(Some(plan)) => Desired::Rules(plan),
        Ok(None) => Desired::Nothing,
        Err(_) => Desired::Keep,
    }
}
