//! The loxilb fleet's members (docs/fleet.md), against the real API server and simulators:
//! loxilbs discovered from the EndpointSlices of their Service, from kube-loxilb's LoxiURL
//! resources (a CRD installed while running, a `cidrpool` as an address pool), over HTTPS,
//! peering with each other, and a Node deletion reaching every loxilb at once. (Split from
//! `fleet.rs`, which keeps the HA roles.)

mod common;
#[path = "common/fleet_setup.rs"]
mod fleet_setup;

use std::time::{Duration, Instant};

use common::*;
use fleet_setup::*;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};

/// Discovery (docs/fleet.md#discovery): without `--loxilb-url`, the loxilbs are the ready
/// addresses of `loxilb-lb-service`'s EndpointSlices, in any namespace. A not-ready address
/// is left out; one that turns ready is programmed completely (roles, every Service's rules)
/// before Services count it; one that goes is dropped (Services count one instance again,
/// new rules go only to the others, and its role moves).
#[tokio::test]
async fn discovery_follows_the_loxilb_services_endpointslices() {
    let host = host_address();
    let a = Simulator::start((host, 0).into(), SimConfig::default())
        .await
        .unwrap();
    let b = Simulator::start((host, 0).into(), SimConfig::default())
        .await
        .unwrap();
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        discovery: true,
        admin_port: Some(admin_port),
        extra_args: vec!["--set-roles=0.0.0.0".into(), "--set-unique-ip".into()],
        ..Options::default()
    };
    let w = World::with("discovery", opts).await;
    w.add_node("node-a", "10.7.0.1").await;
    let svc = "loxilb-lb-service";
    let host = host.to_string();
    w.set_loxilb_slice(svc, "loxilb-a", &host, a.addr().port(), true)
        .await;
    w.set_loxilb_slice(svc, "loxilb-b", &host, b.addr().port(), false)
        .await;
    let programmed_on = |name: &'static str, n: &'static str| {
        let w = &w;
        async move {
            wait_for(&format!("{name} programmed on {n}"), WAIT, || async {
                let svc = w.get(name).await?;
                let (status, _, message) = World::condition(&svc, "loxilb.io/Programmed")?;
                (status == "True" && message.contains(&format!(" on {n} "))).then_some(())
            })
            .await
        }
    };
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    w.create(&World::lb_service("api", Some(CLASS), &[(81, "TCP")]))
        .await;
    let web_ip = w.wait_for_ip("web").await;
    let api_ip = w.wait_for_ip("api").await;
    programmed_on("web", "1/1").await;
    programmed_on("api", "1/1").await;
    let holds = |s: &Simulator, ip: &str| s.rules().iter().any(|r| r.external_ip == ip);
    assert!(holds(&a, &web_ip) && holds(&a, &api_ip));
    assert!(
        b.rules().is_empty(),
        "a loxilb that is not ready gets nothing"
    );
    assert_eq!(
        wait_sole_master(std::slice::from_ref(&a), "llb-inst0").await,
        0
    );

    // b turns ready: joins, is programmed, then counted.
    b.set_write_latency(Duration::from_millis(50));
    w.set_loxilb_slice(svc, "loxilb-b", &host, b.addr().port(), true)
        .await;
    programmed_on("web", "2/2").await;
    assert!(
        holds(&b, &web_ip) && holds(&b, &api_ip),
        "counted only once it holds every Service's rules"
    );
    assert_eq!(b.cluster_state("llb-inst0").as_deref(), Some("BACKUP"));

    // a goes: dropped, its role moves to b (a, still running, is told BACKUP: never two
    // masters), new rules go to b only.
    w.delete_loxilb_slice("loxilb-a").await;
    programmed_on("web", "1/1").await;
    wait_for("b MASTER, a BACKUP", WAIT, || async {
        (b.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && a.cluster_state("llb-inst0").as_deref() == Some("BACKUP"))
        .then_some(())
    })
    .await;
    w.create(&World::lb_service("late", Some(CLASS), &[(82, "TCP")]))
        .await;
    let late_ip = w.wait_for_ip("late").await;
    programmed_on("late", "1/1").await;
    assert!(holds(&b, &late_ip));
    assert!(!holds(&a, &late_ip), "a dropped loxilb gets no new rule");
    // Its gauges went with it (a series left behind would say it is still up).
    let a_label = format!("instance=\"{}\"", a.url());
    wait_for("a's gauges gone", WAIT, || async {
        let text = World::metrics_text(admin_port).await?;
        let role_label = format!("loxilb=\"{}\"", a.url());
        let left_behind = text.lines().any(|l| {
            (l.starts_with("loxi_ccm_loxilb_up{") && l.contains(&a_label))
                || (l.starts_with("loxi_ccm_loxilb_rules{") && l.contains(&a_label))
                || (l.starts_with("loxi_ccm_ha_roles{") && l.contains(&role_label))
        });
        (!left_behind).then_some(())
    })
    .await;
    w.finish().await;
}

