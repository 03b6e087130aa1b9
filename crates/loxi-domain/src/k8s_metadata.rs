//! kube-loxilb's `--enableK8sMetadata`: what loxilb is told about the cluster through
//! `POST /config/k8smeta` (not in loxilb's published spec: docs/loxilb-api.md#kubernetes-metadata),
//! and what to send to one loxilb given what it was sent before.
//!
//! The body is kube-loxilb's model: lists of Services (of this controller), the pods those
//! Services select, and the Nodes. kube-loxilb posts all of it to every loxilb every 60 s;
//! here each loxilb gets the full set once (when it is new to us or restarted) and after
//! that only the objects that changed. The model has no way to say "this object is gone",
//! so a removal sends the full set again (what kube-loxilb sends every minute).
//!
//! Better than kube-loxilb where it slips: a Service without a selector selects no pod (its
//! empty selector selected every pod of the cluster), a selector selects only pods of the
//! Service's namespace, a Service without an address yet is sent with an empty
//! `externalIP` (kube-loxilb indexed the first ingress entry unchecked), and a Node's
//! `status` is its `Ready` condition (kube-loxilb took the last condition listed, whatever
//! its type).

use std::collections::BTreeMap;

use serde::Serialize;

/// A pod as loxilb is told about it (`PodMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodMeta {
    pub name: String,
    pub namespace: String,
    pub ip: String,
    #[serde(rename = "nodeName")]
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
}

/// One port of a Service (`ServicePort`); a named target port is sent as 0, as kube-loxilb
/// does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePortMeta {
    pub port: i32,
    pub protocol: String,
    #[serde(rename = "nodePort")]
    pub node_port: i32,
    #[serde(rename = "targetPort")]
    pub target_port: i32,
}

/// A Service as loxilb is told about it (`ServiceMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceMeta {
    pub name: String,
    pub namespace: String,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: String,
    /// The first ingress entry's hostname, else its IP (kube-loxilb's choice); empty while
    /// the Service has no address.
    #[serde(rename = "externalIP")]
    pub external_ip: String,
    pub ports: Vec<ServicePortMeta>,
}

/// A Node as loxilb is told about it (`NodeMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeMeta {
    pub name: String,
    #[serde(rename = "internalIP")]
    pub internal_ip: String,
    pub labels: BTreeMap<String, String>,
    /// The `Ready` condition's status: `True`, `False` or `Unknown`.
    pub status: String,
}

/// A Service with the label selector its pods are chosen by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSource {
    pub meta: ServiceMeta,
    pub selector: BTreeMap<String, String>,
}

/// One object of a snapshot, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Pod(PodMeta),
    Service(ServiceMeta),
    Node(NodeMeta),
}

/// An object's identity in a snapshot: its kind, then `namespace/name` (`name` for Nodes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ItemKey {
    Pod(String),
    Service(String),
    Node(String),
}

/// Everything loxilb should know now, by identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub BTreeMap<ItemKey, Item>);

/// The body of `POST /config/k8smeta` (`K8sMetaModel`). Lists are never `null`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Message {
    pub pods: Vec<PodMeta>,
    pub services: Vec<ServiceMeta>,
    pub nodes: Vec<NodeMeta>,
}

impl Message {
    /// How many objects it carries.
    pub fn len(&self) -> usize {
        self.pods.len() + self.services.len() + self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn push(&mut self, item: &Item) {
        match item {
            Item::Pod(p) => self.pods.push(p.clone()),
            Item::Service(s) => self.services.push(s.clone()),
            Item::Node(n) => self.nodes.push(n.clone()),
        }
    }
}

/// What to send to one loxilb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// It holds what we would send.
    Nothing,
    /// Only the objects that are new or changed since the last send.
    Changes(Message),
    /// Everything: a loxilb we never sent to (new, or restarted), or an object went away.
    Full(Message),
}

