//! The Service reconcile: inputs from the stores, addresses from `ipam`, the plan from the
//! domain, rules through `loxilb`, and the report (status, conditions, Events), with the
//! cleanup and finalizers of Services that go (their rules first: `teardown`).

mod apply;
pub mod cleanup;
pub mod conditions;
pub mod context;
pub mod departures;
pub mod inputs;
pub mod placement;
pub mod plan;
pub mod reconcile;
pub mod report;
pub mod status;
pub mod teardown;

pub use context::{Context, Settings};
