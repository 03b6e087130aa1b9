//! Programming a slow loxilb: the simulator's `loxilb-0.9.8` cost profile (one rule write at a
//! time, each completing at the next tick of loxilb's datapath worker), its tick shortened to
//! 200 ms and the call timeout to 1 s, so the shape is a real loxilb's at a fifth of the time
//! (shorter, the machine's own delays would weigh as much as loxilb's). Writes go out as fast as loxilb takes them, never twice, the most urgent first, and a
//! slow loxilb is never taken for a down one (docs/architecture.md#writing-to-a-slow-loxilb).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use loxilb_sim::{Profile, SimConfig};

const CLASS: &str = "loxilb.io/loxilb";
const TICK: Duration = Duration::from_millis(200);
const WAIT: Duration = Duration::from_secs(120);

fn slow() -> SimConfig {
    SimConfig {
        profile: Profile::Loxilb098 { tick: TICK },
        ..SimConfig::default()
    }
}

fn options(admin_port: u16) -> Options {
    Options {
        admin_port: Some(admin_port),
        extra_args: vec!["--loxilb-timeout=1s".into()],
        ..Options::default()
    }
}

/// Endpoint addresses of every rule the simulator holds.
fn endpoints_of_rules(w: &World) -> Vec<BTreeSet<String>> {
    w.sim
        .rules()
        .iter()
        .map(|r| r.endpoints.iter().map(|e| e.ip.to_string()).collect())
        .collect()
}

async fn replays_came_back(port: u16) -> f64 {
    World::metric_sum(
        port,
        "loxi_ccm_loxilb_replays_total",
        &["reason=\"came_back\""],
    )
    .await
    .unwrap_or_default()
}

/// A burst of 30 two-port Services on a loxilb that takes one write per tick: 60 writes, one
/// per rule, none timing out (the window keeps what is in flight within the call timeout),
/// the loxilb never taken for down nor replayed, and no listing while writes run (a listing
/// during writes can crash loxilb 0.9.8).
#[tokio::test]
async fn a_burst_costs_one_write_per_rule_and_no_outage() {
    let port = testenv::free_port().unwrap();
    let opts = options(port);
    let w = World::with_sim("economy-burst", opts, slow()).await;
    w.add_node("node-a", "10.7.0.1").await;
    w.add_node("node-b", "10.7.0.2").await;
    // Settled: the start's listing and marker are done.
    wait_for("the controller's metrics", WAIT, || async {
        World::metric_sum(port, "loxi_ccm_loxilb_up", &[])
            .await
            .filter(|v| *v == 1.0)
    })
    .await;
    let replays_before = replays_came_back(port).await;
    let posts_before = w.sim.rule_posts();
    let listings_before = w.sim.costs().listings_during_writes;
    for i in 0..30 {
        w.create(&World::lb_service(
            &format!("b{i:02}"),
            Some(CLASS),
            &[(80, "TCP"), (443, "TCP")],
        ))
        .await;
    }
    wait_for("60 rules with both endpoints", WAIT, || async {
        let rules = endpoints_of_rules(&w);
        (rules.len() == 60 && rules.iter().all(|e| e.len() == 2)).then_some(())
    })
    .await;
    let posts = w.sim.rule_posts() - posts_before;
    let unanswered = World::metric_sum(port, "loxi_ccm_loxilb_writes_unanswered_total", &[])
        .await
        .unwrap_or_default();
    let window = World::metric_sum(port, "loxi_ccm_loxilb_write_window", &[]).await;
    eprintln!("burst: {posts} rule POSTs, {unanswered} unanswered, window {window:?}");
    assert_eq!(posts, 60, "one write per rule");
    assert_eq!(unanswered, 0.0, "writes that timed out");
    assert_eq!(
        replays_came_back(port).await,
        replays_before,
        "the slow loxilb was taken for down and replayed"
    );
    assert_eq!(
        w.sim.costs().listings_during_writes,
        listings_before,
        "rules listed while writes ran"
    );
    w.finish().await;
}

