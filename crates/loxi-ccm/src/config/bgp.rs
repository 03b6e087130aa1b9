//! The BGP and HA options (`BgpArgs`, `HaArgs`) validated, each refusal naming its option.

use loxi_domain::bgp::{BgpInput, BgpSettings};
use loxi_domain::roles::HaSettings;

use crate::config::ConfigError;
use crate::config::cli::{BgpArgs, HaArgs};
use crate::config::origins::Origins;

/// The BGP settings from the flags (`loxi_domain::bgp`), a refusal naming the option it came
/// from.
pub(super) fn bgp_settings(
    args: &BgpArgs,
    origins: &Origins,
) -> Result<Option<BgpSettings>, ConfigError> {
    let peers = args.bgp_peers.join(",");
    let input = BgpInput {
        local_asn: args.bgp_local_as.as_deref(),
        router_id: args.bgp_router_id.as_deref(),
        listen_port: args.bgp_listen_port,
        multihop: args.bgp_multihop,
        peers: (!peers.is_empty()).then_some(peers.as_str()),
    };
    BgpSettings::from_input(&input).map_err(|e| {
        let id = match e.field.as_str() {
            loxi_domain::bgp::FIELD_LOCAL_ASN => "bgp_local_as",
            loxi_domain::bgp::FIELD_ROUTER_ID => "bgp_router_id",
            loxi_domain::bgp::FIELD_LISTEN_PORT => "bgp_listen_port",
            _ => "bgp_peers",
        };
        ConfigError::invalid(origins.describe(id), e.to_string())
    })
}

/// `--set-roles`: the HA settings, or `None` when unset.
pub(super) fn ha_roles(
    args: &HaArgs,
    origins: &Origins,
) -> Result<Option<HaSettings>, ConfigError> {
    let vip = match args.set_roles.as_deref().map(str::trim) {
        None | Some("") => return Ok(None),
        Some(vip) => vip,
    };
    if vip.parse::<std::net::IpAddr>().is_err() {
        return Err(origins.invalid_value(
            "set_roles",
            vip,
            "the HA VIP must be an IP address (0.0.0.0 for none)",
        ));
    }
    Ok(Some(HaSettings {
        vip: vip.to_string(),
        instance_count: args.num_zone_instances,
        excluded: args
            .exclude_role_list
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    }))
}

/// What needs BGP on, or cannot work with it: the BGP custom resources need it; several HA
/// instances cannot have it.
pub(super) fn check_bgp_needs(
    bgp_on: bool,
    bgp: &BgpArgs,
    ha: &HaArgs,
    origins: &Origins,
) -> Result<(), ConfigError> {
    if bgp.bgp_crds && !bgp_on {
        return Err(origins.invalid(
            "bgp_crds",
            "the BGP custom resources need BGP on: set the local AS number (--bgp-local-as, \
             kube-loxilb: --setBGP)",
        ));
    }
    if bgp_on && ha.num_zone_instances > 1 {
        // docs/fleet.md#several-ha-instances-and-bgp: seen on loxilb 0.9.8.
        return Err(origins.invalid(
            "num_zone_instances",
            format!(
                "{} HA instances with BGP on: loxilb advertises every address with the BGP \
                 preference (MED) of llb-inst0's role, whatever the HA instance of its rule, \
                 so the router sends the traffic of the other instances' addresses to a \
                 loxilb that is not their MASTER and they are unreachable; use one HA \
                 instance per group (--num-zone-instances=1) with BGP",
                ha.num_zone_instances
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::run_args;

    #[test]
    fn bgp_settings_name_the_option_at_fault() {
        let origins = Origins::default();
        let off = run_args(&[]);
        assert!(bgp_settings(&off.bgp, &origins).unwrap().is_none());
        let on = run_args(&["--bgp-local-as=65001", "--bgp-peers=192.0.2.1:65002"]);
        let settings = bgp_settings(&on.bgp, &origins).unwrap().unwrap();
        assert_eq!(settings.peers.len(), 1);
        let bad_id = run_args(&["--bgp-local-as=65001", "--bgp-router-id=nope"]);
        let e = bgp_settings(&bad_id.bgp, &origins).unwrap_err().to_string();
        assert!(e.starts_with("--bgp-router-id: "), "{e}");
    }

    #[test]
    fn ha_roles_need_an_ip_and_drop_empty_exclusions() {
        let origins = Origins::default();
        assert!(ha_roles(&run_args(&[]).ha, &origins).unwrap().is_none());
        let args = run_args(&["--set-roles=0.0.0.0", "--exclude-role-list=a,,b"]);
        let roles = ha_roles(&args.ha, &origins).unwrap().unwrap();
        assert_eq!(roles.vip, "0.0.0.0");
        assert_eq!(roles.excluded, ["a", "b"]);
        let bad = run_args(&["--set-roles=vip"]);
        let e = ha_roles(&bad.ha, &origins).unwrap_err().to_string();
        assert!(e.contains("--set-roles") && e.contains("IP address"), "{e}");
    }

    #[test]
    fn bgp_crds_need_bgp_and_bgp_takes_one_ha_instance() {
        let origins = Origins::default();
        let crds = run_args(&["--bgp-crds"]);
        let e = check_bgp_needs(false, &crds.bgp, &crds.ha, &origins).unwrap_err();
        assert!(e.to_string().contains("--bgp-crds"), "{e}");
        assert!(check_bgp_needs(true, &crds.bgp, &crds.ha, &origins).is_ok());
        let two = run_args(&["--num-zone-instances=2"]);
        assert!(check_bgp_needs(false, &two.bgp, &two.ha, &origins).is_ok());
        let e = check_bgp_needs(true, &two.bgp, &two.ha, &origins).unwrap_err();
        assert!(e.to_string().contains("--num-zone-instances"), "{e}");
    }
}
