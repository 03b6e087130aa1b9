//! BGP: what every loxilb's goBGP holds, from the flags (`--bgp-local-as`, `--bgp-peers`, ...)
//! and, with `--bgp-crds`, kube-loxilb's four BGP resources; their status, Events, finalizers
//! and the session metrics (docs/bgp.md).
//!
//! Level-triggered, on the health loop's tick (`--health-interval`): each tick takes one
//! [`Plan`] from the stores (the decisions are pure, `desired`), every reachable loxilb is
//! brought to it (`crate::loxilb::bgp`, which also lists the sessions), then [`Bgp::publish`]
//! writes what changed: each resource's status (conditions `Accepted` and `Programmed`,
//! peers' sessions), Events, finalizers, metrics. A resource being deleted is left out of the
//! plan, so the pass removes it from loxilb; its finalizer goes once every reachable loxilb
//! has let it go (an unreachable one has nothing after a restart, or is cleaned by the next
//! pass: neighbours by listing, the rest from what this process sent).
//!
//! Where an Event goes when a session leaves `ESTABLISHED`: on the `BGPPeerService` that
//! configures the peer; a peer from the flags has no object of its own, so a warning log line
//! and `loxi_ccm_bgp_session_drops_total` say it.

pub mod crds;
pub mod desired;
mod schema;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use loxi_domain::bgp::BgpSettings;
use loxilb_client::ClientError;
use serde_json::json;
use tracing::{info, warn};

use crate::k8s::events::EventRecorder;
use crate::loxilb::Instance;
use crate::loxilb::bgp::{BgpReport, ItemId};
use crate::metrics::Metrics;
use crds::{
    BGPPeerService, BGPPolicyApplyService, BGPPolicyDefinedSetsService, BGPPolicyDefinitionService,
    BgpStatus, PeerSession,
};
use desired::{Desired, Item, Kind, MeshMember, Pass, Resource as Res, ResourceId, Snapshot};

/// Our finalizer on the BGP resources: removed once loxilb no longer holds what they
/// configured.
pub const FINALIZER: &str = "loxilb.io/bgp-cleanup";

/// The session state a peer should be in.
const ESTABLISHED: &str = "ESTABLISHED";
/// The session state shown for a loxilb that does not answer (goBGP's "unknown").
const DOWN: &str = "UNKNOWN";

/// Where the watch of one kind is: its CRD not served (yet), its first listing under way, or
/// listed. A kind that is not served has no resources: its empty store is the truth. One
/// being listed is not known yet: no pass is made from it (it could remove what its
/// resources configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Waiting = 0,
    Listing = 1,
    Listed = 2,
}

/// A kind's phase, shared between its watch and the plan.
#[derive(Clone)]
struct SharedPhase(Arc<AtomicU8>);

impl SharedPhase {
    fn new(phase: Phase) -> SharedPhase {
        SharedPhase(Arc::new(AtomicU8::new(phase as u8)))
    }

    fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Relaxed);
    }

    fn get(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::Waiting,
            1 => Phase::Listing,
            _ => Phase::Listed,
        }
    }
}

/// Where the CRDs come from, for the log line of a kind that is not served.
const CRD_HINT: &str = "install the CRDs with kubectl apply -f deploy/optional/bgp-crds.yaml (Helm: bgpCrds.enabled=true) and grant the RBAC in deploy/20-clusterrole.yaml";

/// The API and the store of one kind.
struct Kept<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<K>,
    store: Store<K>,
    phase: SharedPhase,
}

/// The four kinds' APIs and stores (with `--bgp-crds`).
pub struct Resources {
    peers: Kept<BGPPeerService>,
    sets: Kept<BGPPolicyDefinedSetsService>,
    definitions: Kept<BGPPolicyDefinitionService>,
    applies: Kept<BGPPolicyApplyService>,
}

