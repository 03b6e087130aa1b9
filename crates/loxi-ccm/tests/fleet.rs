//! The loxilb fleet's HA roles (docs/fleet.md), against the real API server and several
//! simulators: exactly one MASTER per HA instance, spread over the loxilbs; a master that
//! stops answering is replaced within 2 s of being seen down, and does not take the role
//! back when it returns; a controller restart and a leader change keep every master (the
//! record); a restarted loxilb gets its role before its BGP and its rules; rules carry their
//! Service's HA instance, which is recorded on the Service and never changes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use loxilb_sim::{SimConfig, Simulator};

async fn sim() -> Simulator {
    Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap()
}

/// Among the simulators that are up: the index of the only one that is MASTER for
/// `instance` while every other one is BACKUP, else `None`.
async fn sole_master(sims: &[Simulator], instance: &str) -> Option<usize> {
    sole_master_without(sims, instance, usize::MAX).await
}

async fn wait_sole_master(sims: &[Simulator], instance: &str) -> usize {
    wait_for(&format!("one MASTER for {instance}"), WAIT, || async {
        sole_master(sims, instance).await
    })
    .await
}

/// The HA role record (HA instance -> master URL).
async fn record(w: &World) -> std::collections::BTreeMap<String, String> {
    let api: Api<ConfigMap> = Api::namespaced(w.client.clone(), &w.ns);
    api.get_opt("loxi-ccm-ha-roles")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .unwrap_or_default()
}

fn url_label(s: &Simulator) -> String {
    format!("loxilb=\"{}\"", s.url())
}

/// Waits until the controller serving metrics on `port` has posted `role` for `instance`
/// to `s`.
async fn wait_posted(port: u16, s: &Simulator, instance: &str, role: &str) {
    let inst = format!("ha_instance=\"{instance}\"");
    let role_label = format!("role=\"{role}\"");
    wait_for(&format!("{role} posted to {}", s.url()), WAIT, || async {
        let v = World::metric_sum(
            port,
            "loxi_ccm_ha_roles",
            &[&inst, &url_label(s), &role_label],
        )
        .await?;
        (v == 1.0).then_some(())
    })
    .await;
}

/// Three loxilbs, two HA instances: one master each, on different loxilbs, recorded. The
/// master of `llb-inst0` goes down: another takes over within 2 s of the controller seeing
/// it down; back up, the old master is made BACKUP and the role stays where it went.
#[tokio::test]
async fn one_master_per_instance_failover_and_no_flapping() {
    let (b, c) = (sim().await, sim().await);
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args: vec![
            format!("--loxilb-url={}", b.url()),
            format!("--loxilb-url={}", c.url()),
            "--set-roles=0.0.0.0".into(),
            "--num-zone-instances=2".into(),
        ],
        ..Options::default()
    };
    let w = World::with("hafailover", opts).await;
    let sims = vec![w.sim.clone(), b, c];
    let m0 = wait_sole_master(&sims, "llb-inst0").await;
    let m1 = wait_sole_master(&sims, "llb-inst1").await;
    assert_ne!(m0, m1, "the instances are spread over the loxilbs");
    for s in &sims {
        let vips: Vec<String> = s.cluster_states().into_iter().map(|(_, _, v)| v).collect();
        assert!(vips.iter().all(|v| v == "0.0.0.0"), "{vips:?}");
    }
    wait_for("the roles recorded", WAIT, || async {
        let r = record(&w).await;
        (r.get("llb-inst0") == Some(&sims[m0].url()) && r.get("llb-inst1") == Some(&sims[m1].url()))
            .then_some(())
    })
    .await;

    let down_at = Instant::now();
    sims[m0].go_down().await;
    let up_label = format!("instance=\"{}\"", sims[m0].url());
    wait_for("the master seen down", WAIT, || async {
        let up = World::metric_sum(admin_port, "loxi_ccm_loxilb_up", &[&up_label]).await?;
        (up == 0.0).then_some(())
    })
    .await;
    let seen = Instant::now();
    let new = wait_sole_master(&sims, "llb-inst0").await;
    let (after_seen, after_down) = (seen.elapsed(), down_at.elapsed());
    eprintln!(
        "failover: new master {after_seen:?} after the master was seen down, {after_down:?} after it went down"
    );
    assert_ne!(new, m0);
    assert!(
        after_seen < Duration::from_secs(2),
        "new master {after_seen:?} after the failure was seen"
    );
    // The metric is polled, so "seen" may be noticed late: bound the whole span too (one
    // 200 ms health interval to notice, then 2 s).
    assert!(
        after_down < Duration::from_millis(2200),
        "new master {after_down:?} after the master went down"
    );
    assert_eq!(sole_master(&sims, "llb-inst1").await, Some(m1));

    sims[m0].come_up().await.unwrap();
    wait_for("the old master made BACKUP", WAIT, || async {
        (sims[m0].cluster_state("llb-inst0").as_deref() == Some("BACKUP")).then_some(())
    })
    .await;
    assert_eq!(sole_master(&sims, "llb-inst0").await, Some(new));
    wait_for("the new master recorded", WAIT, || async {
        (record(&w).await.get("llb-inst0") == Some(&sims[new].url())).then_some(())
    })
    .await;
    let failovers = World::metric_sum(
        admin_port,
        "loxi_ccm_ha_failovers_total",
        &["ha_instance=\"llb-inst0\""],
    )
    .await;
    assert_eq!(failovers, Some(1.0));
    w.finish().await;
}

