//! Contract tests: the typed client against a started `loxilb-sim`, over real HTTP.
//!
//! Every test starts its own simulator on port 0 and asserts on two things: what the client
//! returns (outcome enums, error variants, retryability) and what the simulator really holds
//! afterwards (`Simulator::rules()`, `Simulator::request_count()`). No sleeps are used for
//! synchronisation: every simulator knob takes effect before the setter returns.

use std::net::SocketAddr;
use std::time::Duration;

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::convert::{from_entry, to_entry};
use loxilb_client::{
    ClientConfig, ClientError, DeleteOutcome, EndpointEntry, LoadbalanceEntry, LoxilbClient,
    RetryPolicy, SecondaryIp, ServiceArguments, WriteOutcome,
};
use loxilb_sim::{Fault, SimConfig, SimEndpoint, SimRule, Simulator};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

async fn start_sim(cfg: SimConfig) -> Simulator {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Simulator::start(addr, cfg).await.expect("simulator starts")
}

/// Retries with tiny delays so that retry tests stay fast.
fn quick_retry(attempts: usize) -> RetryPolicy {
    RetryPolicy {
        attempts,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

fn config_for(sim: &Simulator) -> ClientConfig {
    let mut cfg = ClientConfig::new(&sim.url());
    cfg.timeout = Duration::from_secs(2);
    cfg
}

fn client_for(sim: &Simulator) -> LoxilbClient {
    LoxilbClient::new(config_for(sim)).expect("client builds")
}

fn ep(ip: &str, target_port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        target_port,
        weight: 1,
    }
}

fn tcp_rule(vip: &str, port: u16, name: &str, endpoints: Vec<Endpoint>) -> Rule {
    Rule {
        key: RuleKey {
            ip: vip.parse().unwrap(),
            port,
            protocol: Protocol::Tcp,
        },
        name: name.to_string(),
        mode: NatMode::FullNat,
        selection: EndpointSelection::RoundRobin,
        endpoints,
        monitor: true,
        managed: true,
        probe: Default::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        egress: false,
        allowed_sources: vec![],
        secondary_ips: vec![],
        bgp: false,
        private_ip: None,
    }
}

fn web_rule() -> Rule {
    // Endpoints deliberately out of order: loxilb stores a new rule's endpoints sorted by IP.
    tcp_rule(
        "192.0.2.10",
        80,
        "ccm-test_default_web_80_tcp:llb-inst0",
        vec![ep("10.0.0.12", 30080), ep("10.0.0.11", 30080)],
    )
}

fn sim_ep(ip: &str, target_port: u16, weight: u8) -> SimEndpoint {
    SimEndpoint {
        ip: ip.to_string(),
        target_port,
        weight,
    }
}

fn sim_eps(rule: &SimRule) -> Vec<(String, u16, u8)> {
    rule.endpoints
        .iter()
        .map(|e| (e.ip.clone(), e.target_port, e.weight))
        .collect()
}

fn sctp_entry(secondary: &[&str]) -> LoadbalanceEntry {
    LoadbalanceEntry {
        service_arguments: ServiceArguments {
            external_ip: "192.168.10.200".into(),
            port: 38412,
            protocol: "sctp".into(),
            mode: 2,
            managed: true,
            name: "core_amf:llb-inst0".into(),
            ..Default::default()
        },
        endpoints: ["10.0.1.21", "10.0.1.22"]
            .iter()
            .map(|ip| EndpointEntry {
                endpoint_ip: (*ip).into(),
                target_port: 38412,
                weight: 1,
                ..Default::default()
            })
            .collect(),
        secondary_ips: secondary
            .iter()
            .map(|ip| SecondaryIp {
                secondary_ip: (*ip).into(),
            })
            .collect(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Apply: create, idempotent re-apply, update, list round trip
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn apply_creates_rule_with_exact_fields() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let rule = web_rule();

    let outcome = client.apply_rule(&to_entry(&rule)).await.expect("apply");
    assert_eq!(outcome, WriteOutcome::Applied);

    let expected = SimRule {
        external_ip: "192.0.2.10".into(),
        port: 80,
        port_max: 0,
        protocol: "tcp".into(),
        block: 0,
        host: String::new(),
        name: "ccm-test_default_web_80_tcp:llb-inst0".into(),
        mode: 2,
        sel: 0,
        security: 0,
        bgp: false,
        monitor: true,
        managed: true,
        egress: false,
        proxyprotocolv2: false,
        // 0 was sent: loxilb's effective default for tcp.
        inactive_timeout: 240,
        probetype: String::new(),
        probeport: 0,
        // A new rule's endpoints are stored sorted by IP.
        endpoints: vec![sim_ep("10.0.0.11", 30080, 1), sim_ep("10.0.0.12", 30080, 1)],
        secondary_ips: vec![],
        allowed_sources: vec![],
        index: 1,
        private_ip: None,
    };
    assert_eq!(sim.rules(), vec![expected]);
}

#[tokio::test]
async fn reapplying_the_same_rule_is_already_present() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let entry = to_entry(&web_rule());

    assert_eq!(
        client.apply_rule(&entry).await.unwrap(),
        WriteOutcome::Applied
    );
    let before = sim.rules();
    let requests = sim.request_count();

    assert_eq!(
        client.apply_rule(&entry).await.unwrap(),
        WriteOutcome::AlreadyPresent
    );
    // One request (a 409 is an answer, not something to retry) and nothing changed.
    assert_eq!(sim.request_count() - requests, 1);
    assert_eq!(sim.rules(), before);
}

#[tokio::test]
async fn changed_endpoints_are_applied_in_place() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let mut rule = web_rule();
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );

    rule.endpoints = vec![ep("10.0.0.13", 30080), ep("10.0.0.12", 30080)];
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );

    let rules = sim.rules();
    assert_eq!(
        rules.len(),
        1,
        "updated in place, not duplicated: {rules:?}"
    );
    // Kept endpoints stay, new ones are appended; the removed one is hidden
    // (docs/loxilb-api.md#updates).
    assert_eq!(
        sim_eps(&rules[0]),
        vec![
            ("10.0.0.12".to_string(), 30080, 1),
            ("10.0.0.13".to_string(), 30080, 1)
        ]
    );
    assert_eq!(rules[0].index, 1);

    // The removed endpoint stays hidden in the rule, and loxilb counts it as a change on every
    // re-POST (seen on a live loxilb, docs/loxilb-api.md#updates): 200, not 409, and nothing
    // changes.
    assert_eq!(
        client.apply_rule(&to_entry(&rule)).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.rules(), rules);
}

