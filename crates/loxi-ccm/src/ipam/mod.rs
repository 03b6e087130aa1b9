//! Address management: the only owner of the allocator index, the pool set in effect, the
//! durable `AddressClaim` records and the Services waiting for an address.
//!
//! The claims are the record (one cluster-scoped object per address, written before the
//! address is published or programmed: `docs/architecture.md#invariants`); the
//! index is a cache of them, rebuilt at start-up before anything is allocated and kept
//! current by the claim watch. Everything that reads or changes the index goes through
//! [`Ipam`]'s methods, under its one lock.

pub mod address_pools;
pub mod claims;
pub mod crds;
mod ensure;
mod gateway;
mod release;
mod schema;
pub mod watch;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use loxi_domain::ipam::{Family, Sharing};
use loxi_domain::pools::PoolSet;
use loxi_domain::{AllocError, Allocator, AnnotationError, ControllerName, Pool};
use thiserror::Error;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::k8s::view::{owner_key, published_addresses, secondary_owner_key};
use crate::metrics::Metrics;
use address_pools::Pools;
use claims::{AddressClaim, ClaimedBy};

pub use ensure::Held;

/// Where Services waiting for an address are sent when one may have freed up.
pub type Requeue = mpsc::UnboundedSender<ObjectRef<Service>>;

/// What the operator configured for addresses (flags and config file).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Pools from `--external-cidr`, `--cidr-pools`, ...
    pub pools: Vec<Pool>,
    /// Secondary pools (`--external-secondary-cidrs`), for SCTP multi-homing.
    pub secondary_pools: Vec<Pool>,
    /// `--set-unique-ip`: one Service per address.
    pub unique_ip: bool,
    /// `--namespace`: only Services (and claim owners) in this namespace are ours.
    pub namespace: Option<String>,
    /// The default group of loxilbs (`--zone`): Services placed on it share addresses with
    /// Services that name no group.
    pub zone: String,
    /// This controller among several in one cluster: only its own claims are ever changed
    /// or released here; another's only mark their address as taken.
    pub controller: ControllerName,
}

/// Why a Service has no address now: reported on the Service, nothing to retry until
/// something changes (the Service, the pools, an address freed).
#[derive(Debug, Error)]
pub enum AddressProblem {
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    #[error(transparent)]
    Allocation(#[from] AllocError),
    /// The API server refused to store the address's claim (a policy, a quota, a webhook):
    /// without it the address is neither published nor programmed.
    #[error("the AddressClaim for {ip} was refused by the API server: {message}")]
    ClaimRefused { ip: IpAddr, message: String },
}

impl AddressProblem {
    /// Stable category, for the condition reason and the Warning Event.
    pub fn reason(&self) -> &'static str {
        match self {
            AddressProblem::Annotation(e) => e.reason(),
            AddressProblem::Allocation(e) => e.reason(),
            AddressProblem::ClaimRefused { .. } => "AddressClaimRefused",
        }
    }
}

