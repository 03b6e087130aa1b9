//! kube-loxilb's `Egress` resource (`--egress`, docs/egress.md): each source address of an
//! Egress (its `addresses`, and the addresses of the pods its `selector` selects now) becomes
//! a loxilb firewall rule that source-NATs it to the `vip`, on every loxilb.
//!
//! Level-triggered: a pass takes every Egress and the pods from the stores, asks
//! `loxi_domain::egress::decide` for the rules of all of them together (one per source; the
//! older Egress keeps a source two name), and brings every reachable loxilb's SNAT rules of
//! ours to exactly those (`crate::loxilb::snat`: listed, then the difference sent). So a pod
//! that leaves the selector, or an Egress that goes, takes exactly its rules with it, which
//! kube-loxilb (recomputing the pods at delete time) does not. Then [`Egresses::pass`] writes
//! each Egress's status (`programmed` n/m, sources, conflicts, conditions), Warning Events,
//! and the finalizer: an Egress being deleted keeps [`FINALIZER`] until every reachable
//! loxilb let its rules go.
//!
//! A pass runs when an Egress or a pod changes (a short settling delay gathers a burst), at
//! every `--drift-interval` (a rule removed by hand comes back), and for one loxilb after it
//! restarted ([`Egresses::replay`], called by the fleet worker's replay).

pub mod crds;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use loxi_domain::ClusterId;
use loxi_domain::egress::{
    ConditionText, Decision, EgressInput, Outcome, PodSource, decide, pod_addresses,
    snat_preference, status as decide_status,
};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::k8s::conditions::StatusCondition;
use crate::k8s::events::EventRecorder;
use crate::k8s::pod::PodView;
use crate::loxilb::Instance;
use crate::metrics::Metrics;
use crds::{Egress, EgressStatus};

/// Our finalizer on Egresses: removed once no reachable loxilb holds their rules.
pub const FINALIZER: &str = "loxilb.io/egress-cleanup";

/// kube-loxilb's annotation on an Egress naming the Multus networks whose pod addresses are
/// the sources (comma-separated; `name` means the network of the Egress's namespace).
pub const MULTUS_ANNOTATION: &str = "loxilb.io/multus-nets";

/// How long a pass waits after a change for the changes that come with it.
const SETTLE: Duration = Duration::from_millis(200);

/// Where the Egress kind's CRD comes from, for the log line while it is not served.
const CRD_HINT: &str =
    "install the CRD with kubectl apply -f deploy/optional/egress.yaml (Helm: egress.enabled=true)";

/// Where the Egress watch is (as `crate::bgp`): its CRD not served, its first listing under
/// way, or listed. Not served: there is no Egress, and an empty store is the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Listing,
    Listed,
}

/// One loxilb's last pass, by URL: `None` not reached, `Some(Err)` what it refused.
type Passes = BTreeMap<String, Option<Result<(), String>>>;

#[derive(Default)]
struct State {
    passes: Passes,
    /// What a pass reads of each Egress and pod, by kind and key: an event that changes
    /// none of it (a status we wrote, a pod's conditions) starts no pass.
    seen: std::collections::HashMap<(bool, String), String>,
}

/// The Egress subsystem's handle.
pub struct Egresses {
    client: kube::Client,
    store: Store<Egress>,
    pods: Store<PodView>,
    phase: watch::Sender<Phase>,
    pods_listed: watch::Sender<bool>,
    /// Counts the changes of Egresses and pods: a pass follows each.
    changes: watch::Sender<u64>,
    preference: u16,
    recorder: EventRecorder,
    metrics: Metrics,
    state: Mutex<State>,
}

/// A pod as egress keeps it: labels, addresses, Multus' network-status, liveness (the spec,
/// its Node, is not read here).
fn trim_pod(pod: &mut PodView) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| k == crate::k8s::view::NETWORK_STATUS_ANNOTATION);
    }
    pod.spec = Default::default();
    pod.status.pod_ip = None;
}

