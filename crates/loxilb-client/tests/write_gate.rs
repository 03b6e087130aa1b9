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
        egress: false,
        allowed_sources: Vec::new(),
        secondary_ips: Vec::new(),
        bgp: false,
        private_ip: None,
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

/// A write checked while the gate was open must not leave once it has closed, however long
/// the way to the socket took. Here the TLS handshake is held up (a TCP relay in front of
/// the HTTPS simulator forwards nothing until the test lets it) and the gate closes
/// meanwhile: a remote loxilb, or a process frozen (SIGSTOP) while connecting, makes the same
/// window. The write is a DELETE: it has no body, so only the checks made while the call is
/// polled can stop it (a write with a body is also stopped by the last check, when the
/// connection writes it: the next test). Fails when the gate is asked only once, before the
/// HTTP client starts connecting.
#[tokio::test]
async fn a_gate_that_closes_while_the_connection_is_set_up_stops_the_write() {
    use tokio::net::{TcpListener, TcpStream};
    let ca = testenv::certs::TestCa::new("loxilb test CA").unwrap();
    let cert = ca.server_cert(&["127.0.0.1"]).unwrap();
    let any_port = "127.0.0.1:0".parse().unwrap();
    let (cert_pem, key_pem) = (&cert.cert_pem, &cert.key_pem);
    let sim = Simulator::start_tls(any_port, SimConfig::default(), cert_pem, key_pem)
        .await
        .unwrap();
    let upstream = sim.url().trim_start_matches("https://").to_string();
    let relay = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay.local_addr().unwrap();
    let (accepted_tx, accepted) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut client_side, _) = relay.accept().await.unwrap();
        let _ = accepted_tx.send(());
        let _ = go_rx.await;
        let mut sim_side = TcpStream::connect(&upstream).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut client_side, &mut sim_side).await;
    });

    let open = Arc::new(AtomicBool::new(true));
    let gate = open.clone();
    let mut cfg = ClientConfig::new(&format!("https://{relay_addr}"));
    cfg.ca_pem = Some(ca.pem().as_bytes().to_vec());
    cfg.retry.attempts = 1;
    let client = LoxilbClient::new(cfg)
        .unwrap()
        .with_write_gate(Arc::new(move || gate.load(Ordering::SeqCst)));
    let write =
        tokio::spawn(async move { client.delete_rule("192.0.2.10", 80, "tcp", false).await });
    // The client is connected to the relay and waits for the TLS handshake.
    accepted.await.unwrap();
    open.store(false, Ordering::SeqCst);
    go.send(()).unwrap();
    stopped_unsent(write.await.unwrap().map(drop), &sim).await;
}

/// The write ended with `WritesStopped` and none reached the simulator (given the time to).
async fn stopped_unsent(result: Result<(), ClientError>, sim: &Simulator) {
    let err = result.unwrap_err();
    assert!(matches!(err, ClientError::WritesStopped { .. }), "{err:?}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        sim.writes(),
        0,
        "a write left after the gate closed: {:?}",
        sim.write_log()
    );
}

tokio::task_local! {
    /// Set in the task that calls the client: a gate that is open there only is closed by
    /// the time the connection's own task writes the request.
    static CALLER: ();
}

/// The last check is made where the request is written: in the connection's task, after the
/// request was handed over. A gate open in the calling task and closed in the connection's
/// task stands for a Lease that runs out between the hand-over and the write (a freeze
/// there). Fails when the body does not ask the gate (`GatedBody`).
#[tokio::test]
async fn the_gate_is_asked_again_when_the_connection_writes_the_request() {
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let mut cfg = ClientConfig::new(&sim.url());
    cfg.retry.attempts = 1;
    let client = LoxilbClient::new(cfg)
        .unwrap()
        .with_write_gate(Arc::new(|| CALLER.try_with(|()| ()).is_ok()));
    let result = CALLER
        .scope((), client.apply_rule(&to_entry(&rule())))
        .await;
    stopped_unsent(result.map(drop), &sim).await;
}

/// A gated write goes out as an ungated one would (`Content-Length`, not chunked; JSON),
/// with the caller's identity and loxi-ccm's `User-Agent`, which the simulator records.
#[tokio::test]
async fn writes_carry_their_length_and_the_callers_identity() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("\"serviceArguments\"") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        let body = r#"{"code":200,"result":"Success"}"#;
        conn.write_all(
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        String::from_utf8_lossy(&seen).to_ascii_lowercase()
    });
    let mut cfg = ClientConfig::new(&format!("http://{addr}"));
    cfg.identity = Some("replica-a_0123abcd".into());
    let client = LoxilbClient::new(cfg)
        .unwrap()
        .with_write_gate(Arc::new(|| true));
    client.apply_rule(&to_entry(&rule())).await.unwrap();
    let request = server.await.unwrap();
    assert!(
        request.starts_with("post /netlox/v1/config/loadbalancer http/1.1\r\n"),
        "{request}"
    );
    for header in [
        "content-type: application/json\r\n",
        "x-loxi-ccm-identity: replica-a_0123abcd\r\n",
        &format!("user-agent: {}\r\n", loxilb_client::USER_AGENT),
    ] {
        assert!(request.contains(header), "{header:?} missing: {request}");
    }
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    assert!(
        format!("{head}\r\n").contains(&format!("content-length: {}\r\n", body.len())),
        "{request}"
    );
    assert!(!head.contains("transfer-encoding"), "{request}");

    // The simulator records who wrote.
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    for identity in [Some("replica-a_0123abcd"), None] {
        let mut cfg = ClientConfig::new(&sim.url());
        cfg.identity = identity.map(str::to_string);
        let client = LoxilbClient::new(cfg).unwrap();
        client.apply_rule(&to_entry(&rule())).await.unwrap();
    }
    assert_eq!(sim.writes_from("replica-a_0123abcd"), 1);
    assert_eq!(sim.writes_from(loxilb_client::USER_AGENT), 1);
    let callers: Vec<Option<String>> = sim.write_log().into_iter().map(|w| w.caller).collect();
    assert_eq!(
        callers,
        [
            Some("replica-a_0123abcd".to_string()),
            Some(loxilb_client::USER_AGENT.to_string())
        ]
    );
}