/// Ensuring addresses either settles on a problem of the Service or fails on the API server
/// (retried with backoff).
#[derive(Debug, Error)]
pub enum EnsureError {
    #[error(transparent)]
    Problem(#[from] AddressProblem),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The state behind the one lock.
struct State {
    index: Allocator,
    pools: Arc<PoolSet>,
    /// Services that could not have an address: woken when one may have freed up.
    waiting: HashSet<ObjectRef<Service>>,
}

/// The address subsystem's handle.
pub struct Ipam {
    state: Mutex<State>,
    pools: Pools,
    claims: Store<AddressClaim>,
    claims_api: Api<AddressClaim>,
    settings: Settings,
    requeue: Requeue,
    metrics: Metrics,
}

impl Ipam {
    pub fn new(
        settings: Settings,
        pools: Pools,
        claims: Store<AddressClaim>,
        claims_api: Api<AddressClaim>,
        requeue: Requeue,
        metrics: Metrics,
    ) -> Ipam {
        let set = pools.compute(&settings.pools, &settings.secondary_pools);
        Ipam {
            state: Mutex::new(State {
                index: Allocator::new(settings.pools.clone()),
                pools: Arc::new(set),
                waiting: HashSet::new(),
            }),
            pools,
            claims,
            claims_api,
            settings,
            requeue,
            metrics,
        }
    }

    /// The state, also after a panic elsewhere held the lock: every change to it is made
    /// whole under the lock, so what a panicking holder left is still consistent.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The claim store (read-only, for `check` of the claim watch and for tests).
    pub fn claim_store(&self) -> &Store<AddressClaim> {
        &self.claims
    }

    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    /// The pool set in effect.
    pub fn pool_set(&self) -> Arc<PoolSet> {
        self.state().pools.clone()
    }

    /// Builds the index before anything is allocated: the pools, then every claim and every
    /// owner it lists (whoever made it), then addresses Services show without a claim yet
    /// (first start after kube-loxilb, the Go loxi-ccm or an older version), held here until
    /// their reconcile claims them. In shared mode Services showing one address on different
    /// ports (kube-loxilb's sharing) hold it together.
    pub fn rebuild<'a>(&self, ours: impl Iterator<Item = &'a Service>) {
        let mut state = self.state();
        let set = self
            .pools
            .compute(&self.settings.pools, &self.settings.secondary_pools);
        // A pool event before start-up may have logged them already.
        self.pools.log_invalid(&set, Some(&state.pools));
        state.index = Allocator::new(set.pools());
        state.pools = Arc::new(set);
        for claim in self.claims.state() {
            let Some(ip) = claim.ip() else { continue };
            for (key, sharing) in self.indexed_owners(&claim) {
                if let Err(e) = state.index.assign_shared(ip, &key, sharing) {
                    warn!(error = %e, owner = %key, "two incompatible owners recorded for one address");
                }
            }
        }
        for svc in ours {
            let key = owner_key(svc);
            let sharing = match service_sharing(svc, &self.settings.zone) {
                Ok(s) if !self.settings.unique_ip => s,
                _ => Sharing::Exclusive,
            };
            for ip in published_addresses(svc) {
                if state.index.holds(&ip, &key) {
                    continue;
                }
                if let Err(e) = state.index.assign_shared(ip, &key, sharing.clone()) {
                    warn!(service = %key, error = %e, "address shown by a Service is claimed by another");
                }
            }
        }
        info!(
            addresses = state.index.used(),
            claims = self.claims.len(),
            "address index rebuilt"
        );
        drop(state);
        self.publish_metrics();
    }

    /// Re-reads the pool resources. When the pools changed, the index is rebuilt over them
    /// with every owner kept, and Services waiting for an address try again (a new, grown or
    /// re-enabled pool may have room for them). Returns whether anything changed.
    pub fn refresh_pools(&self) -> bool {
        let mut state = self.state();
        let set = self
            .pools
            .compute(&self.settings.pools, &self.settings.secondary_pools);
        if *state.pools == set {
            return false;
        }
        if state.pools.pools() != set.pools() {
            state.index = state.index.with_pools(set.pools());
            let names: Vec<&str> = set.defs.iter().map(|d| d.name()).collect();
            info!(pools = ?names, "address pools changed: index rebuilt, no address moved");
        }
        self.pools.log_invalid(&set, Some(&state.pools));
        state.pools = Arc::new(set);
        drop(state);
        self.publish_metrics();
        self.wake_waiters();
        true
    }

    /// Keeps the index in step with claims made or removed elsewhere (another replica,
    /// another process, an operator's reservation). Before start-up (`ready` false) the
    /// index is rebuilt from the store as a whole instead.
    pub fn on_claim_event(&self, event: &watcher::Event<AddressClaim>, ready: bool) {
        if !ready {
            return;
        }
        match event {
            watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
                // Owners recorded elsewhere enter the index (refused when they clash with a
                // pick of this replica whose claim write is in flight: that write settles
                // it). Owners the index has and the claim lacks are left in the index for the
                // same reason, but get a pass of their own: either their claim write is in
                // flight (the pass finds it done), or they were taken off meanwhile, or an
                // older version of this claim put them back after their pass let the address
                // go. Their pass claims the address again or lets it go for good; without it
                // a Service could keep showing an address whose claim no longer lists it, and
                // the drift check would never program it again (the soak's bugs,
                // docs/RELIABILITY.md).
                //
                // Owners the claim records otherwise than the index (other ports, key or
                // group) get a pass too. A watch that resumes after a broken connection
                // (no re-list, so no `InitDone`) delivers the claim versions it missed only
                // now: a Service whose ports changed and changed back meanwhile had its
                // second pass read the claim of before the first change from the store,
                // find it listing the Service as it is, and write nothing, while the real
                // claim kept the first change (the fault matrix's `watch_connections_cut`,
                // docs/RELIABILITY.md). Its pass now finds the store as it is and rewrites
                // the claim.
                if let Some(ip) = c.ip() {
                    let owners = self.indexed_owners(c);
                    let listed: Vec<String> = owners.iter().map(|(k, _)| k.clone()).collect();
                    let passes: Vec<ObjectRef<Service>> = {
                        let mut state = self.state();
                        let mut due: Vec<String> = state
                            .index
                            .owners_of(&ip)
                            .into_iter()
                            .map(str::to_string)
                            .filter(|k| !listed.contains(k))
                            .collect();
                        if self.ours(c) {
                            for (key, sharing) in owners {
                                if state
                                    .index
                                    .sharing_of(&ip, &key)
                                    .is_some_and(|indexed| *indexed != sharing)
                                {
                                    due.push(key.clone());
                                }
                                let _ = state.index.assign_shared(ip, &key, sharing);
                            }
                        } else {
                            // Nothing of ours is ever in flight on another controller's
                            // claim: it holds the address alone, and whoever of ours the
                            // index had there gets a pass (below) to move or let go.
                            state.index.set_owners(ip, owners);
                        }
                        due.iter().filter_map(|k| service_of_key(k)).collect()
                    };
                    for svc in passes {
                        let _ = self.requeue.send(svc);
                    }
                }
            }
            watcher::Event::InitDone => {
                // A re-list after the watch broke (an API server restart, an expired
                // resourceVersion) is complete. Passes that ran while it was under way read
                // the old store: a claim that looked like it recorded a Service as it is now
                // may not (the soak's claim-ports violation: a Service's ports changed back
                // while the claim's last update was not in the store yet, so its pass wrote
                // nothing). And a claim deleted or updated meanwhile sends no event of its
                // own: its owners were never re-queued (the soak's unbacked-status
                // violations). Every owner of a claim, and every Service the index holds an
                // address for, gets a pass on the store as it is now; a pass with nothing to
                // do writes nothing.
                let mut owners: HashSet<ObjectRef<Service>> = self
                    .claims
                    .state()
                    .iter()
                    .filter(|c| self.ours(c))
                    .flat_map(|c| {
                        c.owners()
                            .into_iter()
                            .filter(|o| !o.uid.is_empty())
                            .map(|o| ObjectRef::new(&o.name).within(&o.namespace))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                owners.extend(
                    self.state()
                        .index
                        .entries()
                        .filter_map(|(_, key, _)| service_of_key(key)),
                );
                for svc in owners {
                    let _ = self.requeue.send(svc);
                }
            }
            watcher::Event::Delete(c) => {
                // Only the owners the deleted claim listed let go: a fresh pick of the same
                // address by another Service stays.
                let mut freed = false;
                if let Some(ip) = c.ip() {
                    let mut state = self.state();
                    for (key, _) in self.indexed_owners(c) {
                        freed |= state.index.release_from(&ip, &key);
                    }
                }
                // Owners that are still served lost what backs their address (the claim
                // deleted by hand, or by another tool): their reconcile claims it again, the
                // address they show first, before the woken waiters below look for one.
                // Without this they kept showing it, unclaimed, until something else
                // re-queued them (found by the fault matrix: docs/RELIABILITY.md). A Service
                // being deleted is re-queued for nothing: its reconcile finds it gone.
                let ours = if self.ours(c) { c.owners() } else { Vec::new() };
                for owner in ours.into_iter().filter(|o| !o.uid.is_empty()) {
                    let _ = self
                        .requeue
                        .send(ObjectRef::new(&owner.name).within(&owner.namespace));
                }
                if freed {
                    self.publish_metrics();
                    self.wake_waiters();
                }
            }
            _ => {}
        }
    }

    /// The addresses indexed for the Service (VIPs, secondary addresses) when every one of
    /// them is backed by a claim in the store that lists this very Service with the ports
    /// and sharing key it has now; `None` when one is not (being claimed, refused, or its
    /// ports changed and its own pass has not settled that yet): nothing may be programmed
    /// for it from the index alone. A claim recording old ports says nothing about the new
    /// ones: they may be a sharer's, and programming them there put two Services on one
    /// address and port, the drift check flapping between their rules (the soak's first
    /// bug, docs/RELIABILITY.md). The Service's own pass re-decides (refreshes its entry, or
    /// moves it), and the drift check follows.
    pub fn backed_addresses(&self, svc: &Service) -> Option<(Vec<IpAddr>, Vec<IpAddr>)> {
        let (vips, secondaries) = {
            let state = self.state();
            (
                state.index.addresses_of(&owner_key(svc)).to_vec(),
                state.index.addresses_of(&secondary_owner_key(svc)).to_vec(),
            )
        };
        let sharing = service_sharing(svc, &self.settings.zone).ok()?;
        let (ns, name, uid) = (
            svc.namespace().unwrap_or_default(),
            svc.name_any(),
            svc.uid().unwrap_or_default(),
        );
        let vip = ClaimedBy::new(&ns, &name, &uid, &sharing);
        let secondary = ClaimedBy::secondary(&ns, &name, &uid);
        let recorded =
            |ip: &IpAddr, me: &ClaimedBy| self.claim_of(ip).is_some_and(|c| c.records_as_is(me));
        (vips.iter().all(|ip| recorded(ip, &vip))
            && secondaries.iter().all(|ip| recorded(ip, &secondary)))
        .then_some((vips, secondaries))
    }

    /// The addresses the Service shows whose claims still list it.
    pub fn kept_addresses(&self, svc: &Service) -> Vec<IpAddr> {
        published_addresses(svc)
            .into_iter()
            .filter(|ip| self.claimed_by(svc, ip))
            .collect()
    }

    /// Whether the index holds any address for the Service.
    pub fn holds_any(&self, svc: &Service) -> bool {
        let state = self.state();
        !state.index.addresses_of(&owner_key(svc)).is_empty()
            || !state
                .index
                .addresses_of(&secondary_owner_key(svc))
                .is_empty()
    }

    /// Whether the claim store holds a claim for `ip` that lists `svc` (this very Service).
    fn claimed_by(&self, svc: &Service, ip: &IpAddr) -> bool {
        let ns = svc.namespace().unwrap_or_default();
        let uid = svc.uid().unwrap_or_default();
        self.claim_of(ip)
            .is_some_and(|c| c.owner(&ns, &svc.name_any()).is_some_and(|o| o.uid == uid))
    }

    /// The store's claim of `ip` when it is this controller's (another controller's claim
    /// is never read as backing, listing or recording one of our Services, even one of the
    /// same namespace/name and uid that moved between classes).
    fn claim_of(&self, ip: &IpAddr) -> Option<Arc<AddressClaim>> {
        self.claims
            .get(&ObjectRef::new(&claims::claim_name(ip)))
            .filter(|c| self.ours(c))
    }

    /// Whether the claim is this controller's (docs/architecture.md#several-controllers-in-one-cluster).
    fn ours(&self, claim: &AddressClaim) -> bool {
        self.settings
            .controller
            .owns(claim.spec.controller.as_deref())
    }

    /// The index's owners of a claim: each owner with what it occupies, for our claims; for
    /// another controller's, a single exclusive owner under a key no Service of ours has
    /// (`@<controller>`), so that the address counts as taken and nothing of ours ever joins
    /// it, lets it go or re-queues its owners.
    fn indexed_owners(&self, claim: &AddressClaim) -> Vec<(String, Sharing)> {
        if self.ours(claim) {
            claim
                .owners()
                .iter()
                .map(|o| (o.key(), o.sharing()))
                .collect()
        } else {
            let controller = claim
                .spec
                .controller
                .as_deref()
                .unwrap_or(ControllerName::DEFAULT);
            vec![(format!("@{controller}"), Sharing::Exclusive)]
        }
    }

    /// Where `ip` comes from, for messages: ` from pool <name>` or ` (outside every pool)`.
    pub fn origin(&self, ip: &IpAddr) -> String {
        let state = self.state();
        let pool = state.index.pool_containing(ip);
        if pool.is_empty() {
            " (outside every pool)".to_string()
        } else {
            format!(" from pool {pool}")
        }
    }

    /// The Service waits for an address: it is re-queued when one may have freed up.
    pub fn wait_for_address(&self, svc: &Service) {
        self.state().waiting.insert(ObjectRef::from_obj(svc));
    }

    /// An address was freed or the pools changed: Services waiting for one try again.
    pub fn wake_waiters(&self) {
        let waiting: Vec<_> = self.state().waiting.drain().collect();
        for r in waiting {
            let _ = self.requeue.send(r);
        }
    }

    /// Namespace labels changed: a pool's `namespaceSelector` may now admit waiting Services.
    pub fn on_namespace_change(&self) {
        let selective = self
            .pool_set()
            .defs
            .iter()
            .any(|d| d.namespace_selector.is_some());
        if selective {
            self.wake_waiters();
        }
    }

    /// Pool metrics from the index, and a nudge to the pool status writer.
    pub fn publish_metrics(&self) {
        {
            let state = self.state();
            for pool in state.index.pools() {
                let total = state
                    .index
                    .total_in(&pool.name, Family::V4)
                    .saturating_add(state.index.total_in(&pool.name, Family::V6));
                self.metrics
                    .set_pool(&pool.name, total, state.index.used_in(&pool.name));
            }
        }
        self.pools.changed.notify_one();
    }

    /// What a pool's status should say now.
    pub fn pool_status(
        &self,
        pool: &address_pools::AddressPool,
    ) -> address_pools::AddressPoolStatus {
        let state = self.state();
        address_pools::desired_status(pool, &state.pools, &state.index)
    }

    /// Deletes retained claims whose time is up, and takes owners that no longer exist off
    /// their claims (deleting a claim whose owners are all gone). Only owners in the
    /// namespaces this replica serves. `missing` says whether an owner is missing from the
    /// Service store; `confirm_gone` whether a missing one is really gone.
    pub async fn collect<F, Fut>(&self, missing: impl Fn(&ClaimedBy) -> bool, confirm_gone: F)
    where
        F: Fn(ClaimedBy) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let now = k8s_openapi::jiff::Timestamp::now();
        let in_scope = |o: &ClaimedBy| {
            self.settings
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == o.namespace)
        };
        for claim in self.claims.state().into_iter().filter(|c| self.ours(c)) {
            let owners = claim.owners();
            let mut orphans: Vec<&ClaimedBy> = Vec::new();
            for o in owners.iter().copied() {
                // A Gateway's claim is released by the Gateway's own cleanup
                // (crate::gateway): the Service store does not know it.
                if o.is_gateway() {
                    continue;
                }
                if in_scope(o) && !o.uid.is_empty() && missing(o) && confirm_gone(o.clone()).await {
                    orphans.push(o);
                }
            }
            let expired = claim.expired(now) && in_scope(&claim.spec.service);
            if expired || orphans.len() == owners.len() {
                info!(address = %claim.spec.address, owner = %claim.owner_key(), expired, "releasing claim");
                if let Err(e) = claims::release(&self.claims_api, &claim).await {
                    warn!(error = %e, "could not release claim");
                }
                continue;
            }
            for o in orphans {
                info!(address = %claim.spec.address, owner = %o.key(), "taking a deleted Service off a shared address");
                match claims::leave(&self.claims_api, &claim, &o.namespace, &o.name).await {
                    Ok(()) => {
                        if let Some(ip) = claim.ip() {
                            self.state().index.release_from(&ip, &o.key());
                        }
                    }
                    Err(e) => warn!(error = %e, "could not update claim"),
                }
            }
        }
    }
}

