//! The cost profile `loxilb-0.9.8` (docs/loxilb-api.md#costs-and-versions), run with a
//! short tick: the shape of loxilb's costs (one lock, tick-aligned completions, deletes at
//! once, 409 behind the lock, the lost-endpoint re-POST as a full update, the write timeout,
//! goBGP's start-up delay) and the instant default left as it was.
//!
//! Timing assertions are lower bounds and orderings; upper bounds, where any, are generous:
//! the machine running the tests may be loaded.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::future::join_all;
use loxilb_sim::{Profile, SimConfig, SimWrite};
use serde_json::{Value, json};

fn loxilb(tick_ms: u64) -> Profile {
    Profile::Loxilb098 {
        tick: Duration::from_millis(tick_ms),
    }
}

async fn start_profile(tick_ms: u64) -> Env {
    start_with(SimConfig {
        profile: loxilb(tick_ms),
        ..SimConfig::default()
    })
    .await
}

/// The logged rule POSTs, in the order they were answered.
fn rule_posts(env: &Env) -> Vec<SimWrite> {
    env.sim
        .write_log()
        .into_iter()
        .filter(|w| w.method == "POST" && w.path == "/config/loadbalancer")
        .collect()
}

fn vip(i: usize) -> String {
    format!("10.0.{}.{}", i / 200, i % 200 + 1)
}

/// Creates `n` rules at once, `vip(0..n)`.
async fn create_all(env: &Env, n: usize) -> Vec<Reply> {
    join_all(
        (0..n).map(|i| async move { env.post_lb(&tcp_rule(&vip(i), 80, &["10.1.0.1"])).await }),
    )
    .await
}

