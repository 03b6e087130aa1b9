//! Contract tests, loxilb's refusals and failures: the typed client against a started
//! `loxilb-sim`, over real HTTP — limits and invalid rules refused without retry, 500s retried
//! as configured, an unreachable or slow loxilb, tokens, and invalid URLs. (Split from
//! `against_simulator.rs`, which keeps applying, listing and deleting.)

#[path = "common/simulator.rs"]
mod simulator;

use std::time::Duration;

use loxi_domain::{EndpointSelection, NatMode};
use loxilb_client::convert::{from_entry, to_entry};
use loxilb_client::{
    ClientConfig, ClientError, DeleteOutcome, LoxilbClient, RetryPolicy, WriteOutcome,
};
use loxilb_sim::{Fault, SimConfig, Simulator};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------
use simulator::*;

// ---------------------------------------------------------------------------------------------
// 3. Error classification (docs/loxilb-api.md: Answers and errors, Authentication, Limits)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn too_many_endpoints_is_rejected_and_not_retried() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let eps = (1..=33u16)
        .map(|i| ep(&format!("10.0.1.{i}"), 30080))
        .collect();
    let rule = tcp_rule("192.0.2.30", 80, "too-many:llb-inst0", eps);

    let err = client
        .apply_rule(&to_entry(&rule))
        .await
        .expect_err("33 endpoints must fail");
    assert!(
        matches!(&err, ClientError::Rejected { status: 400, message } if message.contains("endpoints-range")),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert_eq!(err.category(), "LoxilbRejected");
    assert_eq!(sim.request_count(), 1, "a 400 is not retried");
    assert!(sim.rules().is_empty());

    // 32 is the limit and is accepted.
    let eps = (1..=32u16)
        .map(|i| ep(&format!("10.0.1.{i}"), 30080))
        .collect();
    let rule = tcp_rule("192.0.2.30", 80, "max:llb-inst0", eps);
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.rules()[0].endpoints.len(), 32);
}

#[tokio::test]
async fn dsr_with_round_robin_is_rejected_despite_http_200() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let mut rule = tcp_rule("192.0.2.31", 80, "dsr:llb-inst0", vec![ep("10.0.0.1", 80)]);
    rule.mode = NatMode::Dsr;
    rule.selection = EndpointSelection::RoundRobin;

    let err = client
        .apply_rule(&to_entry(&rule))
        .await
        .expect_err("200 with an Error result is a failure");
    match &err {
        ClientError::Rejected { status, message } => {
            assert_eq!(*status, 200);
            assert!(message.starts_with("Error:"), "{message}");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(sim.request_count(), 1);
    assert!(sim.rules().is_empty(), "nothing created");

    // With hash selection the same DSR rule is fine.
    rule.selection = EndpointSelection::Hash;
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.rules()[0].mode, 3);
}

#[tokio::test]
async fn rule_limit_is_capacity_exceeded() {
    let sim = start_sim(SimConfig {
        max_rules: 2,
        ..SimConfig::default()
    })
    .await;
    let client = client_for(&sim);
    for port in [80, 81] {
        let r = tcp_rule(
            "192.0.2.40",
            port,
            "cap:llb-inst0",
            vec![ep("10.0.0.1", 80)],
        );
        assert_eq!(
            client.apply_rule(&to_entry(&r)).await.unwrap(),
            WriteOutcome::Applied
        );
    }
    let requests = sim.request_count();

    let third = tcp_rule("192.0.2.40", 82, "cap:llb-inst0", vec![ep("10.0.0.1", 80)]);
    let err = client
        .apply_rule(&to_entry(&third))
        .await
        .expect_err("third rule exceeds max_rules");
    assert!(
        matches!(&err, ClientError::Capacity { status: 403, message } if message.contains("hwm")),
        "{err:?}"
    );
    assert_eq!(err.category(), "CapacityExceeded");
    assert!(!err.is_retryable());
    assert_eq!(sim.request_count() - requests, 1, "a 403 is not retried");
    let ports: Vec<u16> = sim.rules().iter().map(|r| r.port).collect();
    assert_eq!(ports, vec![80, 81]);
}

