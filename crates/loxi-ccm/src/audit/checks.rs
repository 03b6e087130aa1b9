//! The invariants, as pure functions over one [`Snapshot`] of the cluster and its loxilbs.
//! Nothing here reads the network or the clock: `collect` takes the snapshot, these decide.
//!
//! What counts as a violation is what the controller must never leave behind once it has
//! converged. States the controller reaches by design and reports itself (a Service waiting
//! for room on a full loxilb, reported `CapacityExceeded`; an address kept after its pool was
//! shrunk, since editing a pool never moves an address) are notes, not violations.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use loxi_domain::addressing::{ANN_SECONDARY_IPS, ANN_STATIC_IP};
use loxi_domain::pools::PoolSet;
use loxi_domain::{Action, ClusterId, NodeView, Rule, RuleKey, RuleName, diff_rules};

mod egress;
mod firewall;
mod gateway;
mod shared;

pub use gateway::GatewaySnapshot;

use crate::ipam::claims::{AddressClaim, ClaimedBy};
use crate::k8s::view::{SERVICE_NAME_LABEL, Selection, endpoint_views, published_addresses};
use crate::service::Settings;
use crate::service::plan::{PlanWorld, plan_from};
use crate::service::status::{COND_ADDRESS, COND_PROGRAMMED};

/// The `loxilb.io/Programmed` reasons under which a Service is reported, by the controller
/// itself, as lacking rules it wants: a full loxilb (`crate::loxilb::REASON_CAPACITY`), a rule
/// with source ranges past loxilb's first indexes (`REASON_SOURCE_RANGES`), a foreign rule
/// on its address and port (`service::conditions`).
const REPORTED_REASONS: [&str; 3] = [
    "CapacityExceeded",
    "SourceRangesUnsupported",
    "RuleConflict",
];

/// One loxilb instance as the audit saw it.
#[derive(Debug, Clone)]
pub struct InstanceSnapshot {
    pub url: String,
    /// Its group of loxilbs: it should hold the rules of that group's Services only.
    pub group: String,
    /// Its HA states (instance -> `MASTER`, `BACKUP`, ...) when they could be read.
    pub ha_states: Option<BTreeMap<String, String>>,
    /// Every rule it lists, read back into the domain model; `Err`: it could not be listed
    /// (down, refusing): its rules are not checked, and the report says so.
    pub rules: Result<Vec<Rule>, String>,
    /// BGP advertisement references per address text, where the loxilb exposes them (only
    /// the simulator does; `None` for real loxilb).
    pub advertisements: Option<BTreeMap<String, u32>>,
    /// Its firewall rules (`GET /config/firewall/all`); `None`: not read, `Err`: could not
    /// be listed. Ours are checked like the rules (`firewall`).
    pub firewall: Option<Result<Vec<loxilb_client::FirewallEntry>, String>>,
}

/// Everything the checks read, taken at one time.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub cluster: ClusterId,
    pub selection: Selection,
    /// The Service reconcile's settings (annotation defaults, `--namespace`, BGP on).
    pub settings: Settings,
    pub services: Vec<Service>,
    /// The planner's view of every Node.
    pub nodes: Vec<NodeView>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Multus addresses per pod (namespace, name), with `--multus` only.
    pub pod_networks: HashMap<(String, String), BTreeMap<String, Vec<IpAddr>>>,
    pub claims: Vec<AddressClaim>,
    pub pools: PoolSet,
    pub instances: Vec<InstanceSnapshot>,
    /// `--set-roles`: roles are arbitrated, so each HA instance has one master.
    pub roles: Option<loxi_domain::roles::HaSettings>,
    /// `--egress`: every Egress with the addresses of the pods it selects now; `None`: off,
    /// or the Egress kind not served (nothing checked).
    pub egresses: Option<Vec<loxi_domain::egress::EgressInput>>,
    /// `--gatewayAPI`: the Gateway API objects; `None`: off, or its CRDs not served
    /// (Gateways not checked).
    pub gateways: Option<GatewaySnapshot>,
}

/// The kinds of violation, each with a stable name (the report's first word after
/// `VIOLATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// An address held by owners that may not share it.
    SharedAddress,
    /// A served Service lacks a rule, holds a wrong or stale one, on a listed loxilb.
    Rules,
    /// A rule named as this cluster's whose Service is gone.
    OwnedOrphan,
    /// A claim (or an owner entry of one) whose Service is gone, without a reservation.
    OwnerlessClaim,
    /// A Service with our finalizer shows an address that no claim backs for it.
    UnbackedStatus,
    /// An address outside every pool that nobody asked for.
    OutsidePools,
    /// A loxilb's BGP advertisement counts differ from its rules.
    BgpAdvertisements,
    /// A claim records, for a Service that owns it, other ports or another sharing key than
    /// the Service has now: the sharing decisions (and the drift check) work on a stale
    /// record, which can put two Services on one address and port.
    ClaimPorts,
    /// With `--set-roles`, an HA instance of a group with a reachable loxilb has no master
    /// or more than one among the group's loxilbs.
    HaMasters,
    /// A claim lists a live Service (same uid) as owner of its address, but the Service
    /// shows other addresses and not this one: the claim holds the address (and its ports)
    /// for a Service that has moved on.
    StaleOwner,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::SharedAddress => "shared-address",
            Kind::Rules => "rules",
            Kind::OwnedOrphan => "owned-orphan",
            Kind::OwnerlessClaim => "ownerless-claim",
            Kind::UnbackedStatus => "unbacked-status",
            Kind::OutsidePools => "outside-pools",
            Kind::BgpAdvertisements => "bgp-advertisements",
            Kind::ClaimPorts => "claim-ports",
            Kind::HaMasters => "ha-masters",
            Kind::StaleOwner => "stale-owner",
        }
    }
}

/// One broken invariant and the objects involved (`Service ns/name`, `AddressClaim x`,
/// `rule "..." on <url>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub detail: String,
    pub objects: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VIOLATION {}: {} [{}]",
            self.kind.name(),
            self.detail,
            self.objects.join("; ")
        )
    }
}

/// The audit's outcome: violations (exit 1) and notes (what was not checked, and states the
/// controller reaches by design and reports itself).
#[derive(Debug, Clone, Default)]
pub struct Findings {
    pub violations: Vec<Violation>,
    pub notes: Vec<String>,
    /// What was looked at, for the summary line.
    pub services: usize,
    pub claims: usize,
    pub rules: usize,
    pub instances: usize,
}

impl Findings {
    pub fn clean(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn of_kind(&self, kind: Kind) -> Vec<&Violation> {
        self.violations.iter().filter(|v| v.kind == kind).collect()
    }

    /// `audit passed: 0 violations (12 Services, 12 claims, 24 rules on 1 loxilb)`.
    pub fn summary(&self) -> String {
        format!(
            "audit {}: {} violation(s) ({} Services, {} claims, {} rules on {} loxilb)",
            if self.clean() { "passed" } else { "failed" },
            self.violations.len(),
            self.services,
            self.claims,
            self.rules,
            self.instances,
        )
    }

    fn violation(&mut self, kind: Kind, detail: impl Into<String>, objects: Vec<String>) {
        self.violations.push(Violation {
            kind,
            detail: detail.into(),
            objects,
        });
    }
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for v in &self.violations {
            writeln!(f, "{v}")?;
        }
        for n in &self.notes {
            writeln!(f, "NOTE {n}")?;
        }
        Ok(())
    }
}