/// kube-loxilb's `LoxiURL` resources (docs/fleet.md#loxiurl-resources): a resource of type
/// default adds its loxilbs to the fleet (programmed completely, then counted), its deletion
/// takes them out again; a `cidrpool` one that is no pool is refused with a Warning Event
/// naming it.
#[tokio::test]
async fn loxiurl_resources_add_and_remove_loxilbs() {
    use kube::api::{DeleteParams, PostParams};
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    let extra = sim().await;
    let (w, resources) = world_with_loxiurl_crd("loxiurl").await;
    let ip = w.serve_one_port("web", 80).await;
    let name = format!("{}-extra", w.ns);
    let res = LoxiURL::new(
        &name,
        LoxiURLSpec {
            loxi_url: extra.url(),
            kind: None,
            zone: Some("llb".into()),
        },
    );
    resources
        .create(&PostParams::default(), &res)
        .await
        .unwrap();
    let on = |n: &'static str| {
        let w = &w;
        async move {
            wait_for(&format!("web programmed on {n}"), WAIT, || async {
                let svc = w.get("web").await?;
                let (status, _, message) = World::condition(&svc, "loxilb.io/Programmed")?;
                (status == "True" && message.contains(&format!(" on {n} "))).then_some(())
            })
            .await
        }
    };
    on("2/2").await;
    assert!(extra.rules().iter().any(|r| r.external_ip == ip));
    resources
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    on("1/1").await;

    let pool = format!("{}-pool", w.ns);
    resources
        .create(&PostParams::default(), &cidrpool(&pool, "12.12.12.0/33"))
        .await
        .unwrap();
    invalid_loxiurl_event(
        &w,
        "a Warning Event on the bad cidrpool LoxiURL",
        &pool,
        None,
    )
    .await;
    let _ = resources.delete(&pool, &DeleteParams::default()).await;
    w.finish().await;
}

/// A `LoxiURL` CRD installed while the controller runs is followed without a restart
/// (docs/fleet.md#loxiurl-resources): the controller starts in a cluster without it, the CRD
/// shipped in `deploy/optional/loxiurl-crd.yaml` is installed, then a resource naming a second
/// loxilb, which gets the Service's rule.
#[tokio::test]
async fn a_loxiurl_crd_installed_while_running_is_followed() {
    use kube::api::{DeleteParams, PostParams};
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    let extra = sim().await;
    let mut w = World::with("loxiurllate", Options::default()).await;
    // A cluster without the CRD (another test of this binary may have installed it).
    delete_crds(&w.client, &["loxiurls.loxiurl.loxilb.io"]).await;
    w.stop_controller().await;
    w.start_controller(&Options::default()).await;
    w.add_node("node-a", "10.7.0.1").await;
    // Served on the world's loxilb: the controller runs, and has looked for the CRD.
    let ip = w.serve_one_port("web", 80).await;

    install_shipped_crds(&w.client, "optional/loxiurl-crd.yaml").await;
    let resources: Api<LoxiURL> = Api::all(w.client.clone());
    let name = format!("{}-late", w.ns);
    let res = LoxiURL::new(&name, LoxiURLSpec::of(&extra.url(), None));
    resources
        .create(&PostParams::default(), &res)
        .await
        .unwrap();
    wait_for("the LoxiURL's loxilb programmed", WAIT, || async {
        extra
            .rules()
            .iter()
            .any(|r| r.external_ip == ip)
            .then_some(())
    })
    .await;
    resources
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    w.finish().await;
}

