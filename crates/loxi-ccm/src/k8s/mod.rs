//! Kubernetes helpers shared by the subsystems: the API client, Events, trimmed watch
//! objects, reconcile triggers that wait for the store, and plain views of Services, Nodes and EndpointSlices.

pub mod api;
pub mod events;
pub mod triggers;
pub mod trim;
pub mod view;
