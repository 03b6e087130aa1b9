//! Durable address claims (docs/architecture.md#invariants).
//!
//! One cluster-scoped `AddressClaim` per allocated address, named after the address, created
//! **before** the address is published or programmed anywhere. The API server's name
//! uniqueness settles races between replicas or processes: of two creates for one address,
//! exactly one succeeds. The in-memory allocator is only an index of these objects, rebuilt
//! from them at start-up before any allocation and kept current by a watch.
//!
//! Retain and reservations use the same object: a claim whose `service` names a Service that
//! does not exist (yet) keeps the address for that namespace/name, either until `retainUntil`
//! passes or until someone deletes the claim.
//!
//! **Shared addresses** (kube-loxilb's shared mode, see `loxi_domain::sharing`): the claim
//! lists every owner, `service` first (kept from the first version of this resource, so
//! claims written before sharing existed stay valid and tools reading `service` still see an
//! owner) and `sharedWith` for the others, each with the ports it serves on the address.
//! Joining or leaving is a full update carrying the observed resourceVersion: of two
//! concurrent changes one fails with 409 and is re-decided on the fresh object, so two owners
//! never end up on the same address, port and protocol.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use loxi_domain::ControllerName;
use loxi_domain::ipam::{PortProto, Sharing};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The Service (or the future Service, for a reservation) an address belongs to.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedBy {
    /// The Service's namespace.
    #[schemars(transform = super::schema::dns_label)]
    pub namespace: String,
    /// The Service's name.
    #[schemars(transform = super::schema::dns_label)]
    pub name: String,
    /// UID of the Service holding the address; empty while the address is only reserved or
    /// retained for this namespace/name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The (port, protocol) pairs the Service serves on this address, as `80/TCP` (recorded
    /// in unique mode too, so that switching modes moves nobody). Absent: not known (a
    /// reservation, or a claim written before sharing existed), and then nobody shares the
    /// address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::owner_ports)]
    pub ports: Option<Vec<String>>,
    /// The Service's `loxilb.io/sharing-key`: it shares only with owners of the same key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_key: Option<String>,
    /// The group of loxilbs the Service is placed on (its `loxilb.io/zoneselect`); absent:
    /// the default group. An address lives in one group: it is shared only within it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `secondary` for an SCTP multi-homing address (never shared, not shown in the
    /// Service's status); `gateway` when the owner is a Gateway API Gateway of this
    /// namespace/name, not a Service (never shared); absent for a Service's VIP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::owner_role)]
    pub role: Option<String>,
}

pub use crate::k8s::view::ROLE_SECONDARY;

/// The role recorded on a claim's owner entry for a Gateway's address (docs/gateway-api.md).
pub const ROLE_GATEWAY: &str = "gateway";

impl ClaimedBy {
    /// An owner entry for a Service occupying what `sharing` says (`Exclusive`: no ports).
    pub fn new(namespace: &str, name: &str, uid: &str, sharing: &Sharing) -> ClaimedBy {
        let (ports, sharing_key, group) = match sharing {
            Sharing::Exclusive => (None, None, None),
            Sharing::Ports { key, ports, group } => (
                Some(ports.iter().map(ToString::to_string).collect()),
                key.clone(),
                group.clone(),
            ),
        };
        ClaimedBy {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            ports,
            sharing_key,
            group,
            role: None,
        }
    }

    /// The owner entry of a Service's secondary (SCTP multi-homing) address: exclusive.
    pub fn secondary(namespace: &str, name: &str, uid: &str) -> ClaimedBy {
        ClaimedBy {
            role: Some(ROLE_SECONDARY.to_string()),
            ..ClaimedBy::new(namespace, name, uid, &Sharing::Exclusive)
        }
    }

    /// The owner entry of a Gateway's address: exclusive.
    pub fn gateway(namespace: &str, name: &str, uid: &str) -> ClaimedBy {
        ClaimedBy {
            role: Some(ROLE_GATEWAY.to_string()),
            ..ClaimedBy::new(namespace, name, uid, &Sharing::Exclusive)
        }
    }

    /// Owned by a Gateway, not a Service.
    pub fn is_gateway(&self) -> bool {
        self.role.as_deref() == Some(ROLE_GATEWAY)
    }