/// Roles survive the controller: after a failover the master is not the loxilb a fresh
/// decision would pick (the first by URL); a restarted controller and then a new leader keep
/// it, and never post MASTER to the other (its state would show it).
#[tokio::test]
async fn a_restart_and_a_leader_change_keep_the_masters() {
    let other = sim().await;
    let port1 = testenv::free_port().unwrap();
    let opts = |port: u16| Options {
        admin_port: Some(port),
        extra_args: vec![
            format!("--loxilb-url={}", other.url()),
            "--set-roles=0.0.0.0".into(),
        ],
        ..Options::default()
    };
    let mut w = World::with("harestart", opts(port1)).await;
    let sims = vec![w.sim.clone(), other.clone()];
    let first = wait_sole_master(&sims, "llb-inst0").await;
    sims[first].go_down().await;
    let kept = wait_for("the other loxilb MASTER", WAIT, || async {
        sole_master(&sims, "llb-inst0")
            .await
            .filter(|m| *m != first)
    })
    .await;
    sims[first].come_up().await.unwrap();
    wait_for("the old master BACKUP", WAIT, || async {
        (sole_master(&sims, "llb-inst0").await == Some(kept)).then_some(())
    })
    .await;
    wait_for("the move recorded", WAIT, || async {
        (record(&w).await.get("llb-inst0") == Some(&sims[kept].url())).then_some(())
    })
    .await;

    // A restarted controller reads the record.
    w.stop_controller().await;
    let port2 = testenv::free_port().unwrap();
    w.start_controller(&opts(port2)).await;
    wait_posted(port2, &sims[kept], "llb-inst0", "MASTER").await;
    wait_posted(port2, &sims[first], "llb-inst0", "BACKUP").await;
    assert_eq!(sole_master(&sims, "llb-inst0").await, Some(kept));

    // A standby takes over when the leader stops, and keeps the masters too.
    let port3 = testenv::free_port().unwrap();
    let standby = w.spawn_controller(&opts(port3));
    w.stop_controller().await;
    wait_posted(port3, &sims[kept], "llb-inst0", "MASTER").await;
    wait_posted(port3, &sims[first], "llb-inst0", "BACKUP").await;
    assert_eq!(sole_master(&sims, "llb-inst0").await, Some(kept));
    assert_eq!(record(&w).await.get("llb-inst0"), Some(&sims[kept].url()));
    w.controller = Some(standby);
    w.finish().await;
}

