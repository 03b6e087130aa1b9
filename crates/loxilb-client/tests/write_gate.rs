//! The write gate: a closed gate stops every write before it is sent, never a read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::convert::to_entry;
use loxilb_client::{
    BgpDefinedSet, BgpGlobal, BgpNeighbor, BgpPolicy, BgpPolicyApply, ClientConfig, ClientError,
    DefinedSetKind, LoxilbClient, PolicyDirection, RouteAction,
};
use loxilb_sim::{SimConfig, Simulator};

fn rule() -> Rule {
    Rule {
        key: RuleKey {
            ip: "192.0.2.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        },
        name: "ns_svc:llb-inst0".into(),
        mode: NatMode::Default,
        selection: EndpointSelection::RoundRobin,
        endpoints: vec![Endpoint {
            ip: "10.0.0.1".parse().unwrap(),
            target_port: 30080,
            weight: 1,
        }],
        monitor: false,
        managed: true,
        probe: Default::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        allowed_sources: Vec::new(),
        secondary_ips: Vec::new(),
        bgp: false,
    }
}

#[tokio::test]
async fn a_closed_gate_stops_writes_and_lets_reads_through() {
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    let client = LoxilbClient::new(ClientConfig::new(&sim.url()))
        .unwrap()
        .with_write_gate(Arc::new(move || gate.load(Ordering::SeqCst)));
    client.apply_rule(&to_entry(&rule())).await.unwrap();
    assert_eq!(sim.writes(), 1);

    open.store(false, Ordering::SeqCst);
    let err = client.apply_rule(&to_entry(&rule())).await.unwrap_err();
    assert!(matches!(err, ClientError::WritesStopped { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let err = client
        .delete_rule("192.0.2.10", 80, "tcp", false)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::WritesStopped { .. }), "{err:?}");
    assert_eq!(
        sim.writes(),
        1,
        "a write reached loxilb through a closed gate"
    );
    assert_eq!(client.list_rules().await.unwrap().len(), 1, "reads pass");
}

#[tokio::test]
async fn a_closed_gate_stops_every_bgp_write() {
    let sim = Simulator::start(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig {
            bgp: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    let client = LoxilbClient::new(ClientConfig::new(&sim.url()))
        .unwrap()
        .with_write_gate(Arc::new(move || gate.load(Ordering::SeqCst)));
    let global = BgpGlobal {
        router_id: "192.168.10.5".parse().unwrap(),
        local_as: 64512,
        set_next_hop_self: false,
        listen_port: 0,
    };
    let peer = "192.168.10.1".parse().unwrap();
    let apply = BgpPolicyApply::global(PolicyDirection::Export, vec![], RouteAction::Accept);
    let set = BgpDefinedSet {
        name: "ns".into(),
        list: vec!["10.0.0.1/32".into()],
        ..Default::default()
    };
    let stopped = |r: Result<(), ClientError>| {
        let err = r.unwrap_err();
        assert!(matches!(err, ClientError::WritesStopped { .. }), "{err:?}");
    };
    stopped(client.set_bgp_global(&global).await);
    stopped(
        client
            .add_bgp_neighbor(&BgpNeighbor::new(peer, 65001))
            .await
            .map(drop),
    );
    stopped(client.delete_bgp_neighbor(peer, 65001).await.map(drop));
    stopped(
        client
            .add_bgp_defined_set(DefinedSetKind::Neighbor, &set)
            .await,
    );
    stopped(
        client
            .delete_bgp_defined_set(DefinedSetKind::Neighbor, "ns")
            .await
            .map(drop),
    );
    stopped(client.add_bgp_policy(&BgpPolicy::default()).await);
    stopped(client.delete_bgp_policy("p").await.map(drop));
    stopped(client.apply_bgp_policy(&apply).await.map(drop));
    stopped(client.unapply_bgp_policy(&apply).await);
    assert_eq!(
        sim.writes(),
        0,
        "a BGP write reached loxilb through a closed gate"
    );
    // Reads pass.
    assert!(client.list_bgp_neighbors().await.unwrap().is_empty());
    assert!(client.list_bgp_policies().await.unwrap().is_empty());
    assert!(
        client
            .list_bgp_defined_sets(DefinedSetKind::Neighbor)
            .await
            .unwrap()
            .is_empty()
    );
    // And once open, the writes go through.
    open.store(true, Ordering::SeqCst);
    client.set_bgp_global(&global).await.unwrap();
    assert_eq!(sim.writes(), 1);
}
