//! Where the loxilbs of the fleet come from (docs/fleet.md): `--loxilb-url`, the ready
//! addresses of the loxilb Service's EndpointSlices ([`Discovery`], without `--loxilb-url`),
//! and kube-loxilb's `LoxiURL` resources. What each source names is decided here once, for the
//! controller, which follows the sources (`fleet::discovery`, `fleet::loxiurl`), and for
//! `loxi-ccm check` and `loxi-ccm audit`, which read them once ([`loxilbs`]): all three see
//! the same fleet.
//!
//! The `LoxiURL` CRD (`loxiurl.loxilb.io/v1`, cluster-scoped) is kube-loxilb's: same group,
//! kind, scope, version and field names, and like kube-loxilb's its spec keeps fields it does
//! not name, so kube-loxilb's manifests apply unchanged (types loxi-ccm does not take, such as
//! `hostcidr`, are stored and refused by the controller with an Event). loxi-ccm ships it as
//! an optional manifest ([`rendered`]: `deploy/optional/loxiurl-crd.yaml`, the chart's
//! `loxiurlCrd.enabled`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Config, ConfiguredLoxilb, Discovery};

/// The label the EndpointSlice controller puts on a Service's slices.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// kube-loxilb's `LoxiURL` spec: loxilb API URLs (type default) or an address pool (type
/// `cidrpool`). Fields it does not name are kept, as kube-loxilb's CRD keeps them.
// kube's printcolumn(...) syntax repeats `type_ = "string"`, which clippy's
// duplicated_attributes lint misreads (as on AddressPool).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "loxiurl.loxilb.io",
    version = "v1",
    kind = "LoxiURL",
    plural = "loxiurls",
    category = "loxilb",
    doc = "loxilb API URLs joining the fleet (type default), or an address pool (type cidrpool): kube-loxilb's LoxiURL, followed by loxi-ccm.",
    printcolumn(name = "URL", type_ = "string", json_path = ".spec.loxiURL"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".spec.zone"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(transform = keep_unknown_fields)]
pub struct LoxiURLSpec {
    /// Type default (or none): loxilb API URLs, comma-separated (http://10.0.0.5:11111). Type
    /// cidrpool: the pool's blocks, comma-separated CIDRs or a-b ranges, either family.
    #[serde(rename = "loxiURL")]
    pub loxi_url: String,
    /// `default` (or absent): loxilb URLs; `cidrpool`: an address pool named after the
    /// resource, for the Services naming it in loxilb.io/poolSelect. Other types are refused.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// kube-loxilb's zone of the URLs: the group of loxilbs they join (absent: the default
    /// group, --zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

impl LoxiURLSpec {
    /// A resource naming `loxi_url`, of `type` `kind` (`None`: default), in the default zone.
    pub fn of(loxi_url: &str, kind: Option<&str>) -> LoxiURLSpec {
        LoxiURLSpec {
            loxi_url: loxi_url.into(),
            kind: kind.map(str::to_string),
            zone: None,
        }
    }
}

/// kube-loxilb's schema keeps the spec's unknown fields; so does ours, so that no object it
/// stored loses a field when this CRD replaces it.
fn keep_unknown_fields(schema: &mut schemars::Schema) {
    schema.insert(
        "x-kubernetes-preserve-unknown-fields".into(),
        serde_json::Value::Bool(true),
    );
}

/// `(file name, YAML)`: the `LoxiURL` CRD, `charts/loxi-ccm/files/loxiurl-crd.yaml`, which the
/// chart renders with `loxiurlCrd.enabled` and `deploy/optional/` holds. Marked for Helm to
/// keep (`helm.sh/resource-policy: keep`): neither an upgrade without the value nor an
/// uninstall deletes it, and with it every resource (docs/fleet.md#loxiurl-resources).
pub fn rendered() -> Vec<(&'static str, String)> {
    let header = "# Generated from the Rust types by loxi-ccm (crates/loxi-ccm/src/config/sources.rs).\n# Do not edit: change the code and run `UPDATE_CRDS=1 cargo test -p loxi-ccm --test crds`.\n# kube-loxilb's LoxiURL resources (loxilb URLs and cidrpool pools): docs/fleet.md#loxiurl-resources.\n";
    let mut crd = LoxiURL::crd();
    crate::k8s::served::kept_by_helm(&mut crd.metadata);
    vec![(
        "loxiurl-crd.yaml",
        format!(
            "{header}{}",
            serde_saphyr::to_string(&crd).unwrap_or_default()
        ),
    )]
}

/// The group a `LoxiURL` resource's loxilbs join: its `zone`, else `default`.
pub fn group_of(spec: &LoxiURLSpec, default: &str) -> Result<String, String> {
    match spec
        .zone
        .as_deref()
        .map(str::trim)
        .filter(|z| !z.is_empty())
    {
        None => Ok(default.to_string()),
        Some(zone) if loxi_domain::placement::is_group_name(zone) => Ok(zone.to_string()),
        Some(zone) => Err(format!(
            "zone {zone:?} is not a group name: lower-case letters, digits and '-', at most 50 characters"
        )),
    }
}

/// The URLs of a `LoxiURL` resource of type default, or why it gives none.
pub fn urls_of(spec: &LoxiURLSpec) -> Result<Vec<String>, String> {
    match spec.kind.as_deref().map(str::trim).unwrap_or("") {
        "" | "default" => {}
        "cidrpool" => return Err("type cidrpool names address pools, not loxilbs".into()),
        other => {
            return Err(format!(
                "unknown type {other:?}: expected default or cidrpool"
            ));
        }
    }
    let mut urls = Vec::new();
    for url in spec
        .loxi_url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
    {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "loxiURL {url:?} is not a loxilb API URL (http://... or https://...)"
            ));
        }
        urls.push(url.trim_end_matches('/').to_string());
    }
    if urls.is_empty() {
        return Err("loxiURL names no URL".into());
    }
    Ok(urls)
}

