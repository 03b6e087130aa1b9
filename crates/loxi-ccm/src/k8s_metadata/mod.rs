//! kube-loxilb's `--enableK8sMetadata`: every loxilb is told about this controller's
//! Services, the pods they select and the Nodes with `POST /config/k8smeta`
//! (docs/configuration.md#kubernetes-metadata; the call is not in loxilb's published API,
//! docs/loxilb-api.md#kubernetes-metadata).
//!
//! Off, nothing of this runs: no Pod watch, no pass, no call (the runtime does not build the
//! handle). On, the Services and Nodes come from the stores the controller keeps anyway, and
//! the pods from one Pod watch trimmed to what is sent. What to send each loxilb is
//! `loxi_domain::k8s_metadata::next`: the full set to a loxilb we never sent to, then only
//! the objects that changed. A pass runs shortly after a pod changes (a settling delay
//! gathers a burst into one call) and every [`CHECK`] for Services and Nodes; a loxilb
//! whose worker replays it after a restart ([`with_replay`]) is sent the full set again at
//! the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use loxi_domain::k8s_metadata::{
    NodeMeta, PodMeta, Send, ServiceMeta, ServicePortMeta, ServiceSource, Snapshot, next, snapshot,
};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::k8s::pod::PodView;
use crate::k8s::view::Selection;
use crate::loxilb::Instance;
use crate::metrics::Metrics;

/// How long a pass waits after a pod change for the changes that come with it.
const SETTLE: Duration = Duration::from_secs(1);

/// How often the Services and Nodes (whose stores belong to the Service reconcile) are
/// compared with what each loxilb was sent.
pub const CHECK: Duration = Duration::from_secs(5);

/// What each loxilb was sent, by URL: the snapshot it holds, and a count of the times it was
/// forgotten (a restart), so that a send under way when it restarted is not recorded.
#[derive(Default)]
struct Sent(BTreeMap<String, (u64, Option<Arc<Snapshot>>)>);

/// The metadata sender's handle.
pub struct K8sMetadata {
    services: Store<Service>,
    nodes: Store<Node>,
    pods: Store<PodView>,
    pods_listed: watch::Sender<bool>,
    /// Counts pod changes (and restarts): a pass follows each.
    changes: watch::Sender<u64>,
    selection: Selection,
    metrics: Metrics,
    sent: Mutex<Sent>,
}

/// A pod as kept here: what is sent of it and nothing else.
fn trim_pod(pod: &mut PodView) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.annotations = None;
    pod.status.phase = None;
    pod.status.pod_ips = Vec::new();
}

/// What loxilb is told about a pod.
pub fn pod_meta(pod: &PodView) -> PodMeta {
    PodMeta {
        name: pod.name_any(),
        namespace: pod.namespace().unwrap_or_default(),
        ip: pod.status.pod_ip.clone().unwrap_or_default(),
        node_name: pod.spec.node_name.clone().unwrap_or_default(),
        labels: pod.labels().clone(),
    }
}

/// What loxilb is told about a Service, with its selector.
pub fn service_source(svc: &Service) -> ServiceSource {
    let spec = svc.spec.clone().unwrap_or_default();
    let first = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .and_then(|i| i.first());
    let external_ip = first
        .and_then(|i| {
            i.hostname
                .clone()
                .filter(|h| !h.is_empty())
                .or(i.ip.clone())
        })
        .unwrap_or_default();
    ServiceSource {
        meta: ServiceMeta {
            name: svc.name_any(),
            namespace: svc.namespace().unwrap_or_default(),
            cluster_ip: spec.cluster_ip.unwrap_or_default(),
            external_ip,
            ports: spec
                .ports
                .unwrap_or_default()
                .into_iter()
                .map(|p| ServicePortMeta {
                    port: p.port,
                    protocol: p.protocol.unwrap_or_else(|| "TCP".into()),
                    node_port: p.node_port.unwrap_or_default(),
                    target_port: match p.target_port {
                        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                            n
                        }
                        _ => 0,
                    },
                })
                .collect(),
        },
        selector: spec.selector.unwrap_or_default(),
    }
}