    /// The allocator's owner key: `namespace/name` for a VIP, `namespace/name#secondary`
    /// for a secondary address, `namespace/name#gateway` for a Gateway's (`#` never appears
    /// in a Kubernetes name).
    pub fn key(&self) -> String {
        match &self.role {
            Some(role) => format!("{}/{}#{role}", self.namespace, self.name),
            None => format!("{}/{}", self.namespace, self.name),
        }
    }

    pub fn is(&self, namespace: &str, name: &str) -> bool {
        self.namespace == namespace && self.name == name
    }

    /// How this owner shares the address. Ports that do not parse (a hand-edited claim)
    /// make it exclusive: sharing on a guess could put two rules on one port.
    pub fn sharing(&self) -> Sharing {
        // A reservation (no uid: an operator's, or a deleted Service's retained address) is
        // for its namespace/name alone, whatever ports it last recorded: the sharing search
        // must never offer it to anyone else.
        if self.uid.is_empty() {
            return Sharing::Exclusive;
        }
        let Some(list) = &self.ports else {
            return Sharing::Exclusive;
        };
        let parsed: Result<BTreeSet<PortProto>, String> =
            list.iter().map(|p| p.parse::<PortProto>()).collect();
        match parsed {
            Ok(ports) => Sharing::Ports {
                key: self.sharing_key.clone(),
                ports,
                group: self.group.clone(),
            },
            Err(_) => Sharing::Exclusive,
        }
    }
}

// kube's printcolumn(...) syntax repeats `type_ = "string"`, which this lint misreads.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.loxilb.io",
    version = "v1alpha1",
    kind = "AddressClaim",
    plural = "addressclaims",
    shortname = "lbaddr",
    category = "loxilb",
    doc = "One external address owned by one Service (or reserved for one), or shared by several Services on disjoint ports. Named after the address; created before the address is used, deleted after the last owner's rules are gone.",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.service.namespace"
    ),
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.service.name"),
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.service.role"),
    printcolumn(
        name = "Shared-With",
        type_ = "string",
        json_path = ".spec.sharedWith[*].name",
        priority = 1
    ),
    printcolumn(
        name = "Retain-Until",
        type_ = "string",
        json_path = ".spec.retainUntil"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::schema::prose)]
/// The address and who owns it.
pub struct AddressClaimSpec {
    /// The address, in canonical text form (`192.0.2.10`, `2001:db8::a`).
    #[schemars(transform = super::schema::claim_address)]
    pub address: String,
    /// The pool it was taken from (empty for a static address outside every pool).
    #[serde(default)]
    pub pool: String,
    /// The first owner: the Service (or the future Service, for a reservation) the address
    /// belongs to.
    pub service: ClaimedBy,
    /// Further owners of a shared address, in the order they joined. Every two owners have
    /// the same sharing key and disjoint ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_with: Vec<ClaimedBy>,
    /// RFC 3339 time after which a retained address (its Service deleted) goes back to the
    /// pool. Absent: held as long as the claim exists. Only ever set on a claim with a
    /// single owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::rfc3339)]
    pub retain_until: Option<String>,
    /// The loxi-ccm controller that owns this claim (its `--controller-name`), when several
    /// run in one cluster. Absent: the default controller (claims written before controllers
    /// had names). A controller never changes, releases or joins another's claim; it only
    /// counts the address as taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::controller_name)]
    pub controller: Option<String>,
}

/// Object name for an address (`loxi_domain::address_name`: valid for every address).
pub fn claim_name(ip: &IpAddr) -> String {
    loxi_domain::address_name::address_object_name(ip)
}

impl AddressClaim {
    pub fn ip(&self) -> Option<IpAddr> {
        self.spec.address.parse().ok()
    }

    /// `namespace/name` of the first owner.
    pub fn owner_key(&self) -> String {
        self.spec.service.key()
    }

    /// Every owner, the first one first.
    pub fn owners(&self) -> Vec<&ClaimedBy> {
        std::iter::once(&self.spec.service)
            .chain(&self.spec.shared_with)
            .collect()
    }

    /// The entry of namespace/name, if it is an owner.
    pub fn owner(&self, namespace: &str, name: &str) -> Option<&ClaimedBy> {
        self.owners().into_iter().find(|o| o.is(namespace, name))
    }

    /// Whether the claim lists `me` exactly as given (same uid, ports, sharing key, role)
    /// and is not merely retained.
    pub fn records_as_is(&self, me: &ClaimedBy) -> bool {
        self.spec.retain_until.is_none() && self.owners().contains(&me)
    }