/// A loxilb that restarts empty gets its HA role back first, then its BGP settings, then
/// its rules (docs/loxilb-api.md#replay-order).
#[tokio::test]
async fn a_restarted_loxilb_gets_its_role_before_bgp_and_rules() {
    let bgp = SimConfig {
        bgp: true,
        ..SimConfig::default()
    };
    let opts = Options {
        extra_args: vec![
            "--set-roles=0.0.0.0".into(),
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.250:65001".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("harestartorder", opts, bgp).await;
    w.add_node("node-a", "10.7.0.1").await;
    let ip = w.serve_one_port("web", 80).await;
    // At the controller's start the role waits for the first role decision (after the HA
    // record is read), which may come after the first rules.
    wait_for("the start-up role", WAIT, || async {
        (w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")).then_some(())
    })
    .await;
    // The start-up replay is over (its BGP part comes last but one) before the restart.
    wait_for("BGP configured", WAIT, || async {
        let bgp = w.sim.bgp();
        (bgp.global.is_some() && !bgp.neighbors.is_empty()).then_some(())
    })
    .await;
    w.sim.restart();
    wait_for("role, BGP and rule back", WAIT, || async {
        (w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && w.rules_for(&ip).len() == 1
            && w.sim.bgp().global.is_some())
        .then_some(())
    })
    .await;
    let log = w.sim.writes_since_restart();
    // The replay the restart caused is the one that sends the global BGP settings last:
    // the HA role comes right before them. (A start-up replay still finishing when the
    // simulator restarted, or a neighbour check of the health tick, may write before the
    // restart is seen.)
    let global = log
        .iter()
        .rposition(|l| l == "POST /config/bgp/global")
        .unwrap_or_else(|| panic!("no BGP global in {log:?}"));
    assert!(
        global > 0 && log[global - 1] == "POST /config/cistate",
        "{log:?}"
    );
    w.finish().await;
}

/// Rules name their Service's HA instance: the one `loxilb.io/zoneinstance` names, else the
/// least used one, recorded on the Service (and kept when the number of instances changes);
/// an instance that does not exist is refused with a condition naming the annotation.
#[tokio::test]
async fn rules_carry_the_services_ha_instance_which_never_changes() {
    // One address per Service (no sharing), so each address's rules are one Service's.
    let opts = |n: u16| Options {
        extra_args: vec![
            format!("--num-zone-instances={n}"),
            "--set-unique-ip".into(),
        ],
        ..Options::default()
    };
    let mut w = World::with("hainstance", opts(2)).await;
    w.add_node("node-a", "10.7.0.1").await;
    let pinned = annotated(
        World::lb_service("pinned", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/zoneinstance", "1")],
    );
    w.create(&pinned).await;
    let pinned_ip = w.wait_for_ip("pinned").await;
    let sim = w.sim.clone();
    let names_for = |ip: &str| -> Vec<String> {
        sim.rules()
            .into_iter()
            .filter(|r| r.external_ip == ip)
            .map(|r| r.name)
            .collect()
    };
    wait_for("the pinned Service's rule", WAIT, || async {
        let names = names_for(&pinned_ip);
        (names.len() == 1).then_some(())
    })
    .await;
    assert!(
        names_for(&pinned_ip)[0].ends_with(":llb-inst1"),
        "{:?}",
        names_for(&pinned_ip)
    );

    let auto_ip = w.serve_one_port("auto", 81).await;
    let recorded = |svc: &k8s_openapi::api::core::v1::Service| {
        svc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("loxilb.io/zoneinstance").cloned())
    };
    let auto = w.get("auto").await.unwrap();
    assert_eq!(
        recorded(&auto).as_deref(),
        Some("llb-inst0"),
        "the least used"
    );
    assert!(names_for(&auto_ip)[0].ends_with(":llb-inst0"));

    let bad = annotated(
        World::lb_service("bad", Some(CLASS), &[(82, "TCP")]),
        &[("loxilb.io/zoneinstance", "llb-inst7")],
    );
    w.create(&bad).await;
    let (status, reason, message) = wait_for("the bad instance refused", WAIT, || async {
        let svc = w.get("bad").await?;
        World::condition(&svc, "loxilb.io/Programmed").filter(|(s, _, _)| s == "False")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InvalidAnnotation")
    );
    assert!(message.contains("loxilb.io/zoneinstance"), "{message}");

    // More instances later: the recorded instance stays.
    w.stop_controller().await;
    w.start_controller(&opts(3)).await;
    w.create(&World::lb_service("later", Some(CLASS), &[(83, "TCP")]))
        .await;
    let later_ip = w.wait_for_ip("later").await;
    wait_for("the later Service's rule", WAIT, || async {
        (names_for(&later_ip).len() == 1).then_some(())
    })
    .await;
    assert!(
        names_for(&later_ip)[0].ends_with(":llb-inst2"),
        "{:?}",
        names_for(&later_ip)
    );
    assert_eq!(
        recorded(&w.get("auto").await.unwrap()).as_deref(),
        Some("llb-inst0")
    );
    assert!(names_for(&auto_ip)[0].ends_with(":llb-inst0"));
    w.finish().await;
}

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
    use kube::CustomResourceExt;
    use kube::api::{DeleteParams, PostParams};
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    let extra = sim().await;
    let mut w = World::with("loxiurl", Options::default()).await;
    // The CRD (kube-loxilb's group and kind), then a controller that sees it.
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
    let res = LoxiURL::new(
        &pool,
        LoxiURLSpec {
            loxi_url: "12.12.12.0/33".into(),
            kind: Some("cidrpool".into()),
            zone: None,
        },
    );
    resources
        .create(&PostParams::default(), &res)
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(w.client.clone());
    wait_for(
        "a Warning Event on the bad cidrpool LoxiURL",
        WAIT,
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("InvalidLoxiURL")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(pool.as_str())
                })
                .then_some(())
        },
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
    use kube::CustomResourceExt;
    use kube::api::{DeleteParams, PostParams};
    use loxi_ccm::config::sources::{LoxiURL, LoxiURLSpec};
    use loxi_ccm::ipam::address_pools::{AddressPool, AddressPoolSpec};
    let mut w = World::with("cidrpool", Options::default()).await;
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

    let pool = format!("{}-pool", w.ns);
    resources
        .create(
            &PostParams::default(),
            &LoxiURL::new(
                &pool,
                LoxiURLSpec {
                    loxi_url: "198.51.100.0/29".into(),
                    kind: Some("cidrpool".into()),
                    zone: None,
                },
            ),
        )
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
            &LoxiURL::new(
                &taken,
                LoxiURLSpec {
                    loxi_url: "198.51.100.64/29".into(),
                    kind: Some("cidrpool".into()),
                    zone: None,
                },
            ),
        )
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(w.client.clone());
    wait_for(
        "a Warning Event on the LoxiURL whose name is taken",
        WAIT,
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("InvalidLoxiURL")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(taken.as_str())
                        && e.note.as_deref().is_some_and(|n| n.contains("taken"))
                })
                .then_some(())
        },
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

