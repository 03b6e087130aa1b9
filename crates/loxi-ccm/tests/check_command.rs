//! `loxi-ccm check`, run as the built binary: bad configurations and unreachable loxilb fail
//! with a report naming the culprit; a good configuration against a real kube-apiserver and
//! the loxilb simulator passes every check. Also the precedence of the layers, end to end.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Output;

use loxilb_sim::{SimConfig, Simulator};

/// Runs `loxi-ccm check <args>` with exactly `env` as its environment (nothing inherited, so
/// the developer's LOXI_CCM_* / KUBECONFIG cannot leak in).
async fn check(args: &[&str], env: &[(&str, &str)]) -> Output {
    loxi_ccm("check", args, env).await
}

/// Runs `loxi-ccm <command> <args>` as [`check`] does (output to pipes, not a terminal); a
/// `run` that has not stopped after 60 s is killed and fails the test.
async fn loxi_ccm(command: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"));
    cmd.arg(command).args(args).env_clear().kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(std::time::Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("loxi-ccm {command} {args:?} did not stop within 60 s"))
        .expect("the loxi-ccm binary runs")
}

/// The report line starting with `prefix` (`FAIL service watch`).
fn line(out: &Output, prefix: &str) -> String {
    stdout(out)
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no line {prefix:?}:\n{}", text(out)))
}

/// Messages for people: no Debug dumps of kube errors, no Debug-escaped text, no colours.
fn assert_readable(all: &str) {
    for raw in ["Status {", "ApiError", "\\u{", "[V4]", "[V6]", "\x1b["] {
        assert!(!all.contains(raw), "{raw:?} in:\n{all}");
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn temp_file(name: &str, content: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "loxi-ccm-check-test-{}-{name}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, content).unwrap();
    path
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn unreachable_loxilb_fails_naming_the_url() {
    let url = format!("http://127.0.0.1:{}", closed_port());
    let out = check(
        &[
            &format!("--loxilb-url={url}"),
            "--external-cidr=192.0.2.0/24",
            "--kubeconfig=/nonexistent/kubeconfig",
        ],
        &[],
    )
    .await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    let line = stdout(&out)
        .lines()
        .find(|l| l.starts_with(&format!("FAIL loxilb {url}")))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no FAIL line for {url}:\n{all}"));
    assert!(
        line.contains("unreachable") || line.contains("refused"),
        "{line}"
    );
    assert!(stdout(&out).starts_with("OK   configuration:"), "{all}");
}

#[tokio::test]
async fn bad_cidr_fails_naming_option_and_value() {
    let loxilb = "--loxilb-url=http://127.0.0.1:11111";
    // From a flag.
    let out = check(&[loxilb, "--external-cidr=10.0.0.0/33"], &[]).await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("FAIL configuration: flag --external-cidr: invalid value \"10.0.0.0/33\""),
        "{all}"
    );
    // From the environment.
    let out = check(
        &[loxilb],
        &[(
            "LOXI_CCM_CIDR_POOLS",
            "web=10.1.0.0/16,api=10.2.0.0-10.1.0.0",
        )],
    )
    .await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("environment LOXI_CCM_CIDR_POOLS: invalid value \"api=10.2.0.0-10.1.0.0\""),
        "{all}"
    );
    // From the config file, under a kube-loxilb spelling.
    let file = temp_file("badcidr", "externalCIDR: 10.0.0.0/8/8\n");
    let out = check(&[loxilb, &format!("--config={}", file.display())], &[]).await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!(
            "config file {}: key \"externalCIDR\": invalid value \"10.0.0.0/8/8\"",
            file.display()
        )),
        "{all}"
    );
}

#[tokio::test]
async fn unknown_config_key_fails_naming_key_and_file() {
    let file = temp_file(
        "unknownkey",
        "loxilbUrl: http://127.0.0.1:11111\nexternalCidrr: 192.0.2.0/24\n",
    );
    let out = check(&[], &[("LOXI_CCM_CONFIG", file.to_str().unwrap())]).await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains(&format!(
            "config file {}: unknown key \"externalCidrr\"",
            file.display()
        )),
        "{all}"
    );
}

