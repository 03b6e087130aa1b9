//! A loxilb that comes back empty after being away (docs/loxilb-api.md#replay-order): its
//! worker tells it its HA role, then its BGP settings, then every rule, and no Service's pass
//! writes a rule there before the role and BGP, although every Service is re-planned when
//! it comes back and loxilb answers each write slowly (the passes would have the time to
//! overtake the worker).

mod common;

use std::time::Duration;

use common::*;
use loxilb_sim::SimConfig;

#[tokio::test]
async fn a_loxilb_back_empty_gets_its_role_and_bgp_before_any_rule() {
    let opts = Options {
        extra_args: roles_and_bgp_args(),
        ..Options::default()
    };
    let w = World::with_sim("comebackorder", opts, bgp_sim()).await;
    w.add_node("node-a", "10.7.0.1").await;
    let mut ips = Vec::new();
    for name in ["web-a", "web-b", "web-c"] {
        ips.push(w.serve_one_port(name, 80).await);
    }
    wait_for("the start-up role and BGP", WAIT, || async {
        let bgp = w.sim.bgp();
        (w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && bgp.global.is_some()
            && !bgp.neighbors.is_empty())
        .then_some(())
    })
    .await;

    w.sim.go_down().await;
    // A change while it is away: the Services' passes find it unreachable.
    w.add_node("node-b", "10.7.0.2").await;
    wait_for("the Services see it unreachable", WAIT, || async {
        let svc = w.get("web-a").await?;
        let (status, reason, _) = World::condition(&svc, "loxilb.io/Programmed")?;
        (status == "False" && reason == "LoxilbUnavailable").then_some(())
    })
    .await;
    // It lost everything while away, and now answers every write slowly.
    w.sim.restart();
    w.sim.set_write_latency(Duration::from_millis(300));
    w.sim.come_up().await.expect("the simulator listens again");

    let complete = || {
        let bgp = w.sim.bgp();
        w.sim.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && bgp.global.is_some()
            && !bgp.neighbors.is_empty()
            && ips.iter().all(|ip| {
                let rules = w.rules_for(ip);
                rules.len() == 1 && rules[0].2.len() == 2
            })
    };
    wait_for("role, BGP and every rule back", WAIT, || async {
        complete().then_some(())
    })
    .await;
    let log = w.sim.writes_since_restart();
    let first = |what: &str, path: &str| {
        log.iter()
            .position(|l| l.starts_with(&format!("POST {path}")))
            .unwrap_or_else(|| panic!("no {what} in {log:#?}"))
    };
    let order = [
        first("role", "/config/cistate"),
        first("BGP global", "/config/bgp/global"),
        first("BGP neighbour", "/config/bgp/neigh"),
        first("rule", "/config/loadbalancer"),
    ];
    assert!(
        order.windows(2).all(|p| p[0] < p[1]),
        "order after coming back {order:?} in {log:#?}"
    );
    w.finish().await;
}

/// 40 one-port Services on a loxilb that answers each rule write in 200 ms (as a real one
/// does, slowly, from the start: the controller's write window has learnt it), then a
/// restart that empties it; returns once its replay is under way, with the Services'
/// addresses and how many rule POSTs the simulator had seen before the restart.
async fn replay_under_way(name: &str) -> (World, Vec<String>, usize) {
    replay_under_way_with(name, None).await
}

/// [`replay_under_way`], the loxilb restarting with a rule table of `max_rules` if given.
async fn replay_under_way_with(
    name: &str,
    max_rules: Option<usize>,
) -> (World, Vec<String>, usize) {
    let w = World::with_sim(name, Options::default(), SimConfig::default()).await;
    w.add_node("node-a", "10.7.1.1").await;
    w.sim.set_write_latency(Duration::from_millis(200));
    let mut ips = Vec::new();
    for i in 0..SERVICES {
        ips.push(w.serve_one_port(&format!("old-{i}"), 80).await);
    }
    // It restarts empty: the replay of 40 rules lasts ~8 s.
    w.sim.go_down().await;
    match max_rules {
        Some(n) => w.sim.restart_with_max_rules(n),
        None => w.sim.restart(),
    }
    w.sim.come_up().await.expect("the simulator listens again");
    let since = rule_posts(&w).len();
    wait_for("the replay under way", WAIT, || async {
        (rule_posts(&w).len() >= since + 2).then_some(())
    })
    .await;
    (w, ips, since)
}

const SERVICES: usize = 40;

/// The rules POSTed to the simulator (`ip:port/protocol`), oldest first.
fn rule_posts(w: &World) -> Vec<String> {
    w.sim
        .write_log()
        .into_iter()
        .filter(|l| l.method == "POST")
        .filter_map(|l| l.rule)
        .collect()
}