fn svc_name(ns: &str, name: &str) -> String {
    format!("Service {ns}/{name}")
}

fn claim_name(c: &AddressClaim) -> String {
    format!("AddressClaim {}", c.metadata.name.as_deref().unwrap_or(""))
}

fn rule_name(r: &Rule, url: &str) -> String {
    format!("rule {:?} ({}) on {url}", r.name, r.key)
}

/// Runs every check.
pub fn audit(s: &Snapshot) -> Findings {
    let view = View::new(s);
    let mut f = Findings {
        services: view.services.len(),
        claims: view.claims.len(),
        rules: s
            .instances
            .iter()
            .filter_map(|i| i.rules.as_ref().ok())
            .map(Vec::len)
            .sum(),
        instances: s.instances.len(),
        ..Findings::default()
    };
    for inst in &s.instances {
        if let Err(e) = &inst.rules {
            f.notes.push(format!(
                "loxilb {} not checked: its rules could not be listed: {e}",
                inst.url
            ));
        }
    }
    check_sharing(&view, &mut f);
    check_claim_owners(&view, &mut f);
    check_claim_ports(&view, &mut f);
    check_stale_owners(&view, &mut f);
    check_status(&view, &mut f);
    check_pools(s, &view, &mut f);
    let desired = desired_rules(s, &view, &mut f);
    let (desired, desired_fw) = firewall::split_desired(s, desired);
    if s.settings.shared_rules {
        // Rules shared with other controllers: only our endpoints are compared.
        shared::check(s, &view, &desired, &mut f);
    } else {
        check_rules(s, &view, &desired, &mut f);
    }
    firewall::check(s, &view, &desired, &desired_fw, &mut f);
    egress::check(s, &mut f);
    gateway::check(s, &view, &mut f);
    if !s.settings.shared_rules {
        check_orphans(s, &view, &mut f);
    }
    check_advertisements(s, &mut f);
    check_masters(s, &mut f);
    f
}

/// With `--set-roles`: for every group with a loxilb whose HA states could be read, each of
/// its HA instances has exactly one `MASTER` among the group's loxilbs
/// (docs/fleet.md#ha-roles). Excluded loxilbs hold no role and are not counted.
fn check_masters(s: &Snapshot, f: &mut Findings) {
    let Some(roles) = &s.roles else { return };
    let mut groups: BTreeMap<&str, Vec<&InstanceSnapshot>> = BTreeMap::new();
    for inst in &s.instances {
        if inst.ha_states.is_some() && !roles.excludes(&inst.url) {
            groups.entry(inst.group.as_str()).or_default().push(inst);
        }
    }
    for (group, members) in groups {
        for ha in roles.instances_of(group) {
            let masters: Vec<&str> = members
                .iter()
                .filter(|i| {
                    i.ha_states
                        .as_ref()
                        .and_then(|st| st.get(&ha))
                        .is_some_and(|st| st == "MASTER")
                })
                .map(|i| i.url.as_str())
                .collect();
            if masters.len() != 1 {
                f.violation(
                    Kind::HaMasters,
                    format!(
                        "HA instance {ha} of group {group} has {} master(s) among {} reachable loxilb(s): [{}]",
                        masters.len(),
                        members.len(),
                        masters.join(", ")
                    ),
                    members.iter().map(|i| format!("loxilb {}", i.url)).collect(),
                );
            }
        }
    }
}

/// The snapshot indexed, restricted to `--namespace` when one is set.
struct View<'a> {
    services: HashMap<(&'a str, &'a str), &'a Service>,
    claims: Vec<&'a AddressClaim>,
    by_address: BTreeMap<IpAddr, Vec<&'a AddressClaim>>,
    namespace: Option<&'a str>,
    /// The default group of loxilbs (`--zone`).
    zone: &'a str,
    selection: &'a Selection,
}

impl<'a> View<'a> {
    fn new(s: &'a Snapshot) -> View<'a> {
        let namespace = s.settings.namespace.as_deref();
        let in_scope = |ns: &str| namespace.is_none_or(|n| n == ns);
        let services = s
            .services
            .iter()
            .filter(|svc| in_scope(svc.metadata.namespace.as_deref().unwrap_or("")))
            .map(|svc| {
                (
                    (
                        svc.metadata.namespace.as_deref().unwrap_or(""),
                        svc.metadata.name.as_deref().unwrap_or(""),
                    ),
                    svc,
                )
            })
            .collect();
        let claims: Vec<&AddressClaim> = s
            .claims
            .iter()
            // Another loxi-ccm's claims are its own business (its audit judges them).
            .filter(|c| s.selection.controller.owns(c.spec.controller.as_deref()))
            .filter(|c| c.owners().iter().any(|o| in_scope(&o.namespace)))
            .collect();
        let mut by_address: BTreeMap<IpAddr, Vec<&AddressClaim>> = BTreeMap::new();
        for c in &claims {
            if let Some(ip) = c.ip() {
                by_address.entry(ip).or_default().push(c);
            }
        }
        View {
            services,
            claims,
            by_address,
            namespace,
            zone: &s.settings.zone,
            selection: &s.selection,
        }
    }

    fn in_scope(&self, ns: &str) -> bool {
        self.namespace.is_none_or(|n| n == ns)
    }

    /// The Service an owner entry names, when it is that very Service (same uid).
    fn live(&self, o: &ClaimedBy) -> Option<&'a Service> {
        self.services
            .get(&(o.namespace.as_str(), o.name.as_str()))
            .copied()
            .filter(|svc| svc.metadata.uid.as_deref() == Some(o.uid.as_str()))
    }
}

