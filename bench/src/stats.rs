//! Small measurement helpers: latency summaries, process usage from `/proc`, waiting.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

/// Latency distribution in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

pub fn summarize(samples: &[Duration]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        // Nearest rank: the smallest value with at least p% of the samples at or below it.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((p / 100.0) * ms.len() as f64).ceil() as usize;
        ms[i.clamp(1, ms.len()) - 1]
    };
    #[allow(clippy::cast_precision_loss)]
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    Summary {
        count: ms.len(),
        p50_ms: round(rank(50.0)),
        p99_ms: round(rank(99.0)),
        max_ms: round(ms[ms.len() - 1]),
        mean_ms: round(mean),
    }
}

/// Rounds to 0.1 (ms or s) for readable JSON.
pub fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Seconds with millisecond precision.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// Resource usage of one process, read from `/proc`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Usage {
    /// Peak resident set size (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Current resident set size (VmRSS), KiB.
    pub rss_kib: u64,
    /// utime + stime, seconds.
    pub cpu_s: f64,
}

impl Usage {
    pub fn peak_rss_mib(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        round(self.peak_rss_kib as f64 / 1024.0)
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    let ticks = if t > 0 { t as f64 } else { 100.0 };
    ticks
}

/// Reads VmHWM / VmRSS from `/proc/<pid>/status` and utime + stime from `/proc/<pid>/stat`.
pub fn usage(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may contain spaces) start at field 3 (state);
    // utime and stime are fields 14 and 15.
    let Some((_, after)) = stat.rsplit_once(')') else {
        bail!("unexpected /proc/{pid}/stat: {stat}");
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0.0, |v| {
                #[allow(clippy::cast_precision_loss)]
                let v = v as f64;
                v
            })
    };
    // fields[0] is field 3, so field 14 is fields[11].
    let cpu_s = (tick(11) + tick(12)) / clock_ticks();
    Ok(Usage {
        peak_rss_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
        cpu_s: (cpu_s * 1000.0).round() / 1000.0,
    })
}

/// Pids whose `comm` is `name` and whose command line mentions `marker` (e.g. the control
/// plane's temporary directory, so other users' kube-apiservers on the machine are ignored).
pub fn find_pids(name: &str, marker: &Path) -> Vec<u32> {
    let marker = marker.to_string_lossy().to_string();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&marker) {
            out.push(pid);
        }
    }
    out
}

/// Polls `check` every `every` until it returns true; the time it took.
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        if check().await? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = summarize(&samples);
        assert_eq!(s.count, 100);
        assert!((s.p50_ms - 50.0).abs() < f64::EPSILON);
        assert!((s.p99_ms - 99.0).abs() < f64::EPSILON);
        assert!((s.max_ms - 100.0).abs() < f64::EPSILON);
    }

    #[test]
    fn own_usage_is_readable() {
        let u = usage(std::process::id()).unwrap();
        assert!(u.peak_rss_kib > 0);
        assert!(u.rss_kib > 0);
    }
}