/// The Service an index owner key names (`namespace/name`, or `namespace/name#secondary`);
/// none for another controller's (`@<controller>`).
fn service_of_key(key: &str) -> Option<ObjectRef<Service>> {
    let service = key.split('#').next()?;
    let (namespace, name) = service.split_once('/')?;
    Some(ObjectRef::new(name).within(namespace))
}

/// The (port, protocol) pairs a Service serves: what it occupies on a shared address.
pub fn service_ports(svc: &Service) -> Vec<loxi_domain::ipam::PortProto> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| {
                    let port = u16::try_from(p.port).ok()?;
                    let protocol =
                        loxi_domain::Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?;
                    Some(loxi_domain::ipam::PortProto::new(port, protocol))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the Service occupies on its addresses: its ports, `loxilb.io/sharing-key` and group
/// of loxilbs (`default_group`: `--zone`) (`loxi_domain::sharing`; recorded in both modes,
/// the mode only decides joining).
pub fn service_sharing(svc: &Service, default_group: &str) -> Result<Sharing, AnnotationError> {
    loxi_domain::sharing::service_sharing(
        svc.meta().annotations.as_ref(),
        &service_ports(svc),
        default_group,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_keys_name_their_service() {
        let r = service_of_key("team/web").unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref()),
            ("web", Some("team"))
        );
        let r = service_of_key("team/sctp#secondary").unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref()),
            ("sctp", Some("team"))
        );
        assert!(service_of_key("no-slash").is_none());
        assert!(service_of_key("@other").is_none());
    }
}