#[tokio::test]
async fn flag_beats_environment_beats_file() {
    // The file's value is invalid, but the environment's wins over it: the configuration is
    // fine. A flag then wins over the environment, and its bad value is what gets reported.
    let file = temp_file(
        "precedence",
        "loxilbUrl: http://127.0.0.1:11111\nexternalCidr: 192.0.2.0/24\nlbMode: bogus\n",
    );
    let kubeconfig = "--kubeconfig=/nonexistent/kubeconfig";
    let env = [
        ("LOXI_CCM_CONFIG", file.to_str().unwrap()),
        ("LOXI_CCM_LB_MODE", "dsr"),
    ];
    let out = check(&[kubeconfig], &env).await;
    assert!(
        stdout(&out).starts_with("OK   configuration:"),
        "{}",
        text(&out)
    );
    let out = check(&[kubeconfig, "--lb-mode=nonsense"], &env).await;
    assert!(
        text(&out).contains("FAIL configuration: flag --lb-mode: invalid value \"nonsense\""),
        "{}",
        text(&out)
    );
    // Without the environment variable the file's value is used, and rejected by name.
    let out = check(&[kubeconfig], &env[..1]).await;
    assert!(
        text(&out).contains(&format!(
            "FAIL configuration: config file {}: key \"lbMode\": invalid value \"bogus\"",
            file.display()
        )),
        "{}",
        text(&out)
    );
}

#[tokio::test]
async fn good_configuration_passes_every_check() {
    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let sim = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    let file = temp_file(
        "good",
        &format!(
            "loxiURL:\n  - {}\nexternalCIDR: 192.0.2.0/24\ncidr6Pools: v6=2001:db8::/120\n\
             setLBMode: 2\nleaderElectNamespace: kube-system\nsetRoles: 0.0.0.0\n\
             numZoneInstances: 2\n",
            sim.url()
        ),
    );
    // The HA role record as a controller wrote it (docs/fleet.md#the-record).
    let record: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "loxi-ccm-ha-roles"},
        "data": {"llb-inst0": sim.url()},
    }))
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        cp.admin_client().await.unwrap(),
        "kube-system",
    )
    .create(&Default::default(), &record)
    .await
    .unwrap();
    let kubeconfig = cp.kubeconfig_path();
    let out = check(
        &[
            &format!("--config={}", file.display()),
            &format!("--kubeconfig={}", kubeconfig.display()),
        ],
        &[],
    )
    .await;
    let report = stdout(&out);
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<&str> = report.lines().collect();
    assert!(
        lines.iter().all(|l| l.starts_with("OK ")),
        "every line should be OK:\n{report}"
    );
    for name in [
        "configuration",
        "kubernetes API",
        "kubernetes credentials",
        "service watch: filtered by type",
        "kubernetes nodes",
        "cluster id",
        "permissions",
        &format!("loxilb {}", sim.url()),
        "fleet: 1 loxilb(s) from --loxilb-url (group llb: 1), plus LoxiURL resources if any; HA \
         roles for 2 per group (llb-inst0, llb-inst1) with VIP 0.0.0.0, recorded in ConfigMap \
         kube-system/loxi-ccm-ha-roles",
        &format!("HA roles: llb-inst0 MASTER {}", sim.url()),
        "group llb: 1/1 loxilb(s) reachable; fullest holds 0 of 2048 rules",
    ] {
        assert!(
            lines.iter().any(|l| l[5..].starts_with(name)),
            "no line for {name}:\n{report}"
        );
    }
    assert!(text(&out).contains("check passed"), "{}", text(&out));
}