/// What loxilb is told about a Node: its first InternalIP (else its first address) and its
/// `Ready` condition's status (`Unknown` without one).
pub fn node_meta(node: &Node) -> NodeMeta {
    let status = node.status.as_ref();
    let addresses = status
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let internal_ip = addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .or(addresses.first())
        .map(|a| a.address.clone())
        .unwrap_or_default();
    let ready = status
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or_else(|| "Unknown".to_string(), |c| c.status.clone());
    NodeMeta {
        name: node.name_any(),
        internal_ip,
        labels: node.labels().clone(),
        status: ready,
    }
}

impl K8sMetadata {
    /// The handle and its Pod watch (to be spawned; the pods of `namespace` only with
    /// `--namespace`). `services` and `nodes` are the controller's stores.
    pub fn watch(
        client: &kube::Client,
        namespace: Option<&str>,
        services: Store<Service>,
        nodes: Store<Node>,
        selection: Selection,
        metrics: Metrics,
    ) -> (Arc<K8sMetadata>, BoxFuture<'static, ()>) {
        let pods_api: Api<PodView> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let (pods, writer) = reflector::store::<PodView>();
        let me = Arc::new(K8sMetadata {
            services,
            nodes,
            pods,
            pods_listed: watch::Sender::new(false),
            changes: watch::Sender::new(0),
            selection,
            metrics,
            sent: Mutex::default(),
        });
        let pod_watch = {
            let me = me.clone();
            async move {
                reflector(writer, watcher(pods_api, crate::k8s::trim::list_config()))
                    .modify(trim_pod)
                    .default_backoff()
                    .for_each(|event| {
                        match event {
                            Ok(watcher::Event::InitDone) => {
                                me.pods_listed.send_replace(true);
                                me.changed();
                            }
                            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                                me.changed();
                            }
                            Ok(_) => {}
                            Err(e) => warn!(error = %e, "Pod watch error (k8s metadata)"),
                        }
                        futures::future::ready(())
                    })
                    .await;
            }
        };
        (me, Box::pin(pod_watch))
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, Sent> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs passes over `instances()` (every loxilb of the fleet now) after each pod change
    /// and every [`CHECK`]. Sends nothing before `ready` (this replica leads, its stores
    /// synced).
    pub async fn run(
        self: Arc<Self>,
        ready: impl std::future::Future<Output = ()>,
        instances: impl Fn() -> Vec<Arc<Instance>>,
    ) {
        ready.await;
        let (me, instances) = (&self, &instances);
        let pass = move || async move { me.pass(&instances()).await };
        crate::k8s::passes::run_passes(self.changes.subscribe(), SETTLE, CHECK, pass).await;
    }

    /// What every loxilb should know now; `None` while the pods are being listed (a pass
    /// then would tell loxilb of Services without their pods).
    fn snapshot(&self) -> Option<Snapshot> {
        if !*self.pods_listed.borrow() {
            return None;
        }
        let services: Vec<ServiceSource> = self
            .services
            .state()
            .iter()
            .filter(|s| self.selection.serves(s) && s.metadata.deletion_timestamp.is_none())
            .map(|s| service_source(s))
            .collect();
        let namespaces: BTreeSet<&str> = services
            .iter()
            .filter(|s| !s.selector.is_empty())
            .map(|s| s.meta.namespace.as_str())
            .collect();
        let pods: Vec<PodMeta> = self
            .pods
            .state()
            .iter()
            .filter(|p| {
                p.namespace()
                    .is_some_and(|ns| namespaces.contains(ns.as_str()))
            })
            .map(|p| pod_meta(p))
            .collect();
        let nodes: Vec<NodeMeta> = self.nodes.state().iter().map(|n| node_meta(n)).collect();
        Some(snapshot(&services, &pods, &nodes))
    }

    /// One pass: each reachable loxilb of `instances` is sent what it lacks of the snapshot
    /// (one that fails is sent the same again at the next pass).
    pub async fn pass(&self, instances: &[Arc<Instance>]) {
        let Some(now) = self.snapshot() else {
            return;
        };
        let now = Arc::new(now);
        let urls: BTreeSet<&str> = instances.iter().map(|i| i.url()).collect();
        self.sent().0.retain(|url, _| urls.contains(url.as_str()));
        futures::future::join_all(
            instances
                .iter()
                .filter(|i| i.is_healthy())
                .map(|i| self.send(i, &now)),
        )
        .await;
    }

