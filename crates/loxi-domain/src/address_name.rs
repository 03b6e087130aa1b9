//! The Kubernetes object name of an address (an `AddressClaim` is named after the address it
//! claims, so that the API server's name uniqueness settles races).
//!
//! Object names must be RFC 1123 subdomains: lower-case alphanumerics, `-` and `.`, starting
//! and ending with an alphanumeric, at most 253 characters. An IPv4 address is one as it is.
//! An IPv6 address is its usual text with `:` as `-` (`2001:db8::1` → `2001-db8--1`), the
//! form claims have always had; but where that text starts or ends with `::` (`::1`,
//! `2001:db8:1::`, `::ffff:192.0.2.1`) the name would start or end with `-`, so those
//! addresses use the fully written form instead: eight groups of four hex digits
//! (`0000-0000-0000-0000-0000-0000-0000-0001`). Both forms read back to the one address
//! they were made from, so two addresses never share a name.

use std::net::{IpAddr, Ipv6Addr};

/// The object name for `ip` (module docs).
pub fn address_object_name(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let short = v6.to_string().replace(':', "-");
            if short.starts_with('-') || short.ends_with('-') || short.contains('.') {
                expanded(v6)
            } else {
                short
            }
        }
    }
}

/// The address an object name stands for, in either form; `None` for any other name.
pub fn address_from_object_name(name: &str) -> Option<IpAddr> {
    if let Ok(v4) = name.parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(v4));
    }
    let ip: Ipv6Addr = name.replace('-', ":").parse().ok()?;
    // Only the name this module gives the address: one address, one name.
    (address_object_name(&IpAddr::V6(ip)) == name).then_some(IpAddr::V6(ip))
}

fn expanded(v6: &Ipv6Addr) -> String {
    v6.segments()
        .iter()
        .map(|s| format!("{s:04x}"))
        .collect::<Vec<_>>()
        .join("-")
}

/// Whether `name` is a valid Kubernetes object name (RFC 1123 subdomain).
pub fn is_object_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && name.split('.').all(|label| !label.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> String {
        address_object_name(&s.parse().unwrap())
    }

    #[test]
    fn names_keep_the_old_form_where_it_was_valid() {
        assert_eq!(name("192.0.2.1"), "192.0.2.1");
        assert_eq!(name("2001:db8::1"), "2001-db8--1");
        assert_eq!(name("2001:db8:1:2:3:4:5:6"), "2001-db8-1-2-3-4-5-6");
    }

    #[test]
    fn addresses_at_the_edges_get_the_written_out_form() {
        assert_eq!(name("::1"), "0000-0000-0000-0000-0000-0000-0000-0001");
        assert_eq!(
            name("2001:db8:1::"),
            "2001-0db8-0001-0000-0000-0000-0000-0000"
        );
        assert_eq!(name("::"), "0000-0000-0000-0000-0000-0000-0000-0000");
        assert_eq!(
            name("::ffff:192.0.2.1"),
            "0000-0000-0000-0000-0000-ffff-c000-0201"
        );
        for n in ["::1", "2001:db8:1::", "::", "::ffff:192.0.2.1"] {
            assert!(is_object_name(&name(n)), "{n}");
        }
    }

    #[test]
    fn a_name_reads_back_only_in_the_form_it_was_given() {
        let ip: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(address_from_object_name("2001-db8--1"), Some(ip));
        assert_eq!(
            address_from_object_name("2001-0db8-0000-0000-0000-0000-0000-0001"),
            None
        );
        assert_eq!(address_from_object_name("--1"), None);
        assert_eq!(address_from_object_name("web"), None);
    }
}
