//! Every address a Service asks for, each backed by its durable claim before it is used.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use loxi_domain::addressing::{
    ANN_NUM_SECONDARY, ANN_POOL_SELECT, ANN_POOL_SELECT_SECONDARY, AddressInput, AddressSlot,
    address_slots, secondary_slots, selected_pool,
};
use loxi_domain::choice::{
    Choice, Role, Source, choose_address, credited_pool, kept_outside_selection,
};
use loxi_domain::ipam::{Family, Sharing};
use loxi_domain::pools::{PoolSet, Requester};
use loxi_domain::{AllocError, AnnotationError};
use tracing::{info, warn};

use super::claims::{self, AddressClaim, ClaimResult, ClaimedBy};
use super::{AddressProblem, EnsureError, Ipam, service_ports, service_sharing};
use crate::k8s::view::{owner_key, published_addresses, secondary_owner_key};

/// The addresses a Service holds, each backed by its claim.
#[derive(Debug, Default)]
pub struct Held {
    /// VIPs, one per IP family, in status order.
    pub addresses: Vec<IpAddr>,
    /// SCTP multi-homing addresses (only for a Service with an SCTP port).
    pub secondaries: Vec<IpAddr>,
    /// Those of both newly allocated by this pass.
    pub newly: Vec<IpAddr>,
    /// The pool each address is credited to, as its claim records it (none: outside every
    /// pool).
    pub pools: BTreeMap<IpAddr, String>,
    /// VIPs the Service keeps although they lie outside the pool its `loxilb.io/poolSelect`
    /// names (the selection came after the address): (address, the selected pool).
    pub kept_outside_selection: Vec<(IpAddr, String)>,
}

impl Held {
    /// The pool `ip` is credited to, when its claim names one.
    pub fn pool_of(&self, ip: &IpAddr) -> Option<&str> {
        self.pools.get(ip).map(String::as_str)
    }
}

/// A claim write the API server will refuse again as it is (unlike a conflict, a throttle or
/// an outage): its message, for the Service's condition.
fn refusal(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(status) if matches!(status.code, 400 | 403 | 422) => {
            Some(status.message.clone())
        }
        _ => None,
    }
}

/// The slots of one Service: what the pass fills, in order.
struct Slots {
    vips: Vec<AddressSlot>,
    secondaries: Vec<AddressSlot>,
}

fn slots(svc: &Service, pools: &PoolSet, who: &Requester<'_>) -> Result<Slots, AnnotationError> {
    let spec = svc.spec.as_ref();
    let families = spec.and_then(|s| s.ip_families.clone()).unwrap_or_default();
    let input = AddressInput {
        annotations: svc.metadata.annotations.as_ref(),
        ip_families: &families,
        ip_family_policy: spec.and_then(|s| s.ip_family_policy.as_deref()),
        load_balancer_ip: spec.and_then(|s| s.load_balancer_ip.as_deref()),
    };
    let selected = selected_pool(svc.metadata.annotations.as_ref());
    let vips = address_slots(&input, |f| pools.serves(selected, who, f))?;
    // Secondary addresses serve SCTP rules only: a Service without an SCTP port gets none.
    let has_sctp = service_ports(svc)
        .iter()
        .any(|p| p.protocol == loxi_domain::Protocol::Sctp);
    let secondaries = match vips.first() {
        Some(first) if has_sctp => {
            secondary_slots(svc.metadata.annotations.as_ref(), first.family)?
        }
        _ => Vec::new(),
    };
    Ok(Slots { vips, secondaries })
}