/// 401 (a token the API server does not know) is refused credentials, not "unreachable";
/// 403 (a ServiceAccount without any RBAC) fails the Service lines naming the missing
/// permission; kube errors are shown as code, reason and message, also at start-up. And an
/// inventory ConfigMap that is missing or invalid fails the check.
#[tokio::test]
async fn refusals_and_inventory_configmaps_are_reported_by_name() {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    use kube::api::{Api, ObjectMeta, PostParams};

    let cp = testenv::ControlPlane::start().await.expect("control plane");
    let loxilb = format!("--loxilb-url=http://127.0.0.1:{}", closed_port());
    let base = [loxilb.as_str(), "--external-cidr=192.0.2.0/24"];

    // 401.
    let unknown = cp.dir().join("unknown-token.kubeconfig");
    cp.write_kubeconfig(&unknown, "not-a-valid-token").unwrap();
    let kc = format!("--kubeconfig={}", unknown.display());
    let out = check(&[base[0], base[1], &kc], &[]).await;
    let all = text(&out);
    let api = line(&out, "FAIL kubernetes API");
    assert!(
        api.contains("authentication failed") && api.contains("401 Unauthorized"),
        "{all}"
    );
    assert!(!api.contains("unreachable"), "{all}");
    assert_readable(&all);

    // The same credentials at start-up: the kube error as code and reason.
    let out = loxi_ccm(
        "run",
        &[
            base[0],
            base[1],
            &kc,
            "--leader-elect=false",
            "--disable-node-init",
            "--admin-addr=127.0.0.1:0",
        ],
        &[],
    )
    .await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("401 Unauthorized"), "{all}");
    assert_readable(&all);

    // 403: authenticated, but no permission at all.
    let admin = cp.admin_client().await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("nobody".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request("nobody", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let nobody = cp.dir().join("nobody.kubeconfig");
    cp.write_kubeconfig(&nobody, &token).unwrap();
    let kc = format!("--kubeconfig={}", nobody.display());
    let out = check(&[base[0], base[1], &kc, "--cluster-id=test"], &[]).await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        line(&out, "OK   kubernetes API").contains("reachable"),
        "{all}"
    );
    let watch = line(&out, "FAIL service watch");
    assert!(
        watch.contains("forbidden") && watch.contains("missing permission list services"),
        "{all}"
    );
    let credentials = line(&out, "FAIL kubernetes credentials");
    assert!(
        credentials.contains("authenticated as system:serviceaccount:default:nobody")
            && credentials.contains("403 Forbidden"),
        "{all}"
    );
    assert!(line(&out, "FAIL kubernetes nodes").contains("missing permission list nodes"));
    assert_readable(&all);

    // The inventory ConfigMap: missing, invalid, then valid.
    let admin_kc = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let with_cm = [
        base[0],
        base[1],
        &admin_kc,
        "--cluster-id=test",
        "--inventory-configmap=kube-system/inventory",
    ];
    let out = check(&with_cm, &[]).await;
    let inventory = line(&out, "FAIL node inventory");
    assert!(
        inventory.contains("ConfigMap kube-system/inventory")
            && inventory.contains("does not exist"),
        "{}",
        text(&out)
    );
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    let mut cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("inventory".into()),
            ..Default::default()
        },
        data: Some(
            [(
                "inventory.yaml".to_string(),
                "nodes:\n  - match: { cidr: 10.0.0.0/33 }\n    zone: a\n".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let out = check(&with_cm, &[]).await;
    let inventory = line(&out, "FAIL node inventory");
    assert!(
        inventory.contains("inventory entry 0") && inventory.contains("not an IP block"),
        "{}",
        text(&out)
    );
    cm.data = Some(
        [(
            "inventory.yaml".to_string(),
            "nodes:\n  - match: { cidr: 10.0.0.0/24 }\n    zone: a\n".to_string(),
        )]
        .into(),
    );
    cms.replace("inventory", &PostParams::default(), &cm)
        .await
        .unwrap();
    let out = check(&with_cm, &[]).await;
    assert!(
        line(&out, "OK   node inventory").contains("valid, 1 entry"),
        "{}",
        text(&out)
    );
}

/// An inventory file is checked even without a usable kubeconfig: a missing file and an
/// invalid one fail with node initialization's own error; `--disable-node-init` skips it.
#[tokio::test]
async fn a_missing_or_invalid_inventory_file_fails_the_check() {
    let base = [
        "--loxilb-url=http://127.0.0.1:11111",
        "--external-cidr=192.0.2.0/24",
        "--kubeconfig=/nonexistent/kubeconfig",
    ];
    let missing = std::env::temp_dir().join("loxi-ccm-check-test-no-such-inventory.yaml");
    let flag = format!("--inventory-file={}", missing.display());
    let out = check(&[base[0], base[1], base[2], &flag], &[]).await;
    let inventory = line(&out, "FAIL node inventory");
    assert!(
        inventory.contains(&format!("file {}", missing.display()))
            && inventory.contains("No such file"),
        "{}",
        text(&out)
    );

    let bad = temp_file(
        "inventory",
        "nodes:\n  - match: { name: \"web-*\" }\n    colour: red\n",
    );
    let flag = format!("--inventory-file={}", bad.display());
    let out = check(&[base[0], base[1], base[2], &flag], &[]).await;
    assert!(!out.status.success(), "{}", text(&out));
    let inventory = line(&out, "FAIL node inventory");
    assert!(
        inventory.contains("inventory entry 0: unknown key `colour`"),
        "{}",
        text(&out)
    );
    let out = check(
        &[base[0], base[1], base[2], &flag, "--disable-node-init"],
        &[],
    )
    .await;
    assert!(!stdout(&out).contains("node inventory"), "{}", text(&out));
}

/// A CA file (for loxilb, or named by the kubeconfig) without a certificate is refused by
/// name, before anything tries to connect with it.
#[tokio::test]
async fn ca_files_without_a_certificate_are_refused_by_name() {
    let empty = temp_file("no-cert-ca", "# a CA bundle without a certificate\n");
    let out = check(
        &[
            "--loxilb-url=https://127.0.0.1:11111",
            "--external-cidr=192.0.2.0/24",
            &format!("--loxilb-ca-file={}", empty.display()),
        ],
        &[],
    )
    .await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        line(&out, "FAIL configuration").contains(&format!(
            "flag --loxilb-ca-file: CA file {} holds no certificate",
            empty.display()
        )),
        "{}",
        text(&out)
    );

    let server = format!("https://127.0.0.1:{}", closed_port());
    let kubeconfig = |cluster: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             {server}\n{cluster}users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: \
             x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        )
    };
    let by_file = temp_file(
        "ca-file-kubeconfig",
        &kubeconfig(&format!("    certificate-authority: {}\n", empty.display())),
    );
    let by_data = temp_file(
        "ca-data-kubeconfig",
        // base64 of "no certificate here\n"
        &kubeconfig("    certificate-authority-data: bm8gY2VydGlmaWNhdGUgaGVyZQo=\n"),
    );
    for (kc, expected) in [
        (
            &by_file,
            format!("CA file {} holds no certificate", empty.display()),
        ),
        (
            &by_data,
            "the certificate-authority-data holds no certificate".to_string(),
        ),
    ] {
        let out = check(
            &[
                "--loxilb-url=http://127.0.0.1:11111",
                "--external-cidr=192.0.2.0/24",
                &format!("--kubeconfig={}", kc.display()),
            ],
            &[],
        )
        .await;
        let client = line(&out, "FAIL kubernetes client");
        assert!(
            client.contains(&format!("kubeconfig {}", kc.display())) && client.contains(&expected),
            "{}",
            text(&out)
        );
    }
}

