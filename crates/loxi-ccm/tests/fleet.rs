//! The loxilb fleet's HA roles (docs/fleet.md), against the real API server and several
//! simulators: exactly one MASTER per HA instance, spread over the loxilbs; a master that
//! stops answering is replaced within 2 s of being seen down, and does not take the role
//! back when it returns; a controller restart and a leader change keep every master (the
//! record); a restarted loxilb gets its role before its BGP and its rules; rules carry their
//! Service's HA instance, which is recorded on the Service and never changes.

mod common;
#[path = "common/fleet_setup.rs"]
mod fleet_setup;

use std::time::{Duration, Instant};

use common::*;
use fleet_setup::*;
use loxilb_sim::Simulator;

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
    let opts = Options {
        extra_args: roles_and_bgp_args(),
        ..Options::default()
    };
    let w = World::with_sim("harestartorder", opts, bgp_sim()).await;
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

/// A failover never waits for a replay (one worker per loxilb): three loxilbs with roles and
/// BGP, each taking 1 s per rule write (a real loxilb's pace) and its goBGP 9 s late after a
/// start; a BACKUP restarts, so that its replay of 200 rules runs; the MASTER goes down during
/// it → another MASTER within 1 s of the health check that sees it gone. (With the replay in
/// the health tick, the MASTER was not even seen gone until the replay ended.)
#[tokio::test]
async fn failover_during_a_replay() {
    let start = || async {
        Simulator::start("127.0.0.1:0".parse().unwrap(), bgp_sim())
            .await
            .unwrap()
    };
    let (b, c) = (start().await, start().await);
    let admin_port = testenv::free_port().unwrap();
    let mut extra_args = vec![
        format!("--loxilb-url={}", b.url()),
        format!("--loxilb-url={}", c.url()),
    ];
    extra_args.extend(roles_and_bgp_args());
    let opts = Options {
        admin_port: Some(admin_port),
        extra_args,
        ..Options::default()
    };
    let w = World::with_sim("hareplay", opts, bgp_sim()).await;
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
    let other = Simulator::start("127.0.0.1:0".parse().unwrap(), bgp_sim())
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
    let w = World::with_sim("hareach", opts, bgp_sim()).await;
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
