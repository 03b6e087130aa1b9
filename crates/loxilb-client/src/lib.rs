//! Typed client for the loxilb REST API (`/netlox/v1`), following how loxilb really behaves
//! (docs/loxilb-api.md) rather than only its published spec.

pub mod bgp;
mod client;
pub mod convert;
pub mod dto;
mod error;
pub mod firewall;
pub mod listing;
mod token;

pub use bgp::{
    BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpNeighborStatus, BgpPolicy, BgpPolicyApply, BgpPrefix,
    BgpStatement, DefinedSetKind, PolicyDirection, RouteAction,
};
pub use client::{
    ClientConfig, DeleteOutcome, IDENTITY_HEADER, LoxilbClient, RetryPolicy, USER_AGENT, WriteGate,
    WriteOutcome, install_crypto_provider,
};
pub use dto::{
    AllowedSource, CiState, EndpointEntry, LoadbalanceEntry, SecondaryIp, ServiceArguments,
    VersionInfo,
};
pub use error::{ClientError, GobgpAnswer};
pub use firewall::{FirewallEntry, FirewallMatch, FirewallOptions};
pub use listing::Listing;
pub use token::Token;