    async fn send(&self, inst: &Instance, now: &Arc<Snapshot>) {
        let (epoch, held) = self.sent().0.get(inst.url()).cloned().unwrap_or_default();
        let (body, kind) = match next(held.as_deref(), now) {
            Send::Nothing => return,
            Send::Changes(m) => (m, "changes"),
            Send::Full(m) => (m, "full"),
        };
        match inst.send_k8s_metadata(&body, &self.metrics).await {
            Ok(()) => {
                debug!(
                    instance = inst.url(),
                    body = kind,
                    objects = body.len(),
                    "Kubernetes metadata sent"
                );
                self.metrics.k8s_metadata_sent(inst.url(), kind, body.len());
                let mut sent = self.sent();
                let entry = sent.0.entry(inst.url().to_string()).or_default();
                // Forgotten meanwhile (it restarted): the full set goes at the next pass.
                if entry.0 == epoch {
                    entry.1 = Some(now.clone());
                }
            }
            Err(e) => {
                warn!(instance = inst.url(), error = %e, "Kubernetes metadata not sent; trying again at the next pass");
            }
        }
    }

    /// `url` restarted: it holds nothing we sent, and gets the full set at the next pass,
    /// which starts now.
    pub fn forget(&self, url: &str) {
        {
            let mut sent = self.sent();
            let entry = sent.0.entry(url.to_string()).or_default();
            entry.0 = entry.0.wrapping_add(1);
            entry.1 = None;
        }
        self.changed();
    }
}

/// The fleet worker's replay (after a loxilb restarted, or joined) followed by forgetting
/// what that loxilb was sent (`crate::fleet::workers::Replay`); the metadata never holds the
/// replay up.
pub fn with_replay(
    metadata: Arc<K8sMetadata>,
    rules: crate::fleet::workers::Replay,
) -> crate::fleet::workers::Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let metadata = metadata.clone();
        let rules = rules.clone();
        Box::pin(async move {
            metadata.forget(inst.url());
            rules(inst).await
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, NodeAddress, NodeCondition, NodeStatus,
        ServicePort, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use kube::api::ObjectMeta;

    use crate::k8s::pod::{PodAddress, PodViewSpec, PodViewStatus};

    #[test]
    fn a_pod_is_trimmed_to_what_is_sent() {
        let mut pod = PodView {
            metadata: ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("a".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                annotations: Some(BTreeMap::from([("big".into(), "x".repeat(100))])),
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
        let before = pod_meta(&pod);
        trim_pod(&mut pod);
        assert!(pod.metadata.annotations.is_none());
        assert!(pod.status.pod_ips.is_empty());
        assert_eq!(pod_meta(&pod), before);
        assert_eq!(before.ip, "10.244.0.7");
        assert_eq!(before.node_name, "n1");
    }

    #[test]
    fn services_and_nodes_read_safely() {
        let mut svc = Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("a".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("10.96.0.10".into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    target_port: Some(IntOrString::String("http".into())),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        };
        let s = service_source(&svc);
        assert_eq!(s.meta.external_ip, "", "no address yet: empty, no panic");
        assert_eq!(s.meta.ports[0].target_port, 0, "a named target port is 0");
        assert_eq!(s.meta.ports[0].protocol, "TCP");
        svc.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("192.0.2.1".into()),
                    ..LoadBalancerIngress::default()
                }]),
            }),
            ..ServiceStatus::default()
        });
        assert_eq!(service_source(&svc).meta.external_ip, "192.0.2.1");

        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let m = node_meta(&node);
        assert_eq!((m.internal_ip.as_str(), m.status.as_str()), ("", "Unknown"));
        node.status = Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "Hostname".into(),
                    address: "n1".into(),
                },
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.0.0.1".into(),
                },
            ]),
            conditions: Some(vec![
                NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..NodeCondition::default()
                },
                NodeCondition {
                    type_: "MemoryPressure".into(),
                    status: "False".into(),
                    ..NodeCondition::default()
                },
            ]),
            ..NodeStatus::default()
        });
        let m = node_meta(&node);
        assert_eq!(
            (m.internal_ip.as_str(), m.status.as_str()),
            ("10.0.0.1", "True")
        );
    }
}