/// Among the simulators that are up, `skip` left out: the index of the only MASTER for
/// `instance` while the others are BACKUP.
async fn sole_master_without(sims: &[Simulator], instance: &str, skip: usize) -> Option<usize> {
    let mut master = None;
    for (i, s) in sims.iter().enumerate() {
        if i == skip || !s.is_up().await {
            continue;
        }
        match s.cluster_state(instance).as_deref() {
            Some("MASTER") if master.is_none() => master = Some(i),
            Some("BACKUP") => {}
            _ => return None,
        }
    }
    master
}

/// A world with a second loxilb, `--set-roles` and `extra` flags: the world, its two
/// simulators, and which of them is MASTER of `llb-inst0`.
async fn two_with_roles(name: &str, extra: &[&str]) -> (World, Vec<Simulator>, usize) {
    let other = sim().await;
    let mut extra_args = vec![
        format!("--loxilb-url={}", other.url()),
        "--set-roles=0.0.0.0".to_string(),
    ];
    extra_args.extend(extra.iter().map(|s| s.to_string()));
    let opts = Options {
        extra_args,
        ..Options::default()
    };
    let w = World::with(name, opts).await;
    let sims = vec![w.sim.clone(), other];
    let master = wait_sole_master(&sims, "llb-inst0").await;
    (w, sims, master)
}