/// A Service created while a restarted loxilb's replay of many rules waits in its write queue
/// gets its rule there ahead of the replay's (docs/architecture.md#writing-to-a-slow-loxilb):
/// the replay holds neither the instance's table nor the Services' passes while its writes
/// wait, and a new Service's first rule is more urgent than a replayed one.
#[tokio::test]
async fn a_new_service_during_a_replay_is_written_ahead_of_it() {
    let (w, ips, since) = replay_under_way("replayahead").await;
    let late = w.serve_one_port("late", 80).await;
    wait_for("every rule back", WAIT, || async {
        ips.iter()
            .all(|ip| w.rules_for(ip).len() == 1)
            .then_some(())
    })
    .await;
    let posts: Vec<String> = rule_posts(&w).split_off(since);
    let at = posts
        .iter()
        .position(|r| r.starts_with(&format!("{late}:")))
        .unwrap_or_else(|| panic!("no rule of the late Service in {posts:#?}"));
    let replayed_before = posts[..at]
        .iter()
        .filter(|r| ips.iter().any(|ip| r.starts_with(&format!("{ip}:"))))
        .count();
    assert!(
        replayed_before < SERVICES,
        "the late Service's rule waited for the whole replay: {posts:#?}"
    );
    // Every rule written once: the late pass took nothing from the replay twice.
    let mut seen = std::collections::HashSet::new();
    assert!(
        posts.iter().all(|r| seen.insert(r.clone())),
        "a rule written twice: {posts:#?}"
    );
    w.finish().await;
}

/// Services deleted while a replay carries their rules: the replay never writes a rule of a
/// Service once that Service is gone (no rule left behind for an address that is free
/// again), and a rule still waiting in the replay costs no write at all.
#[tokio::test]
async fn services_deleted_during_a_replay_leave_no_rule_and_cost_no_waiting_write() {
    let (w, ips, since) = replay_under_way("replaydelete").await;
    let doomed: Vec<(String, String)> = (SERVICES - 15..SERVICES)
        .map(|i| (format!("old-{i}"), ips[i].clone()))
        .collect();
    for (name, _) in &doomed {
        w.services
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("the deleted Services gone", WAIT, || async {
        for (name, _) in &doomed {
            if w.get(name).await.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    let left = |when: &str| {
        for (name, ip) in &doomed {
            assert!(
                w.rules_for(ip).is_empty(),
                "{when}: a rule of the deleted {name} ({ip}) is still on loxilb"
            );
        }
    };
    left("once the Services are gone");
    let kept = &ips[..SERVICES - 15];
    wait_for("every other rule back", WAIT, || async {
        kept.iter()
            .all(|ip| w.rules_for(ip).len() == 1)
            .then_some(())
    })
    .await;
    left("once the replay ended");
    let posts: Vec<String> = rule_posts(&w).split_off(since);
    let never_written = doomed
        .iter()
        .filter(|(_, ip)| !posts.iter().any(|r| r.starts_with(&format!("{ip}:"))))
        .count();
    assert!(
        never_written > 0,
        "every deleted Service's rule was still written by the replay: {posts:#?}"
    );
    w.finish().await;
}

/// A loxilb that comes back with a smaller rule table than the rules it held: the replay
/// fills it, the Services left without room say so (`CapacityExceeded`), and the replay ends
/// — a capacity refusal lists loxilb's rules, which waits for the writes in flight, and the
/// replay's own writes must go on meanwhile (it hung with the loxilb's writes held back).
#[tokio::test]
async fn a_replay_into_a_smaller_table_fills_it_and_the_rest_say_so() {
    const ROOM: usize = 30;
    let (w, ips, _) = replay_under_way_with("replayfull", Some(ROOM)).await;
    let names: Vec<String> = (0..SERVICES).map(|i| format!("old-{i}")).collect();
    wait_for(
        "the table full, every other Service CapacityExceeded",
        WAIT,
        || async {
            let held = ips.iter().filter(|ip| w.rules_for(ip).len() == 1).count();
            if held != ROOM {
                return None;
            }
            let mut full = 0;
            for (name, ip) in names.iter().zip(&ips) {
                let svc = w.get(name).await?;
                let (status, reason, _) = World::condition(&svc, "loxilb.io/Programmed")?;
                match (w.rules_for(ip).len(), status.as_str(), reason.as_str()) {
                    (1, "True", _) => {}
                    (0, "False", "CapacityExceeded") => full += 1,
                    _ => return None,
                }
            }
            (full == SERVICES - ROOM).then_some(())
        },
    )
    .await;
    // The loxilb's writes go on: a deleted Service's rule leaves, and its room goes to one
    // of those waiting.
    w.services
        .delete("old-0", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the deleted Service's rule gone, another one written",
        WAIT,
        || async {
            let held = ips[1..]
                .iter()
                .filter(|ip| w.rules_for(ip).len() == 1)
                .count();
            (w.rules_for(&ips[0]).is_empty() && held == ROOM).then_some(())
        },
    )
    .await;
    w.finish().await;
}