/// The API port of a slice's loxilbs: the slice's port numbered `default` when it lists one,
/// else its only port, else `default`.
fn api_port(slice: &EndpointSlice, default: u16) -> u16 {
    let ports: Vec<u16> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| p.port.and_then(|n| u16::try_from(n).ok()))
        .collect();
    match ports.as_slice() {
        [only] if !ports.contains(&default) => *only,
        _ => default,
    }
}

/// One ready loxilb of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    pub address: IpAddr,
    /// Its API port.
    pub port: u16,
    /// The topology zone the EndpointSlice gives it (its Node's), if any.
    pub zone: Option<String>,
}

/// The ready loxilbs of `slices` (an endpoint without a `ready` condition counts as ready,
/// as Kubernetes defines it), sorted, without duplicates.
pub fn ready_loxilbs<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    default_port: u16,
) -> Vec<Found> {
    let mut out = BTreeSet::new();
    for slice in slices {
        let port = api_port(slice, default_port);
        for ep in slice.endpoints.iter().flatten() {
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if !ready {
                continue;
            }
            out.extend(
                ep.addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .map(|address| Found {
                        address,
                        port,
                        zone: ep.zone.clone(),
                    }),
            );
        }
    }
    out.into_iter().collect()
}

/// The group of loxilbs named after topology zone `zone` (`--loxilb-discovery-zones`): the
/// zone lower-cased, other characters than letters, digits and `-` made `-`, at most 50
/// characters (`us-east-1a` stays, `Zone_A` becomes `zone-a`); `None` when nothing is left.
pub fn zone_group(zone: &str) -> Option<String> {
    let mapped: String = zone
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cut: String = mapped.trim_matches('-').chars().take(50).collect();
    let name = cut.trim_matches('-').to_string();
    loxi_domain::placement::is_group_name(&name).then_some(name)
}

impl Discovery {
    /// The EndpointSlices of the followed Service: in its namespace, or in every one.
    pub fn slices_api(&self, client: &kube::Client) -> Api<EndpointSlice> {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    /// The label selector of the followed Service's EndpointSlices.
    pub fn selector(&self) -> String {
        format!("{SERVICE_NAME_LABEL}={}", self.service)
    }

    /// The loxilbs `slices` list, as (URL, group): in `default_group` or, with
    /// `--loxilb-discovery-zones`, in the group of their topology zone.
    pub fn loxilbs<'a>(
        &self,
        slices: impl Iterator<Item = &'a EndpointSlice>,
        default_group: &str,
    ) -> Vec<(String, String)> {
        ready_loxilbs(slices, self.port)
            .into_iter()
            .map(|f| {
                let group = f
                    .zone
                    .as_deref()
                    .filter(|_| self.by_zone)
                    .and_then(zone_group)
                    .unwrap_or_else(|| default_group.to_string());
                (self.url(&f.address, f.port), group)
            })
            .collect()
    }
}

