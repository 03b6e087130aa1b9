//! The typed BGP calls against a started `loxilb-sim` (BGP on unless a test says otherwise),
//! over real HTTP: what the client returns and what the simulator holds afterwards
//! (docs/loxilb-api.md#bgp). Includes the advertisement reference counting a controller has
//! to plan around: every 200 of a rule POST with `bgp: true` adds a reference, a 409 does not,
//! and each DELETE with `?bgp=true` drops one.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::bgp::{BgpActions, BgpConditions, BgpMatchPrefixSet};
use loxilb_client::convert::to_entry;
use loxilb_client::{
    BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpPolicy, BgpPolicyApply, BgpPrefix, BgpStatement,
    ClientConfig, ClientError, DefinedSetKind, DeleteOutcome, LoadbalanceEntry, LoxilbClient,
    PolicyDirection, RetryPolicy, RouteAction, WriteOutcome,
};
use loxilb_sim::{SimConfig, Simulator};

async fn start_sim(bgp: bool) -> Simulator {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Simulator::start(
        addr,
        SimConfig {
            bgp,
            ..SimConfig::default()
        },
    )
    .await
    .expect("simulator starts")
}

fn client_for(sim: &Simulator) -> LoxilbClient {
    let mut cfg = ClientConfig::new(&sim.url());
    cfg.timeout = Duration::from_secs(2);
    cfg.retry = RetryPolicy {
        attempts: 3,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    };
    LoxilbClient::new(cfg).expect("client builds")
}

