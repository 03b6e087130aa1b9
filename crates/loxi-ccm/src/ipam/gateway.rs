//! The addresses of Gateway API Gateways (`crate::gateway`): the same pools, index and
//! durable claims as Services' addresses, under an owner entry with role `gateway`, so a
//! Gateway and a Service of one namespace/name never take each other's address, and the
//! claim collection (which looks owners up among Services) leaves Gateways' claims to
//! the Gateway's own cleanup.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use tracing::info;

use super::claims::{self, ClaimedBy};
use super::ensure::OwnerKind;
use super::{EnsureError, Held, Ipam};

impl Ipam {
    /// The address of a Gateway, given as a Service of its namespace, name and uid (its
    /// annotations, the address it asks for in `spec.loadBalancerIP` and its family in
    /// `spec.ipFamilies`, the address it shows in `status.loadBalancer`), backed by its
    /// claim: as for a Service, the address it shows stays its own across restarts.
    /// Unlike a Service it does not wait in the address queue: the Gateway controller
    /// tries again on its own.
    pub async fn ensure_gateway(&self, as_service: &Service) -> Result<Held, EnsureError> {
        self.ensure_all(as_service, OwnerKind::Gateway).await
    }

    /// The addresses the Gateway `namespace/name` holds, by its claims in the store.
    pub fn gateway_addresses(&self, namespace: &str, name: &str) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .claims
            .state()
            .iter()
            .filter(|c| self.ours(c))
            .filter(|c| {
                c.owners()
                    .iter()
                    .any(|o| o.is_gateway() && o.is(namespace, name))
            })
            .filter_map(|c| c.ip())
            .collect();
        ips.sort();
        ips
    }

    /// Every Gateway that holds a claim of ours: (namespace, name, uid).
    pub fn gateway_owners(&self) -> Vec<ClaimedBy> {
        let mut owners: Vec<ClaimedBy> = self
            .claims
            .state()
            .iter()
            .filter(|c| self.ours(c))
            .flat_map(|c| {
                c.owners()
                    .into_iter()
                    .filter(|o| o.is_gateway())
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        owners.sort_by_key(ClaimedBy::key);
        owners.dedup_by_key(|o| o.key());
        owners
    }

    /// Gives back every address of the Gateway `namespace/name` (its rules are gone by
    /// now): its claims are deleted (a Gateway's address is never shared or retained).
    pub async fn release_gateway(&self, namespace: &str, name: &str) -> kube::Result<()> {
        let key = ClaimedBy::gateway(namespace, name, "").key();
        let mut ips = self.state().index.addresses_of(&key).to_vec();
        ips.extend(self.gateway_addresses(namespace, name));
        ips.sort();
        ips.dedup();
        for ip in &ips {
            if let Some(claim) = self.claim_of(ip)
                && claim
                    .owners()
                    .iter()
                    .any(|o| o.is_gateway() && o.is(namespace, name))
            {
                claims::leave(&self.claims_api, &claim, namespace, name).await?;
            }
            self.state().index.release_from(ip, &key);
        }
        if !ips.is_empty() {
            info!(released = ?ips, gateway = %format!("{namespace}/{name}"), "Gateway addresses released");
            self.publish_metrics();
            self.wake_waiters();
        }
        Ok(())
    }
}