/// The BGP neighbours of each simulator, as (address, remote AS).
fn neighbours(s: &Simulator) -> Vec<(String, u32)> {
    s.bgp()
        .neighbors
        .into_iter()
        .map(|n| (n.ip, n.remote_as))
        .collect()
}

/// With BGP on, the discovered loxilbs are each other's BGP neighbours (iBGP, as kube-loxilb
/// configures them in-cluster), and a loxilb that leaves is removed from the others'
/// neighbours. The loxilbs of `loxilb-peer-service` run BGP-peer-only: they get BGP settings
/// (peering with the rule-holding ones) and never a rule nor an HA role, and Services do not
/// count them (docs/fleet.md#bgp-peer-only-loxilbs). Simulators are told apart by address,
/// so this needs the machine's IPv4 and a global IPv6 address.
#[tokio::test]
async fn discovered_loxilbs_peer_with_each_other_and_peer_only_ones_get_bgp_only() {
    let Some(v6) = host_address_v6() else {
        eprintln!("skipped: this machine has no global IPv6 address to tell two loxilbs apart");
        return;
    };
    let v4 = host_address();
    let bgp = SimConfig {
        bgp: true,
        ..SimConfig::default()
    };
    let a = Simulator::start((v4, 0).into(), bgp.clone()).await.unwrap();
    let b = Simulator::start((v6, 0).into(), bgp).await.unwrap();
    let peer = Simulator::start(
        (v6, 0).into(),
        SimConfig {
            bgp_only: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let opts = Options {
        discovery: true,
        extra_args: vec![
            "--set-roles=0.0.0.0".into(),
            "--bgp-local-as=65100".into(),
            // The IPv6 loxilbs have no IPv4 address of their own to use.
            "--bgp-router-id=192.0.2.250".into(),
            // Only this test's loxilbs, whatever other tests left behind.
            format!("--loxilb-service-namespace={}", test_namespace("bgpmesh")),
            format!(
                "--loxilb-peer-service-namespace={}",
                test_namespace("bgpmesh")
            ),
        ],
        ..Options::default()
    };
    let w = World::with("bgpmesh", opts).await;
    w.add_node("node-a", "10.7.0.1").await;
    let (v4s, v6s) = (v4.to_string(), v6.to_string());
    w.set_loxilb_slice("loxilb-lb-service", "loxilb-a", &v4s, a.addr().port(), true)
        .await;
    w.set_loxilb_slice("loxilb-lb-service", "loxilb-b", &v6s, b.addr().port(), true)
        .await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    let programmed_on = |n: &'static str| {
        let w = &w;
        async move {
            wait_for(&format!("web programmed on {n}"), WAIT, || async {
                let svc = w.get("web").await?;
                let (status, _, message) = World::condition(&svc, "loxilb.io/Programmed")?;
                (status == "True" && message.contains(&format!(" on {n} "))).then_some(())
            })
            .await
        }
    };
    programmed_on("2/2").await;
    wait_for("a and b each other's neighbours", WAIT, || async {
        (neighbours(&a) == [(v6s.clone(), 65100)] && neighbours(&b) == [(v4s.clone(), 65100)])
            .then_some(())
    })
    .await;

    // b leaves: a forgets it.
    w.delete_loxilb_slice("loxilb-b").await;
    programmed_on("1/1").await;
    wait_for("b removed from a's neighbours", WAIT, || async {
        neighbours(&a).is_empty().then_some(())
    })
    .await;

    // A BGP-peer-only loxilb: BGP settings, peering with a; no rule, no role; not counted.
    w.set_loxilb_slice(
        "loxilb-peer-service",
        "loxilb-peer",
        &v6s,
        peer.addr().port(),
        true,
    )
    .await;
    wait_for("the peer-only loxilb and a peering", WAIT, || async {
        let global = peer.bgp().global?;
        (global.local_as == 65100
            && neighbours(&peer) == [(v4s.clone(), 65100)]
            && neighbours(&a) == [(v6s.clone(), 65100)])
        .then_some(())
    })
    .await;
    let writes = peer.writes_since_restart();
    assert!(
        writes.iter().all(|w| w.contains("/config/bgp/")),
        "only BGP calls reach a BGP-peer-only loxilb: {writes:?}"
    );
    assert!(peer.rules().is_empty());
    assert!(a.rules().iter().any(|r| r.external_ip == ip));
    let svc = w.get("web").await.unwrap();
    let (_, _, message) = World::condition(&svc, "loxilb.io/Programmed").unwrap();
    assert!(message.contains(" on 1/1 "), "not counted: {message}");
    assert_eq!(a.cluster_state("llb-inst0").as_deref(), Some("MASTER"));

    // It leaves: a forgets it too.
    w.delete_loxilb_slice("loxilb-peer").await;
    wait_for(
        "the peer-only loxilb removed from a's neighbours",
        WAIT,
        || async { neighbours(&a).is_empty().then_some(()) },
    )
    .await;
    w.finish().await;
}

/// A `LoxiURL` of type `cidrpool` (docs/fleet.md#loxiurl-resources) is an address pool named
/// after the resource: a Service naming it in `loxilb.io/poolSelect` gets an address from it
/// (one that names no pool does not); when the resource is deleted the address stays with its
/// Service, programmed, and a new Service naming the pool waits. A `cidrpool` whose name an
/// `AddressPool` has is refused with a Warning Event.
#[tokio::test]
async fn a_cidrpool_loxiurl_is_an_address_pool() {
    use kube::api::{DeleteParams, PostParams};
    use loxi_ccm::ipam::address_pools::{AddressPool, AddressPoolSpec};
    let (w, resources) = world_with_loxiurl_crd("cidrpool").await;

    let pool = format!("{}-pool", w.ns);
    resources
        .create(&PostParams::default(), &cidrpool(&pool, "198.51.100.0/29"))
        .await
        .unwrap();
    let named = |name: &str, port: i32| {
        annotated(
            World::lb_service(name, Some(CLASS), &[(port, "TCP")]),
            &[("loxilb.io/poolSelect", pool.as_str())],
        )
    };
    w.create(&named("in-pool", 80)).await;
    let ip = w.wait_for_ip("in-pool").await;
    assert!(ip.starts_with("198.51.100."), "from the cidrpool: {ip}");
    wait_for("its rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;
    let other = w.serve_one_port("no-pool", 81).await;
    assert!(
        other.starts_with("192.0.2."),
        "a cidrpool serves only the Services naming it: {other}"
    );
    let findings = w.audit(&Options::default()).await;
    assert!(
        findings.clean(),
        "the audit takes the cidrpool as a pool: {:?}",
        findings.violations
    );
    // Not even as an address kept from a pool that is gone.
    assert!(
        !findings.notes.iter().any(|n| n.contains(&ip)),
        "{:?}",
        findings.notes
    );

    // Deleted: the address stays with its Service, which stays programmed.
    resources
        .delete(&pool, &DeleteParams::default())
        .await
        .unwrap();
    w.create(&named("after", 82)).await;
    wait_for("a Service naming the deleted pool waits", WAIT, || async {
        let svc = w.get("after").await?;
        let (status, _, message) = World::condition(&svc, "loxilb.io/AddressAllocated")?;
        (status == "False" && message.contains(&pool)).then_some(())
    })
    .await;
    let svc = w.get("in-pool").await.unwrap();
    let shown: Vec<String> = svc
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| i.ip)
        .collect();
    assert_eq!(shown, std::slice::from_ref(&ip), "the address never moves");
    assert_eq!(w.rules_for(&ip).len(), 1);
    assert!(
        w.claims()
            .await
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some(ip.as_str())),
        "its claim stays"
    );

    // A cidrpool whose name an AddressPool has: refused, the AddressPool wins.
    let taken = format!("{}-taken", w.ns);
    let pools: Api<AddressPool> = Api::all(w.client.clone());
    pools
        .create(
            &PostParams::default(),
            &AddressPool::new(
                &taken,
                AddressPoolSpec {
                    addresses: vec!["203.0.113.0/29".into()],
                    auto_assign: false,
                    avoid_buggy_ips: true,
                    priority: 0,
                    disabled: false,
                    namespace_selector: None,
                    service_selector: None,
                    retain_addresses: None,
                    bgp_advertise: true,
                },
            ),
        )
        .await
        .unwrap();
    resources
        .create(
            &PostParams::default(),
            &cidrpool(&taken, "198.51.100.64/29"),
        )
        .await
        .unwrap();
    invalid_loxiurl_event(
        &w,
        "a Warning Event on the LoxiURL whose name is taken",
        &taken,
        Some("taken"),
    )
    .await;
    let taken_svc = annotated(
        World::lb_service("taken", Some(CLASS), &[(83, "TCP")]),
        &[("loxilb.io/poolSelect", taken.as_str())],
    );
    w.create(&taken_svc).await;
    let taken_ip = w.wait_for_ip("taken").await;
    assert!(
        taken_ip.starts_with("203.0.113."),
        "the AddressPool's: {taken_ip}"
    );
    let _ = resources.delete(&taken, &DeleteParams::default()).await;
    let _ = pools.delete(&taken, &DeleteParams::default()).await;
    w.finish().await;
}

