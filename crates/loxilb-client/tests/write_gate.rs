//! The write gate: a closed gate stops every write before it is sent, never a read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::convert::to_entry;
use loxilb_client::{ClientConfig, ClientError, LoxilbClient};
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
