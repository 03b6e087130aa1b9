//! The leader-election options (`LeaderArgs`) validated into the Lease this controller
//! competes for.

use std::time::Duration;

use loxi_domain::ControllerName;

use crate::config::cli::LeaderArgs;
use crate::config::origins::{Origin, Origins};
use crate::config::{ConfigError, is_dns_label};
use crate::leader::LeaseConfig;

/// `--leader-elect-name`'s default: the default controller's Lease.
const DEFAULT_LEASE_NAME: &str = "loxi-ccm";

/// The Lease's name: each controller elects its own leader, as two controllers on one Lease
/// would leave one of them standing by for good. A name the user set is kept as it is.
pub(super) fn lease_name(
    args: &LeaderArgs,
    controller: &ControllerName,
    origins: &Origins,
) -> String {
    if matches!(origins.of("leader_elect_name"), Origin::Default)
        && args.leader_elect_name == DEFAULT_LEASE_NAME
    {
        controller.suffixed(DEFAULT_LEASE_NAME)
    } else {
        args.leader_elect_name.clone()
    }
}

/// The Lease to compete for, `None` with leader election off; `lease_name` from
/// [`lease_name`].
pub(super) fn lease(
    args: &LeaderArgs,
    lease_name: &str,
    identity: &str,
    origins: &Origins,
) -> Result<Option<LeaseConfig>, ConfigError> {
    if !args.leader_elect {
        return Ok(None);
    }
    let duration = args.leader_elect_lease_duration;
    if duration < Duration::from_secs(1) {
        return Err(origins.invalid_value(
            "leader_elect_lease_duration",
            &format!("{duration:?}"),
            "must be at least 1s (the Lease counts in whole seconds)",
        ));
    }
    for (id, v) in [
        ("leader_elect_namespace", &args.leader_elect_namespace),
        ("leader_elect_name", &args.leader_elect_name),
    ] {
        if v.trim().is_empty() {
            return Err(origins.invalid_value(id, v, "must not be empty"));
        }
    }
    // Refused here rather than by the API server on every attempt to take the Lease.
    if !is_dns_label(&args.leader_elect_namespace) {
        return Err(origins.invalid_value(
            "leader_elect_namespace",
            &args.leader_elect_namespace,
            "not a namespace name (RFC 1123 label: at most 63 characters of [a-z0-9-], \
             starting and ending with a letter or digit)",
        ));
    }
    if !loxi_domain::address_name::is_object_name(&args.leader_elect_name) {
        return Err(origins.invalid_value(
            "leader_elect_name",
            &args.leader_elect_name,
            "not a Lease name (RFC 1123 subdomain: at most 253 characters of [a-z0-9-.], \
             starting and ending with a letter or digit)",
        ));
    }
    let mut lease = LeaseConfig::new(
        &args.leader_elect_namespace,
        lease_name,
        identity.to_string(),
    );
    lease.lease_duration = duration;
    // client-go's proportions: renew within 2/3 of the lease, retry at 2/15.
    lease.renew_deadline = duration * 2 / 3;
    lease.retry_period = duration * 2 / 15;
    Ok(Some(lease))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::run_args;

    #[test]
    fn each_controller_gets_its_own_lease_unless_named() {
        let origins = Origins::default();
        let args = run_args(&[]);
        let default = ControllerName::default_controller();
        assert_eq!(lease_name(&args.leader, &default, &origins), "loxi-ccm");
        let zone_a = ControllerName::new("zone-a").unwrap();
        assert_eq!(
            lease_name(&args.leader, &zone_a, &origins),
            "loxi-ccm-zone-a"
        );
    }

    #[test]
    fn the_lease_follows_client_go_proportions_and_refuses_bad_names() {
        let origins = Origins::default();
        let args = run_args(&["--leader-elect-lease-duration=15s"]);
        let lease = lease(&args.leader, "loxi-ccm", "me", &origins)
            .unwrap()
            .unwrap();
        assert_eq!(lease.renew_deadline, Duration::from_secs(10));
        assert_eq!(lease.retry_period, Duration::from_secs(2));
        let off = run_args(&["--leader-elect=false", "--leader-elect-namespace=Bad"]);
        assert!(
            super::lease(&off.leader, "x", "me", &origins)
                .unwrap()
                .is_none()
        );
        for flag in [
            "--leader-elect-namespace=Bad",
            "--leader-elect-name=-x",
            "--leader-elect-lease-duration=500ms",
        ] {
            let args = run_args(&[flag]);
            let e = super::lease(&args.leader, "x", "me", &origins)
                .unwrap_err()
                .to_string();
            let long = flag.split('=').next().unwrap();
            assert!(
                e.starts_with(&format!("{long}: invalid value")),
                "{flag}: {e}"
            );
        }
    }
}