    /// The same claim with `owners` (the first becomes `service`); `None` when empty.
    fn with_owners(&self, mut owners: Vec<ClaimedBy>) -> Option<AddressClaim> {
        if owners.is_empty() {
            return None;
        }
        let mut next = self.clone();
        next.spec.service = owners.remove(0);
        next.spec.shared_with = owners;
        Some(next)
    }

    /// A retained claim whose time is up.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.spec
            .retain_until
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|until| until <= now)
    }
}

/// Result of trying to claim an address.
#[derive(Debug)]
pub enum ClaimResult {
    /// The claim (as written) now lists this Service, up to date: created, taken over,
    /// refreshed, joined, or already so.
    Ours(Box<AddressClaim>),
    /// Someone else holds it in a way this Service cannot share.
    Taken(Box<AddressClaim>),
}

/// What to do with an existing claim for `me`.
enum Decision {
    /// Lists `me` exactly, not retained.
    Current,
    /// Write this instead (take over a reservation, refresh ports, join).
    Update(Box<AddressClaim>),
    Taken,
}

fn decide(
    existing: &AddressClaim,
    me: &ClaimedBy,
    may_join: bool,
    controller: &ControllerName,
) -> Decision {
    if !controller.owns(existing.spec.controller.as_deref()) {
        return decide_foreign(existing, me, controller);
    }
    let owners = existing.owners();
    let mine = |o: &&ClaimedBy| o.is(&me.namespace, &me.name) && o.role == me.role;
    let others: Vec<&ClaimedBy> = owners.iter().copied().filter(|o| !mine(o)).collect();
    let fits = others.iter().all(|o| o.sharing().compatible(&me.sharing()));
    match owners.iter().find(|o| mine(o)) {
        // Another Service of the same namespace/name (deleted and re-created meanwhile)
        // still holds it: its claim is released by its own cleanup, not taken over here.
        Some(entry) if !entry.uid.is_empty() && entry.uid != me.uid => Decision::Taken,
        Some(entry) => {
            if *entry == me && existing.spec.retain_until.is_none() {
                return Decision::Current;
            }
            // Reserved or retained for this namespace/name (the Service takes it over), or
            // its ports or key changed: allowed while every other owner still fits.
            if !fits {
                return Decision::Taken;
            }
            let list: Vec<ClaimedBy> = owners
                .iter()
                .map(|o| if mine(o) { me.clone() } else { (*o).clone() })
                .collect();
            let mut next = existing.with_owners(list).expect("not empty");
            next.spec.retain_until = None;
            Decision::Update(Box::new(next))
        }
        None => {
            // A retained or reserved address is kept for its Service alone.
            let held_for_someone =
                existing.spec.retain_until.is_some() || owners.iter().any(|o| o.uid.is_empty());
            if !may_join || held_for_someone || !fits {
                return Decision::Taken;
            }
            let mut list: Vec<ClaimedBy> = owners.into_iter().cloned().collect();
            list.push(me.clone());
            Decision::Update(Box::new(existing.with_owners(list).expect("not empty")))
        }
    }
}

