//! Contract tests: the typed client against a started `loxilb-sim`, over real HTTP.
//!
//! Every test starts its own simulator on port 0 and asserts on two things: what the client
//! returns (outcome enums, error variants, retryability) and what the simulator really holds
//! afterwards (`Simulator::rules()`, `Simulator::request_count()`). No sleeps are used for
//! synchronisation: every simulator knob takes effect before the setter returns.

#[path = "common/simulator.rs"]
mod simulator;

use loxi_domain::{EndpointSelection, NatMode, Protocol, Rule};
use loxilb_client::convert::{from_entry, to_entry};
use loxilb_client::{DeleteOutcome, WriteOutcome};
use loxilb_sim::{SimConfig, SimRule};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------
use simulator::*;

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