/// `--loxilb-discovery-scheme=https` (docs/configuration.md#loxilb-authentication-and-tls):
/// the loxilbs found in the cluster, rule-holding and BGP-peer-only, are reached at
/// `https://<address>:<port>`, verified against `--loxilb-ca-file`, with the token.
#[tokio::test]
async fn discovered_loxilbs_are_reached_over_https() {
    let v4 = host_address();
    let ca = testenv::certs::TestCa::new("discovery test CA").unwrap();
    let ca_file =
        std::env::temp_dir().join(format!("loxi-ccm-fleet-test-{}-ca.crt", std::process::id()));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let tls_sim = |ip: std::net::IpAddr, cfg: SimConfig| {
        let cert = ca.server_cert(&[&ip.to_string()]).unwrap();
        async move {
            Simulator::start_tls((ip, 0).into(), cfg, &cert.cert_pem, &cert.key_pem)
                .await
                .unwrap()
        }
    };
    let token = Some("discovered-token".to_string());
    let a = tls_sim(
        v4,
        SimConfig {
            bgp: true,
            auth_token: token.clone(),
            ..SimConfig::default()
        },
    )
    .await;
    assert!(a.url().starts_with("https://"));
    // A BGP-peer-only one too, where the machine has a second (IPv6) address.
    let v6 = host_address_v6();
    let peer = match v6 {
        Some(ip) => Some(
            tls_sim(
                ip,
                SimConfig {
                    bgp_only: true,
                    auth_token: token.clone(),
                    ..SimConfig::default()
                },
            )
            .await,
        ),
        None => {
            eprintln!("no global IPv6 address: the BGP-peer-only part is skipped");
            None
        }
    };
    let opts = Options {
        discovery: true,
        extra_args: vec![
            "--loxilb-discovery-scheme=https".into(),
            format!("--loxilb-ca-file={}", ca_file.display()),
            "--loxilb-token=discovered-token".into(),
            "--bgp-local-as=65100".into(),
            "--bgp-router-id=192.0.2.250".into(),
            format!(
                "--loxilb-service-namespace={}",
                test_namespace("discoveryhttps")
            ),
            format!(
                "--loxilb-peer-service-namespace={}",
                test_namespace("discoveryhttps")
            ),
        ],
        ..Options::default()
    };
    let w = World::with("discoveryhttps", opts).await;
    w.add_node("node-a", "10.7.0.1").await;
    w.set_loxilb_slice(
        "loxilb-lb-service",
        "loxilb-a",
        &v4.to_string(),
        a.addr().port(),
        true,
    )
    .await;
    if let (Some(peer), Some(v6)) = (&peer, v6) {
        w.set_loxilb_slice(
            "loxilb-peer-service",
            "loxilb-peer",
            &v6.to_string(),
            peer.addr().port(),
            true,
        )
        .await;
    }
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("web programmed over HTTPS", WAIT, || async {
        let svc = w.get("web").await?;
        let (status, _, message) = World::condition(&svc, "loxilb.io/Programmed")?;
        (status == "True" && message.contains(" on 1/1 ")).then_some(())
    })
    .await;
    assert!(a.rules().iter().any(|r| r.external_ip == ip));
    if let (Some(peer), Some(v6)) = (&peer, v6) {
        wait_for(
            "the peer-only loxilb configured over HTTPS",
            WAIT,
            || async {
                (neighbours(peer) == [(v4.to_string(), 65100)]
                    && neighbours(&a) == [(v6.to_string(), 65100)])
                .then_some(())
            },
        )
        .await;
    }
    let _ = std::fs::remove_file(&ca_file);
    w.finish().await;
}

