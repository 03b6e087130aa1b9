//! Pure decision code of loxi-ccm.
//!
//! Everything here is a function from plain data to plain data: no Kubernetes types, no HTTP,
//! no clocks. The controller turns API objects into the views defined here, asks this crate
//! what should exist, and applies the answer at its edges (docs/architecture.md#data-flow,
//! steps 1 and 3).

pub mod address_name;
pub mod addressing;
pub mod bgp;
pub mod choice;
pub mod diff;
pub mod duration;
pub mod egress;
pub mod firewall;
pub mod ingress;
pub mod intent;
pub mod inventory;
pub mod ipam;
pub mod k8s_metadata;
pub mod model;
pub mod mtls;
pub mod naming;
pub mod placement;
pub mod plan;
pub mod pools;
pub mod private_address;
pub mod roles;
pub mod selection;
pub mod shared_rules;
pub mod sharing;
pub mod text;
pub mod write_window;

pub use diff::{Action, diff_rules};
pub use intent::{AnnotationError, Defaults, ServiceIntent, parse_intent};
pub use ipam::{AllocError, Allocator, Pool};
pub use model::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
pub use naming::{ClusterId, ControllerName, RuleName};
pub use plan::{
    EndpointPortView, EndpointView, NodeView, PlanError, ServicePortView, ServiceView,
    TrafficPolicy, plan_rules,
};