/// Every loxilb of the fleet as the controller would follow it now, each once (by URL, first
/// source wins): `--loxilb-url`, then the discovered ones, then those of `LoxiURL` resources
/// of type default (none without their CRD; resources being deleted and ones the controller
/// refuses are left out). Read once, for `check` and `audit`. `Err`: a source that exists
/// could not be read.
pub async fn loxilbs(client: &kube::Client, cfg: &Config) -> anyhow::Result<Vec<ConfiguredLoxilb>> {
    use anyhow::Context as _;
    let mut named: Vec<(String, String)> = Vec::new();
    if let Some(d) = &cfg.discovery {
        let slices = d
            .slices_api(client)
            .list(&ListParams::default().labels(&d.selector()))
            .await
            .with_context(|| format!("listing the EndpointSlices of Service {}", d.service))?
            .items;
        named.extend(d.loxilbs(slices.iter(), &cfg.zone));
    }
    let resources: Api<LoxiURL> = Api::all(client.clone());
    match resources.list(&ListParams::default()).await {
        Ok(list) => {
            for res in list
                .items
                .iter()
                .filter(|r| r.metadata.deletion_timestamp.is_none())
            {
                let (Ok(group), Ok(urls)) = (group_of(&res.spec, &cfg.zone), urls_of(&res.spec))
                else {
                    continue;
                };
                named.extend(urls.into_iter().map(|url| (url, group.clone())));
            }
        }
        // kube-loxilb's CRD is not installed: no such loxilbs.
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e).context("listing LoxiURL resources"),
    }
    let mut out = cfg.loxilb.clone();
    for (url, group) in named {
        if out.iter().any(|c| c.client.url == url) {
            continue;
        }
        let mut client = cfg.loxilb_template.clone();
        client.url = url;
        out.push(ConfiguredLoxilb { group, client });
    }
    Ok(out)
}

