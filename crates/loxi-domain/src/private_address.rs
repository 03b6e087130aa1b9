//! `--privateCIDR` (kube-loxilb's spelling): the private address each rule carries as
//! loxilb's `privateIP`, for clouds where the VIP is an elastic IP that the cloud translates
//! to an address of the loxilb instance (docs/configuration.md#private-addresses).
//!
//! As in kube-loxilb, the setting is written as a CIDR and the address written in it is the
//! private address (`10.10.0.1` of `10.10.0.1/24`); a bare address is accepted too. A
//! Service that asks for its address by name (`loxilb.io/staticIP`, `spec.loadBalancerIP`)
//! gets no private address: its address is the one to plumb.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::addressing::ANN_STATIC_IP;

/// Reads `--privateCIDR`: the address written in a CIDR, or a bare address.
pub fn parse_private_cidr(value: &str) -> Result<IpAddr, String> {
    let value = value.trim();
    let address = value.split_once('/').map_or(value, |(ip, _)| ip);
    let ip: IpAddr = address
        .parse()
        .map_err(|_| format!("{value:?} is not an address or a CIDR such as 10.10.0.1/24"))?;
    if let Some((_, len)) = value.split_once('/') {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        match len.parse::<u8>() {
            Ok(n) if n <= max => {}
            _ => {
                return Err(format!(
                    "{value:?}: the prefix length {len:?} is not a number from 0 to {max}"
                ));
            }
        }
    }
    if ip.is_unspecified() {
        return Err(format!(
            "{value:?}: the unspecified address cannot be plumbed"
        ));
    }
    Ok(ip)
}

/// The `privateIP` of a rule on `vip` for a Service with these annotations and
/// `spec.loadBalancerIP`: the configured address, unless the Service names its address or
/// the address is of the other IP family than the VIP (loxilb cannot plumb a VIP of one
/// family on an address of the other).
pub fn private_ip_for(
    configured: Option<IpAddr>,
    annotations: &BTreeMap<String, String>,
    load_balancer_ip: Option<&str>,
    vip: IpAddr,
) -> Option<IpAddr> {
    let named = |v: Option<&str>| v.is_some_and(|v| !v.trim().is_empty());
    if named(annotations.get(ANN_STATIC_IP).map(String::as_str)) || named(load_balancer_ip) {
        return None;
    }
    configured.filter(|ip| ip.is_ipv4() == vip.is_ipv4())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_address_written_in_the_cidr() {
        assert_eq!(parse_private_cidr("10.10.0.1/24"), Ok(ip("10.10.0.1")));
        assert_eq!(parse_private_cidr(" 10.10.0.7 "), Ok(ip("10.10.0.7")));
        assert_eq!(parse_private_cidr("fd00::5/64"), Ok(ip("fd00::5")));
        for bad in [
            "",
            "10.10.0.1/33",
            "10.10.0.1/x",
            "ten/8",
            "0.0.0.0/0",
            "fd00::1/129",
        ] {
            let e = parse_private_cidr(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn services_naming_their_address_get_none() {
        let none = BTreeMap::new();
        let vip = ip("192.0.2.10");
        let conf = Some(ip("10.10.0.1"));
        assert_eq!(private_ip_for(conf, &none, None, vip), conf);
        assert_eq!(private_ip_for(None, &none, None, vip), None);
        let static_ip = BTreeMap::from([(ANN_STATIC_IP.to_string(), "192.0.2.10".to_string())]);
        assert_eq!(private_ip_for(conf, &static_ip, None, vip), None);
        assert_eq!(private_ip_for(conf, &none, Some("192.0.2.10"), vip), None);
        // Empty values count as absent, as everywhere else.
        let empty = BTreeMap::from([(ANN_STATIC_IP.to_string(), " ".to_string())]);
        assert_eq!(private_ip_for(conf, &empty, Some(""), vip), conf);
        // Never across families.
        assert_eq!(private_ip_for(conf, &none, None, ip("2001:db8::1")), None);
    }
}
