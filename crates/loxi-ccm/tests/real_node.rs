//! The opt-in real-node tier (`cargo xtask realnode`, docs/testing.md): a real kubelet,
//! containerd and kube-proxy (testenv::node) against the real control plane, with the image
//! `cargo xtask image` built loaded into the node's runtime.
//!
//! One test, in phases that build on each other (one node per machine: kubelet's cgroups,
//! kube-proxy's nftables tables):
//! 1. node initialization: the Node the kubelet registers (`--cloud-provider=external`, the
//!    `uninitialized` taint) is initialized by the chart's Pod (the image, scheduled on that
//!    node through the chart's toleration) with the inventory given as chart values, as
//!    docs/configuration.md says: taint removed, providerID, addresses, topology labels;
//! 2. the chart: `helm install` with the image → 2 Pods Running and Ready under the chart's
//!    restricted security context (probes on /healthz and /readyz answered by kubelet), one of
//!    them the Lease's holder, metrics scraped from a Pod's address;
//! 3. a LoadBalancer Service of real Pods (a busybox httpd image built here): EndpointSlices
//!    written by kube-controller-manager; the loxilb rule (simulator) carries the Node and
//!    NodePort, kube-proxy answers on that NodePort with the Pod's page; in pod-network mode
//!    the rule carries the Pods' addresses and a deleted Pod leaves it;
//! 4. `kubectl drain` of the node (the chart's Pods): the PodDisruptionBudget keeps one Pod,
//!    which holds the Lease; a rolling update moves leadership to a new Pod; `loxi-ccm audit`
//!    is clean after each.
//!
//! Ignored by `cargo test` (needs root, Debian packages and the node binaries, which
//! `cargo xtask realnode` installs and builds before running it with `--ignored`).

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;
use testenv::ControlPlane;
use testenv::node::RealNode;

const NODE: &str = "realnode-1";
/// Generous: a cold node pulls nothing, but a busy machine starts Pods slowly.
const WAIT: Duration = Duration::from_secs(180);

async fn wait_for<T, Fut: std::future::Future<Output = Option<T>>>(
    what: &str,
    node: &RealNode,
    mut check: impl FnMut() -> Fut,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for {what}\n{}",
            node.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A plain HTTP/1.0 GET; the body, or None while nothing answers.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    common::kubectl_as_admin(cp, args)
}

/// Prints how long each phase took (the tier's timings in docs/testing.md come from here).
struct Clock(Instant);

impl Clock {
    fn lap(&mut self, what: &str) {
        eprintln!(
            "real node: {what} in {:.1} s",
            self.0.elapsed().as_secs_f64()
        );
        self.0 = Instant::now();
    }
}

/// Keeps the node's logs under the target folder when the test fails.
struct LogsOnFailure<'a>(&'a RealNode);

impl Drop for LogsOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let to = std::env::temp_dir().join("loxi-ccm-realnode-logs");
            let _ = self.0.copy_logs(&to);
            eprintln!("real node: logs kept in {}", to.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "opt-in tier: cargo xtask realnode (root, containerd, kubelet; docs/testing.md)"]
