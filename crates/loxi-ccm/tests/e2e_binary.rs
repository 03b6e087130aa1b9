//! End to end: the `deploy/` manifests applied with kubectl to a real kube-apiserver (RBAC on),
//! and the built `loxi-ccm` binary started as a user would, authenticated as the shipped
//! ServiceAccount, so the shipped ClusterRole is what is tested.

mod common;
#[path = "common/e2e_setup.rs"]
mod e2e_setup;

use std::process::Stdio;
use std::time::Instant;

use e2e_setup::*;
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, DeleteParams, PostParams};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;

#[tokio::test]
async fn shipped_manifests_and_rbac_run_the_binary_end_to_end() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    // Everything below runs with the shipped ServiceAccount's rights only.
    let sa_kc = apply_shipped_manifests(&cp).await;

    let admin = cp.admin_client().await.unwrap();
    let ns = "e2e";
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, ip) in [("e2e-a", "10.9.0.1"), ("e2e-b", "10.9.0.2")] {
        add_node(&admin, name, ip).await;
    }

    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let log_path = cp.dir().join("loxi-ccm.log");
    let admin_port = testenv::free_port().unwrap();
    let mut ccm = KillOnDrop(
        loxi_ccm_run(&sa_kc, &sim, &format!("127.0.0.1:{admin_port}"))
            .args([
                "--log-format",
                "json",
                // A tight client-side limit: start-up's lists and watches exceed the burst,
                // so requests really wait for tokens, through the real TLS + token stack.
                "--kube-api-qps",
                "20",
                "--kube-api-burst",
                "5",
            ])
            .stdout(std::fs::File::create(&log_path).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let ip = wait_for("an address on web", || async {
        services
            .get("web")
            .await
            .ok()?
            .status?
            .load_balancer?
            .ingress?
            .first()?
            .ip
            .clone()
    })
    .await;
    assert!(ip.starts_with("198.51.100."));
    wait_for("two rules", || async {
        (sim.rules().iter().filter(|r| r.external_ip == ip).count() == 2).then_some(())
    })
    .await;

    // The cloud node controller, under the same ServiceAccount: a kubelet-style new Node.
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "e2e-new", "annotations": {"alpha.kubernetes.io/provided-node-ip": "10.9.0.3"}},
                "spec": {"taints": [{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let node = wait_for("e2e-new initialized", || async {
        let n = nodes.get("e2e-new").await.ok()?;
        let tainted = n
            .spec
            .as_ref()?
            .taints
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.key.contains("uninitialized")));
        (!tainted).then_some(n)
    })
    .await;
    assert_eq!(
        node.spec.unwrap().provider_id.as_deref(),
        Some("loxilb://e2e-new")
    );
    let addresses: Vec<(String, String)> = node
        .status
        .unwrap()
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".to_string(), "10.9.0.3".to_string())),
        "{addresses:?}"
    );

    // Metrics and probes answer.
    let metrics = reqwest_get(&format!("http://127.0.0.1:{admin_port}/metrics")).await;
    assert!(metrics.contains("loxi_ccm_reconciles_total"), "{metrics}");
    assert!(
        reqwest_get(&format!("http://127.0.0.1:{admin_port}/readyz"))
            .await
            .starts_with("ok")
    );

    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("web deleted and its rules gone", || async {
        (services.get_opt("web").await.ok()?.is_none() && sim.rules().is_empty()).then_some(())
    })
    .await;

    // SIGTERM: the binary stops by itself.
    let started = Instant::now();
    unsafe {
        libc_kill(ccm.0.id() as i32, 15);
    }
    let status = exit_of(&mut ccm.0, "loxi-ccm ignored SIGTERM").await;
    eprintln!(
        "loxi-ccm exited {status} {:?} after SIGTERM",
        started.elapsed()
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "exit status {status}; log:\n{log}");
    assert!(!log.contains("forbidden"), "RBAC denied something:\n{log}");
}

