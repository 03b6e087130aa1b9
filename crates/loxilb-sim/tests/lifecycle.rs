//! Simulation controls: restart, down/up, latency, faults, admin API.

mod common;

use std::time::{Duration, Instant};

use common::*;
use loxilb_sim::{Fault, SimRule};
use serde_json::{Value, json};

/// Polls (bounded) until connecting to `addr` gives the wanted outcome.
/// Used only for the *timed* admin down/up, which runs on the server's clock.
async fn wait_until_reachable(addr: std::net::SocketAddr, reachable: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ok = tokio::net::TcpStream::connect(addr).await.is_ok();
        if ok == reachable {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{addr} never became reachable={reachable}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn restart_wipes_all_state() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"]))
            .await,
    );
    let set = json!({"instance": "llb-inst0", "state": "MASTER", "vip": "0.0.0.0"});
    assert_success(&env.post("/config/cistate", &set).await);
    assert!(env.sim.request_count() >= 2);

    env.sim.restart();
    assert_eq!(env.sim.request_count(), 0);
    assert!(env.list().await.is_empty());
    let (_, ci) = env.get("/config/cistate/all").await;
    assert_eq!(
        ci,
        json!({"Attr": [{"instance": "llb-inst0", "state": "NOT_DEFINED", "vip": "0.0.0.0", "sync": null}]})
    );
    // Index allocation restarts at 1.
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.2", 80, &["10.0.0.1"]))
            .await,
    );
    assert_eq!(env.sim.rules()[0].index, 1);

    // Same through the admin API.
    let r = env.send(env.http.post(env.admin("/restart"))).await;
    assert_eq!(r.0, 200);
    assert!(env.sim.rules().is_empty());
}

#[tokio::test]
async fn go_down_refuses_connections_and_come_up_keeps_state() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"]))
            .await,
    );
    let addr = env.sim.addr();

    env.sim.go_down().await;
    let err = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    // The pooled keep-alive connection was closed too: requests fail.
    let err = env
        .http
        .get(env.api("/version"))
        .send()
        .await
        .expect_err("down");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    // Idempotent.
    env.sim.go_down().await;

    env.sim.come_up().await.expect("rebinds the same address");
    assert_eq!(env.sim.addr(), addr);
    let fresh = Env {
        sim: env.sim.clone(),
        http: client(),
    };
    let rules = fresh.list().await;
    assert_eq!(rules.len(), 1, "state kept across down/up");
    env.sim.come_up().await.expect("no-op when up");
    env.sim.clone().shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn admin_timed_down_comes_back() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"]))
            .await,
    );
    let r = env
        .send(
            env.http
                .post(env.admin("/down"))
                .json(&json!({"seconds": 1})),
        )
        .await;
    assert_eq!(r.0, 200, "{r:?}");
    wait_until_reachable(env.sim.addr(), false).await;
    wait_until_reachable(env.sim.addr(), true).await;
    let fresh = Env {
        sim: env.sim.clone(),
        http: client(),
    };
    assert_eq!(fresh.list().await.len(), 1);
}

#[tokio::test]
async fn fault_injection_on_writes() {
    let env = start().await;
    env.sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));
    let r = env
        .post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"]))
        .await;
    assert_eq!(r.0, 500);
    assert_eq!(r.1["code"], 500);
    assert!(r.1["result"].is_string());
    assert!(env.sim.rules().is_empty(), "faulted call changed nothing");
    assert_eq!(
        env.get("/config/loadbalancer/all").await.0,
        200,
        "reads pass"
    );

    // Admin API: every 2nd call of all methods fails with 503.
    let r = env
        .send(
            env.http
                .put(env.admin("/fault"))
                .json(&json!({"status": 503, "rate": 0.5, "onlyWrites": false})),
        )
        .await;
    assert_eq!(r.0, 200, "{r:?}");
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(env.get("/version").await.0);
        }
        v
    };
    assert_eq!(statuses, [200, 503, 200, 503]);
    let r = env.send(env.http.delete(env.admin("/fault"))).await;
    assert_eq!(r.0, 200);
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.1"]))
            .await,
    );
    let (_, stats) = env.send(env.http.get(env.admin("/stats"))).await;
    assert_eq!(stats["faultsInjected"], 3);
    assert!(stats["fault"].is_null());
}

