//! The loxilb token and HTTPS, with the controller running against the real API server and
//! the simulator requiring a token (and serving HTTPS): a wrong token is reported on the
//! Service as `LoxilbUnauthorized` (never showing the token, there or in the metrics), and a
//! new token, written to the token file or into the token Secret, is picked up without a
//! restart. A certificate the controller refuses (another CA, expired) is reported on the
//! Service as `LoxilbTLSError`.

mod common;

use std::time::Duration;

use common::{CLASS, Options, World, wait_for};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use loxilb_sim::{SimConfig, Simulator};
use serde_json::json;
use testenv::certs::TestCa;

const PROGRAMMED: &str = "loxilb.io/Programmed";
/// Longer than the file re-read period (2 s) and the controller's retry backoff.
const ROTATION_WAIT: Duration = Duration::from_secs(60);

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("loxi-ccm-auth-test-{}-{name}", std::process::id()))
}

/// Waits until the Service's Programmed condition has `status` and `reason`; answers its
/// message.
async fn programmed(world: &World, name: &str, status: &str, reason: &str) -> String {
    wait_for(
        &format!("{name}: {PROGRAMMED}={status} ({reason})"),
        ROTATION_WAIT,
        || async {
            let svc = world.get(name).await?;
            let (s, r, m) = World::condition(&svc, PROGRAMMED)?;
            (s == status && r == reason).then_some(m)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_token_is_reported_and_a_rewritten_token_file_is_picked_up() {
    let file = temp_path("token");
    std::fs::write(&file, "wrong-token-value\n").unwrap();
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        extra_args: vec![format!("--loxilb-token-file={}", file.display())],
        admin_port: Some(admin_port),
        ..Options::default()
    };
    let world = World::with_sim(
        "auth-file",
        opts,
        SimConfig {
            auth_token: Some("right-token-value".into()),
            ..SimConfig::default()
        },
    )
    .await;
    world.add_node("auth-file-n1", "10.7.0.1").await;
    world
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;

    let message = programmed(&world, "web", "False", "LoxilbUnauthorized").await;
    assert!(!message.contains("wrong-token-value"), "{message}");
    assert!(world.sim.rules().is_empty());

    // The operator fixes the file (as the kubelet does when a mounted Secret changes).
    std::fs::write(&file, "right-token-value\n").unwrap();
    programmed(&world, "web", "True", "Programmed").await;
    let ip = world.wait_for_ip("web").await;
    assert_eq!(world.rules_for(&ip).len(), 1);

    // loxilb's token changes again: refused, then accepted once the file follows.
    world.sim.set_auth_token(Some("third-token-value"));
    world
        .create(&World::lb_service("api", Some(CLASS), &[(81, "TCP")]))
        .await;
    programmed(&world, "api", "False", "LoxilbUnauthorized").await;
    std::fs::write(&file, "third-token-value").unwrap();
    programmed(&world, "api", "True", "Programmed").await;
    let events = world.event_reasons("api").await;
    assert!(
        events.iter().any(|r| r == "LoxilbUnauthorized"),
        "{events:?}"
    );

    // No token in the metrics, nor in the Services' conditions.
    let metrics = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("loxi_ccm_"), "{metrics}");
    let statuses = format!("{:?}", world.get("api").await.unwrap().status);
    for token in [
        "wrong-token-value",
        "right-token-value",
        "third-token-value",
    ] {
        assert!(!metrics.contains(token), "{token} in the metrics");
        assert!(!statuses.contains(token), "{token} in the status");
    }
    std::fs::remove_file(&file).unwrap();
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_token_secret_is_watched() {
    let ns = format!("auth-secret-{}", std::process::id() % 100_000);
    let opts = Options {
        extra_args: vec![format!("--loxilb-token-secret={ns}/loxilb-auth")],
        ..Options::default()
    };
    // No Secret yet: no token is sent.
    let world = World::with_sim(
        "auth-secret",
        opts,
        SimConfig {
            auth_token: Some("from-secret".into()),
            ..SimConfig::default()
        },
    )
    .await;
    assert_eq!(world.ns, ns);
    world.add_node("auth-secret-n1", "10.7.1.1").await;
    world
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    programmed(&world, "web", "False", "LoxilbUnauthorized").await;

    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("loxilb-auth".into()),
                    ..Default::default()
                },
                string_data: Some([("token".to_string(), "from-secret\n".to_string())].into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    programmed(&world, "web", "True", "Programmed").await;

    // Rotation: loxilb first, then the Secret.
    world.sim.set_auth_token(Some("rotated"));
    world
        .create(&World::lb_service("api", Some(CLASS), &[(81, "TCP")]))
        .await;
    programmed(&world, "api", "False", "LoxilbUnauthorized").await;
    secrets
        .patch(
            "loxilb-auth",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": "rotated"}})),
        )
        .await
        .unwrap();
    programmed(&world, "api", "True", "Programmed").await;
    world.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn https_with_the_given_ca() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let cert = ca.server_cert(&["127.0.0.1"]).unwrap();
    let ca_file = temp_path("ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let sim = Simulator::start_tls(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig::default(),
        &cert.cert_pem,
        &cert.key_pem,
    )
    .await
    .unwrap();
    let opts = Options {
        extra_args: vec![format!("--loxilb-ca-file={}", ca_file.display())],
        ..Options::default()
    };
    let world = World::with_simulator("auth-tls", opts, sim).await;
    assert!(world.sim.url().starts_with("https://"));
    world.add_node("auth-tls-n1", "10.7.2.1").await;
    let ip = world.serve_one_port("web", 80).await;
    assert_eq!(world.rules_for(&ip).len(), 1);
    programmed(&world, "web", "True", "Programmed").await;
    std::fs::remove_file(&ca_file).unwrap();
    world.finish().await;
}

/// A certificate the controller refuses is shown on the Service as what it is: `Programmed=
/// False`, reason `LoxilbTLSError`, the refusal in the message, and a Warning Event, rather
/// than as loxilb being unavailable (an outage to wait out). `cert` is what the simulator
/// serves; the controller trusts `ca` only. Returns the condition's message.
async fn refused_certificate_is_reported(
    name: &str,
    ca: &TestCa,
    cert: &testenv::certs::ServerCert,
) -> String {
    let ca_file = temp_path(&format!("{name}-ca.crt"));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let sim = Simulator::start_tls(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig::default(),
        &cert.cert_pem,
        &cert.key_pem,
    )
    .await
    .unwrap();
    let opts = Options {
        extra_args: vec![format!("--loxilb-ca-file={}", ca_file.display())],
        ..Options::default()
    };
    let world = World::with_simulator(name, opts, sim).await;
    world.add_node(&format!("{name}-n1"), "10.7.3.1").await;
    world
        .create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let message = programmed(&world, "web", "False", "LoxilbTLSError").await;
    assert!(message.contains("TLS handshake failed"), "{message}");
    assert!(message.contains("--loxilb-ca-file"), "{message}");
    assert!(message.contains(&world.sim.url()), "{message}");
    // The address is claimed (its condition names it) but not shown while its rules wait
    // for a usable loxilb: users read a shown address as ready.
    let svc = world.get("web").await.unwrap();
    let (status, _, claimed) = World::condition(&svc, "loxilb.io/AddressAllocated").unwrap();
    assert_eq!(status, "True", "{claimed}");
    let shown = svc.status.and_then(|s| s.load_balancer?.ingress);
    assert!(
        shown.unwrap_or_default().is_empty(),
        "shown before its rule"
    );
    assert!(world.sim.rules().is_empty());
    let events = wait_for("a LoxilbTLSError Warning Event", ROTATION_WAIT, || async {
        let reasons = world.event_reasons("web").await;
        reasons
            .iter()
            .any(|r| r == "LoxilbTLSError")
            .then_some(reasons)
    })
    .await;
    assert!(
        !events.iter().any(|r| r == "LoxilbUnavailable"),
        "{events:?}"
    );
    std::fs::remove_file(&ca_file).unwrap();
    world.finish().await;
    message
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_from_another_ca_is_reported_on_the_service() {
    let loxilb_ca = TestCa::new("loxilb's own CA").unwrap();
    let cert = loxilb_ca.server_cert(&["127.0.0.1"]).unwrap();
    let given = TestCa::new("the CA given to the controller").unwrap();
    let message = refused_certificate_is_reported("tls-wrong-ca", &given, &cert).await;
    assert!(message.contains("UnknownIssuer"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_certificate_is_reported_on_the_service() {
    let ca = TestCa::new("loxilb test CA").unwrap();
    let cert = ca.expired_server_cert(&["127.0.0.1"]).unwrap();
    let message = refused_certificate_is_reported("tls-expired", &ca, &cert).await;
    assert!(
        message.to_ascii_lowercase().contains("expired"),
        "{message}"
    );
}