/// Waits (bounded) until the simulator has received `n` writes in all.
async fn until_received(env: &Env, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while env.sim.writes() < n {
        assert!(
            Instant::now() < deadline,
            "only {} writes",
            env.sim.writes()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Creates sent together complete one per tick, in tick order, each at a tick; a GET
/// meanwhile is answered at once, and counted as a listing during a rule write.
#[tokio::test]
async fn parallel_creates_complete_one_per_tick() {
    let tick = Duration::from_millis(200);
    let env = start_profile(200).await;
    let n = 6;
    let t0 = Instant::now();
    let creates = create_all(&env, n);
    let listing = async {
        // Once the first create is made (and waits for its tick).
        let deadline = Instant::now() + Duration::from_secs(20);
        while env.sim.rules().is_empty() {
            assert!(Instant::now() < deadline, "no create was made");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let listed = env.list().await;
        (listed.len(), rule_posts(&env).len())
    };
    let (replies, (listed, done_at_listing)) = tokio::join!(creates, listing);
    let elapsed = t0.elapsed();
    for r in &replies {
        assert_success(r);
    }
    // The GET did not wait for the queue; it saw the rule being written.
    assert!(done_at_listing < n, "the listing waited for every create");
    assert!(listed >= 1, "the rule in flight is already listed");
    assert!(env.sim.costs().listings_during_writes >= 1);
    let log = rule_posts(&env);
    assert_eq!(log.len(), n);
    let ticks: Vec<u64> = log
        .iter()
        .map(|w| w.tick.expect("completed at a tick"))
        .collect();
    assert!(
        ticks.windows(2).all(|w| w[0] < w[1]),
        "one write per tick, in order: {ticks:?}"
    );
    for w in &log {
        // Never before its tick (ticks counted from the simulator's start).
        assert!(
            w.completed >= tick * u32::try_from(w.tick.unwrap()).unwrap(),
            "{w:?}"
        );
        assert!(w.accepted <= w.completed && w.answered, "{w:?}");
    }
    // Serialised: n writes span at least n - 1 whole ticks.
    assert!(
        elapsed >= tick * u32::try_from(n - 1).unwrap(),
        "{elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    assert_eq!(env.sim.costs().writes_completed, n as u64);
    // With no write in flight, a listing is not counted.
    let before = env.sim.costs().listings_during_writes;
    env.list().await;
    assert_eq!(env.sim.costs().listings_during_writes, before);
}

/// A DELETE takes no lock and waits for no tick: it completes while creates queue.
#[tokio::test]
async fn deletes_answer_at_once_while_creates_queue() {
    let env = start_profile(200).await;
    assert_success(&env.post_lb(&tcp_rule("10.9.0.1", 80, &["10.1.0.1"])).await);
    let base = env.sim.writes();
    let n = 5;
    let creates = create_all(&env, n);
    let delete = async {
        until_received(&env, base + n as u64).await;
        env.delete("/config/loadbalancer/externalipaddress/10.9.0.1/port/80/protocol/tcp")
            .await
    };
    let (replies, deleted) = tokio::join!(creates, delete);
    replies.iter().for_each(assert_success);
    assert_success(&deleted);
    let log = env.sim.write_log();
    let at = log
        .iter()
        .position(|w| w.method == "DELETE")
        .expect("the delete is logged");
    assert_eq!(log[at].tick, None, "a delete waits for no tick");
    // Behind the lock it would have come after all of them; a tick of slack for a slow
    // machine.
    let creates_after = log[at..].iter().filter(|w| w.method == "POST").count();
    assert!(
        creates_after >= n - 2,
        "the delete went past the queued creates: {log:?}"
    );
    assert!(env.find("10.9.0.1", 80).await.is_none());
}

/// An identical re-POST answers 409 without waiting for a tick, but only once it has the
/// lock: after the writes queued before it.
#[tokio::test]
async fn identical_repost_answers_409_behind_the_lock() {
    let env = start_profile(200).await;
    let body = tcp_rule("10.9.0.1", 80, &["10.1.0.1"]);
    assert_success(&env.post_lb(&body).await);
    // Alone: 409 at once, no tick.
    let alone = env.post_lb(&body).await;
    assert_handler_error(&alone, 409, "lbrule-exists error");
    assert_eq!(rule_posts(&env).last().unwrap().tick, None);

    let base = env.sim.writes();
    let n = 3;
    let creates = create_all(&env, n);
    let repost = async {
        until_received(&env, base + n as u64).await;
        // The creates reach the lock's queue first.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        (env.post_lb(&body).await, t.elapsed())
    };
    let (replies, (queued, waited)) = tokio::join!(creates, repost);
    replies.iter().for_each(assert_success);
    assert_handler_error(&queued, 409, "lbrule-exists error");
    let log = rule_posts(&env);
    let last = log.last().unwrap();
    assert_eq!((last.status, last.tick), (409, None), "{log:?}");
    assert!(
        log[log.len() - 1 - n..log.len() - 1]
            .iter()
            .all(|w| w.status == 200 && w.completed <= last.completed),
        "the 409 came after the queued creates: {log:?}"
    );
    // Alone it answers at once; behind the creates it waited at least a tick.
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert_eq!(env.sim.costs().identical_reposts, 2);
}

/// loxilb keeps an endpoint removed by an update hidden in the rule: every identical re-POST
/// is then a full update (200, a tick each), counted as a no-op update.
#[tokio::test]
async fn lost_endpoint_repost_costs_a_tick_each_time() {
    let tick = Duration::from_millis(100);
    let env = start_profile(100).await;
    assert_success(
        &env.post_lb(&tcp_rule("10.9.0.1", 80, &["10.1.0.1", "10.1.0.2"]))
            .await,
    );
    let lost = tcp_rule("10.9.0.1", 80, &["10.1.0.1"]);
    assert_success(&env.post_lb(&lost).await);
    assert_eq!(
        env.sim.costs().noop_updates,
        0,
        "losing the endpoint is a change"
    );
    let repeats = 4;
    let t = Instant::now();
    for _ in 0..repeats {
        assert_success(&env.post_lb(&lost).await);
    }
    let elapsed = t.elapsed();
    let log = rule_posts(&env);
    let ticks: Vec<u64> = log[log.len() - repeats..]
        .iter()
        .map(|w| w.tick.expect("each repeat waits for the worker"))
        .collect();
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "{ticks:?}");
    // One after the other, each to its own tick: at least repeats - 1 whole ticks.
    assert!(
        elapsed >= tick * u32::try_from(repeats - 1).unwrap(),
        "{elapsed:?}"
    );
    assert_eq!(env.sim.costs().noop_updates, repeats as u64);
    assert_eq!(env.sim.costs().identical_reposts, 0);
    let listed = env.find("10.9.0.1", 80).await.unwrap();
    assert_eq!(ep_ips(&listed), ["10.1.0.1"]);
}

/// A request older than the write timeout (60 ticks) is applied, but its connection closes
/// without an answer.
#[tokio::test]
async fn a_request_past_the_write_timeout_is_applied_but_not_answered() {
    // 20 ms ticks: the timeout is 1.2 s; the write latency ages the request past it.
    let env = start_profile(20).await;
    assert_eq!(
        env.sim.profile().write_timeout(),
        Some(Duration::from_millis(1200))
    );
    env.sim.set_write_latency(Duration::from_millis(1300));
    let sent = env
        .http
        .post(env.api("/config/loadbalancer"))
        .json(&tcp_rule("10.9.0.1", 80, &["10.1.0.1"]))
        .send()
        .await;
    assert!(sent.is_err(), "answered: {sent:?}");
    assert!(env.find("10.9.0.1", 80).await.is_some(), "applied");
    let w = rule_posts(&env).pop().unwrap();
    assert!(!w.answered && w.status == 200, "{w:?}");
    assert!(
        w.completed - w.accepted > Duration::from_millis(1200),
        "{w:?}"
    );
    assert_eq!(env.sim.costs().unanswered, 1);
    // Reads are not delayed by the write latency: answered.
    assert_eq!(env.get("/config/loadbalancer/all").await.0, 200);
}

/// The same through a queue: with many writes ahead, the last ones wait past the timeout;
/// every write is applied, exactly the late ones go unanswered.
#[tokio::test]
async fn writes_queued_past_the_write_timeout_go_unanswered() {
    // 10 ms ticks: 0.6 s timeout; 100 writes take at least 1 s.
    let env = start_profile(10).await;
    let timeout = env.sim.profile().write_timeout().unwrap();
    let n = 100;
    let sim = &env;
    let replies: Vec<Result<u16, reqwest::Error>> = join_all((0..n).map(|i| async move {
        sim.http
            .post(sim.api("/config/loadbalancer"))
            .json(&tcp_rule(&vip(i), 80, &["10.1.0.1"]))
            .send()
            .await
            .map(|r| r.status().as_u16())
    }))
    .await;
    assert_eq!(env.sim.rules().len(), n, "every write applied");
    let dropped = replies.iter().filter(|r| r.is_err()).count();
    assert!(replies.iter().flatten().all(|&s| s == 200), "{replies:?}");
    let log = rule_posts(&env);
    let unanswered = log.iter().filter(|w| !w.answered).count();
    assert!(unanswered >= 1, "nothing waited past {timeout:?}");
    assert_eq!(dropped, unanswered);
    assert_eq!(env.sim.costs().unanswered, unanswered as u64);
    for w in &log {
        assert_eq!(w.answered, w.completed - w.accepted <= timeout, "{w:?}");
    }
}

/// A client that gives up does not cancel its write: loxilb still applies it in its turn.
#[tokio::test]
async fn a_write_whose_client_gave_up_is_still_applied() {
    // The impatient write arrives early in the first tick and completes at the second at the
    // earliest (600 ms); its client gives up after 150 ms.
    let env = start_profile(300).await;
    let first_body = tcp_rule("10.9.0.1", 80, &["10.1.0.1"]);
    let first = env.post_lb(&first_body);
    let impatient = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        env.http
            .post(env.api("/config/loadbalancer"))
            .json(&tcp_rule("10.9.0.2", 80, &["10.1.0.1"]))
            .timeout(Duration::from_millis(150))
            .send()
            .await
    };
    let (first, impatient) = tokio::join!(first, impatient);
    assert_success(&first);
    assert!(impatient.is_err(), "{impatient:?}");
    // Made in its turn and completed at its tick, as if answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rule_posts(&env).len() < 2 {
        assert!(Instant::now() < deadline, "never completed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(env.find("10.9.0.2", 80).await.is_some(), "applied");
    let w = rule_posts(&env).pop().unwrap();
    assert!(w.status == 200 && w.tick.is_some(), "{w:?}");
}

/// goBGP answers only 9 ticks after the start (and after a restart).
#[tokio::test]
async fn gobgp_answers_nine_ticks_after_the_start() {
    let t0 = Instant::now();
    let env = start_with(SimConfig {
        bgp: true,
        profile: loxilb(200),
        ..SimConfig::default()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (status, body) = env.get("/config/bgp/neigh/all").await;
    assert_eq!(status, 500, "{body}");
    while env.get("/config/bgp/neigh/all").await.0 != 200 {
        assert!(Instant::now() < deadline, "goBGP never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(1800),
        "{:?}",
        t0.elapsed()
    );
}

/// The default profile is instant: no tick, no lock, every write answered.
#[tokio::test]
async fn instant_profile_is_unchanged() {
    let env = start().await;
    assert_eq!(env.sim.profile(), Profile::Instant);
    let replies = create_all(&env, 5).await;
    replies.iter().for_each(assert_success);
    let log = rule_posts(&env);
    assert!(
        log.iter().all(|w| w.tick.is_none() && w.answered),
        "{log:?}"
    );
    // No goBGP delay, no write timeout.
    assert_eq!(Profile::Instant.write_timeout(), None);
    assert_eq!(env.admin_json("/profile").await["profile"], "instant");
}

/// The admin API sets the profile and its tick, and reports the costs.
#[tokio::test]
async fn admin_sets_the_profile_and_reports_costs() {
    let env = start().await;
    let put = |body: Value| {
        let env = &env;
        async move {
            env.send(env.http.put(env.admin("/profile")).json(&body))
                .await
        }
    };
    let (status, v) = put(json!({"profile": "loxilb-0.9.8", "tickMs": 50})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tickMs"], 50.0);
    assert_eq!(v["writeTimeoutMs"], 3000.0);
    assert_eq!(v["gobgpDelayMs"], 450.0);
    assert_eq!(env.sim.profile(), loxilb(50));
    assert_eq!(
        put(json!({"profile": "loxilb-0.9.8"})).await.1["tickMs"],
        1000.0
    );
    assert_eq!(put(json!({"profile": "loxilb-0.9.7"})).await.0, 400);
    assert_eq!(
        put(json!({"profile": "loxilb-0.9.8", "tickMs": 0})).await.0,
        400
    );
    let (status, v) = put(json!({"profile": "instant"})).await;
    assert_eq!((status, &v["tickMs"]), (200, &Value::Null), "{v}");

    assert_success(&env.post_lb(&tcp_rule("10.9.0.1", 80, &["10.1.0.1"])).await);
    assert_handler_error(
        &env.post_lb(&tcp_rule("10.9.0.1", 80, &["10.1.0.1"])).await,
        409,
        "lbrule-exists error",
    );
    let costs = env.admin_json("/costs").await;
    assert_eq!(costs["writesCompleted"], 2);
    assert_eq!(costs["identicalReposts"], 1);
    assert_eq!(costs["unanswered"], 0);
    assert_eq!(env.admin_json("/stats").await["costs"], costs);
    let writes = env.admin_json("/writes").await;
    let w = &writes[0];
    assert!(w["accepted_ms"].as_f64().unwrap() <= w["completed_ms"].as_f64().unwrap());
    assert_eq!(w["answered"], true);
    assert!(w.get("tick").is_none(), "{w}");
}
