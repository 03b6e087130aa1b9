//! The Service reconcile: inputs from the stores, addresses from `ipam`, the plan from the
//! domain, rules through `loxilb`, and the report (status, conditions, Events), with the
//! cleanup and finalizers of Services that go (their rules first: `teardown`), the rules of
//! whole loxilbs (`drift`: replay and drift check) and where a Service goes (`placing`).

mod apply;
pub mod backoff;
pub mod cleanup;
pub mod conditions;
pub mod context;
pub mod departures;
pub mod drift;
pub mod error;
pub mod inputs;
pub mod placing;
pub mod plan;
pub mod reconcile;
pub mod report;
pub mod reporter;
pub mod rules_first;
pub mod status;
pub mod teardown;
pub mod watch;

pub use context::{Context, Settings};