/// No address with two owners beyond legal sharing (`loxi_domain::sharing`): every two
/// owners of a claim have the same key and disjoint ports, a secondary address has one owner,
/// nobody is listed twice, and one address has one claim.
fn check_sharing(v: &View<'_>, f: &mut Findings) {
    for c in &v.claims {
        let owners = c.owners();
        for (i, a) in owners.iter().enumerate() {
            for b in owners.iter().skip(i + 1) {
                let why = if a.is(&b.namespace, &b.name) && a.role == b.role {
                    Some("listed twice".to_string())
                } else if a.role.is_some() || b.role.is_some() {
                    Some("a secondary address is never shared".to_string())
                } else if !a.sharing().compatible(&b.sharing()) {
                    Some(format!(
                        "sharing not allowed: keys {:?} and {:?}, groups {:?} and {:?}, ports \
                         {:?} and {:?} (an owner without ports or uid holds the address alone)",
                        a.sharing_key.as_deref().unwrap_or(""),
                        b.sharing_key.as_deref().unwrap_or(""),
                        a.group.as_deref().unwrap_or(""),
                        b.group.as_deref().unwrap_or(""),
                        a.ports.as_deref().unwrap_or_default(),
                        b.ports.as_deref().unwrap_or_default(),
                    ))
                } else {
                    None
                };
                if let Some(why) = why {
                    f.violation(
                        Kind::SharedAddress,
                        format!(
                            "address {} has owners {} and {}: {why}",
                            c.spec.address,
                            a.key(),
                            b.key()
                        ),
                        vec![
                            claim_name(c),
                            svc_name(&a.namespace, &a.name),
                            svc_name(&b.namespace, &b.name),
                        ],
                    );
                }
            }
        }
    }
    for (ip, claims) in &v.by_address {
        if claims.len() > 1 {
            f.violation(
                Kind::SharedAddress,
                format!("address {ip} has {} claims", claims.len()),
                claims.iter().map(|c| claim_name(c)).collect(),
            );
        }
    }
}

/// No claim without an owner and without a reservation: every owner entry with a uid names
/// a Service that exists with that uid (an entry without uid is a reservation or a retained
/// address, held for its namespace/name on purpose). A Gateway's entry (role `gateway`) is
/// not looked for among Services: the Gateway checks judge it (`gateway`).
fn check_claim_owners(v: &View<'_>, f: &mut Findings) {
    for c in &v.claims {
        let owners = c.owners();
        let dangling: Vec<&&ClaimedBy> = owners
            .iter()
            .filter(|o| {
                !o.uid.is_empty()
                    && !o.is_gateway()
                    && v.in_scope(&o.namespace)
                    && v.live(o).is_none()
            })
            .collect();
        if dangling.is_empty() {
            continue;
        }
        let detail = if dangling.len() == owners.len() {
            format!(
                "claim for {} has no owner: {} gone, and no reservation",
                c.spec.address,
                dangling
                    .iter()
                    .map(|o| o.key())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!(
                "claim for {} still lists {} whose Service is gone (its ports stay blocked)",
                c.spec.address,
                dangling
                    .iter()
                    .map(|o| o.key())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut objects = vec![claim_name(c)];
        objects.extend(
            dangling
                .iter()
                .map(|o| format!("{} (uid {})", svc_name(&o.namespace, &o.name), o.uid)),
        );
        f.violation(Kind::OwnerlessClaim, detail, objects);
    }
}

/// Every live owner of a claim (a VIP entry with a uid naming an existing Service) is
/// recorded with the ports and sharing key the Service has now. A Service whose annotations
/// do not parse is left out: it keeps what it had until its owner fixes them. So is, as a
/// note, one that reports it has no address decision (`loxilb.io/AddressAllocated` False:
/// its new ports clash with a sharer's and no other address is free): it keeps showing its
/// address, on its old record, by design.
fn check_claim_ports(v: &View<'_>, f: &mut Findings) {
    for c in &v.claims {
        for o in c.owners() {
            if o.uid.is_empty() || o.role.is_some() || !v.in_scope(&o.namespace) {
                continue;
            }
            let Some(svc) = v.live(o) else { continue };
            let Ok(sharing) = crate::ipam::service_sharing(svc, v.zone) else {
                continue;
            };
            let now = ClaimedBy::new(&o.namespace, &o.name, &o.uid, &sharing);
            if now.ports == o.ports && now.sharing_key == o.sharing_key && now.group == o.group {
                continue;
            }
            let show = |o: &ClaimedBy| {
                format!(
                    "ports [{}] key {:?} group {:?}",
                    o.ports.as_deref().unwrap_or_default().join(", "),
                    o.sharing_key.as_deref().unwrap_or(""),
                    o.group.as_deref().unwrap_or("")
                )
            };
            let detail = format!(
                "claim for {} records {} with {}, but the Service has {}",
                c.spec.address,
                o.key(),
                show(o),
                show(&now)
            );
            if let Some(reason) = condition_false(svc, COND_ADDRESS) {
                f.notes.push(format!(
                    "{detail} (it reports {reason}: no address decision)"
                ));
                continue;
            }
            f.violation(
                Kind::ClaimPorts,
                detail,
                vec![claim_name(c), svc_name(&o.namespace, &o.name)],
            );
        }
    }
}

/// Every live owner of a claim (a VIP entry with a uid naming the Service that exists with
/// that uid) shows the claim's address once it shows any: a claim that still lists a
/// Service which publishes other addresses holds an address, and its ports on it, for
/// nobody (the 30-minute soak's stale sharer, docs/RELIABILITY.md#soak). Not judged: a
/// Service that shows no address yet (not published, or cleared) or is being deleted (its
/// cleanup releases the claim after its status), entries without uid (reservations and
/// retained addresses) and secondary addresses (never shown). A dual-stack Service shows two
/// addresses: the claim's has to be among them, the other family's is not "another".
fn check_stale_owners(v: &View<'_>, f: &mut Findings) {
    for c in &v.claims {
        let Some(ip) = c.ip() else { continue };
        for o in c.owners() {
            if o.uid.is_empty() || o.role.is_some() || !v.in_scope(&o.namespace) {
                continue;
            }
            let Some(svc) = v.live(o) else { continue };
            if svc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let shown = published_addresses(svc);
            if shown.is_empty() || shown.contains(&ip) {
                continue;
            }
            f.violation(
                Kind::StaleOwner,
                format!(
                    "claim for {ip} lists {} (uid {}), but the Service shows {} and not {ip}",
                    o.key(),
                    o.uid,
                    shown
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                vec![claim_name(c), svc_name(&o.namespace, &o.name)],
            );
        }
    }
}

/// No Service with our finalizer showing an address that no claim backs for it.
fn check_status(v: &View<'_>, f: &mut Findings) {
    for (&(ns, name), svc) in &v.services {
        if v.selection_finalizers(svc).is_empty() {
            continue;
        }
        let uid = svc.metadata.uid.as_deref().unwrap_or("");
        for ip in published_addresses(svc) {
            let claims = v.by_address.get(&ip).map(Vec::as_slice).unwrap_or_default();
            let backed = claims.iter().any(|c| {
                c.owners()
                    .iter()
                    .any(|o| o.is(ns, name) && o.uid == uid && o.role.is_none())
            });
            if !backed {
                let mut objects = vec![svc_name(ns, name)];
                objects.extend(claims.iter().map(|c| claim_name(c)));
                f.violation(
                    Kind::UnbackedStatus,
                    format!(
                        "{ns}/{name} shows {ip} in its status, {}",
                        if claims.is_empty() {
                            "and no claim exists for it".to_string()
                        } else {
                            "but its claim does not list this Service".to_string()
                        }
                    ),
                    objects,
                );
            }
        }
    }
}

impl View<'_> {
    /// Our finalizers on `svc`: this controller's class finalizer, and the standard one a
    /// CCM-mode controller sets (counted for the default controller whatever its mode, since
    /// the audit judges what is left behind). Another loxi-ccm's finalizer is not ours.
    fn selection_finalizers(&self, svc: &Service) -> Vec<String> {
        let selection = self.selection;
        let standard = selection.ccm_mode || selection.controller.is_default();
        svc.metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| {
                selection
                    .finalizers_in(Some(std::slice::from_ref(f)), false)
                    .len()
                    == 1
                    || (standard && f.as_str() == crate::k8s::view::CCM_FINALIZER)
            })
            .cloned()
            .collect()
    }
}

/// The addresses a Service asks for by name: `loxilb.io/staticIP`, `spec.loadBalancerIP`,
/// `loxilb.io/secondaryIPs`.
fn requested_addresses(svc: &Service) -> BTreeSet<IpAddr> {
    let annotations = svc.annotations();
    let listed = [ANN_STATIC_IP, ANN_SECONDARY_IPS]
        .into_iter()
        .filter_map(|k| annotations.get(k))
        .flat_map(|v| v.split(','))
        .chain(
            svc.spec
                .as_ref()
                .and_then(|s| s.load_balancer_ip.as_deref()),
        );
    listed.filter_map(|t| t.trim().parse().ok()).collect()
}

/// No address outside every pool unless an owner asked for it by name, or it is an
/// operator's reservation. An address whose claim names a pool that no longer holds it was
/// taken from that pool before it was shrunk or deleted: kept by design (a pool edit never
/// moves an address), noted.
fn check_pools(s: &Snapshot, v: &View<'_>, f: &mut Findings) {
    for c in &v.claims {
        let Some(ip) = c.ip() else {
            f.violation(
                Kind::OutsidePools,
                format!("claim address {:?} is not an IP address", c.spec.address),
                vec![claim_name(c)],
            );
            continue;
        };
        if s.pools.defs.iter().any(|d| d.pool.contains(&ip)) {
            continue;
        }
        let owners = c.owners();
        if owners.iter().any(|o| o.uid.is_empty()) {
            continue; // a reservation: an operator may reserve any address
        }
        let requested = owners
            .iter()
            .filter_map(|o| v.live(o))
            .any(|svc| requested_addresses(svc).contains(&ip));
        if requested {
            continue;
        }
        if !c.spec.pool.is_empty() {
            f.notes.push(format!(
                "{} ({ip}) was taken from pool {:?}, which no longer holds it: kept where it \
                 is (a pool edit never moves an address)",
                claim_name(c),
                c.spec.pool
            ));
            continue;
        }
        f.violation(
            Kind::OutsidePools,
            format!("{ip} lies outside every pool and no owner asked for it"),
            std::iter::once(claim_name(c))
                .chain(owners.iter().map(|o| svc_name(&o.namespace, &o.name)))
                .collect(),
        );
    }
}

/// Whether the Service is served and its rules are due: our class (or CCM mode), in scope,
/// not being deleted, our finalizer set.
fn served(s: &Snapshot, v: &View<'_>, svc: &Service) -> bool {
    s.selection.serves(svc)
        && svc.metadata.deletion_timestamp.is_none()
        && !v.selection_finalizers(svc).is_empty()
}

/// Per served Service: the rules it should have (`None`: the planner refuses it, a problem
/// the controller reports on the Service, and its rules are left as they are).
type Desired<'a> = HashMap<(&'a str, &'a str), Option<Vec<Rule>>>;

fn desired_rules<'a>(s: &Snapshot, v: &View<'a>, f: &mut Findings) -> Desired<'a> {
    let mut out = HashMap::new();
    for (&key, svc) in &v.services {
        if !served(s, v, svc) {
            continue;
        }
        let (ns, name) = key;
        let uid = svc.metadata.uid.as_deref().unwrap_or("");
        let mut vips: Vec<IpAddr> = Vec::new();
        let mut secondaries: Vec<IpAddr> = Vec::new();
        for c in &v.claims {
            for o in c.owners() {
                if o.is(ns, name)
                    && o.uid == uid
                    && let Some(ip) = c.ip()
                {
                    if o.role.is_some() {
                        secondaries.push(ip);
                    } else {
                        vips.push(ip);
                    }
                }
            }
        }
        vips.sort();
        secondaries.sort();
        let endpoints = || {
            let slices = s.endpoint_slices.iter().filter(|sl| {
                sl.metadata.namespace.as_deref() == Some(ns)
                    && sl
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(SERVICE_NAME_LABEL))
                        .is_some_and(|n| n == name)
            });
            endpoint_views(slices, |pns, pname| {
                s.pod_networks
                    .get(&(pns.to_string(), pname.to_string()))
                    .cloned()
                    .unwrap_or_default()
            })
        };
        let world = PlanWorld {
            settings: &s.settings,
            cluster: &s.cluster,
            nodes: &s.nodes,
            advertises: &|ip| s.pools.advertises(ip),
        };
        let planned = plan_from(svc, &world, endpoints, &vips, &secondaries);
        match planned {
            Ok(plan) => {
                out.insert(key, Some(plan.map(|p| p.rules).unwrap_or_default()));
            }
            Err(problem) => {
                f.notes.push(format!(
                    "{} not checked against loxilb: {} ({problem})",
                    svc_name(ns, name),
                    problem.reason()
                ));
                out.insert(key, None);
            }
        }
    }
    out
}