/// A pool named by the Service that does not exist is its annotation's fault. The error
/// quotes the annotation's value as the Service gives it; `secondary_blocks` is the number of
/// `--external-secondary-cidrs` blocks (the pools `num-secondary-networks` takes from).
fn unknown_pool(
    svc: &Service,
    role: Role,
    name: String,
    secondary_blocks: usize,
) -> AnnotationError {
    let value_of = |annotation: &str| {
        svc.annotations()
            .get(annotation)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let named_secondary = value_of(ANN_POOL_SELECT_SECONDARY);
    let (annotation, value, reason) = match (role, named_secondary) {
        (Role::Vip, _) => (
            ANN_POOL_SELECT,
            value_of(ANN_POOL_SELECT).unwrap_or_else(|| name.clone()),
            "no pool with this name".to_string(),
        ),
        (Role::Secondary, Some(value)) => (
            ANN_POOL_SELECT_SECONDARY,
            value.clone(),
            if value == name {
                "no pool with this name".to_string()
            } else {
                format!("no pool named {}", loxi_domain::text::shown(&name))
            },
        ),
        (Role::Secondary, None) => (
            ANN_NUM_SECONDARY,
            value_of(ANN_NUM_SECONDARY).unwrap_or_default(),
            format!(
                "one address is taken from each of the pools secondary0, secondary1, ...; \
                 there is no pool {name} (--external-secondary-cidrs gives \
                 {secondary_blocks} block(s))"
            ),
        ),
    };
    AnnotationError {
        annotation,
        value,
        reason,
    }
}

/// Whose addresses a pass ensures: a Service's, or a Gateway's (seen as a Service of its
/// namespace/name by `super::gateway`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OwnerKind {
    Service,
    Gateway,
}

/// Who the Service is in the index and on its claims, for one role.
struct Owner {
    key: String,
    me: ClaimedBy,
    /// What it occupies on the address.
    occupies: Sharing,
}

impl Owner {
    fn of(svc: &Service, role: Role, sharing: &Sharing, kind: OwnerKind) -> Owner {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let uid = svc.uid().unwrap_or_default();
        if kind == OwnerKind::Gateway {
            let me = ClaimedBy::gateway(&ns, &name, &uid);
            return Owner {
                key: me.key(),
                me,
                occupies: Sharing::Exclusive,
            };
        }
        match role {
            Role::Vip => Owner {
                key: owner_key(svc),
                me: ClaimedBy::new(&ns, &name, &uid, sharing),
                occupies: sharing.clone(),
            },
            Role::Secondary => Owner {
                key: secondary_owner_key(svc),
                me: ClaimedBy::secondary(&ns, &name, &uid),
                occupies: Sharing::Exclusive,
            },
        }
    }
}

impl Ipam {
    /// Every address the Service asks for (one per IP family, plus SCTP secondary
    /// addresses), each backed by its claim. A Service that cannot have its addresses now
    /// waits: it is re-queued when an address is released or the pools change.
    pub async fn ensure(&self, svc: &Service) -> Result<Held, EnsureError> {
        let result = self.ensure_all(svc, OwnerKind::Service).await;
        if matches!(result, Err(EnsureError::Problem(_))) {
            self.wait_for_address(svc);
        }
        result
    }