/// A Node deletion goes before changes already queued: with every rule's update for a new
/// Node waiting in the window, the first rule without the deleted Node's address appears
/// while most of those updates still wait (they go after it).
#[tokio::test]
async fn a_node_deletion_overtakes_queued_changes() {
    let port = testenv::free_port().unwrap();
    let opts = options(port);
    let w = World::with_sim("economy-order", opts, slow()).await;
    w.add_node("node-a", "10.7.1.1").await;
    w.add_node("node-b", "10.7.1.2").await;
    for i in 0..40 {
        w.create(&World::lb_service(
            &format!("o{i:02}"),
            Some(CLASS),
            &[(80, "TCP")],
        ))
        .await;
    }
    wait_for("40 rules on both Nodes", WAIT, || async {
        let rules = endpoints_of_rules(&w);
        (rules.len() == 40 && rules.iter().all(|e| e.len() == 2)).then_some(())
    })
    .await;
    let posts_before = w.sim.rule_posts();
    // A third Node: 40 updates (an endpoint added each), at one per tick.
    w.add_node("node-c", "10.7.1.3").await;
    wait_for("the first rule on node-c", WAIT, || async {
        endpoints_of_rules(&w)
            .iter()
            .any(|e| e.contains("10.7.1.3"))
            .then_some(())
    })
    .await;
    w.nodes.delete("node-a", &Default::default()).await.unwrap();
    let waiting_for_c = wait_for("the first rule without node-a", WAIT, || async {
        let rules = endpoints_of_rules(&w);
        rules
            .iter()
            .any(|e| !e.contains("10.7.1.1"))
            .then(|| rules.iter().filter(|e| !e.contains("10.7.1.3")).count())
    })
    .await;
    eprintln!("when the first rule lost node-a, {waiting_for_c} of 40 still waited for node-c");
    assert!(
        waiting_for_c >= 10,
        "the removal waited behind the queued additions ({waiting_for_c} left)"
    );
    wait_for("every rule on node-b and node-c only", WAIT, || async {
        let want: BTreeSet<String> = ["10.7.1.2".to_string(), "10.7.1.3".to_string()].into();
        let rules = endpoints_of_rules(&w);
        (rules.len() == 40 && rules.iter().all(|e| *e == want)).then_some(())
    })
    .await;
    let posts = w.sim.rule_posts() - posts_before;
    eprintln!("node added then deleted: {posts} rule POSTs for 40 rules");
    assert!(posts <= 80, "{posts} writes: at most two per rule");
    w.finish().await;
}