/// The `loxilb.io/Programmed` condition's reason when it is False.
fn unprogrammed_reason(svc: &Service) -> Option<&str> {
    condition_false(svc, COND_PROGRAMMED)
}

/// The reason of condition `type_` on the Service when it is False.
fn condition_false<'a>(svc: &'a Service, type_: &str) -> Option<&'a str> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "False")
        .map(|c| c.reason.as_str())
}

/// Which observable fields of two rules for one key differ, for the report.
fn differences(have: &Rule, want: &Rule) -> String {
    let (h, w) = (have.observable(), want.observable());
    let mut out = Vec::new();
    let mut field = |name: &str, differs: bool, detail: String| {
        if differs {
            out.push(format!("{name} {detail}"));
        }
    };
    let eps = |r: &Rule| {
        r.endpoints
            .iter()
            .map(|e| format!("{}:{}", e.ip, e.target_port))
            .collect::<Vec<_>>()
            .join(",")
    };
    field(
        "endpoints",
        h.endpoints != w.endpoints,
        format!("[{}] want [{}]", eps(&h), eps(&w)),
    );
    field(
        "name",
        h.name != w.name,
        format!("{:?} want {:?}", h.name, w.name),
    );
    field(
        "mode",
        h.mode != w.mode,
        format!("{:?} want {:?}", h.mode, w.mode),
    );
    field(
        "selection",
        h.selection != w.selection,
        format!("{:?} want {:?}", h.selection, w.selection),
    );
    field(
        "monitor",
        h.monitor != w.monitor,
        format!("{} want {}", h.monitor, w.monitor),
    );
    field(
        "probe",
        h.probe != w.probe,
        format!("{:?} want {:?}", h.probe, w.probe),
    );
    field("bgp", h.bgp != w.bgp, format!("{} want {}", h.bgp, w.bgp));
    field(
        "allowedSources",
        h.allowed_sources != w.allowed_sources,
        format!("{:?} want {:?}", h.allowed_sources, w.allowed_sources),
    );
    field(
        "secondaryIPs",
        h.secondary_ips != w.secondary_ips,
        format!("{:?} want {:?}", h.secondary_ips, w.secondary_ips),
    );
    if out.is_empty() {
        out.push("other fields (idle timeout, managed, proxy protocol)".into());
    }
    out.join("; ")
}

