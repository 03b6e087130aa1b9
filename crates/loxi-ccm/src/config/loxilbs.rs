//! The loxilb options validated: how every loxilb is called (`LoxilbApiArgs`: token, TLS,
//! timeouts, limits) and which loxilbs there are (`LoxilbArgs`: URLs with their groups, or the
//! Services they are discovered through).

use loxilb_client::{ClientConfig, ClientError, LoxilbClient, Token};

use crate::config::cli::{LoxilbApiArgs, LoxilbArgs};
use crate::config::origins::Origins;
use crate::config::{ConfigError, ConfiguredLoxilb, Discovery, TokenSource, is_dns_label, token};

/// The numbers of `LoxilbApiArgs` that must not be 0: the write window and the periods.
pub(super) fn check_loxilb_api_limits(
    args: &LoxilbApiArgs,
    origins: &Origins,
) -> Result<(), ConfigError> {
    if args.loxilb_write_window == 0 {
        return Err(origins.invalid_value("loxilb_write_window", "0", "must be at least 1"));
    }
    for (id, d) in [
        ("loxilb_timeout", args.loxilb_timeout),
        ("health_interval", args.health_interval),
        ("drift_interval", args.drift_interval),
        ("loxilb_gone_after", args.loxilb_gone_after),
    ] {
        if d.is_zero() {
            return Err(origins.invalid_value(id, &format!("{d:?}"), "must be longer than 0"));
        }
    }
    Ok(())
}