/// Two processes of the binary WITHOUT leader election (a misconfigured Deployment, or two
/// clusters' controllers sharing a pool by mistake) allocating at once from a pool barely
/// larger than the burst: the claims' name uniqueness still gives every address to one
/// Service only, and each Service ends with exactly one claimed address.
#[tokio::test]
async fn two_processes_without_leader_election_never_duplicate() {
    let (cp, sa_kc, admin, sim) = two_process_setup("race-a", "10.8.1.1").await;
    let start = |name: &str| {
        let flags = [
            "--loxilb-url",
            &sim.url(),
            // 62 usable addresses for 60 Services.
            "--external-cidr",
            "198.51.100.0/26",
            "--admin-addr",
            &format!("127.0.0.1:{}", testenv::free_port().unwrap()),
            "--leader-elect=false",
        ];
        spawn_named(&cp, &sa_kc, name, flags)
    };
    let replicas = [start("racer-a"), start("racer-b")];
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    // One port for all: no two may share an address.
    let names: Vec<String> = (0..60).map(|i| format!("race{i}")).collect();
    futures::future::join_all(names.iter().map(|name| {
        let services = services.clone();
        async move {
            let svc: Service = serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"type": "LoadBalancer", "loadBalancerClass": "loxilb.io/loxilb",
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
            }))
            .unwrap();
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
    }))
    .await;
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(admin.clone());
    let shown = wait_for("60 addresses, one claim each", || async {
        let shown: std::collections::BTreeMap<String, String> = services
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|s| {
                Some((
                    s.metadata.name?,
                    s.status?.load_balancer?.ingress?.first()?.ip.clone()?,
                ))
            })
            .collect();
        let claims = claims.list(&Default::default()).await.ok()?.items;
        (shown.len() == 60 && claims.len() == 60).then_some(shown)
    })
    .await;
    let unique: std::collections::BTreeSet<&String> = shown.values().collect();
    assert_eq!(
        unique.len(),
        60,
        "one address given to two Services: {shown:?}"
    );
    for c in claims.list(&Default::default()).await.unwrap().items {
        assert_eq!(
            shown.get(&c.spec.service.name),
            Some(&c.spec.address),
            "claim {} names a Service that does not show it",
            c.spec.address
        );
    }
    wait_for("exactly one rule per Service", || async {
        let rules = sim.rules();
        let ips: std::collections::BTreeSet<String> =
            rules.iter().map(|r| r.external_ip.clone()).collect();
        (rules.len() == 60 && ips.iter().all(|ip| unique.contains(ip))).then_some(())
    })
    .await;
    for mut child in replicas {
        unsafe {
            libc_kill(child.0.id() as i32, 15);
        }
        let _ = child.0.wait();
    }
    // How much the two really raced (informational: the outcome above is what counts).
    for name in ["racer-a", "racer-b"] {
        let log = std::fs::read_to_string(cp.dir().join(format!("{name}.log"))).unwrap_or_default();
        eprintln!(
            "{name}: {} race(s) lost to the other process",
            log.matches("claimed by someone else first").count()
                + log.matches("released a second address").count()
        );
    }
}

/// An admin address that cannot be listened on (the port is taken) stops `loxi-ccm run` at
/// once, before it asks for the Lease: exit 1 and a message naming the flag, the address and
/// the system's answer. Leading without `/healthz`, `/readyz` and `/metrics` would make the
/// kubelet's probes fail for a reason nobody sees.
#[tokio::test]
async fn an_admin_address_in_use_stops_the_binary_before_it_leads() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let sa_kc = apply_shipped_manifests(&cp).await;
    let admin = cp.admin_client().await.unwrap();
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();

    let mut ccm = KillOnDrop(
        loxi_ccm_run(&sa_kc, &sim, &addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let status = exit_of(
        &mut ccm.0,
        &format!("loxi-ccm still runs 30 s after it could not listen on {addr}"),
    )
    .await;
    let mut stderr = String::new();
    std::io::Read::read_to_string(ccm.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    println!("exit {status} after {:?}: {stderr}", started.elapsed());
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: --admin-addr {addr}: cannot listen for /healthz, /readyz and /metrics: "
        )) && stderr.contains("in use"),
        "{stderr}"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin, "kube-system");
    assert!(
        leases.get_opt("loxi-ccm").await.unwrap().is_none(),
        "no Lease was asked for"
    );
    assert!(sim.rules().is_empty());
    drop(taken);
}