#[tokio::test]
async fn list_rules_round_trips_to_the_same_normalized_rule() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let web = web_rule();
    let mut dns = tcp_rule(
        "2001:db8::53",
        53,
        "ccm-test_kube-system_dns_53_udp:llb-inst0",
        vec![ep("fd00::2", 30053), ep("fd00::1", 30053)],
    );
    dns.key.protocol = Protocol::Udp;
    dns.selection = EndpointSelection::Hash;
    dns.mode = NatMode::Default;
    dns.monitor = false;

    for r in [&web, &dns] {
        assert_eq!(
            client.apply_rule(&to_entry(r)).await.unwrap(),
            WriteOutcome::Applied
        );
    }

    let listed = client.list_rules().await.expect("list");
    assert_eq!(listed.len(), 2);
    let mut back: Vec<Rule> = listed
        .iter()
        .map(|e| from_entry(e).expect("our own rule reads back"))
        .collect();
    back.sort_by_key(|r| r.key);
    let mut want = vec![web.normalized(), dns.normalized()];
    want.sort_by_key(|r| r.key);
    assert_eq!(back, want);
}

#[tokio::test]
async fn list_rules_of_an_empty_loxilb_is_empty() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    assert!(client.list_rules().await.unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// 2. Delete by tuple and by name
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn delete_by_tuple_then_again_is_already_absent() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let web = web_rule();
    let other = tcp_rule(
        "192.0.2.10",
        443,
        "ccm-test_default_web_443_tcp:llb-inst0",
        vec![ep("10.0.0.11", 30443)],
    );
    for r in [&web, &other] {
        client.apply_rule(&to_entry(r)).await.unwrap();
    }

    let out = client
        .delete_rule("192.0.2.10", 80, "tcp", false)
        .await
        .unwrap();
    assert_eq!(out, DeleteOutcome::Deleted);
    let rules = sim.rules();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].port, 443, "only the addressed tuple is deleted");

    let requests = sim.request_count();
    let out = client
        .delete_rule("192.0.2.10", 80, "tcp", false)
        .await
        .unwrap();
    assert_eq!(out, DeleteOutcome::AlreadyAbsent);
    assert_eq!(sim.request_count() - requests, 1, "a 404 is not retried");
    assert_eq!(sim.rules().len(), 1);

    // Same port, other protocol: a different identity, so nothing is there.
    let out = client
        .delete_rule("192.0.2.10", 443, "udp", false)
        .await
        .unwrap();
    assert_eq!(out, DeleteOutcome::AlreadyAbsent);
    assert_eq!(sim.rules().len(), 1);
}