/// A Service whose rule writes wait behind others says so: `Programmed` False, reason
/// `Queued`, with the writes ahead of it; once its rules are on loxilb it says Programmed.
#[tokio::test]
async fn a_service_whose_writes_wait_says_queued_until_programmed() {
    let port = testenv::free_port().unwrap();
    // Ticks of 300 ms: the 16 Services reconciled at once (`--concurrency`) then queue 4.8 s
    // of writes, past the 2 s after which a Service says it is queued (1 s timeout: a write
    // in flight takes up to two ticks).
    let opts = Options {
        admin_port: Some(port),
        extra_args: vec!["--loxilb-timeout=1s".into()],
        ..Options::default()
    };
    let sim = SimConfig {
        profile: Profile::Loxilb098 {
            tick: Duration::from_millis(300),
        },
        ..SimConfig::default()
    };
    let w = World::with_sim("economy-queued", opts, sim).await;
    w.add_node("node-a", "10.7.2.1").await;
    let names: Vec<String> = (0..40).map(|i| format!("q{i:02}")).collect();
    for name in &names {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
    }
    let (name, message) = wait_for("a Service saying its writes are queued", WAIT, || async {
        for name in &names {
            let svc = w.get(name).await?;
            if let Some((status, reason, message)) = World::condition(&svc, "loxilb.io/Programmed")
                && status == "False"
                && reason == "Queued"
            {
                return Some((name.clone(), message));
            }
        }
        None
    })
    .await;
    eprintln!("{name}: {message}");
    assert!(message.contains("ahead"), "{message}");
    wait_for("every Service programmed", WAIT, || async {
        for name in &names {
            let svc = w.get(name).await?;
            let (status, reason, _) = World::condition(&svc, "loxilb.io/Programmed")?;
            if status != "True" || reason != "Programmed" {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(w.sim.rules().len(), 40);
    w.finish().await;
}

/// A Service deleted while its create waits in the window costs no write: the waiting
/// create is dropped unsent, and there is nothing to delete.
#[tokio::test]
async fn a_service_deleted_while_its_create_waits_costs_no_write() {
    let port = testenv::free_port().unwrap();
    let w = World::with_sim("economy-dropped", options(port), slow()).await;
    w.add_node("node-a", "10.7.3.1").await;
    let names: Vec<String> = (0..30).map(|i| format!("d{i:02}")).collect();
    for name in &names {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
    }
    // The Service with the most writes ahead of its own: it waits longest.
    let gone = wait_for("a Service queued behind several writes", WAIT, || async {
        let mut furthest: Option<(usize, String)> = None;
        for name in &names {
            let svc = w.get(name).await?;
            let Some((_, reason, message)) = World::condition(&svc, "loxilb.io/Programmed") else {
                continue;
            };
            let ahead: usize = message
                .split(": ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if reason == "Queued" && ahead >= 4 && furthest.as_ref().is_none_or(|f| ahead > f.0) {
                furthest = Some((ahead, name.clone()));
            }
        }
        furthest.map(|(_, name)| name)
    })
    .await;
    let deletes_before = w
        .sim
        .write_log()
        .iter()
        .filter(|l| l.method == "DELETE")
        .count();
    w.services.delete(&gone, &Default::default()).await.unwrap();
    wait_for("the deleted Service gone", WAIT, || async {
        w.get(&gone).await.is_none().then_some(())
    })
    .await;
    wait_for("29 rules", WAIT, || async {
        (w.sim.rules().len() == 29).then_some(())
    })
    .await;
    let deletes = w
        .sim
        .write_log()
        .iter()
        .filter(|l| l.method == "DELETE")
        .count()
        - deletes_before;
    let posts = w.sim.rule_posts();
    eprintln!("{gone} deleted while queued: {posts} rule POSTs, {deletes} DELETEs");
    assert_eq!(
        deletes, 0,
        "a rule of the deleted Service was created, then deleted"
    );
    assert_eq!(
        posts, 29,
        "one write per remaining rule, none for the deleted Service"
    );
    w.finish().await;
}

/// A Node flapping NotReady/Ready five times while the writes it causes wait (behind a burst
/// of new Services' creates) costs each of the other Services' rules at most one write: a
/// Service's next pass starts only once its write is answered, and then plans from the Node's
/// latest state, which its rule already has.
#[tokio::test]
async fn a_flapping_node_costs_at_most_one_write_per_rule() {
    let port = testenv::free_port().unwrap();
    let w = World::with_sim("economy-flap", options(port), slow()).await;
    w.add_node("node-a", "10.7.4.1").await;
    w.add_node("node-b", "10.7.4.2").await;
    let settled: Vec<String> = (0..20).map(|i| format!("f{i:02}")).collect();
    for name in &settled {
        w.create(&World::lb_service(name, Some(CLASS), &[(80, "TCP")]))
            .await;
    }
    let mut vips = BTreeSet::new();
    for name in &settled {
        vips.insert(format!("{}:80/tcp", w.wait_for_ip(name).await));
    }
    wait_for("20 rules on both Nodes", WAIT, || async {
        let rules = endpoints_of_rules(&w);
        (rules.len() == 20 && rules.iter().all(|e| e.len() == 2)).then_some(())
    })
    .await;
    let logged_before = w.sim.write_log().len();
    let writes_before = w.sim.writes();
    // The backlog: 20 creates, four seconds of loxilb's time, ahead of the flap's writes.
    for i in 0..20 {
        w.create(&World::lb_service(
            &format!("n{i:02}"),
            Some(CLASS),
            &[(80, "TCP")],
        ))
        .await;
    }
    for _ in 0..5 {
        w.set_node_status("node-b", "10.7.4.2", false).await;
        w.set_node_status("node-b", "10.7.4.2", true).await;
    }
    w.set_node_status("node-b", "10.7.4.2", false).await;
    wait_for("40 rules on node-a only", WAIT, || async {
        let rules = endpoints_of_rules(&w);
        let only_a = BTreeSet::from(["10.7.4.1".to_string()]);
        (rules.len() == 40 && rules.iter().all(|e| *e == only_a)).then_some(())
    })
    .await;
    // The simulator applies a write at once but logs it only once its worker's tick has
    // acknowledged it: the last write may be applied and not yet logged.
    wait_for("every write logged", WAIT, || async {
        let logged = w.sim.write_log().len() - logged_before;
        (logged as u64 == w.sim.writes() - writes_before).then_some(())
    })
    .await;
    let mut per_rule: std::collections::BTreeMap<String, usize> = Default::default();
    for write in &w.sim.write_log()[logged_before..] {
        if let Some(rule) = write.rule.as_ref().filter(|r| vips.contains(*r)) {
            *per_rule.entry(rule.clone()).or_default() += 1;
        }
    }
    eprintln!("flap: writes per settled rule {per_rule:?}");
    let unnamed: Vec<String> = w.sim.write_log()[logged_before..]
        .iter()
        .filter(|l| l.rule.is_none())
        .map(|l| format!("{} {} {}", l.method, l.path, l.status))
        .collect();
    eprintln!("flap: other writes {unnamed:?}");
    for vip in vips.iter().filter(|v| !per_rule.contains_key(*v)) {
        let log = w.sim.write_log();
        let entries: Vec<String> = log
            .iter()
            .enumerate()
            .filter(|(_, l)| l.rule.as_ref() == Some(vip))
            .map(|(i, l)| {
                format!(
                    "#{i} {} {:?}-{:?} {}",
                    l.status, l.accepted, l.completed, l.answered
                )
            })
            .collect();
        eprintln!("flap: {vip} (log from #{logged_before}): {entries:?}");
    }
    assert!(
        per_rule.values().all(|n| *n <= 1),
        "a settled rule written more than once: {per_rule:?}"
    );
    // Not vacuous: every settled rule's removal of node-b went through the write log.
    assert_eq!(
        per_rule.len(),
        vips.len(),
        "settled rules written: {per_rule:?} of {vips:?}"
    );
    w.finish().await;
}

/// `loxi-ccm check` run beside the controller (as in its Pod, `--admin-addr` pointing at its
/// admin server) shows what waits for each loxilb: the writes waiting, the window, and the
/// Services nearest their turn.
#[tokio::test]
async fn check_shows_what_waits_for_each_loxilb() {
    let port = testenv::free_port().unwrap();
    // 20 s of loxilb's time queued (ticks of 500 ms): longer than a check takes.
    let opts = Options {
        admin_port: Some(port),
        extra_args: vec!["--loxilb-timeout=5s".into()],
        ..Options::default()
    };
    let sim = SimConfig {
        profile: Profile::Loxilb098 {
            tick: Duration::from_millis(500),
        },
        ..SimConfig::default()
    };
    let w = World::with_sim("economy-check", opts, sim).await;
    w.add_node("node-a", "10.7.5.1").await;
    for i in 0..40 {
        w.create(&World::lb_service(
            &format!("c{i:02}"),
            Some(CLASS),
            &[(80, "TCP")],
        ))
        .await;
    }
    let sim_url = w.sim.url();
    let admin = format!("--admin-addr=127.0.0.1:{port}");
    let line = wait_for("check naming queued writes", WAIT, || async {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"))
            .args([
                "check",
                &format!("--loxilb-url={sim_url}"),
                &admin,
                // The rest of the check needs a valid configuration, not a cluster.
                "--external-cidr=192.0.2.0/24",
                "--kubeconfig=/nonexistent",
            ])
            .env_clear()
            .kill_on_drop(true)
            .output()
            .await
            .expect("the loxi-ccm binary runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find(|l| l.starts_with(&format!("OK   loxilb {sim_url} writes: ")))
            .filter(|l| l.contains("write(s) waiting") && l.contains(&format!("next: {}/c", w.ns)))
            .map(str::to_string)
    })
    .await;
    eprintln!("{line}");
    assert!(line.contains("in flight of"), "{line}");
    wait_for("40 rules", WAIT, || async {
        (w.sim.rules().len() == 40).then_some(())
    })
    .await;
    w.finish().await;
}