/// Whether a pod with `labels` is one of a Service's pods: every pair of a non-empty
/// `selector` present (a selector-less Service has no pods of its own).
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The snapshot of `services`, the pods of their namespaces they select (each pod once,
/// however many Services select it), and `nodes`.
pub fn snapshot(services: &[ServiceSource], pods: &[PodMeta], nodes: &[NodeMeta]) -> Snapshot {
    let mut items = BTreeMap::new();
    for s in services {
        let key = format!("{}/{}", s.meta.namespace, s.meta.name);
        items.insert(ItemKey::Service(key), Item::Service(s.meta.clone()));
    }
    for p in pods {
        let selected = services
            .iter()
            .any(|s| s.meta.namespace == p.namespace && selects(&s.selector, &p.labels));
        if selected {
            let key = format!("{}/{}", p.namespace, p.name);
            items.insert(ItemKey::Pod(key), Item::Pod(p.clone()));
        }
    }
    for n in nodes {
        items.insert(ItemKey::Node(n.name.clone()), Item::Node(n.clone()));
    }
    Snapshot(items)
}

/// What a loxilb that was sent `sent` (`None`: nothing yet, or it restarted since) needs to
/// hold `now`.
pub fn next(sent: Option<&Snapshot>, now: &Snapshot) -> Send {
    let full = || {
        let mut m = Message::default();
        now.0.values().for_each(|i| m.push(i));
        Send::Full(m)
    };
    let Some(sent) = sent else {
        return full();
    };
    if sent.0.keys().any(|k| !now.0.contains_key(k)) {
        return full();
    }
    let mut changes = Message::default();
    for (key, item) in &now.0 {
        if sent.0.get(key) != Some(item) {
            changes.push(item);
        }
    }
    if changes.is_empty() {
        Send::Nothing
    } else {
        Send::Changes(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(ns: &str, name: &str, ip: &str, app: &str) -> PodMeta {
        PodMeta {
            name: name.into(),
            namespace: ns.into(),
            ip: ip.into(),
            node_name: "n1".into(),
            labels: labels(&[("app", app)]),
        }
    }

    fn service(ns: &str, name: &str, app: Option<&str>) -> ServiceSource {
        ServiceSource {
            meta: ServiceMeta {
                name: name.into(),
                namespace: ns.into(),
                cluster_ip: "10.96.0.10".into(),
                external_ip: "192.0.2.1".into(),
                ports: vec![ServicePortMeta {
                    port: 80,
                    protocol: "TCP".into(),
                    node_port: 30080,
                    target_port: 8080,
                }],
            },
            selector: app.map(|a| labels(&[("app", a)])).unwrap_or_default(),
        }
    }

    fn node(name: &str, status: &str) -> NodeMeta {
        NodeMeta {
            name: name.into(),
            internal_ip: "10.0.0.1".into(),
            labels: BTreeMap::new(),
            status: status.into(),
        }
    }

    #[test]
    fn only_the_pods_our_services_select_in_their_namespace() {
        let snap = snapshot(
            &[service("a", "web", Some("web")), service("a", "bare", None)],
            &[
                pod("a", "web-1", "10.244.0.1", "web"),
                pod("b", "web-2", "10.244.0.2", "web"),
                pod("a", "db-1", "10.244.0.3", "db"),
            ],
            &[node("n1", "True")],
        );
        let keys: Vec<&ItemKey> = snap.0.keys().collect();
        assert_eq!(
            keys,
            vec![
                &ItemKey::Pod("a/web-1".into()),
                &ItemKey::Service("a/bare".into()),
                &ItemKey::Service("a/web".into()),
                &ItemKey::Node("n1".into()),
            ]
        );
    }

    #[test]
    fn a_new_loxilb_gets_everything_then_only_what_changed() {
        let services = [service("a", "web", Some("web"))];
        let mut pods = vec![
            pod("a", "web-1", "10.244.0.1", "web"),
            pod("a", "web-2", "10.244.0.2", "web"),
        ];
        let nodes = [node("n1", "True")];
        let first = snapshot(&services, &pods, &nodes);
        let Send::Full(m) = next(None, &first) else {
            panic!("a loxilb never sent to gets the full set");
        };
        assert_eq!((m.pods.len(), m.services.len(), m.nodes.len()), (2, 1, 1));
        assert_eq!(next(Some(&first), &first), Send::Nothing);

        pods[1].ip = "10.244.0.9".into();
        let second = snapshot(&services, &pods, &nodes);
        assert_eq!(
            next(Some(&first), &second),
            Send::Changes(Message {
                pods: vec![pods[1].clone()],
                ..Message::default()
            })
        );
        // A Node's readiness is a change of that Node only.
        let third = snapshot(&services, &pods, &[node("n1", "False")]);
        let Send::Changes(m) = next(Some(&second), &third) else {
            panic!("a Node change is a change");
        };
        assert_eq!((m.pods.len(), m.services.len(), m.nodes.len()), (0, 0, 1));
    }

    #[test]
    fn a_removal_sends_the_full_set() {
        let services = [service("a", "web", Some("web"))];
        let pods = [
            pod("a", "web-1", "10.244.0.1", "web"),
            pod("a", "web-2", "10.244.0.2", "web"),
        ];
        let before = snapshot(&services, &pods, &[]);
        let after = snapshot(&services, &pods[..1], &[]);
        let Send::Full(m) = next(Some(&before), &after) else {
            panic!("a removal cannot be said with changes");
        };
        assert_eq!(m.pods, vec![pods[0].clone()]);
        assert_eq!(m.services.len(), 1);
    }

    #[test]
    fn the_body_has_kube_loxilbs_field_names_and_never_null_lists() {
        let snap = snapshot(
            &[service("a", "web", Some("web"))],
            &[pod("a", "web-1", "10.244.0.1", "web")],
            &[node("n1", "True")],
        );
        let Send::Full(m) = next(None, &snap) else {
            panic!()
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["pods"][0]["nodeName"], "n1");
        assert_eq!(v["services"][0]["clusterIP"], "10.96.0.10");
        assert_eq!(v["services"][0]["externalIP"], "192.0.2.1");
        assert_eq!(v["services"][0]["ports"][0]["nodePort"], 30080);
        assert_eq!(v["services"][0]["ports"][0]["targetPort"], 8080);
        assert_eq!(v["nodes"][0]["internalIP"], "10.0.0.1");
        assert_eq!(v["nodes"][0]["status"], "True");
        let empty = serde_json::to_value(Message::default()).unwrap();
        assert_eq!(
            empty,
            serde_json::json!({"pods": [], "services": [], "nodes": []})
        );
    }
}
