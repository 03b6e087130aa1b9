//! The cloud node controller against a real kube-apiserver: Nodes are created by the tests
//! (no kubelet) with the uninitialized taint and the kubelet's provided-node-ip annotation,
//! and `node_init::run` runs in-process with an inventory file or ConfigMap.
//!
//! One control plane per test binary; tests run one at a time since Nodes are cluster-scoped
//! and each test runs its own controller over all of them. Node names start with "ni-".

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, NodeAddress, NodeSpec, Taint};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use loxi_ccm::node_init::{
    self, ANN_PROVIDED_NODE_IP, ConfigMapRef, LABEL_INSTANCE_TYPE, LABEL_REGION, LABEL_ZONE,
    NodeInitArgs, TAINT_SHUTDOWN, TAINT_UNINITIALIZED,
};
use serde_json::json;
use tokio::sync::{MutexGuard, oneshot};

const WAIT: Duration = Duration::from_secs(30);
/// Namespace of the inventory ConfigMaps.
const NS: &str = "ni-inventory";

/// [`common::wait_for`] for `WAIT`.
async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    common::wait_for(what, WAIT, check).await
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: value.map(str::to_string),
        effect: effect.into(),
        ..Taint::default()
    }
}

fn uninitialized() -> Taint {
    taint(TAINT_UNINITIALIZED, Some("true"), "NoSchedule")
}

fn taints(n: &Node) -> Vec<Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn has_taint(n: &Node, key: &str) -> bool {
    taints(n).iter().any(|t| t.key == key)
}

fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn provider_id(n: &Node) -> Option<&str> {
    n.spec.as_ref()?.provider_id.as_deref()
}

fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|NodeAddress { type_, address }| (type_.clone(), address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// Initialized = the uninitialized taint is gone (the controller writes it last).
fn initialized(n: &Node) -> bool {
    !has_taint(n, TAINT_UNINITIALIZED)
}

fn inventory_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("loxi-ccm-ni-{name}-{}.yaml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// One test's world: the serial lock, a client, the in-process controller, the Nodes made.
struct World {
    _serial: MutexGuard<'static, ()>,
    client: kube::Client,
    nodes: Api<Node>,
    made: Vec<String>,
    configmaps: Vec<String>,
    controller: Option<(
        oneshot::Sender<()>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    )>,
}

impl World {
    async fn start(args: NodeInitArgs) -> World {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let serial = common::serial().await;
        let client = common::control_plane().admin_client().await.unwrap();
        let nodes: Api<Node> = Api::all(client.clone());
        // A test that panicked leaves its Nodes behind: start from none of ours.
        for n in nodes.list(&ListParams::default()).await.unwrap() {
            let name = n.metadata.name.unwrap_or_default();
            if name.starts_with("ni-") {
                let _ = nodes.delete(&name, &DeleteParams::default()).await;
            }
        }
        let _ = Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(NS.into()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await;
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(node_init::run(client.clone(), args, async {
            let _ = rx.await;
        }));
        World {
            _serial: serial,
            client,
            nodes,
            made: Vec::new(),
            configmaps: Vec::new(),
            controller: Some((tx, handle)),
        }
    }

    /// Creates a Node as a kubelet with `--cloud-provider=external --node-ip=<ip>` would.
    async fn add_node(&mut self, name: &str, ip: &str, taints: Vec<Taint>) -> Node {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(BTreeMap::from([(
                    ANN_PROVIDED_NODE_IP.to_string(),
                    ip.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: None,
        };
        let created = self
            .nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        self.made.push(name.into());
        created
    }

    async fn node(&self, name: &str) -> Node {
        self.nodes.get(name).await.unwrap()
    }

    async fn wait_node(&self, what: &str, name: &str, pred: impl Fn(&Node) -> bool) -> Node {
        wait_for(&format!("{name}: {what}"), || async {
            let n = self.node(name).await;
            pred(&n).then_some(n)
        })
        .await
    }

    /// Reasons of the Events about a Node (cluster-scoped objects' Events go to `default`).
    async fn event_reasons(&self, name: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
            .collect()
    }

    /// The Events about a Node with this reason.
    async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    async fn wait_event(&self, name: &str, type_: &str, reason: &str) {
        wait_for(&format!("a {type_} Event {reason} on {name}"), || async {
            self.event_reasons(name)
                .await
                .contains(&(type_.to_string(), reason.to_string()))
                .then_some(())
        })
        .await
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn put_configmap(&mut self, name: &str, inventory: &str) {
        let cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": name, "namespace": NS },
            "data": { "inventory.yaml": inventory },
        });
        self.configmaps()
            .patch(
                name,
                &PatchParams::apply("ni-test").force(),
                &Patch::Apply(cm),
            )
            .await
            .unwrap();
        if !self.configmaps.iter().any(|c| c == name) {
            self.configmaps.push(name.into());
        }
    }

    async fn finish(mut self) {
        if let Some((tx, handle)) = self.controller.take() {
            let _ = tx.send(());
            let stopped = tokio::time::timeout(Duration::from_secs(10), handle)
                .await
                .expect("controller stops on shutdown")
                .expect("controller task");
            stopped.expect("controller returns Ok");
        }
        for name in &self.made {
            let _ = self.nodes.delete(name, &DeleteParams::default()).await;
        }
        for name in &self.configmaps {
            let _ = self
                .configmaps()
                .delete(name, &DeleteParams::default())
                .await;
        }
    }
}

fn configmap_args(name: &str, require_inventory: bool) -> NodeInitArgs {
    NodeInitArgs {
        inventory_configmap: Some(ConfigMapRef {
            namespace: NS.into(),
            name: name.into(),
        }),
        require_inventory,
        ..NodeInitArgs::default()
    }
}

#[tokio::test]
async fn initializes_nodes_from_an_inventory_file() {
    let path = inventory_file(
        "file",
        r#"
nodes:
  - match: { name: "ni-file-rack1-*" }
    zone: rack1
    region: dc-east
    instanceType: r640
  - match: { cidr: "10.0.2.0/24" }
    zone: rack2
    region: dc-east
"#,
    );
    let mut w = World::start(NodeInitArgs {
        inventory_file: Some(path.clone()),
        ..NodeInitArgs::default()
    })
    .await;

    // Created first so the controller has seen it by the time the others are done. It would
    // match the CIDR entry, but is not waiting for initialization.
    let plain = w.add_node("ni-file-plain", "10.0.2.8", vec![]).await;
    let dedicated = taint("example.com/dedicated", Some("infra"), "NoSchedule");
    let by_name = w
        .add_node(
            "ni-file-rack1-a",
            "10.0.1.5",
            vec![dedicated.clone(), uninitialized()],
        )
        .await;
    w.add_node("ni-file-b", "10.0.2.7", vec![uninitialized()])
        .await;
    w.add_node(
        "ni-file-stranger",
        "10.0.9.5,fd00::5",
        vec![uninitialized()],
    )
    .await;

    let n = w
        .wait_node("initialized", "ni-file-rack1-a", initialized)
        .await;
    assert_eq!(provider_id(&n), Some("loxilb://ni-file-rack1-a"));
    assert_eq!(
        addresses(&n),
        pairs(&[("InternalIP", "10.0.1.5"), ("Hostname", "ni-file-rack1-a")])
    );
    assert_eq!(label(&n, LABEL_ZONE), Some("rack1"));
    assert_eq!(label(&n, LABEL_REGION), Some("dc-east"));
    assert_eq!(label(&n, LABEL_INSTANCE_TYPE), Some("r640"));
    // Every other taint is kept as created, including any the API server's admission added.
    let others: Vec<Taint> = taints(&by_name)
        .into_iter()
        .filter(|t| t.key != TAINT_UNINITIALIZED)
        .collect();
    assert!(others.contains(&dedicated));
    assert_eq!(taints(&n), others);

    let n = w.wait_node("initialized", "ni-file-b", initialized).await;
    assert_eq!(provider_id(&n), Some("loxilb://ni-file-b"));
    assert_eq!(label(&n, LABEL_ZONE), Some("rack2"));
    assert_eq!(label(&n, LABEL_REGION), Some("dc-east"));
    assert_eq!(label(&n, LABEL_INSTANCE_TYPE), None);

    let n = w
        .wait_node("initialized", "ni-file-stranger", initialized)
        .await;
    assert_eq!(provider_id(&n), Some("loxilb://ni-file-stranger"));
    assert_eq!(
        addresses(&n),
        pairs(&[
            ("InternalIP", "10.0.9.5"),
            ("InternalIP", "fd00::5"),
            ("Hostname", "ni-file-stranger"),
        ])
    );
    for key in [LABEL_ZONE, LABEL_REGION, LABEL_INSTANCE_TYPE] {
        assert_eq!(label(&n, key), None, "{key}");
    }
    w.wait_event("ni-file-stranger", "Normal", "NodeInitialized")
        .await;

    // Not waiting for initialization: never written.
    let now = w.node("ni-file-plain").await;
    assert_eq!(
        now.metadata.resource_version,
        plain.metadata.resource_version
    );
    assert_eq!(provider_id(&now), None);
    assert!(now.metadata.labels.unwrap_or_default().is_empty());

    w.finish().await;
    let _ = std::fs::remove_file(path);
}

#[tokio::test]
async fn configmap_inventory_retires_and_returns_nodes() {
    let inventory = |retired: bool| {
        format!(
            r#"
nodes:
  - match: {{ name: "ni-cm-old" }}
    retired: {retired}
  - match: {{ name: "ni-cm-rack-*" }}
    zone: cm-zone
    region: cm-region
"#
        )
    };
    let mut w = World::start(configmap_args("inventory-lifecycle", false)).await;
    w.put_configmap("inventory-lifecycle", &inventory(true))
        .await;

    // Already initialized (no uninitialized taint): only the retirement rule applies to it.
    let keep = taint("example.com/keep", None, "NoExecute");
    let old = w
        .add_node("ni-cm-old", "10.0.5.1", vec![keep.clone()])
        .await;
    w.add_node("ni-cm-rack-1", "10.0.5.2", vec![uninitialized()])
        .await;

    let n = w
        .wait_node("initialized", "ni-cm-rack-1", initialized)
        .await;
    assert_eq!(label(&n, LABEL_ZONE), Some("cm-zone"));
    assert_eq!(label(&n, LABEL_REGION), Some("cm-region"));
    assert!(!has_taint(&n, TAINT_SHUTDOWN));

    let n = w
        .wait_node("shutdown taint", "ni-cm-old", |n| {
            has_taint(n, TAINT_SHUTDOWN)
        })
        .await;
    let shutdown = taints(&n)
        .into_iter()
        .find(|t| t.key == TAINT_SHUTDOWN)
        .unwrap();
    assert_eq!(shutdown.effect, "NoSchedule");
    assert!(taints(&n).contains(&keep));
    // The lifecycle rule touches taints only.
    assert_eq!(provider_id(&n), None);
    assert_eq!(label(&n, LABEL_ZONE), None);
    assert_eq!(n.status, old.status);
    w.wait_event("ni-cm-old", "Normal", "NodeRetired").await;

    // Edited in place: applies without restart.
    w.put_configmap("inventory-lifecycle", &inventory(false))
        .await;
    let n = w
        .wait_node("shutdown taint removed", "ni-cm-old", |n| {
            !has_taint(n, TAINT_SHUTDOWN)
        })
        .await;
    assert_eq!(taints(&n), taints(&old));

    w.finish().await;
}

#[tokio::test]
async fn require_inventory_keeps_unknown_nodes_tainted() {
    let mut w = World::start(configmap_args("inventory-required", true)).await;
    w.put_configmap(
        "inventory-required",
        "nodes:\n  - match: { name: ni-req-known }\n    zone: known\n",
    )
    .await;
    w.add_node("ni-req-stranger", "10.0.6.2", vec![uninitialized()])
        .await;
    w.add_node("ni-req-known", "10.0.6.1", vec![uninitialized()])
        .await;

    let n = w
        .wait_node("initialized", "ni-req-known", initialized)
        .await;
    assert_eq!(label(&n, LABEL_ZONE), Some("known"));

    w.wait_event("ni-req-stranger", "Warning", "NodeNotInInventory")
        .await;
    let n = w.node("ni-req-stranger").await;
    assert!(has_taint(&n, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&n), None);
    assert!(addresses(&n).is_empty());

    // Once the inventory knows it, it is initialized, without a restart.
    w.put_configmap(
        "inventory-required",
        "nodes:\n  - match: { name: \"ni-req-*\" }\n    zone: late\n",
    )
    .await;
    let n = w
        .wait_node("initialized", "ni-req-stranger", initialized)
        .await;
    assert_eq!(label(&n, LABEL_ZONE), Some("late"));
    assert_eq!(provider_id(&n), Some("loxilb://ni-req-stranger"));
    // Initialized before the edit: its topology stays as decided then.
    assert_eq!(
        label(&w.node("ni-req-known").await, LABEL_ZONE),
        Some("known")
    );

    w.finish().await;
}

#[tokio::test]
async fn invalid_inventory_blocks_initialization_until_fixed() {
    let path = inventory_file(
        "invalid",
        "nodes:\n  - match: { name: ni-bad-* }\n    zone: z\n  - match: { cidr: 10.0.7.0/33 }\n",
    );
    let mut w = World::start(NodeInitArgs {
        inventory_file: Some(path.clone()),
        ..NodeInitArgs::default()
    })
    .await;
    w.add_node("ni-bad-1", "10.0.7.1", vec![uninitialized()])
        .await;
    w.wait_event("ni-bad-1", "Warning", "InventoryInvalid")
        .await;
    let n = w.node("ni-bad-1").await;
    assert!(has_taint(&n, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&n), None);

    // The file is polled: fixing it initializes the waiting Node.
    std::fs::write(
        &path,
        "nodes:\n  - match: { name: ni-bad-* }\n    zone: z\n  - match: { cidr: 10.0.7.0/24 }\n",
    )
    .unwrap();
    let n = w.wait_node("initialized", "ni-bad-1", initialized).await;
    assert_eq!(label(&n, LABEL_ZONE), Some("z"));

    w.finish().await;
    let _ = std::fs::remove_file(path);
}

const INVENTORY_UNAVAILABLE: &str = "InventoryUnavailable";

/// The notes of the Events about `node` with reason InventoryUnavailable, after checking
/// that each was published once (a retry does not count the same Event again).
async fn unavailable_notes(w: &World, node: &str) -> Vec<String> {
    let events = w.events(node, INVENTORY_UNAVAILABLE).await;
    for e in &events {
        assert_eq!(e.type_.as_deref(), Some("Warning"), "{e:?}");
        assert!(e.series.is_none(), "published again on a retry: {e:?}");
    }
    events.into_iter().filter_map(|e| e.note).collect()
}

#[tokio::test]
async fn missing_inventory_configmap_is_reported_on_waiting_nodes() {
    const CM: &str = "inventory-missing";
    let mut w = World::start(configmap_args(CM, false)).await;
    // Left over by a failed run: the test starts without the ConfigMap.
    let _ = w.configmaps().delete(CM, &DeleteParams::default()).await;
    let plain = w.add_node("ni-miss-plain", "10.0.8.2", vec![]).await;
    w.add_node("ni-miss-1", "10.0.8.1", vec![uninitialized()])
        .await;

    w.wait_event("ni-miss-1", "Warning", INVENTORY_UNAVAILABLE)
        .await;
    // Retried with backoff meanwhile (0.5 s, 1 s, 2 s ...), without another Event.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let notes = unavailable_notes(&w, "ni-miss-1").await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains(&format!("ConfigMap {NS}/{CM}"))
            && notes[0].contains("the ConfigMap does not exist"),
        "{}",
        notes[0]
    );
    let n = w.node("ni-miss-1").await;
    assert!(has_taint(&n, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&n), None);
    // Only Nodes waiting for initialization are blocked, so only they are told.
    assert!(unavailable_notes(&w, "ni-miss-plain").await.is_empty());
    assert_eq!(
        w.node("ni-miss-plain").await.metadata.resource_version,
        plain.metadata.resource_version
    );

    // Another problem: the ConfigMap without the key. One more Event, naming it.
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": CM, "namespace": NS },
        "data": { "inventory.yml": "nodes: []\n" },
    });
    w.configmaps()
        .patch(
            CM,
            &PatchParams::apply("ni-test").force(),
            &Patch::Apply(cm),
        )
        .await
        .unwrap();
    w.configmaps.push(CM.into());
    wait_for("an Event about the missing key", || async {
        let notes = unavailable_notes(&w, "ni-miss-1").await;
        (notes.len() == 2).then_some(notes)
    })
    .await
    .iter()
    .find(|n| n.contains("has no key inventory.yaml"))
    .expect("the second Event names the key");
    assert!(has_taint(&w.node("ni-miss-1").await, TAINT_UNINITIALIZED));

    // The inventory appears: the waiting Node is initialized, without a restart.
    w.put_configmap(
        CM,
        "nodes:\n  - match: { name: \"ni-miss-*\" }\n    zone: found\n",
    )
    .await;
    let n = w.wait_node("initialized", "ni-miss-1", initialized).await;
    assert_eq!(label(&n, LABEL_ZONE), Some("found"));
    assert_eq!(provider_id(&n), Some("loxilb://ni-miss-1"));

    w.finish().await;
}

#[tokio::test]
async fn missing_inventory_file_is_reported_until_it_appears() {
    let path = std::env::temp_dir().join(format!("loxi-ccm-ni-absent-{}.yaml", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut w = World::start(NodeInitArgs {
        inventory_file: Some(path.clone()),
        ..NodeInitArgs::default()
    })
    .await;
    w.add_node("ni-nofile-1", "10.0.9.1", vec![uninitialized()])
        .await;
    w.wait_event("ni-nofile-1", "Warning", INVENTORY_UNAVAILABLE)
        .await;
    let notes = unavailable_notes(&w, "ni-nofile-1").await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains(&format!("file {}", path.display())),
        "{}",
        notes[0]
    );
    assert!(has_taint(&w.node("ni-nofile-1").await, TAINT_UNINITIALIZED));

    // The file is polled: once written, the waiting Node is initialized.
    std::fs::write(
        &path,
        "nodes:\n  - match: { cidr: 10.0.9.0/24 }\n    zone: z9\n",
    )
    .unwrap();
    let n = w.wait_node("initialized", "ni-nofile-1", initialized).await;
    assert_eq!(label(&n, LABEL_ZONE), Some("z9"));
    assert_eq!(unavailable_notes(&w, "ni-nofile-1").await.len(), 1);

    w.finish().await;
    let _ = std::fs::remove_file(path);
}
