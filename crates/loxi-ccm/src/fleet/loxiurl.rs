//! kube-loxilb's `LoxiURL` resources (`loxiurl.loxilb.io/v1`, cluster-scoped), accepted as
//! they are (docs/fleet.md#loxiurl-resources): one of `type` default (or none) names loxilb
//! API URLs, comma-separated in `spec.loxiURL`, which join the fleet next to `--loxilb-url`
//! and the discovered loxilbs, and leave it when the resource goes. One of `type: cidrpool`
//! is an address pool named after the resource, its CIDRs in `spec.loxiURL`, handed to the
//! pool set (`crate::ipam::address_pools::cidrpool_spec`) like an `AddressPool`, and taken
//! out of it when the resource goes (addresses already given stay). A resource that gives
//! nothing (a URL that is not one, a bad CIDR, a pool name already taken, another type) gets
//! a Warning Event saying why. Without the CRD (kube-loxilb's, or ours:
//! `deploy/optional/loxiurl-crd.yaml`) the watch waits for it.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{Fleet, Source};
pub use crate::config::sources::{LoxiURL, LoxiURLSpec, group_of, urls_of};
use crate::ipam::Ipam;
use crate::ipam::address_pools::cidrpool_spec;
use crate::k8s::events::EventRecorder;
use crate::loxilb::Member;
use loxi_domain::pools::PoolSpec;

/// What one resource gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Given {
    /// `type` default: loxilb API URLs.
    Urls(Vec<String>),
    /// `type: cidrpool`: an address pool named after the resource.
    Pool(PoolSpec),
}

/// What the resource `name` gives, or why it gives nothing.
pub fn given(name: &str, spec: &LoxiURLSpec) -> Result<Given, String> {
    if spec.kind.as_deref().map(str::trim) == Some("cidrpool") {
        let pool = cidrpool_spec(name, &spec.loxi_url);
        return match loxi_domain::pools::validate_pool(&pool) {
            Ok(_) => Ok(Given::Pool(pool)),
            Err(problems) => Err(format!(
                "type cidrpool: loxiURL {:?} is not a pool of CIDRs: {}",
                spec.loxi_url,
                problems.join("; ")
            )),
        };
    }
    urls_of(spec).map(Given::Urls)
}

/// Follows the `LoxiURL` resources and keeps their URLs in the fleet (each in its group, the
/// default one being `zone`) and their pools in `ipam`'s pool set. Without kube-loxilb's CRD
/// it waits for it (`crate::k8s::served`): a CRD installed while the controller runs is
/// followed from then on.
pub async fn follow(
    fleet: Fleet,
    kube: kube::Client,
    ipam: Arc<Ipam>,
    recorder: EventRecorder,
    zone: String,
) {
    let api: Api<LoxiURL> = Api::all(kube);
    crate::k8s::served::until_served(
        &api,
        "LoxiURL",
        "install it with kubectl apply -f deploy/optional/loxiurl-crd.yaml (Helm: loxiurlCrd.enabled=true)",
    )
    .await;
    let (store, writer) = reflector::store::<LoxiURL>();
    let events = reflector(writer, watcher(api, watcher::Config::default()))
        .backoff(crate::k8s::served::backoff());
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
        let mut pools = Vec::new();
        let mut now_refused = std::collections::BTreeMap::new();
        for res in store.state() {
            let name = res.name_any();
            let found = given(&name, &res.spec).and_then(|g| match g {
                Given::Urls(u) => Ok((Some(group_of(&res.spec, &zone)?), u, None)),
                Given::Pool(p) => match ipam.pools().name_taken(&p.name, &ipam.settings().pools) {
                    Some(why) => Err(format!("type cidrpool: {why}: rename one of them")),
                    None => Ok((None, Vec::new(), Some(p))),
                },
            });
            match found {
                Ok((group, u, pool)) => {
                    let group = group.unwrap_or_default();
                    members.extend(u.iter().map(|url| Member::new(&group, url)));
                    pools.extend(pool);
                }
                Err(why) => {
                    let name = res.name_any();
                    if refused.get(&name) != Some(&why) {
                        warn!(loxiurl = %name, "{why}");
                        recorder.publish(
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
        fleet.set_source(Source::LoxiURL, members);
        ipam.pools().set_cidrpools(pools);
        // As for an AddressPool edit (crates/loxi-ccm/src/runtime/watches.rs): waiting
        // Services try again, and with BGP on a pool's advertisement decides the rules' flag.
        if ipam.refresh_pools() && fleet.inner.settings.bgp.is_some() {
            fleet.replan();
        }
        ipam.pools().changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_loxiurl_gives_urls() {
        assert_eq!(
            given("x", &LoxiURLSpec::of("http://a:11111", None)).unwrap(),
            Given::Urls(vec!["http://a:11111".into()])
        );
        assert!(
            given("x", &LoxiURLSpec::of("x", Some("zone")))
                .unwrap_err()
                .contains("unknown type")
        );
    }

    #[test]
    fn a_cidrpool_is_a_pool_named_after_the_resource() {
        let Given::Pool(pool) = given(
            "pool1",
            &LoxiURLSpec::of("12.12.12.0/24, 2001:db8::/120", Some("cidrpool")),
        )
        .unwrap() else {
            panic!("not a pool");
        };
        assert_eq!(pool.name, "pool1");
        assert_eq!(pool.addresses, ["12.12.12.0/24", "2001:db8::/120"]);
        assert!(
            !pool.auto_assign,
            "only for Services naming it, as kube-loxilb"
        );
        let bad = given("pool2", &LoxiURLSpec::of("12.12.12.0/33", Some("cidrpool"))).unwrap_err();
        assert!(bad.contains("not a pool of CIDRs"), "{bad}");
        let none = given("pool3", &LoxiURLSpec::of(" , ", Some("cidrpool"))).unwrap_err();
        assert!(none.contains("at least one"), "{none}");
    }
}