/// Watches one kind into a store; the future runs the watch. A kind not served now is waited
/// for (`crate::k8s::served`): CRDs installed while the controller runs are followed without
/// a restart.
async fn kept<K>(client: &kube::Client) -> (Kept<K>, futures::future::BoxFuture<'static, ()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let (store, writer) = reflector::store::<K>();
    let served = crate::k8s::served::probe(&api).await.is_ok();
    let phase = SharedPhase::new(if served {
        Phase::Listing
    } else {
        Phase::Waiting
    });
    let run = {
        let api = api.clone();
        let phase = phase.clone();
        async move {
            if !served {
                crate::k8s::served::until_served(&api, &K::kind(&()), CRD_HINT).await;
                phase.set(Phase::Listing);
            }
            reflector(writer, watcher(api, watcher::Config::default()))
                .backoff(crate::k8s::served::backoff())
                .for_each(|event| {
                    match event {
                        Ok(watcher::Event::InitDone) => phase.set(Phase::Listed),
                        Ok(_) => {}
                        Err(e) => {
                            warn!(kind = %K::kind(&()), error = %e, "BGP resource watch error");
                        }
                    }
                    futures::future::ready(())
                })
                .await;
        }
    };
    (Kept { api, store, phase }, Box::pin(run))
}

impl Resources {
    /// The four watches (to be spawned). A kind whose CRD is not served yet is followed once
    /// it is (the log says so).
    pub async fn watch(
        client: &kube::Client,
    ) -> (Resources, Vec<futures::future::BoxFuture<'static, ()>>) {
        let (peers, a) = kept::<BGPPeerService>(client).await;
        let (sets, b) = kept::<BGPPolicyDefinedSetsService>(client).await;
        let (definitions, c) = kept::<BGPPolicyDefinitionService>(client).await;
        let (applies, d) = kept::<BGPPolicyApplyService>(client).await;
        (
            Resources {
                peers,
                sets,
                definitions,
                applies,
            },
            vec![a, b, c, d],
        )
    }

    fn phases(&self) -> [Phase; 4] {
        [
            self.peers.phase.get(),
            self.sets.phase.get(),
            self.definitions.phase.get(),
            self.applies.phase.get(),
        ]
    }
}

/// What the leader knows of one live or deleted resource, besides its spec.
#[derive(Debug, Clone)]
struct Meta {
    generation: Option<i64>,
    resource_version: Option<String>,
    finalizers: Vec<String>,
    deleting: bool,
    status: BgpStatus,
    reference: ObjectReference,
}

/// One tick's view: the resources and the decisions over them.
pub struct Plan {
    pub desired: Desired,
    /// The loxilbs that peer with each other (`desired::config_for`).
    pub mesh: Vec<MeshMember>,
    meta: BTreeMap<ResourceId, Meta>,
}

/// Sessions as last seen, per (loxilb, peer): state and since when.
type Seen = HashMap<(String, IpAddr), (String, String)>;

#[derive(Default)]
struct State {
    last_good: BTreeMap<ResourceId, (ItemId, Item)>,
    sessions: Seen,
    /// Labels of `loxi_ccm_bgp_sessions` currently set: (loxilb, peer, state).
    shown: BTreeSet<(String, String, String)>,
    /// loxilbs seen down ([`Bgp::loxilb_down`]) and not back yet ([`Bgp::loxilb_back`]):
    /// their sessions stay `UNKNOWN` whatever a pass begun before they went down listed
    /// (such a pass, noted after the down, put ESTABLISHED back until the loxilb returned).
    unreachable: BTreeSet<String>,
}

/// The BGP subsystem's handle.
pub struct Bgp {
    settings: BgpSettings,
    resources: Option<Resources>,
    /// Events about the resources (`None`: BGP from the flags alone, no resource to tell).
    recorder: Option<EventRecorder>,
    metrics: Metrics,
    state: Mutex<State>,
}

fn now() -> String {
    Timestamp::now().to_string()
}

