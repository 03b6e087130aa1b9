//! Gateway API (`--gatewayAPI`): loxilb as the data plane of Gateways whose GatewayClass
//! names this controller (`--loxilbGatewayClass`, kube-loxilb's spellings).
//!
//! - `types`: the Gateway API kinds read, as minimal typed views of the upstream CRDs.
//! - `attach`: which routes attach to which listeners and what their backends resolve to
//!   (pure, the spec's rules and reasons).
//! - `plan`: what one Gateway should be from the objects read (pure): the attachments, the
//!   listeners' endpoints and rules; the pass carries it out, `loxi-ccm audit` checks
//!   against it.
//! - `rules`: a Gateway's loxilb rules from its addresses and listeners' endpoints (pure).
//! - `status`: the conditions and route parent entries (pure).
//! - `tls`: whether a Secret an HTTPS listener names holds a certificate and its key (pure).
//! - `controller`: the watches and the loop; `pass`: one pass over every Gateway of ours,
//!   the only place that calls the API server, IPAM and loxilb.
//!
//! A Gateway's address is a durable AddressClaim like a Service's (`crate::ipam`, owner role
//! `gateway`); its rules go through the same per-loxilb write path as Services' rules
//! (`crate::loxilb::Instance::apply_service`, so the write window and limits apply) under
//! a rule-owner id of its own, `<cluster>.gateway` (see [`rule_owner`]): the Services'
//! drift check and replay never take them for orphans, and this controller's own passes
//! (on every change and every `--drift-interval`) keep them in step. A restarted or joining
//! loxilb gets them back in its worker's replay (`replay`: the rules the last pass decided,
//! wrapped around the fleet worker's `Replay` like the Egresses').
//! docs/gateway-api.md says what is supported and what is not yet.

pub mod attach;
mod controller;
pub mod http;
mod ingress;
mod pass;
pub mod plan;
pub mod replay;
pub mod rules;
pub mod status;
pub mod tls;
pub mod types;

use std::sync::Arc;
use std::time::Duration;

use loxi_domain::{ClusterId, ControllerName};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;

use crate::ipam::Ipam;
use crate::k8s::events::EventRecorder;
use crate::leader::Gate;
use crate::loxilb::Fleet;
use crate::metrics::Metrics;

pub use controller::run;
pub use replay::{Decided, with_replay};

/// The finalizer a Gateway of ours carries while it has rules or an address.
pub const FINALIZER: &str = "loxi-ccm.loxilb.io/gateway";

/// What the operator configured (`--gatewayAPI`, `--loxilbGatewayClass`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The GatewayClass `spec.controllerName` this controller serves.
    pub controller_name: String,
    /// How often every Gateway is passed over even without a change: rules lost by a
    /// loxilb restart come back by then (`--drift-interval`).
    pub resync: Duration,
    /// The group of loxilbs the Gateways' rules go to (`--zone`).
    pub group: String,
    /// How rules are written (`--setLBMode`, BGP advertisement).
    pub style: rules::RuleStyle,
}

/// The stores a pass reads.
#[derive(Clone)]
pub(crate) struct Stores {
    pub classes: Store<types::GatewayClass>,
    pub gateways: Store<types::Gateway>,
    pub tcp_routes: Store<types::TCPRoute>,
    pub udp_routes: Store<types::UDPRoute>,
    pub http_routes: Store<types::HTTPRoute>,
    pub grants: Store<types::ReferenceGrant>,
    /// Every Service (backends are usually ClusterIP, which the Service controller's
    /// LoadBalancer-only watch does not see): a pass reads backends here, not by GETs.
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
}

/// The handles of the subsystems the Gateway controller uses.
#[derive(Clone)]
pub struct Handles {
    pub kube: kube::Client,
    pub ipam: Arc<Ipam>,
    pub instances: Fleet,
    pub gate: Arc<Gate>,
    /// This controller's cluster id (rules' owner ids are derived from it).
    pub cluster: ClusterId,
    pub metrics: Metrics,
    pub recorder: EventRecorder,
    /// Each Gateway's rules as the last pass decided them, which the loxilbs' replay
    /// puts back (`replay`).
    pub decided: Arc<Decided>,
}

/// The id in the rule names of Gateways' rules: the cluster id of a controller named
/// `gateway` under this one, so no Service's rules (and no other controller's) share it.
pub fn rule_owner(cluster: &ClusterId) -> ClusterId {
    let gateway = ControllerName::new("gateway").expect("a valid controller name");
    cluster.for_controller(&gateway)
}