#[tokio::test]
async fn delete_by_tuple_works_for_ipv6_vips() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let rule = tcp_rule(
        "2001:db8::10",
        8080,
        "ccm-test_default_v6_8080_tcp:llb-inst0",
        vec![ep("fd00::11", 30080)],
    );
    client.apply_rule(&to_entry(&rule)).await.unwrap();
    assert_eq!(sim.rules().len(), 1);

    let out = client
        .delete_rule("2001:db8::10", 8080, "tcp", true)
        .await
        .unwrap();
    assert_eq!(out, DeleteOutcome::Deleted);
    assert!(sim.rules().is_empty());
}

#[tokio::test]
async fn delete_by_name_removes_only_exact_name_matches() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let target = "ccm-test_default_web_80_tcp:llb-inst0";
    let rules = [
        tcp_rule("192.0.2.10", 80, target, vec![ep("10.0.0.11", 30080)]),
        // Same name on another VIP: also deleted (names are not unique).
        tcp_rule("192.0.2.11", 80, target, vec![ep("10.0.0.11", 30080)]),
        // Near misses: prefix, suffix, case, other instance.
        tcp_rule(
            "192.0.2.12",
            80,
            "ccm-test_default_web_80_tcp",
            vec![ep("10.0.0.11", 30080)],
        ),
        tcp_rule(
            "192.0.2.13",
            80,
            "ccm-test_default_web_80_tcp:llb-inst0x",
            vec![ep("10.0.0.11", 30080)],
        ),
        tcp_rule(
            "192.0.2.14",
            80,
            "CCM-TEST_default_web_80_tcp:llb-inst0",
            vec![ep("10.0.0.11", 30080)],
        ),
        tcp_rule(
            "192.0.2.15",
            80,
            "ccm-test_default_web_80_tcp:llb-inst1",
            vec![ep("10.0.0.11", 30080)],
        ),
    ];
    for r in &rules {
        assert_eq!(
            client.apply_rule(&to_entry(r)).await.unwrap(),
            WriteOutcome::Applied
        );
    }

    client
        .delete_rules_named(target)
        .await
        .expect("delete by name");

    let left: Vec<String> = sim.rules().iter().map(|r| r.external_ip.clone()).collect();
    assert_eq!(
        left,
        vec!["192.0.2.12", "192.0.2.13", "192.0.2.14", "192.0.2.15"]
    );
    assert!(sim.rules().iter().all(|r| r.name != target));

    // 200 even when nothing matches, and nothing else is touched.
    client
        .delete_rules_named(target)
        .await
        .expect("no match is fine");
    assert_eq!(sim.rules().len(), 4);
}

#[tokio::test]
async fn delete_by_name_escapes_reserved_characters() {
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    // Names are free text (docs/loxilb-api.md#rule-names): `/`, `?`, `#`, `%` and spaces must
    // survive as one path segment.
    let odd = "team/a b?c#d%e:llb-inst0";
    let plain = "team:llb-inst0";
    client
        .apply_rule(&to_entry(&tcp_rule(
            "192.0.2.20",
            80,
            odd,
            vec![ep("10.0.0.1", 80)],
        )))
        .await
        .unwrap();
    client
        .apply_rule(&to_entry(&tcp_rule(
            "192.0.2.21",
            80,
            plain,
            vec![ep("10.0.0.1", 80)],
        )))
        .await
        .unwrap();

    client.delete_rules_named(odd).await.unwrap();
    let left: Vec<String> = sim.rules().iter().map(|r| r.name.clone()).collect();
    assert_eq!(left, vec![plain.to_string()]);
}

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