    pub(super) async fn ensure_all(
        &self,
        svc: &Service,
        kind: OwnerKind,
    ) -> Result<Held, EnsureError> {
        let sharing = match kind {
            OwnerKind::Service => {
                service_sharing(svc, &self.settings.zone).map_err(AddressProblem::from)?
            }
            OwnerKind::Gateway => Sharing::Exclusive,
        };
        let pools = self.pool_set();
        let namespace_labels = self
            .pools
            .namespace_labels(&svc.namespace().unwrap_or_default());
        let who = Requester {
            namespace_labels: &namespace_labels,
            service_labels: svc.labels(),
        };
        let slots = slots(svc, &pools, &who).map_err(AddressProblem::from)?;
        let published = published_addresses(svc);
        let mut held = Held::default();
        let all = (slots.vips.iter().map(|s| (s, Role::Vip)))
            .chain(slots.secondaries.iter().map(|s| (s, Role::Secondary)));
        for (slot, role) in all {
            let owner = Owner::of(svc, role, &sharing, kind);
            let taken = match role {
                Role::Vip => &held.addresses,
                Role::Secondary => &held.secondaries,
            };
            let choice = Choice {
                slot,
                pools: &pools,
                who: &who,
                owner: &owner.key,
                sharing: &sharing,
                unique: self.settings.unique_ip,
                role,
                taken,
                published: &published,
            };
            let (ip, new, pool) = match self.ensure_one(svc, &choice, &owner).await {
                Err(EnsureError::Problem(AddressProblem::Allocation(AllocError::UnknownPool(
                    name,
                )))) if slot.pool.as_deref() == Some(name.as_str()) => {
                    let blocks = self.settings.secondary_pools.len();
                    return Err(AddressProblem::from(unknown_pool(svc, role, name, blocks)).into());
                }
                other => other?,
            };
            match role {
                Role::Vip => {
                    held.addresses.push(ip);
                    if let Some(selected) = kept_outside_selection(slot, &pools, &ip) {
                        held.kept_outside_selection.push((ip, selected.to_string()));
                    }
                }
                Role::Secondary => held.secondaries.push(ip),
            }
            if !pool.is_empty() {
                held.pools.insert(ip, pool);
            }
            if new {
                held.newly.push(ip);
            }
        }
        Ok(held)
    }

    /// The Service's address of one slot, backed by a durable claim listing it that exists
    /// before this returns: the one it shows while its claim lists it, else the one the
    /// domain chooses (`loxi_domain::choice`). A claim made by someone else first (another
    /// replica, another process) is never stolen: a pool address is then chosen again, while
    /// an adopted or requested one is reported as in use. In shared mode the Service joins a
    /// claim whose owners it is compatible with; when its own ports change onto a sharer's,
    /// it moves to another address (the sharer was there first), and the old one is let go
    /// once rules are on the new one. Returns the address, whether it is new, and the pool
    /// its claim credits it to ("" outside every pool).
    async fn ensure_one(
        &self,
        svc: &Service,
        choice: &Choice<'_, '_>,
        owner: &Owner,
    ) -> Result<(IpAddr, bool, String), EnsureError> {
        if choice.role == Role::Vip
            && let Some(shown) = self.shown_and_claimed(svc, choice.slot)
            && self.confirm_shown(svc, &shown, owner).await?
        {
            let pool = self
                .claim_of(&shown)
                .map(|c| c.spec.pool.clone())
                .unwrap_or_default();
            return Ok((shown, false, pool));
        }
        // Bounded: each lost race marks one more address as taken.
        for _ in 0..32 {
            let (ip, source) = {
                let mut state = self.state();
                choose_address(choice, &mut state.index).map_err(AddressProblem::from)?
            };
            match self.claim(svc, ip, source, choice, owner).await? {
                Some((new, pool)) => return Ok((ip, new, pool)),
                None => continue,
            }
        }
        Err(AddressProblem::from(AllocError::Exhausted {
            pool: choice.slot.pool.clone().unwrap_or_default(),
            family: choice.slot.family,
        })
        .into())
    }

    /// The address the Service shows for the slot's family, when its claim lists this very
    /// Service and is not merely retained for it.
    fn shown_and_claimed(&self, svc: &Service, slot: &AddressSlot) -> Option<IpAddr> {
        let shown = published_addresses(svc)
            .into_iter()
            .find(|ip| Family::of(ip) == slot.family)?;
        if slot.requested.is_some_and(|r| r != shown) {
            return None;
        }
        let claim = self.claim_of(&shown)?;
        (self.claimed_by(svc, &shown) && claim.spec.retain_until.is_none()).then_some(shown)
    }