/// The CA bundle of `--loxilb-ca-file`, read and checked.
pub(super) fn ca_pem(
    args: &LoxilbApiArgs,
    origins: &Origins,
) -> Result<Option<Vec<u8>>, ConfigError> {
    let Some(path) = &args.loxilb_ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(path).map_err(|e| {
        origins.invalid(
            "loxilb_ca_file",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    crate::k8s::api::check_ca_bundle(&pem, path)
        .map_err(|message| origins.invalid("loxilb_ca_file", message))?;
    Ok(Some(pem))
}

/// The loxilb token (set now when it is fixed or read from a file) and where it comes from;
/// at most one of the three token options.
pub(super) fn token(
    args: &LoxilbApiArgs,
    origins: &Origins,
) -> Result<(Token, TokenSource), ConfigError> {
    let given: Vec<&str> = [
        ("loxilb_token", args.loxilb_token.is_some()),
        ("loxilb_token_file", args.loxilb_token_file.is_some()),
        ("loxilb_token_secret", args.loxilb_token_secret.is_some()),
    ]
    .into_iter()
    .filter_map(|(id, set)| set.then_some(id))
    .collect();
    if given.len() > 1 {
        let by: Vec<String> = given.iter().map(|id| origins.describe(id)).collect();
        return Err(ConfigError::Conflict(format!(
            "the loxilb token is given more than once, by {}: keep one",
            by.join(" and by ")
        )));
    }
    let token = Token::default();
    let source = if let Some(value) = &args.loxilb_token {
        let value = value.expose();
        if value.trim().is_empty() {
            return Err(origins.invalid("loxilb_token", "is empty"));
        }
        token.set(Some(value));
        TokenSource::Fixed
    } else if let Some(path) = &args.loxilb_token_file {
        let value =
            token::read_token_file(path).map_err(|m| origins.invalid("loxilb_token_file", m))?;
        token.set(Some(&value));
        TokenSource::File(path.clone())
    } else if let Some(text) = &args.loxilb_token_secret {
        let secret = token::SecretRef::parse(text)
            .map_err(|m| origins.invalid_value("loxilb_token_secret", text, m.as_str()))?;
        TokenSource::Secret(secret)
    } else {
        TokenSource::Fixed
    };
    Ok((token, source))
}

/// The client settings every loxilb shares (configured, discovered, `LoxiURL`): timeout,
/// token, TLS and this process's `identity`; the URL is each loxilb's own.
pub(super) fn client_template(
    args: &LoxilbApiArgs,
    token: &Token,
    ca_pem: Option<Vec<u8>>,
    identity: &str,
) -> ClientConfig {
    let mut template = ClientConfig::new("http://loxilb");
    template.timeout = args.loxilb_timeout;
    template.token = token.clone();
    template.ca_pem = ca_pem;
    template.insecure_skip_tls_verify = args.loxilb_insecure_skip_tls_verify;
    template.identity = Some(identity.to_string());
    template
}

/// The default group's name (`--zone`), trimmed.
pub(super) fn zone(args: &LoxilbArgs, origins: &Origins) -> Result<String, ConfigError> {
    let zone = args.zone.trim();
    if !loxi_domain::placement::is_group_name(zone) {
        return Err(origins.invalid_value(
            "zone",
            zone,
            "expected a group name: lower-case letters, digits and '-', at most 50 characters",
        ));
    }
    Ok(zone.to_string())
}

/// `east=http://a:11111` -> (`east`, `http://a:11111`); a plain URL belongs to `default`.
fn split_group<'a>(entry: &'a str, default: &'a str) -> (&'a str, &'a str) {
    match entry.split_once('=') {
        Some((group, url)) if !group.contains("://") && !group.contains('/') => {
            (group.trim(), url.trim())
        }
        _ => (default, entry),
    }
}

/// The loxilbs of `--loxilb-url`, each with its group (`zone` when it names none) and the
/// `template`'s client settings.
pub(super) fn configured_loxilbs(
    args: &LoxilbArgs,
    template: &ClientConfig,
    zone: &str,
    origins: &Origins,
) -> Result<Vec<ConfiguredLoxilb>, ConfigError> {
    let entries = args
        .loxilb_urls
        .iter()
        .map(|u| u.trim())
        .filter(|u| !u.is_empty());
    let mut loxilbs = Vec::new();
    for entry in entries {
        let (group, url) = split_group(entry, zone);
        if !loxi_domain::placement::is_group_name(group) {
            return Err(origins.invalid_value(
                "loxilb_urls",
                entry,
                "the group before '=' must be lower-case letters, digits and '-', at most 50 characters",
            ));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(origins.invalid_value(
                "loxilb_urls",
                url,
                "a loxilb URL must start with http:// or https://",
            ));
        }
        let mut client = template.clone();
        client.url = url.to_string();
        // Building the client checks the URL (host present) and the CA bundle.
        match LoxilbClient::new(client.clone()) {
            Ok(_) => {}
            Err(ClientError::Config(msg)) if msg.contains("CA bundle") => {
                return Err(origins.invalid("loxilb_ca_file", msg));
            }
            Err(e) => return Err(origins.invalid_value("loxilb_urls", url, &e.to_string())),
        }
        loxilbs.push(ConfiguredLoxilb {
            group: group.to_string(),
            client,
        });
    }
    Ok(loxilbs)
}

/// Which Service's EndpointSlices list loxilbs (docs/fleet.md#discovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Followed {
    /// `--loxilb-service`: the rule-holding loxilbs.
    Loxilbs,
    /// `--loxilb-peer-service`: the BGP-peer-only ones.
    BgpPeers,
}

/// The Service (and namespace) whose EndpointSlices list the `which` loxilbs.
pub(super) fn discovery(
    args: &LoxilbArgs,
    which: Followed,
    origins: &Origins,
) -> Result<Discovery, ConfigError> {
    let (service_id, service, namespace_id, namespace) = match which {
        Followed::Loxilbs => (
            "loxilb_service",
            &args.loxilb_service,
            "loxilb_service_namespace",
            args.loxilb_service_namespace.as_deref(),
        ),
        Followed::BgpPeers => (
            "loxilb_peer_service",
            &args.loxilb_peer_service,
            "loxilb_peer_service_namespace",
            args.loxilb_peer_service_namespace.as_deref(),
        ),
    };
    let service = service.trim();
    if !loxi_domain::address_name::is_object_name(service) {
        return Err(origins.invalid_value(service_id, service, "expected the name of a Service"));
    }
    let namespace = namespace.map(str::trim).filter(|n| !n.is_empty());
    if let Some(ns) = namespace
        && !is_dns_label(ns)
    {
        return Err(origins.invalid_value(namespace_id, ns, "expected a namespace name"));
    }
    if args.loxilb_port == 0 {
        return Err(origins.invalid_value("loxilb_port", "0", "expected a port, 1-65535"));
    }
    Ok(Discovery {
        service: service.to_string(),
        namespace: namespace.map(str::to_string),
        port: args.loxilb_port,
        https: args.loxilb_discovery_scheme == "https",
        by_zone: args.loxilb_discovery_zones,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::run_args;

    #[test]
    fn limits_refuse_zero() {
        let origins = Origins::default();
        assert!(check_loxilb_api_limits(&run_args(&[]).loxilb_api, &origins).is_ok());
        for flag in [
            "--loxilb-write-window=0",
            "--health-interval=0s",
            "--loxilb-timeout=0s",
        ] {
            let args = run_args(&[flag]);
            let e = check_loxilb_api_limits(&args.loxilb_api, &origins)
                .unwrap_err()
                .to_string();
            let long = flag.split('=').next().unwrap();
            assert!(
                e.starts_with(&format!("{long}: invalid value")),
                "{flag}: {e}"
            );
        }
    }

    #[test]
    fn one_token_option_at_most() {
        let origins = Origins::default();
        let (value, source) = token(&run_args(&["--loxilb-token=t"]).loxilb_api, &origins).unwrap();
        assert_eq!(value.get().as_deref(), Some("t"));
        assert_eq!(source, TokenSource::Fixed);
        let args = run_args(&["--loxilb-token-secret=ns/name"]);
        let (_, source) = token(&args.loxilb_api, &origins).unwrap();
        assert!(matches!(source, TokenSource::Secret(s) if s.name == "name"));
        let two = run_args(&["--loxilb-token=t", "--loxilb-token-secret=ns/name"]);
        let e = token(&two.loxilb_api, &origins).unwrap_err().to_string();
        assert!(
            e.contains("more than once") && e.contains("--loxilb-token-secret"),
            "{e}"
        );
        let empty = run_args(&["--loxilb-token= "]);
        assert!(
            token(&empty.loxilb_api, &origins)
                .unwrap_err()
                .to_string()
                .contains("is empty")
        );
    }

    #[test]
    fn urls_take_their_group_or_the_zone_and_the_template() {
        let origins = Origins::default();
        let args = run_args(&[
            "--loxilb-url=http://a:11111,east=https://b:8091",
            "--loxilb-timeout=2s",
        ]);
        let zone = zone(&args.loxilbs, &origins).unwrap();
        let template = client_template(&args.loxilb_api, &Token::default(), None, "me");
        let loxilbs = configured_loxilbs(&args.loxilbs, &template, &zone, &origins).unwrap();
        let seen: Vec<(&str, &str)> = loxilbs
            .iter()
            .map(|l| (l.group.as_str(), l.client.url.as_str()))
            .collect();
        assert_eq!(
            seen,
            [("llb", "http://a:11111"), ("east", "https://b:8091")]
        );
        assert!(loxilbs.iter().all(|l| l.client.timeout.as_secs() == 2));
        assert!(
            loxilbs
                .iter()
                .all(|l| l.client.identity.as_deref() == Some("me"))
        );
        for bad in ["--loxilb-url=ftp://a", "--loxilb-url=East=http://a:1"] {
            let args = run_args(&[bad]);
            let e = configured_loxilbs(&args.loxilbs, &template, &zone, &origins).unwrap_err();
            assert!(
                e.to_string().starts_with("--loxilb-url: invalid value"),
                "{bad}: {e}"
            );
        }
        let bad_zone = run_args(&["--zone=Not A Group"]);
        assert!(super::zone(&bad_zone.loxilbs, &origins).is_err());
    }

    #[test]
    fn discovery_of_loxilbs_and_of_bgp_peers() {
        let origins = Origins::default();
        let args = run_args(&[
            "--loxilb-service-namespace=kube-system",
            "--loxilb-discovery-scheme=https",
            "--loxilb-port=8091",
        ]);
        let d = discovery(&args.loxilbs, Followed::Loxilbs, &origins).unwrap();
        assert_eq!(d.service, "loxilb-lb-service");
        assert_eq!(d.namespace.as_deref(), Some("kube-system"));
        assert_eq!(
            d.url(&"192.0.2.1".parse().unwrap(), d.port),
            "https://192.0.2.1:8091"
        );
        let peers = discovery(&args.loxilbs, Followed::BgpPeers, &origins).unwrap();
        assert_eq!(
            (peers.service.as_str(), peers.namespace),
            ("loxilb-peer-service", None)
        );
        let bad = run_args(&["--loxilb-peer-service-namespace=Bad_NS"]);
        let e = discovery(&bad.loxilbs, Followed::BgpPeers, &origins)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--loxilb-peer-service-namespace: "), "{e}");
    }
}