/// How long a failover test waits for the new MASTER (`FAILOVER_WAIT_SECS`, default 30):
/// longer to measure how late an older build is.
fn failover_wait() -> Duration {
    std::env::var("FAILOVER_WAIT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(WAIT, Duration::from_secs)
}

/// Waits until the controller on `port` reports `s` down (`loxi_ccm_loxilb_up` 0): the health
/// check that sees it gone.
async fn wait_seen_down(port: u16, s: &Simulator, within: Duration) -> Instant {
    let label = format!("instance=\"{}\"", s.url());
    wait_for("the loxilb seen down", within, || async {
        let up = World::metric_sum(port, "loxi_ccm_loxilb_up", &[&label]).await?;
        (up == 0.0).then_some(())
    })
    .await;
    Instant::now()
}

/// A failover never waits for a replay (one worker per loxilb): three loxilbs with roles and
/// BGP, each taking 1 s per rule write (a real loxilb's pace) and its goBGP 9 s late after a
/// start; a BACKUP restarts, so that its replay of 200 rules runs; the MASTER goes down during
/// it → another MASTER within 1 s of the health check that sees it gone. (With the replay in
/// the health tick, the MASTER was not even seen gone until the replay ended.)
#[tokio::test]
async fn failover_during_a_replay() {
    let bgp = || SimConfig {
        bgp: true,
        ..SimConfig::default()
    };
    let start = || async {
        Simulator::start("127.0.0.1:0".parse().unwrap(), bgp())
            .await
            .unwrap()
    };
    let (b, c) = (start().await, start().await);
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args: vec![
            format!("--loxilb-url={}", b.url()),
            format!("--loxilb-url={}", c.url()),
            "--set-roles=0.0.0.0".into(),
            "--bgp-local-as=65100".into(),
            "--bgp-peers=192.0.2.250:65001".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("hareplay", opts, bgp()).await;
    let sims = vec![w.sim.clone(), b, c];
    w.add_node("hareplay-a", "10.9.0.1").await;
    // 200 rules: two Services of 100 ports each.
    for name in ["many-a", "many-b"] {
        let ports: Vec<(i32, &str)> = (0..100).map(|p| (8000 + p, "TCP")).collect();
        w.create(&World::lb_service(name, Some(CLASS), &ports))
            .await;
    }
    wait_for(
        "200 rules on every loxilb",
        Duration::from_secs(120),
        || async { sims.iter().all(|s| s.rules().len() == 200).then_some(()) },
    )
    .await;
    let master = wait_sole_master(&sims, "llb-inst0").await;
    let backup = (master + 1) % sims.len();
    for s in &sims {
        s.set_rule_write_latency(Duration::from_secs(1));
        s.set_gobgp_delay(Duration::from_secs(9));
    }
    sims[backup].restart();
    wait_for("the BACKUP's replay under way", WAIT, || async {
        (sims[backup].rules().len() >= 2).then_some(())
    })
    .await;
    let down_at = Instant::now();
    sims[master].go_down().await;
    let seen = wait_seen_down(admin_port, &sims[master], failover_wait()).await;
    let new = wait_for("another MASTER", failover_wait(), || async {
        sole_master_without(&sims, "llb-inst0", master).await
    })
    .await;
    let (after_seen, after_down) = (seen.elapsed(), down_at.elapsed());
    let replayed = sims[backup].rules().len();
    eprintln!(
        "failover during a replay: new master {after_seen:?} after the master was seen down, \
         {after_down:?} after it went down ({replayed} of 200 rules replayed on the restarted BACKUP)"
    );
    assert_ne!(new, master);
    assert!(replayed < 200, "the replay was over: {replayed}");
    assert!(
        after_seen < Duration::from_secs(1),
        "new master {after_seen:?} after the failure was seen"
    );
    // The metric is polled, so "seen" may be noticed late: bound the whole span too (one
    // 200 ms interval to notice, then 1 s, with room for a loaded machine).
    assert!(
        after_down < Duration::from_millis(2500),
        "new master {after_down:?} after the master went down"
    );
    for s in &sims {
        s.set_rule_write_latency(Duration::ZERO);
    }
    w.finish().await;
}

/// A MASTER that hangs (accepts connections, never answers) is replaced within one health
/// interval plus one probe timeout (`--loxilb-timeout`, here 2 s): the probe makes a single
/// attempt.
#[tokio::test]
async fn a_hanging_master_is_replaced_within_one_probe_timeout() {
    let (w, sims, master) = two_with_roles("hahang", &["--loxilb-timeout=2s"]).await;
    let frozen = Instant::now();
    sims[master].set_latency(Duration::from_secs(3600));
    let new = wait_for("another MASTER", WAIT, || async {
        sole_master_without(&sims, "llb-inst0", master).await
    })
    .await;
    let took = frozen.elapsed();
    eprintln!("a hanging MASTER replaced after {took:?} (health interval 200 ms, timeout 2 s)");
    assert_ne!(new, master);
    // One interval (200 ms) + one timeout (2 s) + the post, with room for a loaded machine.
    assert!(
        took < Duration::from_millis(3200),
        "replaced after {took:?}"
    );
    sims[master].set_latency(Duration::ZERO);
    w.finish().await;
}

/// A MASTER that comes back with its state kept (it still says MASTER) is told BACKUP before
/// anything else, as soon as it answers: never two MASTERs of one instance for longer than
/// that first call.
#[tokio::test]
async fn a_returning_master_is_told_backup_first() {
    let (w, sims, master) = two_with_roles("hareturn", &[]).await;
    w.add_node("hareturn-a", "10.9.1.1").await;
    w.serve_one_port("web", 80).await;
    sims[master].go_down().await;
    wait_for("another MASTER", WAIT, || async {
        sole_master_without(&sims, "llb-inst0", master).await
    })
    .await;
    let before = sims[master].write_log().len();
    assert_eq!(
        sims[master].cluster_state("llb-inst0").as_deref(),
        Some("MASTER"),
        "the state is kept while down"
    );
    let back = Instant::now();
    sims[master].come_up().await.unwrap();
    wait_for("the old master BACKUP", WAIT, || async {
        (sims[master].cluster_state("llb-inst0").as_deref() == Some("BACKUP")).then_some(())
    })
    .await;
    let two_masters = back.elapsed();
    let writes: Vec<String> = sims[master].write_log()[before..]
        .iter()
        .map(|w| format!("{} {}", w.method, w.path))
        .collect();
    eprintln!("a returning MASTER told BACKUP {two_masters:?} after it answered again: {writes:?}");
    assert_eq!(
        writes.first().map(String::as_str),
        Some("POST /config/cistate"),
        "{writes:?}"
    );
    assert!(
        two_masters < Duration::from_millis(500),
        "two MASTERs for {two_masters:?}"
    );
    w.finish().await;
}

/// A controller that takes over places the restart marker once and lists the rules once.
#[tokio::test]
async fn a_takeover_places_the_marker_and_lists_once() {
    let port1 = testenv::free_port().unwrap();
    let opts = |port: u16| Options {
        admin_port: Some(port),
        ..Options::default()
    };
    let mut w = World::with("takeover", opts(port1)).await;
    w.add_node("takeover-a", "10.9.2.1").await;
    w.serve_one_port("web", 80).await;
    w.stop_controller().await;
    let before = w.sim.write_log().len();
    let port2 = testenv::free_port().unwrap();
    w.start_controller(&opts(port2)).await;
    let label = format!("instance=\"{}\"", w.sim.url());
    wait_for("the first listing", WAIT, || async {
        World::metric_sum(
            port2,
            "loxi_ccm_loxilb_calls_total",
            &[&label, "op=\"list\""],
        )
        .await
        .filter(|n| *n >= 1.0)
    })
    .await;
    // Whatever follows the take-over comes within a few health intervals.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let markers = w.sim.write_log()[before..]
        .iter()
        .filter(|w| w.method == "POST" && w.path.starts_with("/config/cistate"))
        .count();
    let lists = World::metric_sum(
        port2,
        "loxi_ccm_loxilb_calls_total",
        &[&label, "op=\"list\""],
    )
    .await
    .unwrap_or_default();
    eprintln!("take-over: {markers} marker write(s), {lists} listing(s)");
    assert_eq!(markers, 1, "restart marker writes");
    assert_eq!(lists, 1.0, "rule listings");
    w.finish().await;
}

/// With BGP on, the roles follow reachability: a MASTER whose sessions with the configured
/// peers are all down, while another loxilb has one ESTABLISHED, is replaced after the hold
/// time (`--ha-bgp-hold`, here 2 s); a session that goes down and up again within it moves
/// nothing. A loxilb that stops answering has its sessions reported down at once.
#[tokio::test]
async fn roles_follow_bgp_reachability() {
    let bgp = || SimConfig {
        bgp: true,
        ..SimConfig::default()
    };
    let other = Simulator::start("127.0.0.1:0".parse().unwrap(), bgp())
        .await
        .unwrap();
    let admin_port = testenv::free_port().unwrap();
    let peer = "192.0.2.250";
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args: vec![
            format!("--loxilb-url={}", other.url()),
            "--set-roles=0.0.0.0".into(),
            "--bgp-local-as=65100".into(),
            format!("--bgp-peers={peer}:65001"),
            "--ha-bgp-hold=2s".into(),
        ],
        ..Options::default()
    };
    let w = World::with_sim("hareach", opts, bgp()).await;
    let sims = vec![w.sim.clone(), other];
    let master = wait_sole_master(&sims, "llb-inst0").await;
    let backup = 1 - master;
    for s in &sims {
        wait_for("the peer configured", WAIT, || async {
            s.set_bgp_peer_state(peer, "ESTABLISHED", None)
                .then_some(())
        })
        .await;
    }
    // A flap shorter than the hold time moves nothing.
    sims[master].set_bgp_peer_state(peer, "ACTIVE", None);
    tokio::time::sleep(Duration::from_millis(800)).await;
    sims[master].set_bgp_peer_state(peer, "ESTABLISHED", None);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        sole_master(&sims, "llb-inst0").await,
        Some(master),
        "a flap moved the role"
    );
    // Down for good: the other loxilb is MASTER after the hold time.
    let cut = Instant::now();
    sims[master].set_bgp_peer_state(peer, "ACTIVE", None);
    wait_for("the reachable loxilb MASTER", WAIT, || async {
        (sole_master(&sims, "llb-inst0").await == Some(backup)).then_some(())
    })
    .await;
    let took = cut.elapsed();
    eprintln!("a MASTER cut off from its BGP peers replaced after {took:?} (hold 2 s)");
    assert!(
        took >= Duration::from_secs(2),
        "before the hold time: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "replaced after {took:?}");
    // Its sessions back: the role stays where it went.
    sims[master].set_bgp_peer_state(peer, "ESTABLISHED", None);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sole_master(&sims, "llb-inst0").await, Some(backup));
    // A loxilb that stops answering: its session reported down at once.
    let gone = Instant::now();
    sims[backup].go_down().await;
    let label = format!("loxilb=\"{}\"", sims[backup].url());
    wait_for(
        "the session of the dead loxilb reported down",
        WAIT,
        || async {
            let up = World::metric_sum(
                admin_port,
                "loxi_ccm_bgp_sessions",
                &[&label, "state=\"ESTABLISHED\""],
            )
            .await?;
            let down = World::metric_sum(
                admin_port,
                "loxi_ccm_bgp_sessions",
                &[&label, "state=\"UNKNOWN\""],
            )
            .await?;
            (up == 0.0 && down == 1.0).then_some(())
        },
    )
    .await;
    let reported = gone.elapsed();
    eprintln!("the sessions of a loxilb that stopped answering reported down after {reported:?}");
    assert!(reported < Duration::from_secs(2), "{reported:?}");
    w.finish().await;
}