#[tokio::test]
async fn firewall_rules_are_added_listed_and_deleted() {
    use loxi_domain::firewall::{FwAction, FwRule, Preferences};
    use loxilb_client::firewall::{owned_firewall_rule, to_firewall_entry};
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let prefs = Preferences {
        drop: 40_000,
        allow: 40_001,
    };
    let rule = FwRule {
        source: "198.51.100.0/24".parse().unwrap(),
        destination: "192.0.2.10".parse().unwrap(),
        port: 443,
        protocol: Protocol::Tcp,
        preference: prefs.allow,
        action: FwAction::Allow,
    };
    let entry = to_firewall_entry(&rule);
    assert_eq!(
        client.add_firewall_rule(&entry).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        client.add_firewall_rule(&entry).await.unwrap(),
        WriteOutcome::AlreadyPresent
    );
    let listed = client.list_firewall().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(owned_firewall_rule(&listed[0], prefs), Some(rule));
    assert_eq!(sim.firewall_rules().len(), 1);
    assert_eq!(
        client
            .delete_firewall_rule(&listed[0].rule_arguments)
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client
            .delete_firewall_rule(&entry.rule_arguments)
            .await
            .unwrap(),
        DeleteOutcome::AlreadyAbsent
    );
    assert!(sim.firewall_rules().is_empty());
}

#[tokio::test]
async fn egress_snat_rules_round_trip() {
    use loxi_domain::egress::{EgressSpec, plan};
    use loxilb_client::firewall::{owned_snat_rule, to_snat_entry};
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let spec = EgressSpec {
        addresses: vec!["10.1.0.5".into()],
        vip: "192.0.2.50".into(),
        ..EgressSpec::default()
    };
    let rules = plan(&spec, &["10.244.1.7".parse().unwrap()], 50_123).unwrap();
    for r in &rules {
        let outcome = client.add_firewall_rule(&to_snat_entry(r)).await.unwrap();
        assert_eq!(outcome, WriteOutcome::Applied);
    }
    // loxilb makes an LB rule per SNAT rule.
    assert_eq!(sim.rules().len(), 2);
    let mut listed: Vec<_> = client
        .list_firewall()
        .await
        .unwrap()
        .iter()
        .filter_map(|e| owned_snat_rule(e, 50_123))
        .collect();
    listed.sort();
    assert_eq!(listed, rules);
    for e in client.list_firewall().await.unwrap() {
        assert_eq!(
            client
                .delete_firewall_rule(&e.rule_arguments)
                .await
                .unwrap(),
            DeleteOutcome::Deleted
        );
    }
    assert!(sim.rules().is_empty(), "their LB rules go with them");
}

/// `--enableK8sMetadata`'s call: the body reaches the simulator as kube-loxilb's model, and
/// a restart forgets it.
#[tokio::test]
async fn k8s_metadata_is_posted_in_kube_loxilbs_model() {
    use loxi_domain::k8s_metadata::{Message, NodeMeta, PodMeta};
    let sim = start_sim(SimConfig::default()).await;
    let client = client_for(&sim);
    let body = Message {
        pods: vec![PodMeta {
            name: "web-1".into(),
            namespace: "a".into(),
            ip: "10.244.0.1".into(),
            node_name: "n1".into(),
            labels: [("app".to_string(), "web".to_string())].into(),
        }],
        services: Vec::new(),
        nodes: vec![NodeMeta {
            name: "n1".into(),
            internal_ip: "10.0.0.1".into(),
            labels: Default::default(),
            status: "True".into(),
        }],
    };
    client.post_k8s_metadata(&body).await.unwrap();
    let posts = sim.k8s_metadata_posts();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].pods[0].node_name, "n1");
    assert_eq!(posts[0].pods[0].labels["app"], "web");
    assert_eq!(posts[0].nodes[0].internal_ip, "10.0.0.1");
    assert!(posts[0].services.is_empty());
    sim.restart();
    assert!(sim.k8s_metadata_posts().is_empty());
}
