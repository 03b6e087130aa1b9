//! Kubernetes helpers shared by the subsystems: the API client, Events, trimmed watch
//! objects, reconcile triggers that wait for the store, plain views of Services, Nodes and
//! EndpointSlices, the watches of kinds whose CRD may be installed later (`served`), and the
//! loop of the subsystems that work in whole passes (`passes`).

pub mod api;
pub mod conditions;
pub mod events;
pub mod passes;
pub mod pod;
pub mod schema;
pub mod served;
pub mod triggers;
pub mod trim;
pub mod view;