#[tokio::test]
async fn changing_sctp_secondary_ips_is_rejected() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let entry = sctp_entry(&["192.168.30.200", "192.168.20.200"]);
    assert_eq!(
        client.apply_rule(&entry).await.unwrap(),
        WriteOutcome::Applied
    );
    let stored = sim.rules();
    assert_eq!(
        stored[0].secondary_ips,
        vec!["192.168.20.200", "192.168.30.200"],
        "stored sorted"
    );

    let changed = sctp_entry(&["192.168.20.200", "192.168.40.200"]);
    let err = client
        .apply_rule(&changed)
        .await
        .expect_err("secondary IPs cannot be modified");
    assert!(
        matches!(&err, ClientError::Rejected { status: 500, message } if message.contains("secIP modify error")),
        "{err:?}"
    );
    assert!(!err.is_retryable(), "deterministic 500");
    assert_eq!(err.category(), "LoxilbRejected");
    assert_eq!(sim.rules(), stored, "rule untouched");
}

/// A deterministic error is classified as not retryable, so the client must not spend its
/// in-call retries on it either (the same request fails the same way every time).
#[tokio::test]
async fn deterministic_500_is_not_retried_within_the_call() {
    let sim = start_sim(SimConfig::default()).await;
    let mut cfg = config_for(&sim);
    cfg.retry = quick_retry(3);
    let client = LoxilbClient::new(cfg).unwrap();
    client
        .apply_rule(&sctp_entry(&["192.168.20.200"]))
        .await
        .unwrap();
    let requests = sim.request_count();

    let err = client
        .apply_rule(&sctp_entry(&["192.168.40.200"]))
        .await
        .expect_err("secIP modify error");
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(
        sim.request_count() - requests,
        1,
        "a non-retryable `secIP modify error` was sent more than once"
    );
}

#[tokio::test]
async fn persistent_500_is_server_error_after_exactly_the_configured_attempts() {
    let sim = start_sim(SimConfig::default()).await;
    let mut cfg = config_for(&sim);
    cfg.retry = quick_retry(4);
    let attempts = cfg.retry.attempts;
    let client = LoxilbClient::new(cfg).unwrap();
    sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));

    let err = client
        .apply_rule(&to_entry(&web_rule()))
        .await
        .expect_err("every write fails");
    assert!(
        matches!(&err, ClientError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.category(), "LoxilbServerError");
    assert_eq!(sim.request_count(), attempts as u64);
    assert!(sim.rules().is_empty());

    // Reads are not affected by a write-only fault.
    assert!(client.list_rules().await.unwrap().is_empty());
    assert_eq!(sim.request_count(), attempts as u64 + 1);
}

#[tokio::test]
async fn persistent_500_with_default_retry_policy() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));

    let err = client
        .delete_rule("192.0.2.10", 80, "tcp", false)
        .await
        .expect_err("every write fails");
    assert!(
        matches!(&err, ClientError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(sim.request_count(), RetryPolicy::default().attempts as u64);
}

#[tokio::test]
async fn intermittent_500_is_absorbed_by_the_retry() {
    let sim = start_sim(SimConfig::default()).await;
    let mut cfg = config_for(&sim);
    cfg.retry = quick_retry(3);
    let client = LoxilbClient::new(cfg).unwrap();
    // Every 2nd eligible call fails: call 1 passes, call 2 fails, call 3 passes.
    sim.set_fault(Some(Fault {
        status: 500,
        rate: 0.5,
        only_writes: true,
    }));

    let first = tcp_rule(
        "192.0.2.50",
        80,
        "flaky:llb-inst0",
        vec![ep("10.0.0.1", 80)],
    );
    assert_eq!(
        client.apply_rule(&to_entry(&first)).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.request_count(), 1);

    let second = tcp_rule(
        "192.0.2.51",
        80,
        "flaky:llb-inst0",
        vec![ep("10.0.0.1", 80)],
    );
    assert_eq!(
        client.apply_rule(&to_entry(&second)).await.unwrap(),
        WriteOutcome::Applied,
        "the failed first attempt is retried"
    );
    assert_eq!(sim.request_count(), 3, "one failed attempt plus one retry");
    let vips: Vec<String> = sim.rules().iter().map(|r| r.external_ip.clone()).collect();
    assert_eq!(vips, vec!["192.0.2.50", "192.0.2.51"]);
}

#[tokio::test]
async fn loxilb_down_is_unreachable_and_state_survives_coming_back() {
    let sim = start_sim(SimConfig::default()).await;
    let mut cfg = config_for(&sim);
    cfg.retry = quick_retry(2);
    let client = LoxilbClient::new(cfg).unwrap();
    let rule = web_rule();
    client.apply_rule(&to_entry(&rule)).await.unwrap();
    let before = sim.rules();

    sim.go_down().await;
    let err = client.list_rules().await.expect_err("listener closed");
    assert!(
        matches!(&err, ClientError::Unreachable { url, .. } if *url == sim.url()),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&sim.url()),
        "message names the URL: {err}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.category(), "LoxilbUnreachable");
    let err = client
        .apply_rule(&to_entry(&rule))
        .await
        .expect_err("writes fail too");
    assert!(matches!(err, ClientError::Unreachable { .. }), "{err:?}");

    sim.come_up().await.expect("rebinds the same port");
    assert_eq!(client.version().await.unwrap().version, "0.9.8-sim");
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::AlreadyPresent,
        "state was kept while down"
    );
    assert_eq!(sim.rules(), before);
    let listed = client.list_rules().await.unwrap();
    assert_eq!(from_entry(&listed[0]), Some(rule.normalized()));
}