/// Every loxilb of a group is programmed at once for a Service (`service::apply`): with three
/// loxilbs each taking 1 s per rule write (a real loxilb's pace), a Node deletion reaches all
/// three in under 1.5 s (one loxilb after the other took about 3 s).
#[tokio::test]
async fn a_node_deletion_reaches_every_loxilb_at_once() {
    let (b, c) = (sim().await, sim().await);
    let opts = Options {
        extra_args: vec![
            format!("--loxilb-url={}", b.url()),
            format!("--loxilb-url={}", c.url()),
        ],
        ..Options::default()
    };
    let w = World::with("fleetconcurrent", opts).await;
    let sims = vec![w.sim.clone(), b, c];
    w.add_node("fleetcc-a", "10.8.0.1").await;
    w.add_node("fleetcc-b", "10.8.0.2").await;
    w.serve_one_port("web", 80).await;
    let gone: std::net::IpAddr = "10.8.0.2".parse().unwrap();
    wait_for("the rule on every loxilb", WAIT, || async {
        sims.iter()
            .all(|s| s.count_rules_with_endpoint(gone) == 1)
            .then_some(())
    })
    .await;
    for s in &sims {
        s.set_rule_write_latency(Duration::from_secs(1));
    }
    let started = Instant::now();
    w.nodes
        .delete("fleetcc-b", &Default::default())
        .await
        .unwrap();
    wait_for("the Node gone from every loxilb", WAIT, || async {
        sims.iter()
            .all(|s| s.count_rules_with_endpoint(gone) == 0)
            .then_some(())
    })
    .await;
    let took = started.elapsed();
    eprintln!("a Node deletion reached 3 loxilbs (1 s per rule write) in {took:?}");
    assert!(
        took < Duration::from_millis(1500),
        "a Node deletion reached the three loxilbs in {took:?}"
    );
    for s in &sims {
        s.set_rule_write_latency(Duration::ZERO);
    }
    w.finish().await;
}