/// A missing kubeconfig says its OS error once (check and run), with the path as typed;
/// `run`'s text log in a pipe has no colour codes; a value with an invisible character is
/// quoted once, as it is, not Debug-escaped.
#[tokio::test]
async fn errors_and_logs_are_plain_text() {
    let out = check(
        &[
            "--loxilb-url=http://127.0.0.1:11111",
            "--external-cidr=192.0.2.0/24",
            "--kubeconfig=/nonexistent/kubeconfig",
        ],
        &[],
    )
    .await;
    let client = line(&out, "FAIL kubernetes client");
    assert_eq!(client.matches("(os error 2)").count(), 1, "{client}");
    assert!(
        client.contains("kubeconfig /nonexistent/kubeconfig"),
        "{client}"
    );
    assert!(!client.contains("'\""), "{client}");

    // `run`: the file is read (logged), then the kubeconfig fails.
    let file = temp_file(
        "plain-run",
        "loxilbUrl: http://127.0.0.1:11111\nexternalCidr: 192.0.2.0/24\n",
    );
    let out = loxi_ccm(
        "run",
        &[
            &format!("--config={}", file.display()),
            "--kubeconfig=/nonexistent/kubeconfig",
            "--admin-addr=127.0.0.1:0",
        ],
        &[],
    )
    .await;
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(stdout(&out).contains("configuration file read"), "{all}");
    assert!(!all.contains('\x1b'), "colour codes in a pipe:\n{all:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("(os error 2)").count(), 1, "{stderr}");
    assert!(!stderr.contains("'\""), "{stderr}");

    let out = check(
        &[
            "--loxilb-url=http://127.0.0.1:11111",
            "--external-cidr=10.0.0.0/8\u{200b}",
        ],
        &[],
    )
    .await;
    let all = text(&out);
    assert!(
        all.contains("flag --external-cidr: invalid value \"10.0.0.0/8\u{200b}\""),
        "{all}"
    );
    assert_readable(&all);
}

/// HTTPS to loxilb: the CA given is trusted; another CA, an expired certificate and a wrong
/// token fail the loxilb line saying why; skipping verification passes with a warning. The
/// token never appears in the report, the logs or `--help`.
#[tokio::test]
async fn loxilb_tls_and_token_are_checked_and_the_token_never_shown() {
    use testenv::certs::TestCa;
    const TOKEN: &str = "tls-check-token-s3cret";
    let ca = TestCa::new("loxilb test CA").unwrap();
    let start = |cert: testenv::certs::ServerCert| async move {
        Simulator::start_tls(
            "127.0.0.1:0".parse().unwrap(),
            SimConfig {
                auth_token: Some(TOKEN.into()),
                ..SimConfig::default()
            },
            &cert.cert_pem,
            &cert.key_pem,
        )
        .await
        .unwrap()
    };
    let sim = start(ca.server_cert(&["127.0.0.1"]).unwrap()).await;
    let expired = start(ca.expired_server_cert(&["127.0.0.1"]).unwrap()).await;
    let ca_file = temp_file("ca", ca.pem());
    let other_ca_file = temp_file("other-ca", TestCa::new("other CA").unwrap().pem());
    let token_file = temp_file("token", &format!("{TOKEN}\n"));
    let wrong_token_file = temp_file("wrong-token", "not-the-token\n");
    let run = |url: String, ca: &PathBuf, token: &PathBuf, extra: &[&str]| {
        let mut args = vec![
            format!("--loxilb-url={url}"),
            "--external-cidr=192.0.2.0/24".into(),
            "--kubeconfig=/nonexistent/kubeconfig".into(),
            format!("--loxilb-ca-file={}", ca.display()),
            format!("--loxilb-token-file={}", token.display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            check(&refs, &[]).await
        }
    };

    let out = run(sim.url(), &ca_file, &token_file, &[]).await;
    let ok = line(&out, &format!("OK   loxilb {}", sim.url()));
    assert!(!text(&out).contains(TOKEN), "{}", text(&out));
    assert!(
        line(&out, "OK   configuration").contains("loxilb token from file"),
        "{ok}"
    );

    let out = run(sim.url(), &other_ca_file, &token_file, &[]).await;
    let fail = line(&out, &format!("FAIL loxilb {}", sim.url()));
    assert!(
        fail.contains("TLS handshake failed") && fail.contains("UnknownIssuer"),
        "{fail}"
    );
    assert!(fail.contains("--loxilb-ca-file"), "{fail}");

    let out = run(expired.url(), &ca_file, &token_file, &[]).await;
    let fail = line(&out, &format!("FAIL loxilb {}", expired.url()));
    assert!(fail.to_ascii_lowercase().contains("expired"), "{fail}");

    let out = run(sim.url(), &ca_file, &wrong_token_file, &[]).await;
    let fail = line(&out, &format!("FAIL loxilb {}", sim.url()));
    assert!(fail.contains("refused the credentials"), "{fail}");
    assert!(!text(&out).contains("not-the-token"), "{}", text(&out));

    let out = run(
        expired.url(),
        &other_ca_file,
        &token_file,
        &["--loxilb-insecure-skip-tls-verify"],
    )
    .await;
    line(&out, &format!("OK   loxilb {}", expired.url()));
    assert!(
        line(&out, "OK   configuration").contains("WARNING: loxilb certificates are not verified"),
        "{}",
        text(&out)
    );

    // Neither --help nor a Debug dump shows a token given in the environment.
    let help = loxi_ccm("run", &["--help"], &[("LOXI_CCM_LOXILB_TOKEN", TOKEN)]).await;
    assert!(text(&help).contains("--loxilb-token"), "{}", text(&help));
    assert!(!text(&help).contains(TOKEN), "{}", text(&help));
    for f in [ca_file, other_ca_file, token_file, wrong_token_file] {
        let _ = std::fs::remove_file(f);
    }
}

/// With BGP on, `check` prints the settings and, for each loxilb, every neighbour with its
/// session state and the configured peers it does not hold; a loxilb without BGP fails the
/// line.
#[tokio::test]
async fn bgp_settings_and_each_peers_state_on_each_loxilb() {
    use loxilb_client::bgp::{BgpGlobal, BgpNeighbor};
    let with_bgp = Simulator::start(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig {
            bgp: true,
            ..SimConfig::default()
        },
    )
    .await
    .unwrap();
    let without = Simulator::start("127.0.0.1:0".parse().unwrap(), SimConfig::default())
        .await
        .unwrap();
    loxilb_client::install_crypto_provider();
    let client =
        loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&with_bgp.url()))
            .unwrap();
    client
        .set_bgp_global(&BgpGlobal {
            router_id: "127.0.0.1".parse().unwrap(),
            local_as: 65100,
            set_next_hop_self: false,
            listen_port: 0,
        })
        .await
        .unwrap();
    client
        .add_bgp_neighbor(&BgpNeighbor::new("192.0.2.254".parse().unwrap(), 65001))
        .await
        .unwrap();
    assert!(with_bgp.set_bgp_peer_state("192.0.2.254", "ESTABLISHED", Some("00:01:00")));
    let out = check(
        &[
            &format!("--loxilb-url={},{}", with_bgp.url(), without.url()),
            "--external-cidr=192.0.2.0/24",
            "--kubeconfig=/nonexistent/kubeconfig",
            "--bgp-local-as=65100",
            "--bgp-peers=192.0.2.254:65001,192.0.2.253:65002",
        ],
        &[],
    )
    .await;
    let config = line(&out, "OK   configuration:");
    assert!(
        config.contains("BGP local AS 65100") && config.contains("192.0.2.253:65002"),
        "{config}"
    );
    let good = line(&out, &format!("OK   loxilb {} BGP:", with_bgp.url()));
    assert!(
        good.contains("192.0.2.254 AS 65001 ESTABLISHED (for 00:01:00)"),
        "{good}"
    );
    assert!(good.contains("not held (yet): 192.0.2.253:65002"), "{good}");
    let off = line(&out, &format!("FAIL loxilb {} BGP:", without.url()));
    assert!(off.contains("without BGP"), "{off}");
    assert_readable(&text(&out));
}