#[tokio::test]
async fn slow_loxilb_is_a_timeout() {
    let sim = start_sim(SimConfig::default()).await;
    let mut cfg = config_for(&sim);
    cfg.timeout = Duration::from_millis(200);
    cfg.retry = quick_retry(2);
    let client = LoxilbClient::new(cfg).unwrap();
    sim.set_latency(Duration::from_secs(1));

    let started = std::time::Instant::now();
    let err = client.version().await.expect_err("latency above timeout");
    assert!(
        matches!(&err, ClientError::Timeout { timeout_ms: 200, url } if *url == sim.url()),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(err.category(), "LoxilbTimeout");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "gave up after 2 x 200 ms, not after 2 x 1 s of latency: {:?}",
        started.elapsed()
    );
    assert_eq!(sim.request_count(), 2, "timeouts are retried");

    // Back to normal speed: the same client works.
    sim.set_latency(Duration::ZERO);
    assert!(client.list_rules().await.unwrap().is_empty());
}

/// A write that got no answer in time is not sent again: loxilb may still apply it (it queues
/// writes), and a second copy would only queue behind the first.
#[tokio::test]
async fn a_write_that_times_out_is_sent_once() {
    // loxilb's costs: a write whose client gave up is still applied.
    let sim = start_sim(SimConfig {
        profile: loxilb_sim::Profile::Loxilb098 {
            tick: Duration::from_millis(50),
        },
        ..SimConfig::default()
    })
    .await;
    let mut cfg = config_for(&sim);
    cfg.timeout = Duration::from_millis(200);
    cfg.retry = quick_retry(3);
    let client = LoxilbClient::new(cfg).unwrap();
    sim.set_write_latency(Duration::from_secs(1));
    let err = client
        .apply_rule(&to_entry(&web_rule()))
        .await
        .expect_err("latency above timeout");
    assert!(matches!(&err, ClientError::Timeout { .. }), "{err:?}");
    assert_eq!(sim.rule_posts(), 1, "sent once");
    // Applied anyway, once loxilb got to it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sim.rules().is_empty() {
        assert!(std::time::Instant::now() < deadline, "never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn auth_sim() -> Simulator {
    start_sim(SimConfig {
        auth_token: Some("s3cret".into()),
        ..SimConfig::default()
    })
    .await
}

fn client_with_token(sim: &Simulator, token: Option<&str>) -> LoxilbClient {
    let mut cfg = config_for(sim);
    cfg.token = loxilb_client::Token::new(token);
    cfg.retry = quick_retry(3);
    LoxilbClient::new(cfg).unwrap()
}

#[tokio::test]
async fn missing_token_is_unauthorized() {
    let sim = auth_sim().await;
    let client = client_with_token(&sim, None);

    let err = client.list_rules().await.expect_err("no token");
    assert!(
        matches!(&err, ClientError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert_eq!(err.category(), "LoxilbUnauthorized");

    let err = client
        .apply_rule(&to_entry(&web_rule()))
        .await
        .expect_err("no token");
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");
    assert_eq!(sim.request_count(), 2, "401 is not retried");
    assert!(sim.rules().is_empty());

    // `/version` is always open.
    assert_eq!(client.version().await.unwrap().version, "0.9.8-sim");
}

#[tokio::test]
async fn wrong_token_is_unauthorized() {
    let sim = auth_sim().await;
    let client = client_with_token(&sim, Some("wrong"));

    let err = client.list_rules().await.expect_err("wrong token");
    assert!(
        matches!(&err, ClientError::Unauthorized { status: 500, message } if message.contains("invalid token")),
        "{err:?}"
    );
    assert!(!err.is_retryable());

    let err = client
        .apply_rule(&to_entry(&web_rule()))
        .await
        .expect_err("wrong token");
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");
    assert!(sim.rules().is_empty());
    assert!(client.version().await.is_ok(), "/version needs no token");
}

/// The retry loop means not to retry auth failures; the 500 `invalid token` answer must be
/// sent once, not `RetryPolicy::attempts` times.
#[tokio::test]
async fn wrong_token_is_not_retried() {
    let sim = auth_sim().await;
    let client = client_with_token(&sim, Some("wrong"));
    let err = client.list_rules().await.expect_err("wrong token");
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");
    assert_eq!(sim.request_count(), 1, "an Unauthorized answer was retried");
}

#[tokio::test]
async fn right_token_works() {
    let sim = auth_sim().await;
    let client = client_with_token(&sim, Some("s3cret"));
    let rule = web_rule();

    assert_eq!(client.version().await.unwrap().version, "0.9.8-sim");
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::AlreadyPresent
    );
    let listed = client.list_rules().await.unwrap();
    assert_eq!(from_entry(&listed[0]), Some(rule.clone().normalized()));
    assert_eq!(
        client
            .delete_rule("192.0.2.10", 80, "tcp", false)
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    client.delete_rules_named(&rule.name).await.unwrap();
    assert!(sim.rules().is_empty());
}

#[tokio::test]
async fn version_works_without_auth_config() {
    let sim = start_sim(SimConfig {
        version: "1.2.3-test".into(),
        ..SimConfig::default()
    })
    .await;
    let info = client_for(&sim).version().await.unwrap();
    assert_eq!(info.version, "1.2.3-test");
}

// ---------------------------------------------------------------------------------------------
// 4. Configuration errors
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_urls_are_config_errors() {
    for url in [
        "ftp://x",
        "not a url",
        "",
        "localhost:11111",
        "127.0.0.1:11111",
    ] {
        match LoxilbClient::new(ClientConfig::new(url)) {
            Err(e @ ClientError::Config(_)) => {
                assert_eq!(e.category(), "LoxilbConfig");
                assert!(!e.is_retryable());
            }
            other => panic!("{url:?}: expected ClientError::Config, got {other:?}"),
        }
    }
}

/// `LoxilbClient::new` promises "http:// or https:// with a host".
#[test]
fn urls_without_a_host_are_config_errors() {
    for url in ["http://", "https://", "http:"] {
        match LoxilbClient::new(ClientConfig::new(url)) {
            Err(ClientError::Config(_)) => {}
            Ok(c) => panic!(
                "{url:?} has no host but was accepted (client url {:?})",
                c.url()
            ),
            Err(other) => panic!("{url:?}: expected ClientError::Config, got {other:?}"),
        }
    }
}

#[test]
fn good_urls_are_accepted() {
    for url in [
        "http://127.0.0.1:11111",
        "http://127.0.0.1:11111/",
        "https://loxilb.example:8091",
        "http://[2001:db8::1]:11111",
    ] {
        let c = LoxilbClient::new(ClientConfig::new(url)).expect(url);
        assert_eq!(c.url(), url.trim_end_matches('/'));
    }
}