/// No served Service without its rules on every listed loxilb: each rule the planner wants is
/// there with the right endpoints and flags, and the Service holds no other rule of its own.
/// Missing rules are excused when the Service itself reports why (a full loxilb, source
/// ranges past loxilb's limit, a foreign rule on its key).
fn check_rules(s: &Snapshot, v: &View<'_>, desired: &Desired<'_>, f: &mut Findings) {
    for inst in &s.instances {
        let Ok(rules) = &inst.rules else { continue };
        // The Service's own rules on this instance, by the owner its name carries.
        let mut own: HashMap<(String, String), Vec<&Rule>> = HashMap::new();
        for r in rules {
            if let Some(n) = RuleName::parse(&r.name).filter(|n| n.cluster == s.cluster.as_str()) {
                own.entry((n.namespace, n.service)).or_default().push(r);
            }
        }
        for (&(ns, name), want) in desired {
            let Some(want) = want else { continue };
            let svc = v.services[&(ns, name)];
            // Only its group's loxilbs hold its rules; elsewhere it should have none. A
            // Service not placed yet is judged on the default group only.
            let recorded = crate::service::context::recorded_group(svc);
            if recorded.is_none() && inst.group != s.settings.zone {
                continue;
            }
            let none = Vec::new();
            let want = if s.settings.group_of(svc) == inst.group {
                want
            } else {
                &none
            };
            let reported = unprogrammed_reason(svc).filter(|r| REPORTED_REASONS.contains(r));
            let owned = |r: &Rule| RuleName::is_owned_by(&r.name, &s.cluster);
            for action in diff_rules(want, rules, owned) {
                let (detail, objects) = match action {
                    Action::Create(w) => {
                        if let Some(reason) = reported {
                            f.notes.push(format!(
                                "{} lacks rule {} on {}: reported by the Service ({reason})",
                                svc_name(ns, name),
                                w.key,
                                inst.url
                            ));
                            continue;
                        }
                        (
                            format!("{ns}/{name} has no rule for {} on {}", w.key, inst.url),
                            vec![svc_name(ns, name), format!("loxilb {}", inst.url)],
                        )
                    }
                    Action::Update(w) | Action::Recreate(w) => {
                        let Some(have) = rules.iter().find(|r| r.key == w.key) else {
                            continue;
                        };
                        (
                            format!(
                                "{ns}/{name}'s rule for {} on {} is wrong: {}",
                                w.key,
                                inst.url,
                                differences(have, &w)
                            ),
                            vec![svc_name(ns, name), rule_name(have, &inst.url)],
                        )
                    }
                    Action::Conflict {
                        wanted,
                        foreign_name,
                    } => {
                        if reported.is_some() {
                            continue;
                        }
                        (
                            format!(
                                "{ns}/{name} wants {} on {}, held by a foreign rule {foreign_name:?} and not reported",
                                wanted.key, inst.url
                            ),
                            vec![svc_name(ns, name), format!("loxilb {}", inst.url)],
                        )
                    }
                    Action::Delete(_) => continue,
                };
                f.violation(Kind::Rules, detail, objects);
            }
            let wanted: BTreeSet<RuleKey> = want.iter().map(|r| r.key).collect();
            for r in own
                .get(&(ns.to_string(), name.to_string()))
                .into_iter()
                .flatten()
            {
                if !wanted.contains(&r.key) {
                    f.violation(
                        Kind::Rules,
                        format!(
                            "{ns}/{name} holds a rule it should not have: {} on {}",
                            r.key, inst.url
                        ),
                        vec![svc_name(ns, name), rule_name(r, &inst.url)],
                    );
                }
            }
        }
    }
}

/// No rule named as this cluster's whose Service is gone (or no longer ours and cleaned up).
fn check_orphans(s: &Snapshot, v: &View<'_>, f: &mut Findings) {
    for inst in &s.instances {
        let Ok(rules) = &inst.rules else { continue };
        for r in rules {
            let Some(n) = RuleName::parse(&r.name).filter(|n| n.cluster == s.cluster.as_str())
            else {
                continue;
            };
            if !v.in_scope(&n.namespace) {
                continue;
            }
            let why = match v.services.get(&(n.namespace.as_str(), n.service.as_str())) {
                None => "its Service is gone",
                Some(svc) if !s.selection.serves(svc) && v.selection_finalizers(svc).is_empty() => {
                    "its Service is no longer served and was cleaned up"
                }
                Some(_) => continue,
            };
            f.violation(
                Kind::OwnedOrphan,
                format!("rule for {} on {}: {why}", r.key, inst.url),
                vec![rule_name(r, &inst.url), svc_name(&n.namespace, &n.service)],
            );
        }
    }
}