async fn a_real_node_end_to_end() {
    let mut clock = Clock(Instant::now());
    let archive = PathBuf::from(std::env::var("LOXI_IMAGE_ARCHIVE").expect(
        "LOXI_IMAGE_ARCHIVE: the archive of `cargo xtask image` (cargo xtask realnode sets it)",
    ));
    let ip = testenv::node::node_ip().unwrap();
    let cp = ControlPlane::start_for_node(&ip)
        .await
        .expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    clock.lap("control plane");
    let node = RealNode::start(&cp, NODE, std::slice::from_ref(&archive))
        .await
        .expect("the real node");
    let _logs = LogsOnFailure(&node);
    clock.lap(
        "containerd, images imported, kubelet, kube-proxy, scheduler, controller-manager started",
    );

    // The Node the real kubelet registers (--cloud-provider=external) is tainted.
    let nodes: Api<Node> = Api::all(admin.clone());
    let registered = wait_for(
        "the kubelet's Node, tainted uninitialized",
        &node,
        || async {
            let n = nodes.get_opt(NODE).await.ok()??;
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .as_ref()?
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized");
            tainted.then_some(n)
        },
    )
    .await;
    assert_eq!(
        registered
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("alpha.kubernetes.io/provided-node-ip"))
            .map(String::as_str),
        Some(ip.as_str()),
        "kubelet --node-ip with --cloud-provider=external"
    );
    clock.lap("Node registered with the uninitialized taint");

    let sim = Simulator::start("0.0.0.0:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let sim_url = format!("http://{ip}:{}", sim.addr().port());
    // The chart with the image, installed while the node is still uninitialized (the chart tolerates the
    // taint, as a cloud-controller-manager must): the default image and pull policy
    // (IfNotPresent), as docs/getting-started.md installs it with the archive loaded, and the
    // inventory as chart values (nodeInventory → the ConfigMap loxi-ccm-inventory).
    let values = cp.dir().join("real-node-values.yaml");
    std::fs::write(
        &values,
        format!(
            "nodeInventory:\n  nodes:\n    - match: {{ cidr: \"{ip}/32\" }}\n      zone: rack-a\n      region: lab\n      instanceType: real-node\n"
        ),
    )
    .unwrap();
    let helm = testenv::tools::helm().expect("helm");
    let out = testenv::tools::helm_command(&helm)
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["install", "loxi-ccm"])
        .arg(testenv::chart::chart_dir())
        .args([
            "--namespace",
            "kube-system",
            "--set",
            &format!("loxilb.urls={{{sim_url}}}"),
            "--set",
            "pools.externalCIDR=198.51.100.0/24",
            "-f",
        ])
        .arg(&values)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // 1. Node initialization of the Node the real kubelet registered, by the chart's leader Pod.
    let initialized = wait_for(
        "the chart's loxi-ccm Pod to initialize the kubelet's Node",
        &node,
        || async {
            let n = nodes.get_opt(NODE).await.ok()??;
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized");
            (!tainted && n.spec.as_ref()?.provider_id.is_some()).then_some(n)
        },
    )
    .await;
    assert_eq!(
        initialized.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(format!("loxilb://{NODE}").as_str())
    );
    let labels = initialized.metadata.labels.clone().unwrap_or_default();
    for (key, value) in [
        ("topology.kubernetes.io/zone", "rack-a"),
        ("topology.kubernetes.io/region", "lab"),
        ("node.kubernetes.io/instance-type", "real-node"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
    let addresses: Vec<(String, String)> = initialized
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".into(), ip.clone()))
            && addresses.contains(&("Hostname".into(), NODE.into())),
        "{addresses:?}"
    );
    clock.lap(
        "chart installed; Node initialized by its Pod (taint, providerID, addresses, topology)",
    );

    // 2. The chart's Pods: Running and Ready on the node, one leader, metrics.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "kube-system");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "kube-system");
    let ready = wait_for("the chart's 2 Pods Running and Ready", &node, || async {
        let d = deployments.get_opt("loxi-ccm").await.ok()??;
        let status = d.status?;
        (status.ready_replicas == Some(2) && status.updated_replicas == Some(2)).then_some(())?;
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=loxi-ccm"))
            .await
            .ok()?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && p.metadata.deletion_timestamp.is_none()
            })
            .collect();
        (running.len() == 2).then_some(running)
    })
    .await;
    for pod in &ready {
        let spec = pod.spec.as_ref().unwrap();
        let container = &spec.containers[0];
        let sc = container.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_user, Some(65532));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some());
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        let status = pod.status.as_ref().unwrap();
        let cs = &status.container_statuses.as_ref().unwrap()[0];
        assert!(
            cs.ready,
            "{} not Ready",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        assert_eq!(
            cs.image,
            format!("ghcr.io/loxi-ccm/loxi-ccm:{}", env!("CARGO_PKG_VERSION"))
        );
    }
    let names: Vec<String> = ready
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let holder = wait_for("one chart Pod holding the Lease", &node, || async {
        let lease = leases.get_opt("loxi-ccm").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        names
            .iter()
            .find(|n| holder.starts_with(n.as_str()))
            .cloned()
    })
    .await;
    let leader_ip = ready
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(holder.as_str()))
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .unwrap();
    let metrics = wait_for("metrics scraped from the leader Pod", &node, || async {
        let addr = format!("{leader_ip}:9500");
        tokio::task::spawn_blocking(move || http_get(&addr, "/metrics"))
            .await
            .ok()?
    })
    .await;
    assert!(
        metrics.contains("loxi_ccm_leader 1"),
        "the leader Pod's /metrics:\n{metrics}"
    );
    clock.lap("chart installed: 2 Pods Running and Ready, one leader, metrics scraped");

    // 3. A LoadBalancer Service of real Pods.
    let web_dir = cp.dir().join("web-image");
    std::fs::create_dir_all(web_dir.join("www")).unwrap();
    std::fs::copy("/bin/busybox", web_dir.join("busybox")).expect("busybox-static's /bin/busybox");
    std::fs::write(web_dir.join("www/index.html"), "loxi-web\n").unwrap();
    let web_archive = testenv::node::build_scratch_image(
        &web_dir,
        "localhost/loxi-ccm-test/web:1",
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY www/ /www/\nUSER 65534:65534\nENTRYPOINT [\"/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n",
    )
    .unwrap();
    node.import(&web_archive).unwrap();
    let default_deployments: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    default_deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{
                            "name": "web",
                            "image": "localhost/loxi-ccm-test/web:1",
                            "imagePullPolicy": "Never",
                            "ports": [{"containerPort": 8080}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
                        }]}
                    }
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    for (name, annotations) in [
        ("web", json!({})),
        ("web-pods", json!({"loxilb.io/usepodnetwork": "yes"})),
    ] {
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "annotations": annotations},
                    "spec": {
                        "type": "LoadBalancer",
                        "loadBalancerClass": "loxilb.io/loxilb",
                        "selector": {"app": "web"},
                        "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]
                    }
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }
    let web_pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod_ips = || async {
        let list = web_pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let mut ips: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .collect();
        ips.sort();
        Some(ips)
    };
    let endpoints_of = |rule_part: &'static str| {
        let mut eps: Vec<String> = sim
            .rules()
            .into_iter()
            .filter(|r| r.name.contains(rule_part))
            .flat_map(|r| {
                r.endpoints
                    .iter()
                    .map(|e| format!("{}:{}", e.ip, e.target_port))
                    .collect::<Vec<_>>()
            })
            .collect();
        eps.sort();
        eps
    };
    let node_port = wait_for(
        "the web Service's rule on the Node and its NodePort",
        &node,
        || async {
            let svc = services.get("web").await.ok()?;
            let node_port = svc.spec?.ports?.first()?.node_port?;
            (endpoints_of("_default_web_80_tcp") == [format!("{ip}:{node_port}")])
                .then_some(node_port)
        },
    )
    .await;
    let page = wait_for("kube-proxy to answer on NodeIP:NodePort", &node, || async {
        let addr = format!("{ip}:{node_port}");
        tokio::task::spawn_blocking(move || http_get(&addr, "/"))
            .await
            .ok()?
    })
    .await;
    assert_eq!(
        page, "loxi-web\n",
        "the Pod's page through kube-proxy's NodePort"
    );
    clock.lap("LoadBalancer Service: rule on NodeIP:NodePort, kube-proxy serves it");

    let both = wait_for(
        "both web Pods Ready, in the pod-network rule",
        &node,
        || async {
            let ips = pod_ips().await?;
            let expected: Vec<String> = ips.iter().map(|ip| format!("{ip}:8080")).collect();
            (ips.len() == 2 && endpoints_of("_default_web-pods_80_tcp") == expected).then_some(ips)
        },
    )
    .await;
    let victim = web_pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(both[0].as_str()))
        .unwrap();
    web_pods
        .delete(
            victim.metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let gone = format!("{}:8080", both[0]);
    wait_for(
        "the deleted Pod's address to leave the rule",
        &node,
        || async {
            let eps = endpoints_of("_default_web-pods_80_tcp");
            (!eps.is_empty() && !eps.contains(&gone)).then_some(())
        },
    )
    .await;
    clock.lap("pod-network rule follows the real EndpointSlices (a deleted Pod leaves it)");

    // 4. A drain of the node and a rolling update: the PDB holds, leadership moves, nothing
    // is lost.
    let out = Command::new(cp.k8s_bin_dir().join("kubectl"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "drain",
            NODE,
            "--pod-selector=app.kubernetes.io/name=loxi-ccm",
            "--timeout=30s",
        ])
        .output()
        .unwrap();
    let drain_log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && drain_log.contains("disruption budget"),
        "kubectl drain: the PDB must stop the second eviction (one node: the evicted Pod's \
         replacement cannot be scheduled):\n{drain_log}"
    );
    let survivor = wait_for("one chart Pod left Running and Ready", &node, || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=loxi-ccm"))
            .await
            .ok()?;
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (ready.len() == 1).then(|| ready[0].clone())
    })
    .await;
    wait_for("the remaining Pod to hold the Lease", &node, || async {
        let holder = leases
            .get_opt("loxi-ccm")
            .await
            .ok()??
            .spec?
            .holder_identity?;
        holder.starts_with(&survivor).then_some(())
    })
    .await;
    audit_clean(&admin, &sim_url, &node).await;
    kubectl(&cp, &["uncordon", NODE]);
    clock.lap("drain: the PDB held one Pod, which leads; audit clean");

    kubectl(
        &cp,
        &[
            "-n",
            "kube-system",
            "rollout",
            "restart",
            "deployment/loxi-ccm",
        ],
    );
    kubectl(
        &cp,
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/loxi-ccm",
            "--timeout=300s",
        ],
    );
    let before: Vec<String> = ready
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .chain(std::iter::once(survivor))
        .collect();
    wait_for(
        "a Pod of the new ReplicaSet to hold the Lease",
        &node,
        || async {
            let holder = leases
                .get_opt("loxi-ccm")
                .await
                .ok()??
                .spec?
                .holder_identity?;
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=loxi-ccm"))
                .await
                .ok()?;
            list.items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .filter(|n| !before.contains(n))
                .any(|n| holder.starts_with(&n))
                .then_some(())
        },
    )
    .await;
    audit_clean(&admin, &sim_url, &node).await;
    clock.lap("rolling update: leadership moved to a new Pod; audit clean");

    node.stop();
    clock.lap("node stopped");
}

/// Waits until `loxi-ccm audit`'s checks (with the chart's settings) report no violation.
async fn audit_clean(admin: &kube::Client, sim_url: &str, node: &RealNode) {
    let cli = <loxi_ccm::config::cli::Cli as clap::Parser>::try_parse_from([
        "loxi-ccm".to_string(),
        "run".into(),
        format!("--loxilb-url={sim_url}"),
        "--external-cidr=198.51.100.0/24".into(),
    ])
    .unwrap();
    let loxi_ccm::config::cli::Command::Run(run) = cli.command;
    let cfg = loxi_ccm::config::Config::from_args(&run).unwrap();
    wait_for("loxi-ccm audit to be clean", node, || {
        let cfg = &cfg;
        async move {
            match loxi_ccm::audit::audit(admin, cfg).await {
                Ok(f) if f.clean() => Some(()),
                Ok(f) => {
                    eprintln!("audit: {f}{}", f.summary());
                    None
                }
                Err(e) => {
                    eprintln!("audit: {e}");
                    None
                }
            }
        }
    })
    .await;
}