fn global() -> BgpGlobal {
    BgpGlobal {
        router_id: "192.168.10.5".parse().unwrap(),
        local_as: 64512,
        set_next_hop_self: false,
        listen_port: 0,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const FOUR_BYTE_AS: u32 = 4_200_000_001;

async fn with_global() -> (Simulator, LoxilbClient) {
    let sim = start_sim(true).await;
    let client = client_for(&sim);
    client.set_bgp_global(&global()).await.unwrap();
    (sim, client)
}

#[tokio::test]
async fn global_and_neighbors_round_trip() {
    let (sim, client) = with_global().await;
    let g = sim.bgp().global.expect("global stored");
    assert_eq!(
        (g.router_id.as_str(), g.local_as, g.listen_port),
        ("192.168.10.5", 64512, 179)
    );
    // Repeating the same configuration changes nothing, and loxilb says so with a 500
    // "action 3 is already set" (docs/loxilb-api.md), which the controller takes as in place.
    let again = client.set_bgp_global(&global()).await;
    assert!(
        matches!(&again, Err(e) if format!("{e:?}").contains("already set")),
        "{again:?}"
    );
    assert_eq!(sim.bgp().global.expect("global stored").local_as, 64512);

    let v4 = BgpNeighbor {
        remote_port: 1179,
        set_multi_hop: true,
        ..BgpNeighbor::new(ip("192.168.10.1"), 65001)
    };
    let v6 = BgpNeighbor::new(ip("2001:db8::1"), FOUR_BYTE_AS);
    assert_eq!(
        client.add_bgp_neighbor(&v4).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        client.add_bgp_neighbor(&v6).await.unwrap(),
        WriteOutcome::Applied
    );
    let mut listed = client.list_bgp_neighbors().await.unwrap();
    listed.sort_by(|a, b| a.ip_address.cmp(&b.ip_address));
    let seen: Vec<(&str, u32, &str)> = listed
        .iter()
        .map(|n| (n.ip_address.as_str(), n.remote_as, n.state.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("192.168.10.1", 65001, "ACTIVE"),
            ("2001:db8::1", FOUR_BYTE_AS, "ACTIVE"),
        ]
    );
    assert!(listed.iter().all(|n| n.updowntime == "never"));
    let held = &sim.bgp().neighbors[0];
    assert_eq!((held.remote_port, held.multihop), (1179, true));

    assert!(sim.set_bgp_peer_state("192.168.10.1", "ESTABLISHED", Some("00:10:00")));
    let up = client.list_bgp_neighbors().await.unwrap();
    let n = up.iter().find(|n| n.ip_address == "192.168.10.1").unwrap();
    assert!(n.is_established());
    assert_eq!(n.updowntime, "00:10:00");
}

#[tokio::test]
async fn a_duplicate_neighbor_is_already_present() {
    let (sim, client) = with_global().await;
    let n = BgpNeighbor::new(ip("2001:db8::1"), 65001);
    assert_eq!(
        client.add_bgp_neighbor(&n).await.unwrap(),
        WriteOutcome::Applied
    );
    let before = sim.request_count();
    // Other settings do not matter: the address is the key.
    let other = BgpNeighbor {
        set_multi_hop: true,
        ..BgpNeighbor::new(ip("2001:db8::1"), 65002)
    };
    assert_eq!(
        client.add_bgp_neighbor(&other).await.unwrap(),
        WriteOutcome::AlreadyPresent
    );
    assert_eq!(sim.request_count(), before + 1, "not retried");
    assert_eq!(sim.bgp().neighbors[0].remote_as, 65001, "unchanged");
}

#[tokio::test]
async fn a_neighbor_is_deleted_with_its_remote_as_even_a_four_byte_one() {
    let (sim, client) = with_global().await;
    for n in [
        BgpNeighbor::new(ip("192.168.10.1"), 65001),
        BgpNeighbor::new(ip("2001:db8::1"), FOUR_BYTE_AS),
    ] {
        client.add_bgp_neighbor(&n).await.unwrap();
    }
    // Without remoteAs, or with 4200000001 as such (the route's query is an int32), the
    // simulator would close the connection or answer 422: Deleted proves what was sent.
    assert_eq!(
        client
            .delete_bgp_neighbor(ip("2001:db8::1"), FOUR_BYTE_AS)
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client
            .delete_bgp_neighbor(ip("192.168.10.1"), 65001)
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(sim.bgp().neighbors.is_empty());
    let before = sim.request_count();
    assert_eq!(
        client
            .delete_bgp_neighbor(ip("192.168.10.1"), 65001)
            .await
            .unwrap(),
        DeleteOutcome::AlreadyAbsent,
        "an unknown peer (500 from goBGP)"
    );
    assert_eq!(sim.request_count(), before + 1, "not retried");
}

#[tokio::test]
async fn bgp_off_is_bgp_disabled_for_every_call() {
    let sim = start_sim(false).await;
    let client = client_for(&sim);
    let check = |e: ClientError| {
        assert!(
            matches!(e, ClientError::BgpDisabled { status: 403, .. }),
            "{e:?}"
        );
        assert!(!e.is_retryable());
        assert_eq!(e.category(), "LoxilbBgpDisabled");
    };
    let apply = BgpPolicyApply::global(PolicyDirection::Export, vec![], RouteAction::Accept);
    let set = BgpDefinedSet {
        name: "ps1".into(),
        prefix_list: vec![BgpPrefix::new("10.0.0.0/24", 24, 32)],
        ..Default::default()
    };
    check(client.set_bgp_global(&global()).await.unwrap_err());
    check(
        client
            .add_bgp_neighbor(&BgpNeighbor::new(ip("10.0.0.1"), 65001))
            .await
            .unwrap_err(),
    );
    check(
        client
            .delete_bgp_neighbor(ip("10.0.0.1"), 65001)
            .await
            .unwrap_err(),
    );
    check(client.list_bgp_neighbors().await.unwrap_err());
    check(
        client
            .add_bgp_defined_set(DefinedSetKind::Prefix, &set)
            .await
            .unwrap_err(),
    );
    check(
        client
            .delete_bgp_defined_set(DefinedSetKind::Prefix, "ps1")
            .await
            .unwrap_err(),
    );
    check(
        client
            .list_bgp_defined_sets(DefinedSetKind::Prefix)
            .await
            .unwrap_err(),
    );
    check(
        client
            .add_bgp_policy(&BgpPolicy::default())
            .await
            .unwrap_err(),
    );
    check(client.delete_bgp_policy("p1").await.unwrap_err());
    check(client.list_bgp_policies().await.unwrap_err());
    check(client.apply_bgp_policy(&apply).await.unwrap_err());
    check(client.unapply_bgp_policy(&apply).await.unwrap_err());
    assert_eq!(sim.request_count(), 12, "one attempt per call");
}

#[tokio::test]
async fn neighbors_before_the_global_configuration_are_refused_without_retries() {
    let sim = start_sim(true).await;
    let client = client_for(&sim);
    let err = client
        .add_bgp_neighbor(&BgpNeighbor::new(ip("10.0.0.1"), 65001))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rejected { status: 500, message } if message.contains("hasn't started")),
        "{err:?}"
    );
    assert_eq!(sim.request_count(), 1);
}

fn policy(name: &str, statement: &str, prefix_set: &str) -> BgpPolicy {
    BgpPolicy {
        name: name.into(),
        statements: vec![BgpStatement {
            name: statement.into(),
            conditions: BgpConditions {
                match_prefix_set: Some(BgpMatchPrefixSet {
                    prefix_set: prefix_set.into(),
                    match_set_option: "any".into(),
                }),
                ..Default::default()
            },
            actions: BgpActions {
                route_disposition: "accept-route".into(),
                bgp_actions: None,
            },
        }],
    }
}

#[tokio::test]
async fn defined_sets_policies_and_their_application_round_trip() {
    let (sim, client) = with_global().await;
    let prefixes = BgpDefinedSet {
        name: "vips".into(),
        prefix_list: vec![BgpPrefix::new("192.0.2.0/24", 32, 32)],
        ..Default::default()
    };
    client
        .add_bgp_defined_set(DefinedSetKind::Prefix, &prefixes)
        .await
        .unwrap();
    let peers = BgpDefinedSet {
        name: "peers".into(),
        list: vec!["192.168.10.1/32".into()],
        ..Default::default()
    };
    client
        .add_bgp_defined_set(DefinedSetKind::Neighbor, &peers)
        .await
        .unwrap();
    assert_eq!(
        client
            .list_bgp_defined_sets(DefinedSetKind::Prefix)
            .await
            .unwrap(),
        [prefixes]
    );
    assert_eq!(
        client
            .list_bgp_defined_sets(DefinedSetKind::Neighbor)
            .await
            .unwrap(),
        [peers],
        "sent as `List`, listed as `list`"
    );

    client
        .add_bgp_policy(&policy("export-vips", "export-vips-1", "vips"))
        .await
        .unwrap();
    let listed = client.list_bgp_policies().await.unwrap();
    let mut names: Vec<&str> = listed.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["export-vips", "set-llb-export-gpolicy"],
        "loxilb's own policy is listed too"
    );
    let ours = listed.iter().find(|p| p.name == "export-vips").unwrap();
    assert_eq!(ours.statements[0].name, "export-vips-1");
    assert_eq!(
        ours.statements[0]
            .conditions
            .match_prefix_set
            .as_ref()
            .map(|m| m.prefix_set.as_str()),
        Some("vips")
    );
    // The same statement name again: a deterministic refusal, not retried.
    let before = sim.request_count();
    let err = client
        .add_bgp_policy(&policy("export-vips", "export-vips-1", "vips"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rejected { status: 500, .. }),
        "{err:?}"
    );
    assert_eq!(sim.request_count(), before + 1);

    let apply = BgpPolicyApply::global(
        PolicyDirection::Export,
        vec!["export-vips".into()],
        RouteAction::Accept,
    );
    assert_eq!(
        client.apply_bgp_policy(&apply).await.unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        client.apply_bgp_policy(&apply).await.unwrap(),
        WriteOutcome::AlreadyPresent
    );
    let a = &sim.bgp().assignments[0];
    assert_eq!(
        (
            a.target.as_str(),
            a.policies.as_slice(),
            a.default_action.as_str()
        ),
        ("global", &["export-vips".to_string()][..], "accept")
    );
    // A peer is not a route-server client: refused.
    let mut to_peer = apply.clone();
    to_peer.ip_address = "192.168.10.1".into();
    client
        .add_bgp_neighbor(&BgpNeighbor::new(ip("192.168.10.1"), 65001))
        .await
        .unwrap();
    let err = client.apply_bgp_policy(&to_peer).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Rejected { message, .. } if message.contains("per peer policy")),
        "{err:?}"
    );
    // Applied, the policy cannot go.
    assert!(client.delete_bgp_policy("export-vips").await.is_err());

    client.unapply_bgp_policy(&apply).await.unwrap();
    assert!(sim.bgp().assignments[0].policies.is_empty());
    assert_eq!(
        client.delete_bgp_policy("export-vips").await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client.delete_bgp_policy("export-vips").await.unwrap(),
        DeleteOutcome::AlreadyAbsent
    );
    assert_eq!(
        client
            .delete_bgp_defined_set(DefinedSetKind::Prefix, "vips")
            .await
            .unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        client
            .delete_bgp_defined_set(DefinedSetKind::Prefix, "vips")
            .await
            .unwrap(),
        DeleteOutcome::AlreadyAbsent
    );
}

