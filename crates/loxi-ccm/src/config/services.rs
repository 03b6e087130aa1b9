//! The Service options (`ServiceArgs`: which Services, their defaults, this controller's
//! name) and the Kubernetes API options (`KubeApiArgs`) validated.

use loxi_domain::{ClusterId, ControllerName, Defaults, NatMode};

use crate::config::ConfigError;
use crate::config::cli::{GatewayArgs, KubeApiArgs, ServiceArgs};
use crate::config::origins::Origins;

/// What the Service options decide.
#[derive(Debug, Clone)]
pub(super) struct ServiceSettings {
    pub(super) controller: ControllerName,
    pub(super) defaults: Defaults,
    pub(super) cluster_id: Option<ClusterId>,
    /// `--privateCIDR`: the rules' `privateIP`.
    pub(super) private_ip: Option<std::net::IpAddr>,
}

pub(super) fn service_settings(
    args: &ServiceArgs,
    origins: &Origins,
) -> Result<ServiceSettings, ConfigError> {
    let mode: NatMode = args.lb_mode.trim().parse().map_err(|()| {
        origins.invalid_value(
            "lb_mode",
            &args.lb_mode,
            "expected default, onearm, fullnat, dsr, fullproxy, hostonearm or 0-5",
        )
    })?;
    let cluster_id = match args.cluster_id.as_deref() {
        Some(id) => Some(ClusterId::new(id).map_err(|_| {
            origins.invalid_value("cluster_id", id, "expected 1-32 characters of [a-z0-9-]")
        })?),
        None => None,
    };
    if let Some(ns) = &args.namespace
        && ns.trim().is_empty()
    {
        return Err(origins.invalid_value("namespace", ns, "must not be empty"));
    }
    let class = &args.load_balancer_class;
    if class.trim().is_empty() {
        return Err(origins.invalid_value("load_balancer_class", class, "must not be empty"));
    }
    if args.concurrency == 0 {
        return Err(origins.invalid_value("concurrency", "0", "must be at least 1"));
    }
    let private_ip = match args.private_cidr.as_deref() {
        Some(v) if !v.trim().is_empty() => Some(
            loxi_domain::private_address::parse_private_cidr(v)
                .map_err(|why| origins.invalid_value("private_cidr", v, &why))?,
        ),
        _ => None,
    };
    Ok(ServiceSettings {
        controller: controller_name(args, origins)?,
        private_ip,
        defaults: Defaults {
            mode,
            monitor: args.monitor,
            use_pod_network: args.use_pod_network,
        },
        cluster_id,
    })
}

/// `--controller-name`, else the name derived from the class.
fn controller_name(args: &ServiceArgs, origins: &Origins) -> Result<ControllerName, ConfigError> {
    let Some(name) = args.controller_name.as_deref() else {
        return Ok(ControllerName::for_class(args.load_balancer_class.trim()));
    };
    ControllerName::new(name.trim()).map_err(|_| {
        origins.invalid_value(
            "controller_name",
            name,
            "expected 1-40 characters of [a-z0-9-], starting and ending with a letter or digit, \
             or \"default\"",
        )
    })
}

/// The client-side Kubernetes API rate limit.
pub(super) fn kube_api_rate_limit(
    args: &KubeApiArgs,
    origins: &Origins,
) -> Result<crate::k8s::api::RateLimit, ConfigError> {
    if !args.kube_api_qps.is_finite() || args.kube_api_qps < 0.0 {
        return Err(origins.invalid_value(
            "kube_api_qps",
            &args.kube_api_qps.to_string(),
            "must be 0 (no limit) or a positive number of requests per second",
        ));
    }
    if args.kube_api_qps > 0.0 && args.kube_api_burst == 0 {
        return Err(origins.invalid_value(
            "kube_api_burst",
            "0",
            "must be at least 1 when --kube-api-qps sets a limit",
        ));
    }
    Ok(crate::k8s::api::RateLimit {
        qps: args.kube_api_qps,
        burst: args.kube_api_burst,
    })
}

/// The GatewayClass controllerName served with `--gateway-api` (`None` without it): a
/// domain-prefixed path, as the Gateway API requires of `spec.controllerName`.
pub(super) fn gateway_class(
    args: &GatewayArgs,
    origins: &Origins,
) -> Result<Option<String>, ConfigError> {
    if !args.gateway_api {
        return Ok(None);
    }
    let class = args.loxilb_gateway_class.trim();
    let valid = class.split_once('/').is_some_and(|(domain, path)| {
        domain.contains('.')
            && !path.is_empty()
            && domain
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && !path.chars().any(char::is_whitespace)
    }) && class.len() <= 253;
    if !valid {
        return Err(origins.invalid_value(
            "loxilb_gateway_class",
            class,
            "expected a domain-prefixed path, e.g. loxilb.io/loxilb",
        ));
    }
    Ok(Some(class.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::run_args;

    #[test]
    fn service_defaults_and_the_controller_name() {
        let origins = Origins::default();
        let s =
            service_settings(&run_args(&["--lb-mode=2", "--monitor"]).services, &origins).unwrap();
        assert_eq!(s.defaults.mode, "2".parse::<NatMode>().unwrap());
        assert!(s.defaults.monitor && !s.defaults.use_pod_network);
        assert!(s.controller.is_default());
        assert!(s.cluster_id.is_none());
        let other = run_args(&["--load-balancer-class=example.com/lb"]);
        let s = service_settings(&other.services, &origins).unwrap();
        assert_eq!(s.controller.name(), Some("example-com-lb"));
    }

    #[test]
    fn bad_service_options_name_their_flag() {
        let origins = Origins::default();
        for (flag, long) in [
            ("--lb-mode=sideways", "--lb-mode"),
            ("--cluster-id=Not_An_Id", "--cluster-id"),
            ("--namespace= ", "--namespace"),
            ("--load-balancer-class= ", "--load-balancer-class"),
            ("--concurrency=0", "--concurrency"),
            ("--controller-name=-x-", "--controller-name"),
        ] {
            let e = service_settings(&run_args(&[flag]).services, &origins).unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("{long}: invalid value")),
                "{flag}: {e}"
            );
        }
    }

    #[test]
    fn kube_api_rate_limit_needs_a_burst_with_a_limit() {
        let origins = Origins::default();
        let none = kube_api_rate_limit(&run_args(&[]).kube_api, &origins).unwrap();
        assert_eq!((none.qps, none.burst), (0.0, 100));
        let bad = run_args(&["--kube-api-qps=5", "--kube-api-burst=0"]);
        let e = kube_api_rate_limit(&bad.kube_api, &origins)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--kube-api-burst: "), "{e}");
        let negative = run_args(&["--kube-api-qps=-1"]);
        assert!(kube_api_rate_limit(&negative.kube_api, &origins).is_err());
    }
}
