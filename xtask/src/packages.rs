//! Debian packages a task needs (`musl-tools` and `buildah` for the image; containerd and the
//! CNI plugins for the real node), installed with apt-get when missing. The development
//! machines and CI run as root on Debian; elsewhere a missing package is an error that names
//! the command to run.

use std::process::Command;

use anyhow::{Result, bail};

use crate::run;

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.starts_with(b"install ok installed"))
}

/// Installs the packages of `wanted` that are not installed yet.
pub fn ensure(wanted: &[&str]) -> Result<()> {
    let missing: Vec<&str> = wanted.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !is_root {
        bail!(
            "missing Debian packages: {}; install them: sudo apt-get install -y --no-install-recommends {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    let install = || {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    let what = format!("apt-get install {}", missing.join(" "));
    if run(install(), &what).is_err() {
        // A fresh machine has no package lists yet.
        let mut update = Command::new("apt-get");
        update.args(["update", "-q"]);
        run(update, "apt-get update")?;
        run(install(), &what)?;
    }
    Ok(())
}
