//! The helpers of the client's contract tests (`against_simulator.rs`,
//! `against_simulator_errors.rs`): a started simulator, clients for it, and the rules and
//! entries the tests send. Included with `#[path]` by the test files that use it only.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use loxi_domain::{Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey};
use loxilb_client::{
    ClientConfig, EndpointEntry, LoadbalanceEntry, LoxilbClient, RetryPolicy, SecondaryIp,
    ServiceArguments,
};
use loxilb_sim::{SimConfig, SimEndpoint, SimRule, Simulator};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

pub async fn start_sim(cfg: SimConfig) -> Simulator {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Simulator::start(addr, cfg).await.expect("simulator starts")
}

/// Retries with tiny delays so that retry tests stay fast.
pub fn quick_retry(attempts: usize) -> RetryPolicy {
    RetryPolicy {
        attempts,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}

pub fn config_for(sim: &Simulator) -> ClientConfig {
    let mut cfg = ClientConfig::new(&sim.url());
    cfg.timeout = Duration::from_secs(2);
    cfg
}

pub fn client_for(sim: &Simulator) -> LoxilbClient {
    LoxilbClient::new(config_for(sim)).expect("client builds")
}

pub fn ep(ip: &str, target_port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        target_port,
        weight: 1,
    }
}

pub fn tcp_rule(vip: &str, port: u16, name: &str, endpoints: Vec<Endpoint>) -> Rule {
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

pub fn web_rule() -> Rule {
    // Endpoints deliberately out of order: loxilb stores a new rule's endpoints sorted by IP.
    tcp_rule(
        "192.0.2.10",
        80,
        "ccm-test_default_web_80_tcp:llb-inst0",
        vec![ep("10.0.0.12", 30080), ep("10.0.0.11", 30080)],
    )
}

pub fn sim_ep(ip: &str, target_port: u16, weight: u8) -> SimEndpoint {
    SimEndpoint {
        ip: ip.to_string(),
        target_port,
        weight,
    }
}

pub fn sim_eps(rule: &SimRule) -> Vec<(String, u16, u8)> {
    rule.endpoints
        .iter()
        .map(|e| (e.ip.clone(), e.target_port, e.weight))
        .collect()
}

pub fn sctp_entry(secondary: &[&str]) -> LoadbalanceEntry {
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