/// Another controller's claim: taken, except a bare reservation for this very namespace/name
/// (an operator's, or an address retained when the Service was deleted), which the Service
/// takes over here whichever controller served it before: the claim becomes ours.
fn decide_foreign(
    existing: &AddressClaim,
    me: &ClaimedBy,
    controller: &ControllerName,
) -> Decision {
    let owners = existing.owners();
    let reserved_for_me = owners.len() == 1
        && owners[0].uid.is_empty()
        && owners[0].is(&me.namespace, &me.name)
        && owners[0].role == me.role;
    if !reserved_for_me {
        return Decision::Taken;
    }
    let mut next = existing.with_owners(vec![me.clone()]).expect("not empty");
    next.spec.retain_until = None;
    next.spec.controller = controller.name().map(str::to_string);
    Decision::Update(Box::new(next))
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Makes the claim for `ip` list `me` as it is now: creates it, or takes over a reservation
/// or retained claim of the same namespace/name, or refreshes `me`'s ports and key, or (with
/// `may_join`) joins the owners already there when `me` is compatible with each of them.
/// Every update carries the resourceVersion it was decided on; a conflict re-reads and
/// decides again.
pub async fn claim(
    api: &Api<AddressClaim>,
    ip: &IpAddr,
    pool: &str,
    me: &ClaimedBy,
    may_join: bool,
    controller: &ControllerName,
) -> kube::Result<ClaimResult> {
    let name = claim_name(ip);
    let fresh = AddressClaim::new(
        &name,
        AddressClaimSpec {
            address: ip.to_string(),
            pool: pool.to_string(),
            service: me.clone(),
            shared_with: Vec::new(),
            retain_until: None,
            controller: controller.name().map(str::to_string),
        },
    );
    let mut last_conflict = None;
    // Bounded: each round trip loses only to a change someone else made meanwhile.
    for _ in 0..8 {
        match api.create(&PostParams::default(), &fresh).await {
            Ok(created) => return Ok(ClaimResult::Ours(Box::new(created))),
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(e),
        }
        let Some(mut existing) = api.get_opt(&name).await? else {
            continue; // deleted since: create again
        };
        loop {
            match decide(&existing, me, may_join, controller) {
                Decision::Current => return Ok(ClaimResult::Ours(Box::new(existing))),
                Decision::Taken => return Ok(ClaimResult::Taken(Box::new(existing))),
                Decision::Update(next) => {
                    match api.replace(&name, &PostParams::default(), &next).await {
                        Ok(written) => return Ok(ClaimResult::Ours(Box::new(written))),
                        Err(e) if is_status(&e, 409) => {
                            last_conflict = Some(e);
                            match api.get_opt(&name).await? {
                                Some(c) => existing = c,
                                None => break,
                            }
                        }
                        Err(e) if is_status(&e, 404) => break,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
    Err(last_conflict.unwrap_or_else(|| {
        kube::Error::Api(Box::new(kube::core::Status::failure(
            &format!("claim {name} kept changing"),
            "Conflict",
        )))
    }))
}

/// Deletes the claim of `ip` as observed (never a claim someone changed since).
pub async fn release(api: &Api<AddressClaim>, claim: &AddressClaim) -> kube::Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api
        .delete(&claim.metadata.name.clone().unwrap_or_default(), &dp)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes namespace/name off the claim: the claim is deleted when it was the last owner, else
/// updated without it (the address stays with the others). A conflict re-reads and retries.
pub async fn leave(
    api: &Api<AddressClaim>,
    claim: &AddressClaim,
    namespace: &str,
    name: &str,
) -> kube::Result<()> {
    let object = claim.metadata.name.clone().unwrap_or_default();
    let mut current = claim.clone();
    let mut last_conflict = None;
    for _ in 0..8 {
        let rest: Vec<ClaimedBy> = current
            .owners()
            .into_iter()
            .filter(|o| !o.is(namespace, name))
            .cloned()
            .collect();
        if rest.len() == current.owners().len() {
            return Ok(()); // not an owner (any more)
        }
        let result = match current.with_owners(rest) {
            None => release(api, &current).await,
            Some(next) => api
                .replace(&object, &PostParams::default(), &next)
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if is_status(&e, 404) => return Ok(()),
            Err(e) if is_status(&e, 409) => {
                last_conflict = Some(e);
                match api.get_opt(&object).await? {
                    Some(c) => current = c,
                    None => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_conflict.expect("only conflicts loop"))
}

/// Keeps the address for the Service's namespace/name until `until`: the Service is gone,
/// the address is not handed to anyone else, and a re-created Service gets it back. Only for
/// a claim the Service holds alone (a shared address stays with its other owners anyway).
pub async fn retain(
    api: &Api<AddressClaim>,
    claim: &AddressClaim,
    until: Timestamp,
) -> kube::Result<()> {
    let patch = json!({
        "metadata": { "resourceVersion": claim.metadata.resource_version },
        "spec": { "service": { "uid": "" }, "retainUntil": until.to_string() }
    });
    api.patch(
        &claim.metadata.name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::model::Protocol;

    fn by(name: &str, uid: &str, ports: Option<&[u16]>, key: Option<&str>) -> ClaimedBy {
        let sharing = match ports {
            None => Sharing::Exclusive,
            Some(p) => Sharing::Ports {
                key: key.map(str::to_string),
                ports: p
                    .iter()
                    .map(|p| PortProto::new(*p, Protocol::Tcp))
                    .collect(),
                group: None,
            },
        };
        ClaimedBy::new("ns", name, uid, &sharing)
    }

    fn claim_of(owners: Vec<ClaimedBy>) -> AddressClaim {
        let mut c = AddressClaim::new(
            "192.0.2.1",
            AddressClaimSpec {
                address: "192.0.2.1".into(),
                pool: "default".into(),
                service: ClaimedBy::default(),
                shared_with: Vec::new(),
                retain_until: None,
                controller: None,
            },
        );
        c = c.with_owners(owners).unwrap();
        c
    }

    fn dc() -> ControllerName {
        ControllerName::default()
    }

    fn names(c: &AddressClaim) -> Vec<&str> {
        c.owners().iter().map(|o| o.name.as_str()).collect()
    }

    #[test]
    fn names_are_valid_object_names() {
        assert_eq!(claim_name(&"192.0.2.1".parse().unwrap()), "192.0.2.1");
        assert_eq!(claim_name(&"2001:db8::1".parse().unwrap()), "2001-db8--1");
    }

    #[test]
    fn expiry() {
        let mut c = claim_of(vec![by("svc", "", None, None)]);
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert!(!c.expired(now));
        c.spec.retain_until = Some("2025-12-31T23:59:59Z".into());
        assert!(c.expired(now));
        c.spec.retain_until = Some("2026-01-01T00:00:01Z".into());
        assert!(!c.expired(now));
        assert_eq!(c.owner_key(), "ns/svc");
    }

    #[test]
    fn a_reservation_is_nobody_elses_whatever_ports_it_recorded() {
        // A deleted Service's retained address keeps the ports the Service had.
        let retained = by("gone", "", Some(&[80]), None);
        assert_eq!(retained.sharing(), Sharing::Exclusive);
        let mut c = claim_of(vec![retained]);
        c.spec.retain_until = Some("2099-01-01T00:00:00Z".into());
        let newcomer = by("new", "u2", Some(&[443]), None);
        assert!(matches!(
            decide(&c, &newcomer, true, &dc()),
            Decision::Taken
        ));
        c.spec.retain_until = None;
        assert!(matches!(
            decide(&c, &newcomer, true, &dc()),
            Decision::Taken
        ));
    }

    #[test]
    fn owner_entries_round_trip_their_sharing() {
        let a = by("a", "u1", Some(&[443, 80]), Some("k"));
        assert_eq!(
            a.ports.as_deref(),
            Some(&["80/TCP".to_string(), "443/TCP".to_string()][..])
        );
        assert_eq!(a.sharing().key(), Some("k"));
        assert_eq!(by("b", "u", None, None).sharing(), Sharing::Exclusive);
        let mut odd = a.clone();
        odd.ports = Some(vec!["eighty".into()]);
        assert_eq!(
            odd.sharing(),
            Sharing::Exclusive,
            "unreadable ports never share"
        );
        // Claims written before sharing existed still read.
        let old: AddressClaimSpec = serde_json::from_value(json!({
            "address": "192.0.2.1",
            "service": {"namespace": "ns", "name": "a", "uid": "u"}
        }))
        .unwrap();
        assert!(old.shared_with.is_empty() && old.service.ports.is_none());
    }

    #[test]
    fn joining_needs_consent_compatibility_and_no_reservation() {
        let web = claim_of(vec![by("web", "u1", Some(&[80]), None)]);
        let tls = by("tls", "u2", Some(&[443]), None);
        match decide(&web, &tls, true, &dc()) {
            Decision::Update(next) => assert_eq!(names(&next), ["web", "tls"]),
            _ => panic!("compatible: joins"),
        }
        assert!(matches!(decide(&web, &tls, false, &dc()), Decision::Taken));
        let clash = by("other", "u3", Some(&[80, 443]), None);
        assert!(matches!(decide(&web, &clash, true, &dc()), Decision::Taken));
        let keyed = by("keyed", "u4", Some(&[443]), Some("k"));
        assert!(matches!(decide(&web, &keyed, true, &dc()), Decision::Taken));
        // Unique mode, reservations and retained claims are never joined.
        let alone = claim_of(vec![by("alone", "u5", None, None)]);
        assert!(matches!(decide(&alone, &tls, true, &dc()), Decision::Taken));
        let reserved = claim_of(vec![by("future", "", Some(&[80]), None)]);
        assert!(matches!(
            decide(&reserved, &tls, true, &dc()),
            Decision::Taken
        ));
        let mut retained = web.clone();
        retained.spec.retain_until = Some("2030-01-01T00:00:00Z".into());
        assert!(matches!(
            decide(&retained, &tls, true, &dc()),
            Decision::Taken
        ));
    }

    #[test]
    fn a_claim_records_an_owner_as_is_only_with_its_current_ports() {
        let shared = claim_of(vec![
            by("web", "u1", Some(&[80]), None),
            by("tls", "u2", Some(&[443]), None),
        ]);
        assert!(shared.records_as_is(&by("tls", "u2", Some(&[443]), None)));
        // New ports (here a sharer's): the claim says nothing about them.
        assert!(!shared.records_as_is(&by("tls", "u2", Some(&[80]), None)));
        assert!(!shared.records_as_is(&by("tls", "u2", Some(&[443]), Some("k"))));
        assert!(!shared.records_as_is(&by("tls", "u9", Some(&[443]), None)));
        let mut retained = shared.clone();
        retained.spec.retain_until = Some("2030-01-01T00:00:00Z".into());
        assert!(!retained.records_as_is(&by("tls", "u2", Some(&[443]), None)));
    }

    #[test]
    fn an_owner_refreshes_or_takes_over_its_entry() {
        let shared = claim_of(vec![
            by("web", "u1", Some(&[80]), None),
            by("tls", "u2", Some(&[443]), None),
        ]);
        let same = by("tls", "u2", Some(&[443]), None);
        assert!(matches!(
            decide(&shared, &same, false, &dc()),
            Decision::Current
        ));
        // New ports that still fit: the entry is rewritten in place.
        match decide(
            &shared,
            &by("tls", "u2", Some(&[443, 8443]), None),
            false,
            &dc(),
        ) {
            Decision::Update(next) => {
                assert_eq!(names(&next), ["web", "tls"]);
                assert_eq!(next.spec.shared_with[0].ports.as_ref().unwrap().len(), 2);
            }
            _ => panic!("refresh"),
        }
        // New ports on a sharer's port: taken, the Service must move.
        assert!(matches!(
            decide(&shared, &by("tls", "u2", Some(&[80]), None), false, &dc()),
            Decision::Taken
        ));
        // Another incarnation of the same name does not take it over.
        assert!(matches!(
            decide(&shared, &by("tls", "u9", Some(&[443]), None), true, &dc()),
            Decision::Taken
        ));
        // A reservation (no uid) or retained claim is taken over and un-retained.
        let mut retained = claim_of(vec![by("keep", "", Some(&[80]), None)]);
        retained.spec.retain_until = Some("2030-01-01T00:00:00Z".into());
        match decide(
            &retained,
            &by("keep", "u7", Some(&[80]), None),
            false,
            &dc(),
        ) {
            Decision::Update(next) => {
                assert_eq!(next.spec.service.uid, "u7");
                assert!(next.spec.retain_until.is_none());
            }
            _ => panic!("take over"),
        }
    }

    #[test]
    fn another_controllers_claim_is_never_joined_or_taken_over() {
        let other = ControllerName::new("other").unwrap();
        let mut theirs = claim_of(vec![by("web", "u1", Some(&[80]), None)]);
        theirs.spec.controller = Some("other".into());
        // Compatible ports, same name and uid even (a Service that moved class): taken.
        let tls = by("tls", "u2", Some(&[443]), None);
        assert!(matches!(
            decide(&theirs, &tls, true, &dc()),
            Decision::Taken
        ));
        let same = by("web", "u1", Some(&[80]), None);
        assert!(matches!(
            decide(&theirs, &same, true, &dc()),
            Decision::Taken
        ));
        // Its own controller decides as before.
        assert!(matches!(
            decide(&theirs, &same, true, &other),
            Decision::Current
        ));
        // The default controller's claims (no controller recorded) are foreign to "other".
        let ours = claim_of(vec![by("web", "u1", Some(&[80]), None)]);
        assert!(matches!(decide(&ours, &tls, true, &other), Decision::Taken));
        // A bare reservation for the very namespace/name is taken over, and becomes ours.
        let mut reserved = claim_of(vec![by("web", "", Some(&[80]), None)]);
        reserved.spec.retain_until = Some("2030-01-01T00:00:00Z".into());
        match decide(&reserved, &same, false, &other) {
            Decision::Update(next) => {
                assert_eq!(next.spec.controller.as_deref(), Some("other"));
                assert!(next.spec.retain_until.is_none());
                assert_eq!(next.spec.service.uid, "u1");
            }
            _ => panic!("take over"),
        }
        assert!(matches!(
            decide(&reserved, &tls, true, &other),
            Decision::Taken
        ));
    }
}