/// What egress needs of a pod (`loxi_domain::egress::PodSource`).
pub fn pod_source(pod: &PodView) -> PodSource {
    PodSource {
        labels: pod.labels().clone(),
        ips: pod
            .status
            .pod_ips
            .iter()
            .filter_map(|ip| ip.ip.parse().ok())
            .collect(),
        networks: pod
            .annotations()
            .get(crate::k8s::view::NETWORK_STATUS_ANNOTATION)
            .map(|a| crate::k8s::view::multus_networks(a))
            .unwrap_or_default(),
        live: pod.metadata.deletion_timestamp.is_none() && !pod.finished(),
    }
}

fn object_key<K: Resource>(obj: &K) -> String {
    format!(
        "{}/{}",
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// What a pass decides from of an Egress (its status and our finalizer are what a pass
/// writes).
fn egress_inputs(e: &Egress) -> String {
    format!(
        "{:?} {:?} {:?} {:?}",
        e.spec,
        e.meta().deletion_timestamp.is_some(),
        e.annotations().get(MULTUS_ANNOTATION),
        e.meta().creation_timestamp
    )
}

fn now() -> String {
    Timestamp::now().to_string()
}

impl Egresses {
    /// The Egress and Pod watches (to be spawned; the Pods of `namespace` only with
    /// `--namespace`). An Egress CRD not served now is waited for (`crate::k8s::served`).
    pub async fn watch(
        client: &kube::Client,
        namespace: Option<&str>,
        cluster: &ClusterId,
        recorder: EventRecorder,
        metrics: Metrics,
    ) -> (Arc<Egresses>, Vec<BoxFuture<'static, ()>>) {
        let api: Api<Egress> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let pods_api: Api<PodView> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (store, writer) = reflector::store::<Egress>();
        let (pods, pod_writer) = reflector::store::<PodView>();
        let served = crate::k8s::served::probe(&api).await.is_ok();
        let egresses = Arc::new(Egresses {
            client: client.clone(),
            store,
            pods,
            phase: watch::Sender::new(if served {
                Phase::Listing
            } else {
                Phase::Waiting
            }),
            pods_listed: watch::Sender::new(false),
            changes: watch::Sender::new(0),
            preference: snat_preference(cluster),
            recorder,
            metrics,
            state: Mutex::default(),
        });
        let egress_watch = {
            let me = egresses.clone();
            async move {
                if !served {
                    crate::k8s::served::until_served(&api, "Egress", CRD_HINT).await;
                    me.phase.send_replace(Phase::Listing);
                }
                reflector(writer, watcher(api, crate::k8s::trim::list_config()))
                    .modify(crate::k8s::trim::meta)
                    .backoff(crate::k8s::served::backoff())
                    .for_each(|event| {
                        match event {
                            Ok(watcher::Event::InitDone) => {
                                me.phase.send_replace(Phase::Listed);
                                me.changed();
                            }
                            Ok(watcher::Event::Apply(e)) => me.note(true, &e, egress_inputs(&e)),
                            Ok(watcher::Event::Delete(e)) => me.forget(true, &e),
                            Ok(_) => {}
                            Err(e) => warn!(error = %e, "Egress watch error"),
                        }
                        futures::future::ready(())
                    })
                    .await;
            }
        };
        let pod_watch = {
            let me = egresses.clone();
            async move {
                reflector(
                    pod_writer,
                    watcher(pods_api, crate::k8s::trim::list_config()),
                )
                .modify(trim_pod)
                .default_backoff()
                .for_each(|event| {
                    match event {
                        Ok(watcher::Event::InitDone) => {
                            me.pods_listed.send_replace(true);
                            me.changed();
                        }
                        Ok(watcher::Event::Apply(p)) => {
                            me.note(false, &p, format!("{:?}", pod_source(&p)))
                        }
                        Ok(watcher::Event::Delete(p)) => me.forget(false, &p),
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "Pod watch error (egress)"),
                    }
                    futures::future::ready(())
                })
                .await;
            }
        };
        (egresses, vec![Box::pin(egress_watch), Box::pin(pod_watch)])
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// An object arrived: a pass follows when what a pass reads of it changed.
    fn note<K: Resource>(&self, egress: bool, obj: &K, inputs: String) {
        let key = (egress, object_key(obj));
        let changed = self.state().seen.insert(key, inputs.clone()) != Some(inputs);
        if changed {
            self.changed();
        }
    }

    fn forget<K: Resource>(&self, egress: bool, obj: &K) {
        self.state().seen.remove(&(egress, object_key(obj)));
        self.changed();
    }

    /// Runs passes over `instances()` (every loxilb of the fleet now): after each change, and
    /// every `interval`. Writes nothing before `ready` (this replica leads, its stores
    /// synced).
    pub async fn run(
        self: Arc<Self>,
        ready: impl std::future::Future<Output = ()>,
        instances: impl Fn() -> Vec<Arc<Instance>>,
        interval: Duration,
    ) {
        ready.await;
        let (me, instances) = (&self, &instances);
        let pass = move || async move { me.pass(&instances()).await };
        crate::k8s::passes::run_passes(self.changes.subscribe(), SETTLE, interval, pass).await;
    }

    /// The decision over the stores now; `None` while the Egresses or the pods are being
    /// listed (their rules are not known yet: a pass could remove what they hold).
    fn decision(&self) -> Option<(Decision, Vec<Arc<Egress>>)> {
        let phase = *self.phase.borrow();
        if phase == Phase::Listing || (phase == Phase::Listed && !*self.pods_listed.borrow()) {
            return None;
        }
        let egresses = self.store.state();
        let pods = if egresses.is_empty() {
            Vec::new()
        } else {
            self.pods.state()
        };
        let inputs = inputs(
            egresses.iter().map(|e| e.as_ref()),
            pods.iter().map(|p| p.as_ref()),
        );
        Some((decide(&inputs, self.preference), egresses))
    }

    /// One pass: every loxilb of `instances` to the decision (those not answering are left
    /// for their replay), then statuses, Events and finalizers.
    pub async fn pass(&self, instances: &[Arc<Instance>]) {
        let Some((decision, egresses)) = self.decision() else {
            return;
        };
        let passes = futures::future::join_all(
            instances
                .iter()
                .map(|inst| self.program(inst, &decision.rules)),
        )
        .await;
        let passes: Passes = instances
            .iter()
            .map(|i| i.url().to_string())
            .zip(passes)
            .collect();
        self.state().passes = passes.clone();
        self.publish(&decision, &egresses, &passes).await;
    }

    /// After a loxilb restarted: its SNAT rules as decided now (true when it holds them all,
    /// or when Egresses are not known yet: their first pass will program it).
    pub async fn replay(&self, inst: &Instance) -> bool {
        let Some((decision, _)) = self.decision() else {
            return true;
        };
        let result = self.program(inst, &decision.rules).await;
        let ok = matches!(result, Some(Ok(())));
        self.state().passes.insert(inst.url().to_string(), result);
        if ok {
            info!(
                instance = inst.url(),
                rules = decision.rules.len(),
                "egress SNAT rules replayed"
            );
        }
        ok
    }

    async fn program(
        &self,
        inst: &Instance,
        rules: &[loxi_domain::egress::SnatRule],
    ) -> Option<Result<(), String>> {
        if !inst.is_healthy() {
            return None;
        }
        match inst
            .converge_snat(self.preference, rules, &self.metrics)
            .await
        {
            Ok(report) if report.refused.is_empty() => Some(Ok(())),
            Ok(report) => {
                let text: Vec<String> = report
                    .refused
                    .iter()
                    .map(|(source, e)| format!("{source}: {e}"))
                    .collect();
                warn!(instance = inst.url(), refused = %text.join("; "), "egress SNAT rules refused");
                Some(Err(text.join("; ")))
            }
            Err(e) if e.is_transport() => None,
            Err(e) => Some(Err(e.to_string())),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Statuses, Events and finalizers after a pass.
    async fn publish(&self, decision: &Decision, egresses: &[Arc<Egress>], passes: &Passes) {
        let outcomes: Vec<Outcome<'_>> = passes
            .iter()
            .map(|(url, p)| {
                let p = p
                    .as_ref()
                    .map(|r| r.as_ref().map(|_| ()).map_err(String::as_str));
                (url.as_str(), p)
            })
            .collect();
        let refused_somewhere = passes.values().any(|p| matches!(p, Some(Err(_))));
        let mut programmed_count = 0;
        let mut not_programmed: BTreeMap<String, usize> = BTreeMap::new();
        for e in egresses {
            let ns = e.namespace().unwrap_or_default();
            let name = e.name_any();
            let key = format!("{ns}/{name}");
            let has_finalizer = e.finalizers().iter().any(|f| f == FINALIZER);
            if e.meta().deletion_timestamp.is_some() {
                // Every reachable loxilb let its rules go (one down holds nothing after a
                // restart, and is brought to the decision when it answers again).
                if has_finalizer && !refused_somewhere {
                    let rest: Vec<&String> =
                        e.finalizers().iter().filter(|f| *f != FINALIZER).collect();
                    self.patch_finalizers(e, json!(rest)).await;
                    info!(egress = %key, "Egress removed from loxilb");
                }
                continue;
            }
            if !has_finalizer {
                let mut list = e.finalizers().to_vec();
                list.push(FINALIZER.to_string());
                self.patch_finalizers(e, json!(list)).await;
            }
            let Some(verdict) = decision.verdicts.get(&key) else {
                continue;
            };
            let (programmed, conditions) = decide_status(verdict, &outcomes);
            match conditions.iter().find(|c| c.0 == "Programmed") {
                Some((_, "True", _, _)) => programmed_count += 1,
                Some((_, _, reason, _)) => {
                    *not_programmed.entry((*reason).into()).or_default() += 1
                }
                None => {}
            }
            let previous = e.status.clone().unwrap_or_default();
            let mut conditions: Vec<StatusCondition> =
                conditions.into_iter().map(condition).collect();
            crate::k8s::conditions::stamp_all(
                &mut conditions,
                &previous.conditions,
                e.meta().generation,
                &now(),
            );
            let status = EgressStatus {
                conditions,
                programmed,
                sources: verdict
                    .rules
                    .as_ref()
                    .map(|r| r.iter().map(|r| r.source.to_string()).collect())
                    .unwrap_or_default(),
                conflicts: verdict
                    .conflicts
                    .iter()
                    .map(|(source, owner)| format!("{source} (held by {owner})"))
                    .collect(),
            };
            if status != previous {
                self.announce(e, &previous, &status);
                let body = Patch::Merge(json!({ "status": status }));
                let api: Api<Egress> = Api::namespaced(self.client.clone(), &ns);
                if let Err(err) = api
                    .patch_status(&name, &PatchParams::default(), &body)
                    .await
                {
                    warn!(egress = %key, error = %err, "could not write an Egress's status");
                }
            }
        }
        self.metrics.set_egresses(programmed_count, &not_programmed);
    }

    /// Warning Events when a condition turns False or its message changes while False.
    fn announce(&self, e: &Egress, previous: &EgressStatus, status: &EgressStatus) {
        for c in &status.conditions {
            let was = previous.conditions.iter().find(|p| p.type_ == c.type_);
            let changed = was.is_none_or(|p| p.status != c.status || p.message != c.message);
            if c.status == "False" && changed && c.reason != "NotAccepted" {
                let reference: ObjectReference = e.object_ref(&());
                self.recorder.publish(
                    Event {
                        type_: EventType::Warning,
                        reason: c.reason.clone(),
                        note: Some(c.message.clone()),
                        action: "Configure".into(),
                        secondary: None,
                    },
                    reference,
                );
                warn!(egress = %e.name_any(), reason = %c.reason, message = %c.message, "Egress not programmed");
            }
        }
    }

    /// Sets the finalizer list; the resourceVersion makes the write fail (409) rather than
    /// overwrite a list someone changed in between (the next pass decides again).
    async fn patch_finalizers(&self, e: &Egress, finalizers: serde_json::Value) {
        let ns = e.namespace().unwrap_or_default();
        let api: Api<Egress> = Api::namespaced(self.client.clone(), &ns);
        let body = Patch::Merge(json!({
            "metadata": { "finalizers": finalizers, "resourceVersion": e.resource_version() }
        }));
        if let Err(err) = api
            .patch(&e.name_any(), &PatchParams::default(), &body)
            .await
        {
            warn!(egress = %e.name_any(), error = %err, "could not write an Egress's finalizers");
        }
    }
}

/// What `loxi_domain::egress::decide` reads of `egresses`, with the addresses of the pods
/// (of any namespace: each Egress looks at its own) each selects now. The audit reads the
/// same (`crate::audit`).
pub fn inputs<'a>(
    egresses: impl Iterator<Item = &'a Egress>,
    pods: impl Iterator<Item = &'a PodView>,
) -> Vec<EgressInput> {
    let mut pods_by_ns: BTreeMap<String, Vec<PodSource>> = BTreeMap::new();
    for pod in pods {
        pods_by_ns
            .entry(pod.namespace().unwrap_or_default())
            .or_default()
            .push(pod_source(pod));
    }
    egresses
        .map(|e| {
            let ns = e.namespace().unwrap_or_default();
            let nets: Vec<String> = e
                .annotations()
                .get(MULTUS_ANNOTATION)
                .map(|v| {
                    v.split(',')
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .collect()
                })
                .unwrap_or_default();
            let pods = pods_by_ns.get(&ns).map(Vec::as_slice).unwrap_or_default();
            EgressInput {
                key: format!("{ns}/{}", e.name_any()),
                created: e
                    .meta()
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                spec: e.spec.to_domain(),
                pod_addresses: pod_addresses(&ns, &e.spec.selector, &nets, pods),
                deleting: e.meta().deletion_timestamp.is_some(),
            }
        })
        .collect()
}

/// The fleet worker's replay followed by the Egresses' (`crate::fleet::workers::Replay`):
/// complete when both are.
pub fn with_replay(
    egresses: Arc<Egresses>,
    rules: crate::fleet::workers::Replay,
) -> crate::fleet::workers::Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let egresses = egresses.clone();
        let rules = rules.clone();
        Box::pin(async move {
            let complete = rules(inst.clone()).await;
            let snat = egresses.replay(&inst).await;
            complete && snat
        })
    })
}

