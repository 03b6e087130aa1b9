//! Typed client for the loxilb REST API (`/netlox/v1`), following how loxilb really behaves
//! (docs/loxilb-api.md) rather than only its published spec.

mod client;
pub mod convert;
pub mod dto;
mod error;
pub mod listing;

pub use client::{
    ClientConfig, DeleteOutcome, LoxilbClient, RetryPolicy, WriteGate, WriteOutcome,
    install_crypto_provider,
};
pub use dto::{
    AllowedSource, CiState, EndpointEntry, LoadbalanceEntry, SecondaryIp, ServiceArguments,
    VersionInfo,
};
pub use error::ClientError;
pub use listing::Listing;
