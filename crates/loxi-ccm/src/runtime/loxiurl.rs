//! kube-loxilb's `LoxiURL` resources (`loxiurl.loxilb.io/v1`, cluster-scoped), accepted as
//! they are (docs/fleet.md#loxiurl-resources): one of `type` default (or none) names loxilb
//! API URLs, comma-separated in `spec.loxiURL`, which join the fleet next to `--loxilb-url`
//! and the discovered loxilbs, and leave it when the resource goes. `type: cidrpool` (an
//! address pool) is not taken yet: such a resource gets a Warning Event saying so, and so
//! does a URL that is not one. Without kube-loxilb's CRD nothing is watched.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{CustomResource, Resource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::Shared;
use super::discovery::Source;
use crate::loxilb::Member;

/// kube-loxilb's `LoxiURL` spec. Its CRD keeps unknown fields, so nothing else is read.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "loxiurl.loxilb.io",
    version = "v1",
    kind = "LoxiURL",
    plural = "loxiurls",
    doc = "kube-loxilb's LoxiURL: loxilb API URLs (type default) or an address pool (type cidrpool)."
)]
pub struct LoxiURLSpec {
    /// Comma-separated loxilb API URLs (type default), or a CIDR (type cidrpool).
    #[serde(rename = "loxiURL")]
    pub loxi_url: String,
    /// `default` (or absent): URLs; `cidrpool`: an address pool named after the resource.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// kube-loxilb's zone of the URLs: the group of loxilbs they join (absent: the default
    /// group, `--zone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The group the resource's loxilbs join: its `zone`, else `default`.
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

/// What one resource gives: URLs, or why it gives nothing.
pub fn urls_of(spec: &LoxiURLSpec) -> Result<Vec<String>, String> {
    match spec.kind.as_deref().map(str::trim).unwrap_or("") {
        "" | "default" => {}
        "cidrpool" => {
            return Err(
                "type cidrpool is not supported by loxi-ccm yet: use an AddressPool resource"
                    .into(),
            );
        }
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

/// Follows the `LoxiURL` resources and keeps their URLs in the fleet.
pub async fn follow(shared: Arc<Shared>) {
    let ctx = &shared.service;
    let api: Api<LoxiURL> = Api::all(ctx.kube.clone());
    if let Err(e) = api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        info!(error = %e, "LoxiURL resources not served (kube-loxilb's CRD absent): not followed");
        return;
    }
    let (store, writer) = reflector::store::<LoxiURL>();
    let events = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    futures::pin_mut!(events);
    let mut refused: std::collections::BTreeMap<String, String> = Default::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_) | watcher::Event::Init) => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "watching LoxiURL resources");
                continue;
            }
        }
        let mut members = Vec::new();
        let mut now_refused = std::collections::BTreeMap::new();
        for res in store.state() {
            let found =
                urls_of(&res.spec).and_then(|u| Ok((group_of(&res.spec, &ctx.settings.zone)?, u)));
            match found {
                Ok((group, u)) => members.extend(u.iter().map(|url| Member::new(&group, url))),
                Err(why) => {
                    let name = res.name_any();
                    if refused.get(&name) != Some(&why) {
                        warn!(loxiurl = %name, "{why}");
                        ctx.report.recorder.publish(
                            Event {
                                type_: EventType::Warning,
                                reason: "InvalidLoxiURL".into(),
                                note: Some(crate::k8s::events::note_text(&why)),
                                action: "Validate".into(),
                                secondary: None,
                            },
                            res.object_ref(&()),
                        );
                    }
                    now_refused.insert(name, why);
                }
            }
        }
        refused = now_refused;
        shared
            .members
            .set_grouped(&shared, Source::Resources, members);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str, kind: Option<&str>) -> LoxiURLSpec {
        LoxiURLSpec {
            loxi_url: url.into(),
            kind: kind.map(str::to_string),
            zone: None,
        }
    }

    #[test]
    fn urls_and_refusals() {
        assert_eq!(
            urls_of(&spec("http://a:11111, http://b:11111/", None)).unwrap(),
            ["http://a:11111", "http://b:11111"]
        );
        assert_eq!(
            urls_of(&spec("http://a:11111", Some("default"))).unwrap(),
            ["http://a:11111"]
        );
        assert!(
            urls_of(&spec("12.12.12.0/24", Some("cidrpool")))
                .unwrap_err()
                .contains("cidrpool")
        );
        assert!(
            urls_of(&spec("10.0.0.1:11111", None))
                .unwrap_err()
                .contains("not a loxilb API URL")
        );
        assert!(
            urls_of(&spec("x", Some("zone")))
                .unwrap_err()
                .contains("unknown type")
        );
    }

    #[test]
    fn the_zone_is_the_group() {
        let mut s = spec("http://a:11111", None);
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
}