/// Warns, once at start-up, when `--loxilb-insecure-skip-tls-verify` leaves loxilbs'
/// certificates unchecked: the configured HTTPS URLs, and the loxilbs found in the cluster
/// when they are reached over HTTPS.
pub fn warn_insecure_tls(cfg: &Config) {
    if !cfg.loxilb_insecure_skip_tls_verify {
        return;
    }
    for c in cfg
        .loxilb
        .iter()
        .filter(|c| c.client.url.starts_with("https://"))
    {
        tracing::warn!(
            url = %c.client.url,
            "--loxilb-insecure-skip-tls-verify: loxilb's certificate is NOT checked; anybody \
             in the path can impersonate loxilb and read the token. Use --loxilb-ca-file"
        );
    }
    if cfg
        .discovery
        .iter()
        .chain(&cfg.peer_discovery)
        .any(|d| d.https)
    {
        tracing::warn!(
            "--loxilb-insecure-skip-tls-verify: the certificates of the loxilbs found in the \
             cluster are NOT checked; anybody in the path can impersonate loxilb and read the \
             token. Use --loxilb-ca-file"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    #[test]
    fn urls_and_refusals() {
        assert_eq!(
            urls_of(&LoxiURLSpec::of("http://a:11111, http://b:11111/", None)).unwrap(),
            ["http://a:11111", "http://b:11111"]
        );
        assert_eq!(
            urls_of(&LoxiURLSpec::of("http://a:11111", Some("default"))).unwrap(),
            ["http://a:11111"]
        );
        assert!(
            urls_of(&LoxiURLSpec::of("12.12.12.0/24", Some("cidrpool")))
                .unwrap_err()
                .contains("cidrpool")
        );
        assert!(
            urls_of(&LoxiURLSpec::of("10.0.0.1:11111", None))
                .unwrap_err()
                .contains("not a loxilb API URL")
        );
        assert!(
            urls_of(&LoxiURLSpec::of("x", Some("zone")))
                .unwrap_err()
                .contains("unknown type")
        );
    }

    #[test]
    fn the_zone_is_the_group() {
        let mut s = LoxiURLSpec::of("http://a:11111", None);
        assert_eq!(group_of(&s, "llb").unwrap(), "llb");
        s.zone = Some(" east ".into());
        assert_eq!(group_of(&s, "llb").unwrap(), "east");
        s.zone = Some("East_1".into());
        assert!(
            group_of(&s, "llb")
                .unwrap_err()
                .contains("not a group name")
        );
    }

    /// kube-loxilb's CRD keeps the spec's unknown fields and requires `loxiURL`; ours too,
    /// and Helm keeps it.
    #[test]
    fn the_crd_is_kube_loxilbs_and_kept_by_helm() {
        let crd = LoxiURL::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("loxiurls.loxiurl.loxilb.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap(),
        )
        .unwrap();
        let spec = &schema["properties"]["spec"];
        assert_eq!(spec["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(spec["required"], serde_json::json!(["loxiURL"]));
        let (_, yaml) = &rendered()[0];
        assert!(yaml.contains("helm.sh/resource-policy: keep"), "{yaml}");
    }

    fn ep(addr: &str, ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![addr.to_string()],
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_ready_addresses_count() {
        let a = EndpointSlice {
            endpoints: Some(vec![
                ep("10.0.0.2", Some(true)),
                ep("10.0.0.1", None),
                ep("10.0.0.3", Some(false)),
            ]),
            ..Default::default()
        };
        let b = EndpointSlice {
            endpoints: Some(vec![ep("10.0.0.2", Some(true)), ep("fd00::1", Some(true))]),
            ..Default::default()
        };
        let got: Vec<String> = ready_loxilbs([&a, &b].into_iter(), 11111)
            .iter()
            .map(|f| format!("{} {}", f.address, f.port))
            .collect();
        assert_eq!(got, ["10.0.0.1 11111", "10.0.0.2 11111", "fd00::1 11111"]);
    }

    #[test]
    fn topology_zones_name_groups() {
        assert_eq!(zone_group("us-east-1a").as_deref(), Some("us-east-1a"));
        assert_eq!(zone_group(" Zone_A ").as_deref(), Some("zone-a"));
        assert_eq!(zone_group("rack/7").as_deref(), Some("rack-7"));
        assert_eq!(zone_group("--").as_deref(), None);
        assert_eq!(zone_group("").as_deref(), None);
        assert_eq!(zone_group(&"z".repeat(80)).unwrap().len(), 50);
        let ep = Endpoint {
            zone: Some("rack1".into()),
            ..ep("10.0.0.1", Some(true))
        };
        let slice = EndpointSlice {
            endpoints: Some(vec![ep]),
            ..Default::default()
        };
        let found = ready_loxilbs([&slice].into_iter(), 11111);
        assert_eq!(found[0].zone.as_deref(), Some("rack1"));
        let mut d = Discovery {
            service: "loxilb-lb-service".into(),
            namespace: None,
            port: 11111,
            https: false,
            by_zone: false,
        };
        assert_eq!(
            d.loxilbs([&slice].into_iter(), "llb"),
            [("http://10.0.0.1:11111".to_string(), "llb".to_string())]
        );
        d.by_zone = true;
        assert_eq!(d.loxilbs([&slice].into_iter(), "llb")[0].1, "rack1");
    }

    #[test]
    fn the_api_port_comes_from_the_slice() {
        let with_ports = |ports: &[i32]| EndpointSlice {
            ports: Some(
                ports
                    .iter()
                    .map(|p| EndpointPort {
                        port: Some(*p),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        assert_eq!(api_port(&with_ports(&[]), 11111), 11111);
        assert_eq!(api_port(&with_ports(&[20000]), 11111), 20000);
        assert_eq!(api_port(&with_ports(&[179, 11111]), 11111), 11111);
        assert_eq!(api_port(&with_ports(&[179, 20000]), 11111), 11111);
    }
}
