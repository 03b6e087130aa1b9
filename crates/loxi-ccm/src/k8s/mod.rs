//! Kubernetes helpers shared by the subsystems: the API client, Events, trimmed watch
//! objects, and plain views of Services, Nodes and EndpointSlices.

pub mod api;
pub mod events;
pub mod trim;
pub mod view;