    /// The shown address stays the Service's when its claim records it as it is now, or can
    /// be brought up to date (its ports or sharing key changed, or the claim predates
    /// sharing); false when its new ports land on another owner's.
    async fn confirm_shown(
        &self,
        svc: &Service,
        shown: &IpAddr,
        owner: &Owner,
    ) -> Result<bool, EnsureError> {
        let Some(claim) = self.claim_of(shown) else {
            return Ok(false);
        };
        if claim.owner(&owner.me.namespace, &owner.me.name) == Some(&owner.me)
            && self.index_self(&claim, &owner.key, &owner.occupies)
        {
            return Ok(true);
        }
        let written = claims::claim(
            &self.claims_api,
            shown,
            &claim.spec.pool,
            &owner.me,
            false,
            &self.settings.controller,
        )
        .await?;
        Ok(match written {
            ClaimResult::Ours(written) => {
                self.index_from_claim(&written, &owner.key);
                true
            }
            ClaimResult::Taken(other) => {
                self.index_from_claim(&other, &owner.key);
                warn!(ip = %shown, service = %owner_key(svc), "the Service's ports now overlap another owner's: moving to another address");
                false
            }
        })
    }

    /// Backs the chosen address with a claim. `Some((new, pool))` once claimed, with the pool
    /// the claim credits it to; `None` when someone else claimed it first and another address
    /// should be chosen. A new claim credits the pool the Service selected when the address
    /// lies in several (`loxi_domain::choice::credited_pool`).
    async fn claim(
        &self,
        svc: &Service,
        ip: IpAddr,
        source: Source,
        choice: &Choice<'_, '_>,
        owner: &Owner,
    ) -> Result<Option<(bool, String)>, EnsureError> {
        // Fast path: the claim is already in the store and lists this Service as it is.
        if let Some(c) = self.claim_of(&ip)
            && c.owner(&owner.me.namespace, &owner.me.name) == Some(&owner.me)
            && c.spec.retain_until.is_none()
            && self.index_self(&c, &owner.key, &owner.occupies)
        {
            return Ok(Some((false, c.spec.pool.clone())));
        }
        let pool = credited_pool(choice.slot, choice.pools, choice.who, &ip)
            .unwrap_or_default()
            .to_string();
        // Never in unique mode; a specific address only by a shared key (sharing docs).
        let may_join = choice.role == Role::Vip
            && loxi_domain::sharing::may_join(
                self.settings.unique_ip,
                source == Source::Requested,
                choice.sharing,
            );
        let claimed = match claims::claim(
            &self.claims_api,
            &ip,
            &pool,
            &owner.me,
            may_join,
            &self.settings.controller,
        )
        .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                // The choice may stay in the index only once its claim exists: the drift
                // check and the replay program what the index holds.
                if source != Source::Indexed {
                    self.state().index.release_from(&ip, &owner.key);
                }
                return Err(match refusal(&e) {
                    Some(message) => AddressProblem::ClaimRefused { ip, message }.into(),
                    None => e.into(),
                });
            }
        };
        match claimed {
            ClaimResult::Ours(written) => {
                self.index_from_claim(&written, &owner.key);
                if !written.spec.shared_with.is_empty() {
                    let owners: Vec<String> = written.owners().iter().map(|o| o.key()).collect();
                    info!(%ip, ?owners, "address shared");
                }
                self.publish_metrics();
                Ok(Some((
                    source == Source::Allocated,
                    written.spec.pool.clone(),
                )))
            }
            ClaimResult::Taken(other) => {
                self.index_from_claim(&other, &owner.key);
                let holder = other
                    .owners()
                    .iter()
                    .find(|o| !o.is(&owner.me.namespace, &owner.me.name))
                    .map(|o| o.key())
                    .unwrap_or_else(|| other.owner_key());
                if source.is_specific() {
                    return Err(
                        AddressProblem::from(AllocError::Taken { ip, owner: holder }).into(),
                    );
                }
                warn!(%ip, owner = %holder, service = %owner_key(svc), "address claimed by someone else first; taking another");
                Ok(None)
            }
        }
    }

    /// Makes the index's owners of the claim's address exactly the claim's (the durable
    /// record wins over whatever the index guessed). `me` is the owner key of the pass
    /// calling: every other owner the index had there and the claim lacks gets a pass of its
    /// own, which claims the address again or lets it go.
    ///
    /// Without that pass such an owner could be lost for good: when a shared claim is
    /// deleted while the claim watch is away (re-listing after an API server restart), and
    /// a sharer's pass re-creates it (its create succeeds: the claim is gone), the claim
    /// lists only that sharer; the index then forgets the other owners, the re-list brings
    /// no `Delete` event, and its `InitDone` re-queues only the owners the index and the
    /// store still name. The others kept showing the address with no claim behind it (the
    /// soak's `unbacked-status` violations, docs/RELIABILITY.md#soak).
    fn index_from_claim(&self, claim: &AddressClaim, me: &str) {
        let Some(ip) = claim.ip() else {
            return;
        };
        let dropped: Vec<String> = {
            let mut state = self.state();
            let before: Vec<String> = state
                .index
                .owners_of(&ip)
                .into_iter()
                .map(str::to_string)
                .collect();
            state.index.set_owners(ip, self.indexed_owners(claim));
            before
                .into_iter()
                .filter(|k| k != me && !state.index.holds(&ip, k))
                .collect()
        };
        for key in &dropped {
            if let Some(svc) = super::service_of_key(key) {
                let _ = self.requeue.send(svc);
            }
        }
        if !dropped.is_empty() {
            info!(%ip, owners = ?dropped, "owners the claim no longer lists re-queued");
        }
    }

    /// Records the Service in the index as an owner of the address of `claim`, a claim from
    /// the store listing it; false when the index has an owner there the Service cannot
    /// share with. The caller then asks the API server (`claims::claim`) instead of trusting
    /// the store: the store may lag behind claim writes this replica just made, and a claim
    /// from before a sharer joined can list the Service as it is now when its ports changed
    /// twice meanwhile. Taking that old claim's owners as the truth dropped the sharer from
    /// the index, which moved it to another address while the real claim still listed it
    /// (the 30-minute soak's violation of 2026-11-26, docs/RELIABILITY.md#soak).
    fn index_self(&self, claim: &AddressClaim, key: &str, sharing: &Sharing) -> bool {
        match claim.ip() {
            Some(ip) => self
                .state()
                .index
                .assign_shared(ip, key, sharing.clone())
                .is_ok(),
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(pairs: &[(&str, &str)]) -> Service {
        let annotations: serde_json::Map<String, serde_json::Value> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        let metadata =
            serde_json::json!({"name": "sctp", "namespace": "ns", "annotations": annotations});
        serde_json::from_value(serde_json::json!({ "metadata": metadata })).unwrap()
    }

    /// A missing secondary pool is reported with the annotation's value as the Service
    /// gives it, and the pool that is missing named in the reason.
    #[test]
    fn a_missing_secondary_pool_quotes_the_value_given() {
        let svc = annotated(&[(ANN_NUM_SECONDARY, " 1 ")]);
        let e = unknown_pool(&svc, Role::Secondary, "secondary0".into(), 0);
        assert_eq!(e.annotation, ANN_NUM_SECONDARY);
        assert_eq!(e.value, "1");
        assert_eq!(
            e.to_string(),
            "annotation loxilb.io/num-secondary-networks=\"1\" is invalid: one address is \
             taken from each of the pools secondary0, secondary1, ...; there is no pool \
             secondary0 (--external-secondary-cidrs gives 0 block(s))"
        );
        let svc = annotated(&[(ANN_POOL_SELECT_SECONDARY, "a, b")]);
        let e = unknown_pool(&svc, Role::Secondary, "b".into(), 0);
        assert_eq!(e.value, "a, b");
        assert!(e.to_string().ends_with("no pool named \"b\""), "{e}");
        let svc = annotated(&[(ANN_POOL_SELECT, "web ")]);
        let e = unknown_pool(&svc, Role::Vip, "web".into(), 0);
        assert_eq!(
            (e.value.as_str(), e.reason.as_str()),
            ("web", "no pool with this name")
        );
    }
}
