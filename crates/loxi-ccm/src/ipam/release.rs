//! Giving addresses back: those a Service no longer wants, and all of them when it goes.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tracing::info;

use super::{Ipam, claims};
use crate::k8s::view::{owner_key, secondary_owner_key};

impl Ipam {
    /// Addresses indexed for the Service that it no longer wants: neither in `vips` nor in
    /// `secondaries` (what this pass holds). The caller lets them go with
    /// [`Ipam::release_unwanted`] once their rules are gone, and not while the Service still
    /// shows them.
    pub fn unwanted(&self, svc: &Service, vips: &[IpAddr], secondaries: &[IpAddr]) -> bool {
        let state = self.state();
        let extra = |key: &str, keep: &[IpAddr]| {
            state
                .index
                .addresses_of(key)
                .iter()
                .any(|ip| !keep.contains(ip))
        };
        extra(&owner_key(svc), vips) || extra(&secondary_owner_key(svc), secondaries)
    }

    /// Lets go of every address the Service holds that is not in `vips`/`secondaries` and
    /// not in `shown` (what the Service shows right now, read from the API server: with two
    /// replicas racing, the other may have just published an address this replica's stale
    /// view says is unused, and letting it go would hand a published address to someone
    /// else). Its claims are updated or deleted, the index freed where nobody else holds the
    /// address.
    pub async fn release_unwanted(
        &self,
        svc: &Service,
        vips: &[IpAddr],
        secondaries: &[IpAddr],
        shown: &[IpAddr],
    ) -> kube::Result<()> {
        let mut released = Vec::new();
        for (key, keep) in [
            (owner_key(svc), vips),
            (secondary_owner_key(svc), secondaries),
        ] {
            let extra: Vec<IpAddr> = self
                .state()
                .index
                .addresses_of(&key)
                .iter()
                .copied()
                .filter(|ip| !keep.contains(ip) && !shown.contains(ip))
                .collect();
            for ip in extra {
                self.leave(svc, &ip).await?;
                self.state().index.release_from(&ip, &key);
                released.push(ip);
            }
        }
        if !released.is_empty() {
            info!(?released, service = %owner_key(svc), "addresses no longer wanted released");
            self.publish_metrics();
            self.wake_waiters();
        }
        Ok(())
    }

    /// Takes the Service off the claim of `ip`, when the claim lists it.
    async fn leave(&self, svc: &Service, ip: &IpAddr) -> kube::Result<()> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        if let Some(c) = self.claim_listing(ip, &ns, &name).await? {
            claims::leave(&self.claims_api, &c, &ns, &name).await?;
        }
        Ok(())
    }

    /// The claim of `ip` when it lists namespace/name: the store's copy when that lists it
    /// (a stale one is caught by the write's resourceVersion), else the API server's. The
    /// store lags behind claim writes (this replica's own, or any made while the claim watch
    /// re-lists after an API server restart): trusting a copy that does not list the Service
    /// yet left it on the claim, with its old ports, while the index let it go, and the next
    /// claim event put it back in the index (the soak's first bug, docs/RELIABILITY.md).
    async fn claim_listing(
        &self,
        ip: &IpAddr,
        ns: &str,
        name: &str,
    ) -> kube::Result<Option<claims::AddressClaim>> {
        if let Some(c) = self.claim_of(ip)
            && c.owner(ns, name).is_some()
        {
            return Ok(Some((*c).clone()));
        }
        let fresh = self.claims_api.get_opt(&claims::claim_name(ip)).await?;
        Ok(fresh.filter(|c| self.ours(c) && c.owner(ns, name).is_some()))
    }

    /// Gives the Service's addresses back (their rules are gone by now): takes it off their
    /// claims (deleted when it was the last owner), or keeps an address it held alone as
    /// retained for this namespace/name for `retention` (the Service's annotation; `None`:
    /// its pool's `retainAddresses`; zero: release at once). A shared address is not
    /// retained: it stays with its other owners anyway.
    pub async fn release_all(
        &self,
        svc: &Service,
        retention: Option<Duration>,
    ) -> kube::Result<()> {
        let mut released = Vec::new();
        for key in [owner_key(svc), secondary_owner_key(svc)] {
            let ips = self.state().index.addresses_of(&key).to_vec();
            for ip in ips {
                if self.retain_or_leave(svc, &ip, retention).await? {
                    continue; // still indexed for this namespace/name
                }
                self.state().index.release_from(&ip, &key);
                released.push(ip);
            }
        }
        if !released.is_empty() {
            info!(?released, service = %owner_key(svc), "addresses released");
            self.publish_metrics();
            self.wake_waiters();
        }
        Ok(())
    }

    /// Retains `ip` for the Service when it holds it alone and retention applies (returns
    /// true), else takes the Service off its claim.
    async fn retain_or_leave(
        &self,
        svc: &Service,
        ip: &IpAddr,
        retention: Option<Duration>,
    ) -> kube::Result<bool> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let uid = svc.uid().unwrap_or_default();
        let Some(claim) = self.claim_listing(ip, &ns, &name).await? else {
            return Ok(false);
        };
        // The pool the claim credits the address to (the Service's selection when pools
        // overlap), else the first pool holding it (a claim written without one).
        let retain = retention
            .or_else(|| {
                let pool = if claim.spec.pool.is_empty() {
                    self.state().index.pool_containing(ip).to_string()
                } else {
                    claim.spec.pool.clone()
                };
                self.pool_set().get(&pool).and_then(|d| d.retain)
            })
            .filter(|d| !d.is_zero());
        let ours = claim
            .owner(&ns, &name)
            .is_some_and(|o| o.uid.is_empty() || o.uid == uid);
        if !ours {
            return Ok(false);
        }
        match retain {
            Some(d) if claim.owners().len() == 1 => {
                // Saturating: a period past the year 9999 keeps the address for good.
                let until = k8s_openapi::jiff::Timestamp::now()
                    .saturating_add(d)
                    .unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
                claims::retain(&self.claims_api, &claim, until).await?;
                info!(%ip, %until, "address retained");
                Ok(true)
            }
            _ => {
                claims::leave(&self.claims_api, &claim, &ns, &name).await?;
                Ok(false)
            }
        }
    }
}
