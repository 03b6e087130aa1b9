//! loxi-ccm: the controller binary's library (the binary is a thin `main`; tests run the
//! controller in-process through [`runtime::run`]).
//!
//! Each top-level module is a subsystem that owns its state behind a handle; which may use
//! which is the table in `docs/architecture.md`, kept true by `tests/architecture.rs`.

pub mod audit;
pub mod bgp;
pub mod config;
pub mod egress;
pub mod fleet;
pub mod gateway;
pub mod ipam;
pub mod k8s;
pub mod k8s_metadata;
pub mod leader;
pub mod loxilb;
pub mod metrics;
pub mod node_init;
pub mod runtime;
pub mod service;
