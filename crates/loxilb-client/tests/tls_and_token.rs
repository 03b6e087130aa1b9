//! HTTPS to loxilb and its token, against the simulator serving TLS (`Simulator::start_tls`)
//! with certificates made for the test (`testenv::certs`): the CA given is the only one
//! trusted, a certificate from another CA or an expired one is refused with an error that
//! says so, skipping verification takes any certificate, and a token replaced in place is
//! sent from the next call on.

use std::net::SocketAddr;
use std::time::Duration;

use loxilb_client::{ClientConfig, ClientError, LoxilbClient, RetryPolicy, Token};
use loxilb_sim::{SimConfig, Simulator};
use testenv::certs::{ServerCert, TestCa};

async fn tls_sim(cert: &ServerCert, cfg: SimConfig) -> Simulator {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Simulator::start_tls(addr, cfg, &cert.cert_pem, &cert.key_pem)
        .await
        .expect("simulator serves HTTPS")
}

fn client(url: &str, ca: Option<&str>, insecure: bool) -> LoxilbClient {
    let mut cfg = ClientConfig::new(url);
    cfg.timeout = Duration::from_secs(5);
    cfg.ca_pem = ca.map(|pem| pem.as_bytes().to_vec());
    cfg.insecure_skip_tls_verify = insecure;
    cfg.retry = RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    };
    LoxilbClient::new(cfg).unwrap()
}

/// The refusal of a certificate: not retried as if loxilb were down for a moment, and
/// saying what is wrong.
fn tls_refusal(err: &ClientError) -> String {
    match err {
        ClientError::Tls { detail, .. } => {
            assert!(detail.contains("TLS handshake failed"), "{detail}");
            assert!(detail.contains("--loxilb-ca-file"), "{detail}");
            detail.clone()
        }
        other => panic!("expected a TLS refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_given_ca_is_trusted_and_another_is_refused() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let sim = tls_sim(
        &ca.server_cert(&["127.0.0.1", "localhost"]).unwrap(),
        SimConfig::default(),
    )
    .await;
    assert!(sim.url().starts_with("https://"));

    let good = client(&sim.url(), Some(ca.pem()), false);
    assert!(good.version().await.is_ok());
    assert!(good.list_rules().await.unwrap().is_empty());

    let other = TestCa::new("some other CA").unwrap();
    let err = client(&sim.url(), Some(other.pem()), false)
        .version()
        .await
        .expect_err("a certificate from another CA");
    let detail = tls_refusal(&err);
    assert!(detail.contains("UnknownIssuer"), "{detail}");
    assert_eq!(err.category(), "LoxilbTLSError");
    assert!(!err.is_retryable() && err.is_transport());

    // Without --loxilb-ca-file the system roots are used: a private CA is not among them.
    let err = client(&sim.url(), None, false)
        .version()
        .await
        .expect_err("a private CA without --loxilb-ca-file");
    tls_refusal(&err);
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let sim = tls_sim(
        &ca.expired_server_cert(&["127.0.0.1"]).unwrap(),
        SimConfig::default(),
    )
    .await;
    let err = client(&sim.url(), Some(ca.pem()), false)
        .version()
        .await
        .expect_err("an expired certificate");
    let detail = tls_refusal(&err);
    assert!(detail.to_ascii_lowercase().contains("expired"), "{detail}");
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let sim = tls_sim(
        &ca.server_cert(&["loxilb.example"]).unwrap(),
        SimConfig::default(),
    )
    .await;
    let err = client(&sim.url(), Some(ca.pem()), false)
        .version()
        .await
        .expect_err("the certificate names another host");
    let detail = tls_refusal(&err);
    assert!(detail.contains("not valid for name"), "{detail}");
}

#[tokio::test]
async fn skipping_verification_takes_any_certificate() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let sim = tls_sim(
        &ca.expired_server_cert(&["loxilb.example"]).unwrap(),
        SimConfig::default(),
    )
    .await;
    let insecure = client(&sim.url(), None, true);
    assert!(insecure.list_rules().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_replaced_token_is_sent_from_the_next_call_on() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let sim = tls_sim(
        &ca.server_cert(&["127.0.0.1"]).unwrap(),
        SimConfig {
            auth_token: Some("first".into()),
            ..SimConfig::default()
        },
    )
    .await;
    let token = Token::new(Some("first"));
    let mut cfg = ClientConfig::new(&sim.url());
    cfg.ca_pem = Some(ca.pem().as_bytes().to_vec());
    cfg.token = token.clone();
    let c = LoxilbClient::new(cfg).unwrap();
    assert!(c.list_rules().await.is_ok());
    assert!(!format!("{c:?}").contains("first"));

    // loxilb's token changes: refused until ours does, then accepted, same client.
    sim.set_auth_token(Some("second"));
    let err = c.list_rules().await.expect_err("old token");
    assert_eq!(err.category(), "LoxilbUnauthorized");
    assert!(!err.to_string().contains("first"), "{err}");
    token.set(Some("second\n"));
    assert!(c.list_rules().await.is_ok());
}