/// A world whose controller started after kube-loxilb's `LoxiURL` CRD was served, with a
/// Ready Node, and the API of the `LoxiURL` resources.
async fn world_with_loxiurl_crd(name: &str) -> (World, Api<loxi_ccm::config::sources::LoxiURL>) {
    use kube::CustomResourceExt;
    use kube::api::PostParams;
    use loxi_ccm::config::sources::LoxiURL;
    let mut w = World::with(name, Options::default()).await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(w.client.clone());
    let _ = crds.create(&PostParams::default(), &LoxiURL::crd()).await;
    let resources: Api<LoxiURL> = Api::all(w.client.clone());
    wait_for("the LoxiURL CRD served", WAIT, || async {
        resources.list(&Default::default()).await.ok().map(|_| ())
    })
    .await;
    w.stop_controller().await;
    w.start_controller(&Options::default()).await;
    w.add_node("node-a", "10.7.0.1").await;
    (w, resources)
}

/// A `cidrpool` LoxiURL: `cidr` as an address pool named `name`.
fn cidrpool(name: &str, cidr: &str) -> loxi_ccm::config::sources::LoxiURL {
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    LoxiURL::new(
        name,
        LoxiURLSpec {
            loxi_url: cidr.into(),
            kind: Some("cidrpool".into()),
            zone: None,
        },
    )
}

/// Waits for an `InvalidLoxiURL` Event about the LoxiURL `name` (whose note has `note` in it,
/// when given).
async fn invalid_loxiurl_event(w: &World, what: &str, name: &str, note: Option<&str>) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(w.client.clone());
    wait_for(what, WAIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("InvalidLoxiURL")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && note.is_none_or(|note| e.note.as_deref().is_some_and(|n| n.contains(note)))
            })
            .then_some(())
    })
    .await;
}