// ---------------------------------------------------------------------------------------------
// Advertisement reference counts
// ---------------------------------------------------------------------------------------------

const VIP: &str = "192.0.2.10";

fn rule_entry(endpoint: &str, bgp: bool) -> LoadbalanceEntry {
    let mut entry = to_entry(&Rule {
        key: RuleKey {
            ip: VIP.parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        },
        name: "ns_svc:llb-inst0".into(),
        mode: NatMode::FullNat,
        selection: EndpointSelection::RoundRobin,
        endpoints: vec![Endpoint {
            ip: endpoint.parse().unwrap(),
            target_port: 30080,
            weight: 1,
        }],
        monitor: false,
        managed: true,
        probe: Default::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        egress: false,
        allowed_sources: vec![],
        secondary_ips: vec![],
        bgp: false,
        private_ip: None,
    });
    entry.service_arguments.bgp = bgp;
    entry
}

#[tokio::test]
async fn every_200_with_bgp_adds_a_reference_a_409_does_not() {
    let sim = start_sim(true).await;
    let client = client_for(&sim);
    assert_eq!(
        client
            .apply_rule(&rule_entry("10.0.0.1", true))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 1, "created");
    // The unchanged rule again: 409, nothing added.
    assert_eq!(
        client
            .apply_rule(&rule_entry("10.0.0.1", true))
            .await
            .unwrap(),
        WriteOutcome::AlreadyPresent
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 1);
    // An in-place update answered 200 with bgp: true adds one more: one delete will no longer
    // withdraw the route.
    assert_eq!(
        client
            .apply_rule(&rule_entry("10.0.0.2", true))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(
        sim.bgp_advertisement_count(VIP),
        2,
        "updated with bgp: true"
    );
    assert_eq!(
        client.delete_rule(VIP, 80, "tcp", true).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 1, "still advertised");
    // The next ?bgp=true delete drops the last reference although no rule is left (404).
    assert_eq!(
        client.delete_rule(VIP, 80, "tcp", true).await.unwrap(),
        DeleteOutcome::AlreadyAbsent
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 0, "withdrawn");
}

#[tokio::test]
async fn updates_sent_with_bgp_false_leave_one_reference_for_one_delete() {
    let sim = start_sim(true).await;
    let client = client_for(&sim);
    client
        .apply_rule(&rule_entry("10.0.0.1", true))
        .await
        .unwrap();
    // loxilb never changes `bgp` on an existing rule, so the controller can send false on
    // updates and count creations only.
    assert_eq!(
        client
            .apply_rule(&rule_entry("10.0.0.2", false))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 1);
    assert!(sim.rules()[0].bgp, "the rule still advertises");
    // A delete without bgp leaves the route advertised.
    client
        .apply_rule(&rule_entry("10.0.0.3", false))
        .await
        .unwrap();
    assert_eq!(
        client.delete_rule(VIP, 80, "tcp", false).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        sim.bgp_advertisement_count(VIP),
        1,
        "orphaned advertisement"
    );
    assert_eq!(
        client.delete_rule(VIP, 80, "tcp", true).await.unwrap(),
        DeleteOutcome::AlreadyAbsent
    );
    assert_eq!(sim.bgp_advertisement_count(VIP), 0);
}

#[tokio::test]
async fn a_restart_loses_bgp_and_the_replay_order_works() {
    let (sim, client) = with_global().await;
    client
        .add_bgp_neighbor(&BgpNeighbor::new(ip("192.168.10.1"), 65001))
        .await
        .unwrap();
    client
        .apply_rule(&rule_entry("10.0.0.1", true))
        .await
        .unwrap();
    sim.restart();
    assert!(client.list_bgp_neighbors().await.unwrap().is_empty());
    assert_eq!(sim.bgp_advertisement_count(VIP), 0);
    // Replay: global, neighbours, then rules.
    client.set_bgp_global(&global()).await.unwrap();
    assert_eq!(
        client
            .add_bgp_neighbor(&BgpNeighbor::new(ip("192.168.10.1"), 65001))
            .await
            .unwrap(),
        WriteOutcome::Applied
    );
    client
        .apply_rule(&rule_entry("10.0.0.1", true))
        .await
        .unwrap();
    assert_eq!(sim.bgp_advertisement_count(VIP), 1);
}

/// `loxi-ccm audit` reads the counts from the simulator's admin view; a server without it
/// (real loxilb: no `/admin`) gives `None`.
#[tokio::test]
async fn the_simulators_advertisement_counts_are_read_and_absent_elsewhere() {
    let sim = start_sim(true).await;
    let client = client_for(&sim);
    assert_eq!(
        client.simulator_advertisements().await.unwrap(),
        Some(Default::default())
    );
    client
        .apply_rule(&rule_entry("10.0.0.1", true))
        .await
        .unwrap();
    let counts = client.simulator_advertisements().await.unwrap().unwrap();
    assert_eq!(counts.get(VIP), Some(&1), "{counts:?}");
    // A server that answers 404 for /admin/bgp, as real loxilb does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let elsewhere = LoxilbClient::new(ClientConfig::new(&format!("http://{addr}"))).unwrap();
    assert_eq!(elsewhere.simulator_advertisements().await.unwrap(), None);
}