fn condition((type_, status, reason, message): ConditionText) -> StatusCondition {
    StatusCondition::new(type_, status, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::pod::{PodAddress, PodViewSpec, PodViewStatus};
    use kube::api::ObjectMeta;
    use std::net::IpAddr;

    #[test]
    fn a_pod_is_read_and_trimmed_to_what_egress_needs() {
        let mut pod = PodView {
            metadata: ObjectMeta {
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                annotations: Some(BTreeMap::from([
                    ("big".into(), "x".repeat(100)),
                    (
                        crate::k8s::view::NETWORK_STATUS_ANNOTATION.into(),
                        r#"[{"name":"ns/m1","ips":["192.168.1.5"]}]"#.into(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            spec: PodViewSpec {
                node_name: Some("n1".into()),
            },
            status: PodViewStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.244.0.7".into()),
                pod_ips: vec![PodAddress {
                    ip: "10.244.0.7".into(),
                }],
            },
        };
        trim_pod(&mut pod);
        assert_eq!(pod.spec, PodViewSpec::default());
        assert_eq!(pod.annotations().len(), 1);
        assert!(pod.status.pod_ip.is_none());
        let s = pod_source(&pod);
        assert!(s.live);
        assert_eq!(s.ips, vec!["10.244.0.7".parse::<IpAddr>().unwrap()]);
        assert_eq!(s.networks["ns/m1"].len(), 1);
        pod.status.phase = Some("Succeeded".into());
        assert!(
            !pod_source(&pod).live,
            "a finished pod's address is not its own"
        );
    }
}