#[tokio::test]
async fn latency_delays_api_calls_only() {
    let env = start().await;
    env.sim.set_latency(Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(env.get("/version").await.0, 200);
    assert!(t.elapsed() >= Duration::from_millis(200));
    // Admin is never delayed; it also sets latency.
    let r = env
        .send(env.http.put(env.admin("/latency")).json(&json!({"ms": 0})))
        .await;
    assert_eq!(r.0, 200);
    let (_, v) = env.send(env.http.get(env.admin("/latency"))).await;
    assert_eq!(v["ms"], 0);
}

#[tokio::test]
async fn admin_rules_stats_and_counts() {
    let env = start().await;
    assert_success(
        &env.post_lb(&tcp_rule("192.168.10.1", 80, &["10.0.0.2", "10.0.0.1"]))
            .await,
    );
    let _ = env.list().await;
    assert_eq!(env.sim.request_count(), 2);
    let (status, v) = env.send(env.http.get(env.admin("/rules"))).await;
    assert_eq!(status, 200);
    let rules: Vec<SimRule> = serde_json::from_value(v).unwrap();
    assert_eq!(rules, env.sim.rules());
    assert_eq!(rules[0].endpoints[0].ip, "10.0.0.1");
    assert_eq!(rules[0].protocol, "tcp");
    let (status, stats) = env.send(env.http.get(env.admin("/stats"))).await;
    assert_eq!(status, 200);
    assert_eq!(stats["rules"], 1);
    assert_eq!(stats["requests"], 2, "admin calls are not counted");
    assert_eq!(stats["maxRules"], 2048);
    let r = env.send(env.http.post(env.admin("/up"))).await;
    assert_eq!(r.0, 200);
    let r = env
        .send(
            env.http
                .put(env.admin("/fault"))
                .json(&json!({"status": 99})),
        )
        .await;
    assert_eq!(r.0, 400);
    assert!(r.1["error"].is_string());
    let _: Value = r.1;
}

/// Several simulators in one test are separate loxilbs: each boots with its own
/// `llb-inst0`/`NOT_DEFINED` entry, a role set on one does not show on the other, the
/// library's view matches the API's listing, and a restart of one wipes only its roles.
#[tokio::test]
async fn several_simulators_keep_separate_ha_states() {
    let a = start().await;
    let b = start().await;
    let boot = vec![(
        "llb-inst0".to_string(),
        "NOT_DEFINED".to_string(),
        "0.0.0.0".to_string(),
    )];
    assert_eq!(a.sim.cluster_states(), boot);
    assert_eq!(b.sim.cluster_states(), boot);
    let master = json!({"instance": "llb-inst0", "state": "MASTER", "vip": "10.0.0.100"});
    let backup = json!({"instance": "llb-inst0", "state": "BACKUP", "vip": "10.0.0.100"});
    assert_success(&a.post("/config/cistate", &master).await);
    assert_success(&b.post("/config/cistate", &backup).await);
    assert_eq!(a.sim.cluster_state("llb-inst0").as_deref(), Some("MASTER"));
    assert_eq!(b.sim.cluster_state("llb-inst0").as_deref(), Some("BACKUP"));
    assert_eq!(a.sim.cluster_state("llb-inst1"), None);
    let (_, listed) = a.get("/config/cistate/all").await;
    assert_eq!(listed["Attr"][0]["vip"], "10.0.0.100");
    assert_eq!(a.sim.cluster_states()[0].2, "10.0.0.100");
    assert_eq!(b.sim.writes_since_restart(), ["POST /config/cistate"]);
    b.sim.restart();
    assert_eq!(b.sim.cluster_states(), boot);
    assert!(b.sim.writes_since_restart().is_empty());
    assert_eq!(a.sim.cluster_state("llb-inst0").as_deref(), Some("MASTER"));
}

/// Rule writes take the rule write latency one after the other, as loxilb applies them;
/// HA state writes are not held up by them.
#[tokio::test]
async fn rule_writes_take_their_latency_one_at_a_time() {
    let env = start().await;
    env.sim
        .set_rule_write_latency(std::time::Duration::from_millis(300));
    let (rule_a, rule_b) = (
        tcp_rule("10.0.0.1", 80, &["10.1.0.1"]),
        tcp_rule("10.0.0.2", 80, &["10.1.0.1"]),
    );
    let t = std::time::Instant::now();
    let (a, b, state) = tokio::join!(env.post_lb(&rule_a), env.post_lb(&rule_b), async {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let body = json!({"instance": "llb-inst0", "state": "MASTER", "vip": "0.0.0.0"});
        let r = env.post("/config/cistate", &body).await;
        (r, t.elapsed())
    });
    assert_success(&a);
    assert_success(&b);
    assert_success(&state.0);
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(600),
        "{:?}",
        t.elapsed()
    );
    assert!(
        state.1 < std::time::Duration::from_millis(300),
        "the HA state waited: {:?}",
        state.1
    );
}
