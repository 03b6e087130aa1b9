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
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_loxi-ccm"));
    cmd.arg("check").args(args).env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("the loxi-ccm binary runs")
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
             setLBMode: 2\nleaderElectNamespace: kube-system\n",
            sim.url()
        ),
    );
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
    ] {
        assert!(
            lines.iter().any(|l| l[5..].starts_with(name)),
            "no line for {name}:\n{report}"
        );
    }
    assert!(text(&out).contains("check passed"), "{}", text(&out));
}