/// With BGP: each address is advertised once per live rule created with `bgp` (its VIP and
/// its secondary addresses), as loxilb counts them (docs/loxilb-api.md#bgp). Checked only
/// where the loxilb exposes the counts (the simulator); real loxilb does not, which is noted.
fn check_advertisements(s: &Snapshot, f: &mut Findings) {
    if !s.settings.advertise {
        return;
    }
    for inst in &s.instances {
        let Ok(rules) = &inst.rules else { continue };
        let Some(have) = &inst.advertisements else {
            f.notes.push(format!(
                "loxilb {}: BGP advertisement counts not checked: this loxilb does not expose \
                 them (only the simulator's admin API does)",
                inst.url
            ));
            continue;
        };
        let mut want: BTreeMap<IpAddr, u32> = BTreeMap::new();
        for r in rules.iter().filter(|r| r.bgp) {
            *want.entry(r.key.ip).or_default() += 1;
            if r.key.protocol == loxi_domain::Protocol::Sctp {
                for ip in &r.secondary_ips {
                    *want.entry(*ip).or_default() += 1;
                }
            }
        }
        let have: BTreeMap<IpAddr, u32> = have
            .iter()
            .filter_map(|(k, n)| Some((k.parse().ok()?, *n)))
            .collect();
        let addresses: BTreeSet<&IpAddr> = want.keys().chain(have.keys()).collect();
        for ip in addresses {
            let (w, h) = (
                want.get(ip).copied().unwrap_or(0),
                have.get(ip).copied().unwrap_or(0),
            );
            if w != h {
                f.violation(
                    Kind::BgpAdvertisements,
                    format!(
                        "{ip} is advertised {h} time(s) on {}, its rules with bgp say {w}",
                        inst.url
                    ),
                    vec![format!("loxilb {}", inst.url), format!("address {ip}")],
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::claims::AddressClaimSpec;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServicePort, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
    use loxi_domain::ipam::{PortProto, Sharing};
    use loxi_domain::pools::PoolDef;
    use loxi_domain::{Pool, Protocol};

    const NS: &str = "team";

    pub(super) fn service(name: &str, uid: &str, port: i32, ip: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(NS.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                finalizers: Some(vec![crate::k8s::view::CLASS_FINALIZER.into()]),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_class: Some("loxilb.io/loxilb".into()),
                ports: Some(vec![ServicePort {
                    port,
                    protocol: Some("TCP".into()),
                    node_port: Some(30000 + port),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: ip.map(|ip| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            }),
        }
    }

    pub(super) fn owner(name: &str, uid: &str, port: u16) -> ClaimedBy {
        ClaimedBy::new(
            NS,
            name,
            uid,
            &Sharing::Ports {
                key: None,
                ports: [PortProto::new(port, Protocol::Tcp)].into(),
                group: None,
            },
        )
    }

    pub(super) fn claim(ip: &str, owners: Vec<ClaimedBy>) -> AddressClaim {
        let mut owners = owners.into_iter();
        let mut c = AddressClaim::new(
            &crate::ipam::claims::claim_name(&ip.parse().unwrap()),
            AddressClaimSpec {
                address: ip.into(),
                pool: "default".into(),
                service: owners.next().unwrap(),
                shared_with: owners.collect(),
                retain_until: None,
                controller: None,
            },
        );
        c.metadata.uid = Some(format!("claim-{ip}"));
        c
    }

    fn node() -> NodeView {
        NodeView {
            name: "n1".into(),
            internal_ip: Some("10.0.0.1".parse().unwrap()),
            ready: true,
            ..Default::default()
        }
    }

    pub(super) fn snapshot(services: Vec<Service>, claims: Vec<AddressClaim>) -> Snapshot {
        let pool = Pool::new("default", vec!["192.0.2.0/24".parse().unwrap()]);
        let mut s = Snapshot {
            cluster: ClusterId::new("test").unwrap(),
            selection: Selection::new(
                "loxilb.io/loxilb",
                false,
                loxi_domain::ControllerName::default(),
            ),
            settings: Settings {
                namespace: Some(NS.into()),
                ..Settings::default()
            },
            services,
            nodes: vec![node()],
            endpoint_slices: Vec::new(),
            pod_networks: HashMap::new(),
            claims,
            pools: PoolSet {
                defs: vec![PoolDef::from_flags(pool, 0)],
                ..PoolSet::default()
            },
            instances: Vec::new(),
            roles: None,
            egresses: None,
            gateways: None,
        };
        // A loxilb holding exactly the planned rules: a converged cluster.
        let rules = planned(&s);
        s.instances.push(InstanceSnapshot {
            url: "http://loxilb".into(),
            group: "llb".into(),
            ha_states: None,
            rules: Ok(rules),
            advertisements: None,
            firewall: None,
        });
        s
    }

    /// Every rule the planner wants for the snapshot's served Services.
    pub(super) fn planned(s: &Snapshot) -> Vec<Rule> {
        let view = View::new(s);
        let mut f = Findings::default();
        let mut rules: Vec<Rule> = desired_rules(s, &view, &mut f)
            .into_values()
            .flatten()
            .flatten()
            .collect();
        rules.sort_by_key(|r| r.key);
        rules
    }

    const ZONE_SELECT: &str = loxi_domain::placement::ZONE_SELECT_ANNOTATION;

    fn converged() -> Snapshot {
        snapshot(
            vec![
                service("web", "u1", 80, Some("192.0.2.1")),
                service("dns", "u2", 53, Some("192.0.2.1")),
                service("api", "u3", 443, Some("192.0.2.2")),
            ],
            vec![
                claim(
                    "192.0.2.1",
                    vec![owner("web", "u1", 80), owner("dns", "u2", 53)],
                ),
                claim("192.0.2.2", vec![owner("api", "u3", 443)]),
            ],
        )
    }

    pub(super) fn kinds(f: &Findings) -> Vec<Kind> {
        f.violations.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_converged_cluster_is_clean() {
        let s = converged();
        assert_eq!(planned(&s).len(), 3, "one rule per Service and port");
        let f = audit(&s);
        assert!(f.clean(), "{f}");
        assert_eq!((f.services, f.claims, f.rules), (3, 2, 3));
    }

    #[test]
    fn owners_that_may_not_share() {
        let mut s = converged();
        // Same port twice on one address.
        s.claims[0].spec.shared_with[0] = owner("dns", "u2", 80);
        let f = audit(&s);
        let v = f.of_kind(Kind::SharedAddress);
        assert_eq!(v.len(), 1, "{f}");
        assert!(v[0].detail.contains("team/web and team/dns"), "{}", v[0]);
        assert!(v[0].objects.contains(&"Service team/dns".to_string()));

        // Different sharing keys (recorded for web, which has none: `claim-ports` too).
        let mut s = converged();
        s.claims[0].spec.service.sharing_key = Some("a".into());
        assert_eq!(
            kinds(&audit(&s)),
            vec![Kind::SharedAddress, Kind::ClaimPorts]
        );

        // A reservation (no uid) is exclusive.
        let mut s = converged();
        s.claims[1].spec.shared_with.push(ClaimedBy {
            uid: String::new(),
            ..owner("later", "", 8080)
        });
        assert_eq!(kinds(&audit(&s)), vec![Kind::SharedAddress]);
    }

    #[test]
    fn missing_wrong_and_stale_rules() {
        // Missing.
        let mut s = converged();
        if let Ok(rules) = &mut s.instances[0].rules {
            rules.retain(|r| r.key.port != 443);
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::Rules]);
        assert!(
            f.violations[0]
                .detail
                .contains("team/api has no rule for 192.0.2.2:443/tcp"),
            "{f}"
        );

        // Missing but reported by the Service (a full loxilb): a note.
        let mut s2 = s.clone();
        s2.services[2].status.as_mut().unwrap().conditions = Some(vec![Condition {
            type_: COND_PROGRAMMED.into(),
            status: "False".into(),
            reason: "CapacityExceeded".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }]);
        let f = audit(&s2);
        assert!(f.clean(), "{f}");
        assert!(f.notes.iter().any(|n| n.contains("CapacityExceeded")));

        // Wrong endpoints.
        let mut s = converged();
        if let Ok(rules) = &mut s.instances[0].rules {
            rules[0].endpoints[0].ip = "10.9.9.9".parse().unwrap();
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::Rules]);
        assert!(
            f.violations[0].detail.contains("is wrong: endpoints"),
            "{f}"
        );

        // Wrong flag (bgp).
        let mut s = converged();
        if let Ok(rules) = &mut s.instances[0].rules {
            rules[1].bgp = true;
        }
        let f = audit(&s);
        assert!(
            f.violations[0].detail.contains("bgp true want false"),
            "{f}"
        );

        // A stale rule of a served Service (an old port).
        let mut s = converged();
        if let Ok(rules) = &mut s.instances[0].rules {
            let mut old = rules[0].clone();
            old.key.port = 8080;
            old.name = RuleName::new(&s.cluster, NS, "api", 8080, Protocol::Tcp).to_string();
            old.key.ip = "192.0.2.2".parse().unwrap();
            rules.push(old);
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::Rules]);
        assert!(f.violations[0].detail.contains("should not have"), "{f}");

        // An instance that cannot be listed is noted, not judged.
        let mut s = converged();
        s.instances[0].rules = Err("connection refused".into());
        let f = audit(&s);
        assert!(f.clean());
        assert!(f.notes.iter().any(|n| n.contains("connection refused")));
    }

    #[test]
    fn owned_orphans() {
        let mut s = converged();
        s.services
            .retain(|svc| svc.metadata.name.as_deref() != Some("api"));
        s.claims.retain(|c| c.spec.address != "192.0.2.2");
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OwnedOrphan], "{f}");
        assert!(f.violations[0].detail.contains("its Service is gone"));
        // Foreign names and other clusters' rules are never ours.
        if let Ok(rules) = &mut s.instances[0].rules {
            for r in rules.iter_mut().filter(|r| r.key.port == 443) {
                r.name = r.name.replace("ccm-test_", "ccm-other_");
            }
        }
        assert!(audit(&s).clean());
    }

    #[test]
    fn claims_without_owner() {
        let mut s = converged();
        s.services
            .retain(|svc| svc.metadata.name.as_deref() != Some("api"));
        if let Ok(rules) = &mut s.instances[0].rules {
            rules.retain(|r| r.key.port != 443);
        }
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OwnerlessClaim], "{f}");
        assert!(f.violations[0].detail.contains("has no owner"));
        // A Gateway's claim (no Service of that name) is not ownerless.
        let mut gateway = s.clone();
        gateway.claims[1].spec.service.role = Some("gateway".into());
        assert!(
            audit(&gateway).of_kind(Kind::OwnerlessClaim).is_empty(),
            "{}",
            audit(&gateway)
        );
        // A reservation is not ownerless.
        s.claims[1].spec.service.uid = String::new();
        assert!(audit(&s).clean());
        // A re-created Service (new uid) does not own the old entry.
        let mut s = converged();
        s.services[0].metadata.uid = Some("u1-new".into());
        let f = audit(&s);
        assert!(
            f.of_kind(Kind::OwnerlessClaim)[0]
                .detail
                .contains("still lists team/web")
        );
    }

    #[test]
    fn claim_ports_that_are_not_the_owners_ports_now() {
        // The claim still records dns on an old port (5353; the Service serves 53 now): the
        // record behind the soak's first bug (docs/RELIABILITY.md). The sharing check sees
        // nothing wrong, since 5353 and web's 80 differ.
        let mut s = converged();
        s.claims[0].spec.shared_with[0] = owner("dns", "u2", 5353);
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::ClaimPorts], "{f}");
        let v = &f.of_kind(Kind::ClaimPorts)[0];
        assert!(
            v.detail.contains("team/dns with ports [5353/TCP]")
                && v.detail.contains("the Service has ports [53/TCP]"),
            "{v}"
        );
        assert!(v.objects.contains(&"Service team/dns".to_string()));
        // Another sharing key recorded than the Service has.
        let mut s = converged();
        s.claims[1].spec.service.sharing_key = Some("k".into());
        assert_eq!(kinds(&audit(&s)), vec![Kind::ClaimPorts]);
        // A reservation (no uid) keeps the ports its Service last had: not judged.
        let mut s = converged();
        s.claims[1].spec.service.uid = String::new();
        s.claims[1].spec.service.ports = Some(vec!["1/TCP".into()]);
        assert!(audit(&s).of_kind(Kind::ClaimPorts).is_empty());
        // A Service that reports it has no address decision keeps its old record: a note.
        let mut s = converged();
        s.claims[1].spec.service = owner("api", "u3", 8443);
        s.services[2]
            .status
            .as_mut()
            .unwrap()
            .conditions
            .get_or_insert_default()
            .push(Condition {
                type_: COND_ADDRESS.into(),
                status: "False".into(),
                reason: "Exhausted".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            });
        let f = audit(&s);
        assert!(f.of_kind(Kind::ClaimPorts).is_empty(), "{f}");
        assert!(
            f.notes.iter().any(|n| n.contains("it reports Exhausted")),
            "{f}"
        );
    }

    #[test]
    fn an_owner_whose_service_shows_another_address() {
        // The soak's stale sharer: dns moved to 192.0.2.3 (its own claim, shown, programmed)
        // while the shared claim of 192.0.2.1 still lists it, holding port 53 there.
        let mut s = converged();
        s.services[1].status = service("dns", "u2", 53, Some("192.0.2.3")).status;
        s.claims
            .push(claim("192.0.2.3", vec![owner("dns", "u2", 53)]));
        // The planner works from the claims: loxilb holds dns's rule on both addresses.
        s.instances[0].rules = Ok(planned(&s));
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::StaleOwner], "{f}");
        let v = &f.violations[0];
        assert!(
            v.detail
                .contains("claim for 192.0.2.1 lists team/dns (uid u2)")
                && v.detail.contains("shows 192.0.2.3 and not 192.0.2.1"),
            "{v}"
        );
        assert_eq!(
            v.objects,
            vec![
                "AddressClaim 192.0.2.1".to_string(),
                "Service team/dns".to_string()
            ]
        );

        let stale = |s: &Snapshot| audit(s).of_kind(Kind::StaleOwner).len();
        // Not published yet (or cleared): not judged.
        let mut quiet = s.clone();
        quiet.services[1].status = None;
        assert_eq!(stale(&quiet), 0);
        // Being deleted: its cleanup releases the claims after the status.
        let mut deleting = s.clone();
        deleting.services[1].metadata.deletion_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(stale(&deleting), 0);
        // A re-created Service (another uid) is not the owner listed (`ownerless-claim`).
        let mut recreated = s.clone();
        recreated.services[1].metadata.uid = Some("u2-new".into());
        assert_eq!(stale(&recreated), 0);
        // A reservation or a retained address (no uid) is held for the name on purpose.
        let mut reserved = s.clone();
        reserved.claims[0].spec.shared_with[0].uid = String::new();
        assert_eq!(stale(&reserved), 0);
        // A secondary (SCTP multi-homing) address is never shown.
        let mut secondary = s.clone();
        secondary.claims[0].spec.shared_with[0] = ClaimedBy::secondary(NS, "dns", "u2");
        assert_eq!(stale(&secondary), 0);
        // Dual stack: the Service shows both families' addresses; each claim's is among them.
        let mut dual = converged();
        let mut both = service("api", "u3", 443, Some("192.0.2.2")).status.unwrap();
        let ingress = both
            .load_balancer
            .as_mut()
            .unwrap()
            .ingress
            .as_mut()
            .unwrap();
        ingress.push(LoadBalancerIngress {
            ip: Some("2001:db8::2".into()),
            ..Default::default()
        });
        dual.services[2].status = Some(both.clone());
        dual.claims
            .push(claim("2001:db8::2", vec![owner("api", "u3", 443)]));
        assert_eq!(stale(&dual), 0, "{}", audit(&dual));
        // ... but not another address of the claim's family.
        ingress_set(&mut dual.services[2], &["192.0.2.2", "2001:db8::9"]);
        assert_eq!(stale(&dual), 1, "{}", audit(&dual));
        // The hostname form (`llb-<ip>`) shows the address too.
        let mut hostname = converged();
        hostname.services[2].status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    hostname: Some("llb-192.0.2.2".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        assert_eq!(stale(&hostname), 0, "{}", audit(&hostname));
    }

    fn ingress_set(svc: &mut Service, ips: &[&str]) {
        svc.status.get_or_insert_default().load_balancer = Some(LoadBalancerStatus {
            ingress: Some(
                ips.iter()
                    .map(|ip| LoadBalancerIngress {
                        ip: Some((*ip).into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        });
    }

    #[test]
    fn status_address_without_claim() {
        let mut s = converged();
        s.services[2].status = service("api", "u3", 443, Some("192.0.2.9")).status;
        let f = audit(&s);
        let v = f.of_kind(Kind::UnbackedStatus);
        assert_eq!(v.len(), 1, "{f}");
        assert!(v[0].detail.contains("192.0.2.9") && v[0].detail.contains("no claim"));
        // Without our finalizer, the status is someone else's business.
        s.services[2].metadata.finalizers = None;
        assert!(audit(&s).of_kind(Kind::UnbackedStatus).is_empty());
    }

    #[test]
    fn addresses_outside_every_pool() {
        let mut s = converged();
        s.services[2].status = service("api", "u3", 443, Some("198.51.100.7")).status;
        s.claims[1] = claim("198.51.100.7", vec![owner("api", "u3", 443)]);
        s.claims[1].spec.pool = String::new();
        s.instances[0].rules = Ok(planned(&s));
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::OutsidePools], "{f}");
        // Asked for by name: fine.
        let mut asked = s.clone();
        asked.services[2].metadata.annotations =
            Some([(ANN_STATIC_IP.to_string(), "198.51.100.7".to_string())].into());
        assert!(audit(&asked).clean());
        // Taken from a pool that was shrunk since: kept by design, noted.
        s.claims[1].spec.pool = "default".into();
        let f = audit(&s);
        assert!(f.clean(), "{f}");
        assert!(f.notes.iter().any(|n| n.contains("no longer holds it")));
    }

    #[test]
    fn bgp_advertisement_counts() {
        let mut s = converged();
        s.settings.advertise = true;
        s.instances[0].rules = Ok(planned(&s));
        let f = audit(&s);
        assert!(
            f.clean() && f.notes.iter().any(|n| n.contains("does not expose")),
            "{f}"
        );
        s.instances[0].advertisements =
            Some([("192.0.2.1".to_string(), 2), ("192.0.2.2".to_string(), 1)].into());
        assert!(audit(&s).clean());
        s.instances[0].advertisements =
            Some([("192.0.2.1".to_string(), 2), ("192.0.2.3".to_string(), 1)].into());
        let f = audit(&s);
        assert_eq!(
            kinds(&f),
            vec![Kind::BgpAdvertisements, Kind::BgpAdvertisements],
            "{f}"
        );
    }

    #[test]
    fn rules_stay_on_their_groups_loxilbs() {
        // A second group (east) with a loxilb holding nothing: clean, since no Service is
        // placed there.
        let mut s = converged();
        s.instances.push(InstanceSnapshot {
            url: "http://east".into(),
            group: "east".into(),
            ha_states: None,
            rules: Ok(Vec::new()),
            advertisements: None,
            firewall: None,
        });
        let f = audit(&s);
        assert!(f.clean(), "{f}");
        // api recorded on east: its rule belongs there, not on llb.
        let annotate = |svc: &mut Service| {
            svc.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ZONE_SELECT.into(), "east".into());
        };
        annotate(&mut s.services[2]);
        let f = audit(&s);
        let v = f.of_kind(Kind::Rules);
        assert_eq!(v.len(), 2, "{f}");
        assert!(
            v.iter()
                .any(|v| v.detail.contains("has no rule") && v.detail.contains("http://east")),
            "{f}"
        );
        assert!(
            v.iter().any(|v| v.detail.contains("should not have") && v.detail.contains("http://loxilb")),
            "{f}"
        );
        // The claim records the group too (the sharing rules read it).
        assert_eq!(kinds(&f), vec![Kind::ClaimPorts, Kind::Rules, Kind::Rules]);
        // Moved where it belongs, named after east's HA instance, and recorded: clean again.
        s.claims[1].spec.service.group = Some("east".into());
        let (east, llb): (Vec<Rule>, Vec<Rule>) =
            planned(&s).into_iter().partition(|r| r.key.port == 443);
        assert!(east[0].name.ends_with(":east-inst0"), "{}", east[0].name);
        s.instances[0].rules = Ok(llb);
        s.instances[1].rules = Ok(east);
        let f = audit(&s);
        assert!(f.clean(), "{f}");
    }

    #[test]
    fn one_master_per_ha_instance_and_group() {
        let mut s = converged();
        s.roles = Some(loxi_domain::roles::HaSettings {
            vip: "0.0.0.0".into(),
            instance_count: 1,
            excluded: vec!["http://excluded".into()],
        });
        let states = |state: &str| Some([("llb-inst0".to_string(), state.to_string())].into());
        let mut second = s.instances[0].clone();
        second.url = "http://loxilb2".into();
        s.instances.push(second);
        s.instances[0].ha_states = states("MASTER");
        s.instances[1].ha_states = states("BACKUP");
        assert!(audit(&s).clean());
        // Two masters.
        s.instances[1].ha_states = states("MASTER");
        let f = audit(&s);
        assert_eq!(kinds(&f), vec![Kind::HaMasters], "{f}");
        assert!(f.violations[0].detail.contains("2 master(s)"), "{f}");
        // None (after a restart nobody is master yet).
        s.instances[0].ha_states = states("NOT_DEFINED");
        s.instances[1].ha_states = states("BACKUP");
        assert_eq!(kinds(&audit(&s)), vec![Kind::HaMasters]);
        // An excluded loxilb holds no role and is not counted; one whose states could not
        // be read is not judged.
        s.instances[0].ha_states = states("MASTER");
        s.instances[1].url = "http://excluded".into();
        assert!(audit(&s).clean());
        s.instances[1].url = "http://loxilb2".into();
        s.instances[1].ha_states = None;
        assert!(audit(&s).clean());
    }
}
