//! The control planes' working directories (`<tmp>/loxi-ccm-cp-*`, ~140 MB each with etcd's
//! data) and their removal once nothing uses them.
//!
//! A test binary keeps its control plane in a `static`, and statics are never dropped: the
//! directory outlives the process (so do those of a killed or panicked run). Left alone they
//! filled a 250 GB disk over a few days of test runs. So each directory records the process
//! that made it, and every new control plane first removes the directories no living process
//! uses: within one `cargo test` run a binary clears what the previous binaries left.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The prefix of every control plane's directory in the system's temporary directory.
pub const PREFIX: &str = "loxi-ccm-cp-";

/// The file in a directory naming the process that made it.
const OWNER_FILE: &str = "owner.pid";

/// A directory younger than this is never removed: its maker may not have written its owner
/// file yet (or is an older testenv that writes none and is still starting).
const GRACE: Duration = Duration::from_secs(2 * 60);

/// Records this process as the owner of `dir`.
pub fn claim(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())
}

/// Removes the directories of control planes whose processes are gone; returns how many.
/// Errors are ignored: a directory that cannot be removed now is tried again next time.
pub fn sweep() -> usize {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return 0;
    };
    let candidates: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .map(|e| e.path())
        .collect();
    if candidates.is_empty() {
        return 0;
    }
    let cmdlines = process_cmdlines();
    candidates
        .into_iter()
        .filter(|dir| is_abandoned(dir, &cmdlines))
        .filter(|dir| std::fs::remove_dir_all(dir).is_ok())
        .count()
}

/// Nothing uses `dir`: it is past the grace period, its owner (if recorded) is dead, and no
/// running process names it on its command line (etcd names its data directory there, so a
/// control plane started by an older testenv without an owner file is recognised too).
fn is_abandoned(dir: &Path, cmdlines: &[String]) -> bool {
    let age = std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok());
    if age.is_none_or(|age| age < GRACE) {
        return false;
    }
    if let Some(pid) = std::fs::read_to_string(dir.join(OWNER_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        && Path::new(&format!("/proc/{pid}")).exists()
    {
        return false;
    }
    let name = dir.to_string_lossy();
    !cmdlines.iter().any(|c| c.contains(name.as_ref()))
}

/// The command lines of every running process (arguments joined by spaces).
fn process_cmdlines() -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aged_dir(owner: Option<u32>) -> tempfile::TempDir {
        let dir = tempfile::Builder::new()
            .prefix("loxi-ccm-workdir-test-")
            .tempdir()
            .unwrap();
        if let Some(pid) = owner {
            std::fs::write(dir.path().join(OWNER_FILE), pid.to_string()).unwrap();
        }
        let old = SystemTime::now() - GRACE - Duration::from_secs(60);
        std::fs::File::open(dir.path())
            .unwrap()
            .set_modified(old)
            .unwrap();
        dir
    }

    #[test]
    fn a_dead_owners_old_directory_is_abandoned() {
        // PIDs above the kernel's maximum (4,194,304) never exist.
        let dir = aged_dir(Some(4_194_305));
        assert!(is_abandoned(dir.path(), &[]));
    }

    #[test]
    fn a_living_owners_directory_is_kept() {
        let dir = aged_dir(Some(std::process::id()));
        assert!(!is_abandoned(dir.path(), &[]));
    }

    #[test]
    fn a_directory_a_process_names_is_kept() {
        let dir = aged_dir(None);
        let cmdline = format!("etcd --data-dir {}/etcd", dir.path().display());
        assert!(!is_abandoned(dir.path(), &[cmdline]));
        assert!(is_abandoned(
            dir.path(),
            &["etcd --data-dir /elsewhere".into()]
        ));
    }

    #[test]
    fn a_young_directory_is_kept() {
        let dir = tempfile::Builder::new()
            .prefix("loxi-ccm-workdir-test-")
            .tempdir()
            .unwrap();
        assert!(!is_abandoned(dir.path(), &[]));
    }
}
