//! `loxi-ccm audit` against the real API server and the loxilb simulator: a converged
//! cluster reports nothing; each kind of violation, planted by hand while the controller is
//! stopped, is reported with the objects involved; the binary exits 1 on violations and 0
//! when clean.

mod common;

use std::time::Duration;

use common::{CLASS, Options, World, assert_found};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::audit::Kind;
use loxi_ccm::ipam::claims::{AddressClaim, AddressClaimSpec, ClaimedBy, claim_name};
use loxilb_client::{ClientConfig, LoxilbClient};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(60);

fn claim(ip: &str, pool: &str, owners: Vec<ClaimedBy>) -> AddressClaim {
    let mut owners = owners.into_iter();
    AddressClaim::new(
        &claim_name(&ip.parse().unwrap()),
        AddressClaimSpec {
            address: ip.into(),
            pool: pool.into(),
            service: owners.next().unwrap(),
            shared_with: owners.collect(),
            retain_until: None,
            controller: None,
        },
    )
}

fn owner(ns: &str, name: &str, uid: &str, ports: &[&str]) -> ClaimedBy {
    ClaimedBy {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        ports: Some(ports.iter().map(|p| p.to_string()).collect()),
        ..ClaimedBy::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planted_violations_are_reported() {
    let opts = Options {
        drift: "2s",
        ..Options::default()
    };
    let mut world = World::with("audit", opts.clone()).await;
    world.add_node("audit-n1", "10.0.0.1").await;
    world.add_node("audit-n2", "10.0.0.2").await;
    for (name, port) in [("web", 80), ("dns", 53), ("api", 443)] {
        world
            .create(&World::lb_service(name, Some(CLASS), &[(port, "TCP")]))
            .await;
    }
    world.settle_programmed(&opts, SETTLE).await;
    let clean = world.audit(&opts).await;
    assert!(clean.clean(), "{clean}");
    assert_eq!((clean.services, clean.rules), (3, 3), "{}", clean.summary());

    // Plant every kind of violation with the controller stopped, so nothing repairs them.
    world.stop_controller().await;
    let ns = world.ns.clone();
    let claims: Api<AddressClaim> = Api::all(world.client.clone());
    let loxilb = LoxilbClient::new(ClientConfig::new(&world.sim.url())).unwrap();
    let api = world.get("api").await.unwrap();
    let web = world.get("web").await.unwrap();
    let shared_ip = world.wait_for_ip("web").await;
    let api_ip = world.wait_for_ip("api").await;

    // 1. A rule deleted by hand (api's).
    loxilb
        .delete_rule(&api_ip, 443, "tcp", false)
        .await
        .unwrap();
    // 2. A rule with wrong endpoints (web's, re-posted with one endpoint changed).
    let mut wrong = loxilb
        .list_rules()
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.service_arguments.port == 80)
        .unwrap();
    wrong.endpoints[0].endpoint_ip = "10.9.9.9".into();
    loxilb.apply_rule(&wrong).await.unwrap();
    // 3. An owned orphan: a rule named as this cluster's for a Service that never existed.
    let mut orphan = wrong.clone();
    orphan.service_arguments.external_ip = "192.0.2.200".into();
    orphan.service_arguments.port = 8080;
    orphan.service_arguments.name = format!("ccm-test_{ns}_ghost_8080_tcp:llb-inst0");
    loxilb.apply_rule(&orphan).await.unwrap();
    // 4. A claim whose owner is gone, without a reservation.
    claims
        .create(
            &PostParams::default(),
            &claim(
                "192.0.2.201",
                "default",
                vec![owner(&ns, "ghost", "gone-uid", &["80/TCP"])],
            ),
        )
        .await
        .unwrap();
    // 5. Two owners on one port: dns's entry on the shared claim rewritten to web's port.
    let shared_name = claim_name(&shared_ip.parse().unwrap());
    let mut shared = claims.get(&shared_name).await.unwrap();
    for o in std::iter::once(&mut shared.spec.service).chain(shared.spec.shared_with.iter_mut()) {
        if o.name == "dns" {
            o.ports = Some(vec!["80/TCP".into()]);
        }
    }
    claims
        .replace(&shared_name, &PostParams::default(), &shared)
        .await
        .unwrap();
    // 6. A status address no claim backs (a foreign actor's write).
    world
        .services
        .patch_status(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": api_ip}, {"ip": "192.0.2.203"}]}}})),
        )
        .await
        .unwrap();
    // 7. An address outside every pool that nobody asked for, on a live Service (which
    //    shows another address: a stale owner too).
    claims
        .create(
            &PostParams::default(),
            &claim(
                "198.51.100.9",
                "",
                vec![owner(&ns, "web", &web.uid().unwrap(), &["80/TCP"])],
            ),
        )
        .await
        .unwrap();

    let found = world.audit(&opts).await;
    assert_found(
        &found,
        Kind::Rules,
        &[&format!("{ns}/api has no rule for {api_ip}:443/tcp")],
    );
    assert_found(
        &found,
        Kind::Rules,
        &[&format!("{ns}/web's rule"), "endpoints", "10.9.9.9"],
    );
    assert_found(
        &found,
        Kind::OwnedOrphan,
        &["192.0.2.200:8080/tcp", &format!("Service {ns}/ghost")],
    );
    assert_found(
        &found,
        Kind::OwnerlessClaim,
        &["192.0.2.201", "has no owner", "gone-uid"],
    );
    assert_found(
        &found,
        Kind::SharedAddress,
        &[
            &shared_ip,
            &format!("Service {ns}/dns"),
            &format!("Service {ns}/web"),
        ],
    );
    assert_found(
        &found,
        Kind::UnbackedStatus,
        &["192.0.2.203", &format!("Service {ns}/api")],
    );
    assert_found(
        &found,
        Kind::OutsidePools,
        &["198.51.100.9", "outside every pool"],
    );
    assert_found(
        &found,
        Kind::StaleOwner,
        &[
            "claim for 198.51.100.9",
            &format!("lists {ns}/web"),
            &format!("shows {shared_ip} and not 198.51.100.9"),
        ],
    );
    assert!(!found.clean());

    // The binary says the same and exits 1.
    let kubeconfig = common::control_plane().kubeconfig_path();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
        .args([
            "audit".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--loxilb-url={}", world.sim.url()),
            format!("--external-cidr={}", opts.cidr),
            format!("--namespace={ns}"),
            "--cluster-id=test".into(),
        ])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("VIOLATION owned-orphan"), "{stdout}");
    assert!(stderr.contains("audit failed"), "{stderr}");

    // Undo what the controller may not decide for the operator (the planted claims and the
    // illegal sharing), restart it, and the rest is repaired: clean again.
    claims
        .delete(
            &claim_name(&"198.51.100.9".parse().unwrap()),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    let mut shared = claims.get(&shared_name).await.unwrap();
    for o in std::iter::once(&mut shared.spec.service).chain(shared.spec.shared_with.iter_mut()) {
        if o.name == "dns" {
            o.ports = Some(vec!["53/TCP".into()]);
        }
    }
    claims
        .replace(&shared_name, &PostParams::default(), &shared)
        .await
        .unwrap();
    world.start_controller(&opts).await;
    let took = world.settle_programmed(&opts, SETTLE).await;
    eprintln!("repaired after restart in {took:?}");
    let after = world.audit(&opts).await;
    assert!(after.clean(), "{after}");
    assert_eq!(api.uid(), world.get("api").await.unwrap().uid());

    // The binary exits 0 on a clean cluster.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
        .args([
            "audit".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--loxilb-url={}", world.sim.url()),
            format!("--external-cidr={}", opts.cidr),
            format!("--namespace={ns}"),
            "--cluster-id=test".into(),
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    world.finish().await;
}

/// `loxi-ccm audit` and `check` cover every loxilb of the fleet, as the controller finds them
/// (docs/fleet.md): here one discovered from the loxilb Service's EndpointSlices and one
/// named by a `LoxiURL` resource, no `--loxilb-url`. An owned orphan planted on each is
/// reported, naming the loxilb, and the binary exits 1; `check` has a line for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_loxilb_of_the_fleet_is_audited_and_checked() {
    use common::{install_shipped_crds, test_namespace, wait_for};
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    use loxilb_sim::{SimConfig, Simulator};

    let host = common::host_address();
    let discovered = Simulator::start((host, 0).into(), SimConfig::default())
        .await
        .unwrap();
    let listed = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let ns = test_namespace("auditfleet");
    let opts = Options {
        discovery: true,
        // Only this test's loxilbs, whatever other tests left behind.
        extra_args: vec![format!("--loxilb-service-namespace={ns}")],
        ..Options::default()
    };
    let mut world = World::with("auditfleet", opts.clone()).await;
    install_shipped_crds(&world.client, "optional/loxiurl-crd.yaml").await;
    let resources: Api<LoxiURL> = Api::all(world.client.clone());
    let name = format!("{ns}-listed");
    let res = LoxiURL::new(&name, LoxiURLSpec::of(&listed.url(), None));
    resources
        .create(&PostParams::default(), &res)
        .await
        .unwrap();
    let (address, port) = (host.to_string(), discovered.addr().port());
    let service = "loxilb-lb-service";
    world
        .set_loxilb_slice(service, "loxilb-a", &address, port, true)
        .await;
    world.add_node("audit-n1", "10.0.0.1").await;
    world
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = world.wait_for_ip("web").await;
    wait_for("web's rule on both loxilbs", SETTLE, || async {
        [&discovered, &listed]
            .iter()
            .all(|s| s.rules().iter().any(|r| r.external_ip == ip))
            .then_some(())
    })
    .await;
    // Settled: web programmed on both loxilbs (the loxilb Service is not a load balancer).
    world
        .settle(&opts, SETTLE, |s| {
            s.metadata.name.as_deref() != Some("web")
                || World::condition(s, "loxilb.io/Programmed")
                    .is_some_and(|c| c.0 == "True" && c.2.contains(" on 2/2 "))
        })
        .await;
    let clean = world.audit(&opts).await;
    assert!(clean.clean(), "{clean}");
    assert_eq!(clean.instances, 2, "{}", clean.summary());

    // An owned orphan on each, with the controller stopped.
    world.stop_controller().await;
    for (sim, port) in [(&discovered, 8080), (&listed, 8081)] {
        let loxilb = LoxilbClient::new(ClientConfig::new(&sim.url())).unwrap();
        let mut orphan = loxilb.list_rules().await.unwrap().remove(0);
        orphan.service_arguments.external_ip = "192.0.2.200".into();
        orphan.service_arguments.port = port;
        orphan.service_arguments.name = format!("ccm-test_{}_ghost_{port}_tcp:llb-inst0", world.ns);
        loxilb.apply_rule(&orphan).await.unwrap();
    }
    let found = world.audit(&opts).await;
    for (sim, port) in [(&discovered, 8080), (&listed, 8081)] {
        let needles = [format!("192.0.2.200:{port}/tcp"), sim.url()];
        assert!(
            found
                .of_kind(Kind::OwnedOrphan)
                .iter()
                .any(|v| needles.iter().all(|n| v.to_string().contains(n.as_str()))),
            "{found}"
        );
    }

    // The binary says the same and exits 1; `check` looks at both loxilbs.
    let kubeconfig = common::control_plane().kubeconfig_path();
    let flags = [
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--external-cidr={}", opts.cidr),
        format!("--namespace={}", world.ns),
        "--cluster-id=test".into(),
        format!("--loxilb-service-namespace={ns}"),
    ];
    let binary = |command: &'static str| {
        let flags = flags.clone();
        async move {
            let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"));
            let output = cmd.arg(command).args(&flags).output().await.unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout).to_string();
            (output.status.code(), stdout)
        }
    };
    let (code, stdout) = binary("audit").await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains(&listed.url()), "{stdout}");
    let (_, stdout) = binary("check").await;
    for sim in [&discovered, &listed] {
        let line = format!("OK   loxilb {}: reachable", sim.url());
        assert!(stdout.contains(&line), "no {line:?} in\n{stdout}");
    }

    resources
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    world.finish().await;
}
