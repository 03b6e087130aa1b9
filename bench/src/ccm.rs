//! The controller under test: the release `loxi-ccm` binary as its own process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::stats::{Usage, usage};

/// How the controller is started (the same for every process of a run).
#[derive(Debug, Clone)]
pub struct CcmSpec {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    /// One `--loxilb-url` each: a plain URL (the default group) or `<group>=<url>`
    /// (docs/fleet.md#groups-and-placement).
    pub loxilb_urls: Vec<String>,
    pub external_cidr: String,
    pub lease_namespace: String,
    pub log_dir: PathBuf,
    /// Extra flags from the command line (`--ccm-arg`).
    pub extra: Vec<String>,
    /// Extra environment (`--ccm-env`).
    pub env: Vec<(String, String)>,
}

pub struct Ccm {
    child: Child,
    pub admin: String,
    pub log: PathBuf,
    http: reqwest::Client,
}

impl Ccm {
    /// Starts `loxi-ccm run` (leader election on, default tuning).
    pub fn spawn(spec: &CcmSpec, label: &str) -> Result<Ccm> {
        let port = testenv::free_port()?;
        let admin = format!("127.0.0.1:{port}");
        let log = spec.log_dir.join(format!("loxi-ccm-{label}.log"));
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new(&spec.bin);
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&spec.kubeconfig)
            .args(spec.loxilb_urls.iter().map(|u| format!("--loxilb-url={u}")))
            .args([
                "--external-cidr",
                &spec.external_cidr,
                "--admin-addr",
                &admin,
                "--leader-elect-namespace",
                &spec.lease_namespace,
                "--log-format",
                "json",
            ])
            .args(&spec.extra)
            .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(out.try_clone()?)
            .stderr(out);
        let child =
            testenv::spawn_tied(cmd).with_context(|| format!("starting {}", spec.bin.display()))?;
        Ok(Ccm {
            child,
            admin,
            log,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn usage(&self) -> Result<Usage> {
        usage(self.pid())
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "loxi-ccm exited ({status}); log tail:\n{}",
                log_tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// `/readyz` answers `ok` or `ok (leader)`: synced, leading, loxilb reachable (not
    /// `standby`, not `degraded`).
    pub async fn fully_ready(&mut self) -> Result<bool> {
        self.check_alive()?;
        let Ok(resp) = self
            .http
            .get(format!("http://{}/readyz", self.admin))
            .send()
            .await
        else {
            return Ok(false);
        };
        if !resp.status().is_success() {
            return Ok(false);
        }
        let body = resp.text().await.unwrap_or_default();
        let body = body.trim();
        Ok(body.starts_with("ok") && !body.contains("standby") && !body.contains("degraded"))
    }

    pub async fn metrics(&mut self) -> Result<String> {
        self.check_alive()?;
        Ok(self
            .http
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Sum of the samples of `name` whose labels contain every `label="value"` in `labels`.
    pub async fn metric(&mut self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        let text = self.metrics().await?;
        Ok(metric_sum(&text, name, labels))
    }

    /// Reconcile results and loxilb calls counted by the controller so far, plus how often
    /// each WARN/ERROR message appears in its log.
    pub async fn counters(&mut self) -> Result<serde_json::Value> {
        let text = self.metrics().await?;
        let r =
            |result: &str| metric_sum(&text, "loxi_ccm_reconciles_total", &[("result", result)]);
        let c = |op: &str| metric_sum(&text, "loxi_ccm_loxilb_calls_total", &[("op", op)]);
        let mut warnings: std::collections::BTreeMap<String, u64> = Default::default();
        for line in std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if matches!(v["level"].as_str(), Some("WARN" | "ERROR")) {
                let msg = v["message"].as_str().unwrap_or("?").to_string();
                *warnings.entry(msg).or_default() += 1;
            }
        }
        Ok(serde_json::json!({
            "reconciles": {"success": r("success"), "error": r("error"), "invalid": r("invalid")},
            "loxilb_calls": {"apply": c("apply"), "delete": c("delete"), "list": c("list")},
            "log_warnings": warnings,
        }))
    }

    /// SIGTERM, then waits for the exit; the time it took.
    pub async fn stop(mut self) -> Result<Duration> {
        let started = Instant::now();
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    eprintln!(
                        "loxi-bench: loxi-ccm exited {status} after SIGTERM; log tail:\n{}",
                        log_tail(&self.log, 20)
                    );
                }
                return Ok(started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("loxi-ccm ignored SIGTERM for 60 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((m, r)) => (m, r),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())?
        })
        .fold(0.0, |a, b| a + b)
}

pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_series() {
        let text = "# TYPE loxi_ccm_reconciles counter\n\
loxi_ccm_reconciles_total{result=\"success\"} 12\n\
loxi_ccm_reconciles_total{result=\"error\"} 2\n\
loxi_ccm_loxilb_calls_total{instance=\"x\",op=\"apply\",result=\"ok\"} 7\n";
        assert!(
            (metric_sum(text, "loxi_ccm_reconciles_total", &[("result", "success")]) - 12.0).abs()
                < f64::EPSILON
        );
        assert!((metric_sum(text, "loxi_ccm_reconciles_total", &[]) - 14.0).abs() < f64::EPSILON);
        assert!(
            (metric_sum(text, "loxi_ccm_loxilb_calls_total", &[("op", "apply")]) - 7.0).abs()
                < f64::EPSILON
        );
    }
}