impl Bgp {
    pub fn new(
        settings: BgpSettings,
        resources: Option<Resources>,
        recorder: EventRecorder,
        metrics: Metrics,
    ) -> Bgp {
        Bgp {
            settings,
            resources,
            recorder: Some(recorder),
            metrics,
            state: Mutex::default(),
        }
    }

    /// BGP from the flags alone (no resources, so no Events): what the fleet needs without
    /// an API server (crates/loxi-ccm/tests/fleet_alone.rs).
    pub fn from_flags(settings: BgpSettings, metrics: Metrics) -> Bgp {
        Bgp {
            settings,
            resources: None,
            recorder: None,
            metrics,
            state: Mutex::default(),
        }
    }

    fn publish_event(&self, ev: Event, regarding: ObjectReference) {
        if let Some(recorder) = &self.recorder {
            recorder.publish(ev, regarding);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This tick's plan, from the stores, with the loxilbs of the fleet now (`mesh`: they
    /// become each other's neighbours). `None` while a kind whose CRD was just installed is
    /// being listed (its resources are not known yet).
    pub fn plan(&self, mesh: Vec<MeshMember>) -> Option<Plan> {
        if self
            .resources
            .as_ref()
            .is_some_and(|r| r.phases().contains(&Phase::Listing))
        {
            return None;
        }
        let mut snap = Snapshot::default();
        let mut meta = BTreeMap::new();
        if let Some(r) = &self.resources {
            observe(
                &r.peers.store,
                Kind::Peer,
                &mut meta,
                &mut snap.peers,
                |o| (o.spec.spec.clone(), o.status.clone()),
            );
            observe(
                &r.sets.store,
                Kind::DefinedSets,
                &mut meta,
                &mut snap.sets,
                |o| (o.spec.spec.clone(), o.status.clone()),
            );
            observe(
                &r.definitions.store,
                Kind::Definition,
                &mut meta,
                &mut snap.definitions,
                |o| (o.spec.spec.clone(), o.status.clone()),
            );
            observe(
                &r.applies.store,
                Kind::Apply,
                &mut meta,
                &mut snap.applies,
                |o| (o.spec.spec.clone(), o.status.clone()),
            );
        }
        let mut state = self.state();
        let desired = desired::desired(&self.settings, &snap, &state.last_good);
        state.last_good = desired.last_good.clone();
        Some(Plan {
            desired,
            mesh,
            meta,
        })
    }

    /// Whether `a` and `b` want the same BGP settings on the loxilb at `url` (a pass made with
    /// one stands for the other).
    pub fn same_settings(a: &Plan, b: &Plan, url: &str) -> bool {
        desired::config_for(&a.desired.config, &a.mesh, url)
            == desired::config_for(&b.desired.config, &b.mesh, url)
    }

    /// The loxilb at `url` stopped answering: its sessions are down with it, reported at once
    /// (metrics, and the Event or log line of a session leaving ESTABLISHED), not once it is
    /// back. Its state reads `UNKNOWN` until a pass lists it again.
    pub fn loxilb_down(&self, plan: &Plan, url: &str) {
        let now = now();
        let mut left = Vec::new();
        {
            let mut state = self.state();
            state.unreachable.insert(url.to_string());
            let State {
                sessions, shown, ..
            } = &mut *state;
            for ((loxilb, ip), (current, since)) in sessions.iter_mut() {
                if loxilb != url || current == DOWN {
                    continue;
                }
                if current == ESTABLISHED {
                    left.push(*ip);
                }
                self.metrics
                    .set_bgp_session(loxilb, &ip.to_string(), current, false);
                shown.remove(&(loxilb.clone(), ip.to_string(), current.clone()));
                *current = DOWN.to_string();
                *since = now.clone();
                self.metrics
                    .set_bgp_session(loxilb, &ip.to_string(), DOWN, true);
                shown.insert((loxilb.clone(), ip.to_string(), DOWN.to_string()));
            }
        }
        for ip in left {
            self.session_left(plan, url, ip, DOWN);
        }
    }

    /// The loxilb at `url` answers again: the next passes on it report its sessions.
    pub fn loxilb_back(&self, url: &str) {
        self.state().unreachable.remove(url);
    }

    /// The loxilb at `url` left the fleet (its worker is stopped): its sessions leave the
    /// metric now, not at the next publish, and are forgotten, so a loxilb joining later at
    /// the same URL starts afresh. No Event: the sessions did not drop, their loxilb left.
    pub fn loxilb_left(&self, url: &str) {
        let mut state = self.state();
        state.unreachable.remove(url);
        state.sessions.retain(|(loxilb, _), _| loxilb != url);
        let (gone, kept): (BTreeSet<_>, BTreeSet<_>) = std::mem::take(&mut state.shown)
            .into_iter()
            .partition(|(loxilb, _, _)| loxilb == url);
        state.shown = kept;
        for (l, p, s) in &gone {
            self.metrics.set_bgp_session(l, p, s, false);
        }
    }

    /// One pass on a reachable loxilb: every loxilb's configuration plus its own mesh
    /// neighbours.
    pub async fn sync(&self, inst: &Instance, plan: &Plan) -> Result<BgpReport, ClientError> {
        let config = desired::config_for(&plan.desired.config, &plan.mesh, inst.url());
        inst.ensure_bgp(&config).await
    }

    /// Writes what the latest passes (one per loxilb, `None`: not reached) changed: session
    /// metrics and Events, and, when every pass was made with this plan's settings
    /// (`current`), the resources' statuses and finalizers.
    pub async fn publish(
        &self,
        plan: &Plan,
        passes: &[(String, Option<&Result<BgpReport, ClientError>>)],
        current: bool,
    ) {
        let texts: Vec<String> = passes
            .iter()
            .map(|(_, p)| match p {
                Some(Err(e)) => e.to_string(),
                _ => String::new(),
            })
            .collect();
        let view: Vec<Pass<'_>> = passes
            .iter()
            .zip(&texts)
            .map(|((url, p), text)| {
                let pass = match p {
                    None => None,
                    Some(Ok(r)) => Some(Ok(r)),
                    Some(Err(_)) => Some(Err(text.as_str())),
                };
                (url.as_str(), pass)
            })
            .collect();
        let sessions = self.track_sessions(plan, &view);
        if self.resources.is_none() || !current {
            return;
        }
        // A loxilb running without BGP holds nothing a deletion must wait for.
        let removal_view: Vec<Pass<'_>> = passes
            .iter()
            .zip(&view)
            .map(|((_, pass), (url, v))| match pass {
                Some(Err(ClientError::BgpDisabled { .. })) => (*url, None),
                _ => (*url, *v),
            })
            .collect();
        let now = now();
        for (id, m) in &plan.meta {
            if m.deleting {
                let item = plan.desired.removing.get(id).cloned().flatten();
                if m.finalizers.iter().any(|f| f == FINALIZER)
                    && desired::removed_everywhere(item.as_ref(), &removal_view)
                {
                    let rest: Vec<&String> =
                        m.finalizers.iter().filter(|f| *f != FINALIZER).collect();
                    self.patch_meta(id, m, json!(rest)).await;
                    info!(kind = id.0.name(), name = %id.1, "BGP resource removed from loxilb");
                }
                continue;
            }
            if !m.finalizers.iter().any(|f| f == FINALIZER) {
                let mut list = m.finalizers.clone();
                list.push(FINALIZER.to_string());
                self.patch_meta(id, m, json!(list)).await;
            }
            let Some(verdict) = plan.desired.verdicts.get(id) else {
                continue;
            };
            let outcomes = verdict
                .item
                .as_ref()
                .map(|item| desired::outcomes(item, &view))
                .unwrap_or_default();
            let mut status = BgpStatus {
                conditions: desired::conditions(
                    verdict,
                    &outcomes,
                    m.generation,
                    &m.status.conditions,
                    &now,
                ),
                state: None,
                sessions: Vec::new(),
            };
            if id.0 == Kind::Peer
                && let Some(ItemId::Peer(ip)) = verdict.item
            {
                status.sessions = sessions
                    .iter()
                    .filter(|(_, peer, _)| *peer == ip)
                    .map(|(url, _, (state, since))| PeerSession {
                        loxilb: url.clone(),
                        state: state.clone(),
                        since: since.clone(),
                    })
                    .collect();
                let states: Vec<&str> = status.sessions.iter().map(|s| s.state.as_str()).collect();
                status.state = desired::summary(&states);
            }
            if status != m.status {
                self.announce_changes(id, m, &status);
                self.patch_status(id, &status).await;
            }
        }
    }

    /// Warning Events when a condition turns False (a refused spec, a loxilb refusal).
    fn announce_changes(&self, id: &ResourceId, m: &Meta, status: &BgpStatus) {
        for c in &status.conditions {
            let was = m.status.conditions.iter().find(|p| p.type_ == c.type_);
            let changed = was.is_none_or(|p| p.status != c.status || p.message != c.message);
            if c.status == "False" && changed && c.reason != "NotAccepted" {
                self.publish_event(
                    Event {
                        type_: EventType::Warning,
                        reason: c.reason.clone(),
                        note: Some(c.message.clone()),
                        action: "Configure".into(),
                        secondary: None,
                    },
                    m.reference.clone(),
                );
                warn!(kind = id.0.name(), name = %id.1, reason = %c.reason, message = %c.message, "BGP resource not configured");
            }
        }
    }

    /// Session states of the wanted peers on each reached loxilb, with since when; metrics
    /// and the Event or log line of a session leaving ESTABLISHED. Returns (loxilb, peer,
    /// (state, since)).
    fn track_sessions(
        &self,
        plan: &Plan,
        view: &[Pass<'_>],
    ) -> Vec<(String, IpAddr, (String, String))> {
        let now = now();
        let mut out = Vec::new();
        let mut state = self.state();
        let mut shown = BTreeSet::new();
        let addresses = desired::session_addresses(&plan.desired.config, &plan.mesh);
        for &ip in &addresses {
            for (url, listed) in desired::sessions(ip, view) {
                let Some(current) = listed else { continue };
                if state.unreachable.contains(&url) {
                    continue;
                }
                let key = (url.clone(), ip);
                let before = state.sessions.get(&key).cloned();
                let since = match &before {
                    Some((s, since)) if *s == current => since.clone(),
                    _ => now.clone(),
                };
                if let Some((was, _)) = &before
                    && was == ESTABLISHED
                    && current != ESTABLISHED
                {
                    self.session_left(plan, &url, ip, &current);
                }
                state.sessions.insert(key, (current.clone(), since.clone()));
                shown.insert((url.clone(), ip.to_string(), current.clone()));
                out.push((url, ip, (current, since)));
            }
        }
        // A loxilb not reached (down) keeps its sessions in the metric as last seen
        // (`UNKNOWN` once it was seen down: `Bgp::loxilb_down`).
        let unreached: BTreeSet<&str> = view
            .iter()
            .filter(|(url, pass)| pass.is_none() || state.unreachable.contains(*url))
            .map(|(url, _)| *url)
            .collect();
        for ((url, ip), (current, _)) in &state.sessions {
            if unreached.contains(url.as_str()) && addresses.contains(ip) {
                // The metric only: the resources' statuses list the loxilbs reached.
                shown.insert((url.clone(), ip.to_string(), current.clone()));
            }
        }
        // Peers no longer configured start afresh if they come back.
        state.sessions.retain(|(_, ip), _| addresses.contains(ip));
        for (l, p, s) in state.shown.difference(&shown) {
            self.metrics.set_bgp_session(l, p, s, false);
        }
        for (l, p, s) in &shown {
            self.metrics.set_bgp_session(l, p, s, true);
        }
        state.shown = shown;
        out
    }

    fn session_left(&self, plan: &Plan, loxilb: &str, ip: IpAddr, state: &str) {
        self.metrics
            .bgp_session_dropped(loxilb, &ip.to_string(), state);
        let item = ItemId::Peer(ip);
        let owner = plan
            .desired
            .verdicts
            .iter()
            .find(|((kind, _), v)| *kind == Kind::Peer && v.item.as_ref() == Some(&item));
        let message =
            format!("the BGP session of {loxilb} with {ip} left ESTABLISHED: now {state}");
        match owner.and_then(|(id, _)| plan.meta.get(id)) {
            Some(m) => {
                self.publish_event(
                    Event {
                        type_: EventType::Warning,
                        reason: "BGPSessionDown".into(),
                        note: Some(message.clone()),
                        action: "Observe".into(),
                        secondary: None,
                    },
                    m.reference.clone(),
                );
                warn!(peer = %ip, loxilb, state, "{message}");
            }
            None => {
                warn!(peer = %ip, loxilb, state, "{message} (a peer from --bgp-peers, or another loxilb)")
            }
        }
    }

    async fn patch_status(&self, id: &ResourceId, status: &BgpStatus) {
        let Some(r) = &self.resources else { return };
        let body = Patch::Merge(json!({ "status": status }));
        let pp = PatchParams::default();
        let name = id.1.as_str();
        let result = match id.0 {
            Kind::Peer => r.peers.api.patch_status(name, &pp, &body).await.map(drop),
            Kind::DefinedSets => r.sets.api.patch_status(name, &pp, &body).await.map(drop),
            Kind::Definition => r
                .definitions
                .api
                .patch_status(name, &pp, &body)
                .await
                .map(drop),
            Kind::Apply => r.applies.api.patch_status(name, &pp, &body).await.map(drop),
        };
        if let Err(e) = result {
            warn!(kind = id.0.name(), name, error = %e, "could not write a BGP resource's status");
        }
    }

    /// Sets the finalizer list; the resourceVersion makes the write fail (409) rather than
    /// overwrite a list someone changed in between (the next tick decides again).
    async fn patch_meta(&self, id: &ResourceId, m: &Meta, finalizers: serde_json::Value) {
        let Some(r) = &self.resources else { return };
        let body = Patch::Merge(json!({
            "metadata": { "finalizers": finalizers, "resourceVersion": m.resource_version }
        }));
        let pp = PatchParams::default();
        let name = id.1.as_str();
        let result = match id.0 {
            Kind::Peer => r.peers.api.patch(name, &pp, &body).await.map(drop),
            Kind::DefinedSets => r.sets.api.patch(name, &pp, &body).await.map(drop),
            Kind::Definition => r.definitions.api.patch(name, &pp, &body).await.map(drop),
            Kind::Apply => r.applies.api.patch(name, &pp, &body).await.map(drop),
        };
        if let Err(e) = result {
            warn!(kind = id.0.name(), name, error = %e, "could not write a BGP resource's finalizers");
        }
    }
}

/// Reads one kind's store into the snapshot and the metadata map.
fn observe<K, S>(
    store: &Store<K>,
    kind: Kind,
    meta: &mut BTreeMap<ResourceId, Meta>,
    out: &mut Vec<Res<S>>,
    parts: impl Fn(&K) -> (S, Option<BgpStatus>),
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    for obj in store.state() {
        let (spec, status) = parts(&obj);
        let name = obj.name_any();
        let deleting = obj.meta().deletion_timestamp.is_some();
        meta.insert(
            (kind, name.clone()),
            Meta {
                generation: obj.meta().generation,
                resource_version: obj.resource_version(),
                finalizers: obj.finalizers().to_vec(),
                deleting,
                status: status.unwrap_or_default(),
                reference: obj.object_ref(&()),
            },
        );
        out.push(Res {
            name,
            deleting,
            spec,
        });
    }
}
