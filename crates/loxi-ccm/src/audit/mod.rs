//! `loxi-ccm audit`: a read-only check of a live cluster and its loxilbs against the
//! invariants the controller keeps (docs/RELIABILITY.md#the-auditor):
//!
//! - no address with two owners beyond legal sharing (`loxi_domain::sharing`);
//! - every served Service has its rules, with the right endpoints and flags, on every loxilb
//!   that can be listed, computed by the controller's own planner (`service::plan`), and no
//!   rule it should not have;
//! - no rule named as this cluster's (`loxi_domain::naming`) whose Service is gone;
//! - no claim whose owners are gone, unless it is a reservation;
//! - no claim listing a live Service that shows another address and not the claim's;
//! - no Service with our finalizer showing an address no claim backs for it;
//! - no address outside every pool unless an owner asked for it by name (or reserved it);
//! - with `--gatewayAPI`, each Gateway of ours has its claim and its listeners' rules on
//!   every listed loxilb of the group with current endpoints (`gateway::plan`), and no
//!   Gateway rule or claim outlives its Gateway;
//! - with BGP, advertisement counts matching the rules, where loxilb exposes them (only the
//!   simulator does).
//!
//! The checks are pure functions over a snapshot ([`checks`]); taking the snapshot is the
//! only I/O ([`collect`]). Tests call [`audit`] after every fault; operators run the
//! subcommand, which takes the options of `run`.

pub mod checks;
pub mod collect;

pub use checks::{Findings, InstanceSnapshot, Kind, Snapshot, Violation};

use crate::config::Config;

/// Takes a snapshot of the cluster and its loxilbs and checks it.
pub async fn audit(client: &kube::Client, cfg: &Config) -> anyhow::Result<Findings> {
    let snapshot = collect::snapshot(client, cfg).await?;
    Ok(checks::audit(&snapshot))
}
