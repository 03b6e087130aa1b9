//! loxi-ccm: the controller binary's library (the binary is a thin `main`; tests run the
//! controller in-process through [`controller::run`]).

pub mod admin;
pub mod check;
pub mod claims;
pub mod cli;
pub mod config;
pub mod context;
pub mod controller;
pub mod crds;
pub mod departures;
pub mod events;
pub mod fleet;
pub mod kube_api;
pub mod kube_view;
pub mod leader;
pub mod metrics;
pub mod node_init;
pub mod node_watch;
pub mod pools;
pub mod reconcile;
pub mod status;
pub mod trim;
