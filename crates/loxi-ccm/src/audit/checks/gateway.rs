//! Gateways (`--gatewayAPI`, docs/gateway-api.md) checked like Services: each Gateway of
//! ours has its AddressClaim, and its listeners' rules are on every listed loxilb of the
//! group with the endpoints its routes' backends have now (the controller's own decision,
//! `crate::gateway::plan`); no rule under the Gateways' owner id whose Gateway is gone, and
//! no Gateway claim whose Gateway is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use loxi_domain::{Action, Rule, RuleKey, RuleName, diff_rules};

use super::{Findings, Kind, Snapshot, View, claim_name, differences, rule_name};
use crate::gateway::plan::{self, Inputs};
use crate::gateway::rules::RuleStyle;
use crate::gateway::types::{Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TCPRoute, UDPRoute};

/// The Gateway API objects, read when `--gatewayAPI` is on and its CRDs are served.
#[derive(Debug, Clone, Default)]
pub struct GatewaySnapshot {
    /// The GatewayClass `controllerName` served (`--loxilbGatewayClass`).
    pub controller_name: String,
    pub classes: Vec<GatewayClass>,
    pub gateways: Vec<Gateway>,
    pub tcp_routes: Vec<TCPRoute>,
    pub udp_routes: Vec<UDPRoute>,
    pub http_routes: Vec<HTTPRoute>,
    pub grants: Vec<ReferenceGrant>,
    /// Every Service and EndpointSlice of the cluster (backends may be in any namespace).
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Namespace labels, for `allowedRoutes.namespaces.from: Selector`.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
}

fn gw_name(ns: &str, name: &str) -> String {
    format!("Gateway {ns}/{name}")
}

/// Runs the Gateway checks (none without the snapshot: `--gatewayAPI` off).
pub fn check(s: &Snapshot, v: &View<'_>, f: &mut Findings) {
    let Some(g) = &s.gateways else { return };
    let owner = crate::gateway::rule_owner(&s.cluster);
    let ours: BTreeSet<String> = g
        .classes
        .iter()
        .filter(|c| c.spec.controller_name == g.controller_name)
        .map(|c| c.name_any())
        .collect();
    let live: Vec<&Gateway> = g
        .gateways
        .iter()
        .filter(|gw| ours.contains(&gw.spec.gateway_class_name))
        .filter(|gw| gw.metadata.deletion_timestamp.is_none())
        .collect();
    let is_live = |ns: &str, name: &str, uid: Option<&str>| {
        live.iter().any(|gw| {
            gw.namespace().as_deref() == Some(ns)
                && gw.name_any() == name
                && uid.is_none_or(|u| gw.uid().as_deref() == Some(u))
        })
    };
    // Claims whose Gateway is gone.
    for c in &v.claims {
        for o in c.owners().into_iter().filter(|o| o.is_gateway()) {
            if !o.uid.is_empty() && !is_live(&o.namespace, &o.name, Some(&o.uid)) {
                f.violation(
                    Kind::OwnerlessClaim,
                    format!(
                        "claim for {} lists the Gateway {} (uid {}), which is gone",
                        c.spec.address,
                        o.key(),
                        o.uid
                    ),
                    vec![claim_name(c), gw_name(&o.namespace, &o.name)],
                );
            }
        }
    }
    // Rules under the Gateways' owner id whose Gateway is gone.
    for inst in &s.instances {
        let Ok(rules) = &inst.rules else { continue };
        for r in rules {
            let Some(n) = RuleName::parse(&r.name).filter(|n| n.cluster == owner.as_str()) else {
                continue;
            };
            if !is_live(&n.namespace, &n.service, None) {
                f.violation(
                    Kind::OwnedOrphan,
                    format!(
                        "Gateway rule for {} on {}: its Gateway is gone",
                        r.key, inst.url
                    ),
                    vec![rule_name(r, &inst.url), gw_name(&n.namespace, &n.service)],
                );
            }
        }
    }
    let routes = plan::routes(&g.tcp_routes, &g.udp_routes, &g.http_routes);
    let grants = plan::grants(&g.grants);
    let services = plan::backend_services(&routes, |ns, name| {
        g.services
            .iter()
            .find(|s| s.namespace().as_deref() == Some(ns) && s.name_any() == name)
            .cloned()
    });
    let labels = |ns: &str| g.namespace_labels.get(ns).cloned().unwrap_or_default();
    let inputs = Inputs {
        routes: &routes,
        grants: &grants,
        services: &services,
        namespace_labels: &labels,
    };
    let slices: Vec<&EndpointSlice> = g.endpoint_slices.iter().collect();
    let style = RuleStyle {
        mode: s.settings.defaults.mode,
        advertise: s.settings.advertise,
    };
    for gw in live {
        let ns = gw.namespace().unwrap_or_default();
        let name = gw.name_any();
        let uid = gw.uid().unwrap_or_default();
        let addresses: Vec<IpAddr> = v
            .claims
            .iter()
            .filter(|c| {
                c.owners()
                    .iter()
                    .any(|o| o.is_gateway() && o.is(&ns, &name) && o.uid == uid)
            })
            .filter_map(|c| c.ip())
            .collect();
        let shown: Vec<String> = gw
            .status
            .as_ref()
            .map(|st| st.addresses.iter().map(|a| a.value.clone()).collect())
            .unwrap_or_default();
        if addresses.is_empty() {
            if shown.is_empty() {
                f.notes.push(format!(
                    "{} not checked against loxilb: it has no address yet",
                    gw_name(&ns, &name)
                ));
            } else {
                f.violation(
                    Kind::UnbackedStatus,
                    format!(
                        "{ns}/{name} shows {} in its status, and no claim backs it for the Gateway",
                        shown.join(", ")
                    ),
                    vec![gw_name(&ns, &name)],
                );
            }
            continue;
        }
        let want = plan::desired_rules(&owner, gw, &addresses, &inputs, &slices, style);
        for inst in &s.instances {
            if inst.group != s.settings.zone {
                continue;
            }
            let Ok(rules) = &inst.rules else { continue };
            check_instance(&owner, (&ns, &name), &want, rules, &inst.url, f);
        }
    }
}

/// The Gateway `ns/name`'s rules on one loxilb against `want`.
fn check_instance(
    owner: &loxi_domain::ClusterId,
    (ns, name): (&str, &str),
    want: &[Rule],
    rules: &[Rule],
    url: &str,
    f: &mut Findings,
) {
    let owned = |r: &Rule| RuleName::is_owned_by(&r.name, owner);
    for action in diff_rules(want, rules, owned) {
        let (detail, objects) = match action {
            Action::Create(w) => (
                format!("Gateway {ns}/{name} has no rule for {} on {url}", w.key),
                vec![gw_name(ns, name), format!("loxilb {url}")],
            ),
            Action::Update(w) | Action::Recreate(w) => {
                let Some(have) = rules.iter().find(|r| r.key == w.key) else {
                    continue;
                };
                (
                    format!(
                        "Gateway {ns}/{name}'s rule for {} on {url} is wrong: {}",
                        w.key,
                        differences(have, &w)
                    ),
                    vec![gw_name(ns, name), rule_name(have, url)],
                )
            }
            Action::Conflict {
                wanted,
                foreign_name,
            } => (
                format!(
                    "Gateway {ns}/{name} wants {} on {url}, held by a foreign rule {foreign_name:?}",
                    wanted.key
                ),
                vec![gw_name(ns, name), format!("loxilb {url}")],
            ),
            Action::Delete(_) => continue,
        };
        f.violation(Kind::Rules, detail, objects);
    }
    let wanted: BTreeSet<RuleKey> = want.iter().map(|r| r.key).collect();
    for r in rules {
        let Some(n) = RuleName::parse(&r.name).filter(|n| n.cluster == owner.as_str()) else {
            continue;
        };
        if n.namespace == ns && n.service == name && !wanted.contains(&r.key) {
            f.violation(
                Kind::Rules,
                format!(
                    "Gateway {ns}/{name} holds a rule it should not have: {} on {url}",
                    r.key
                ),
                vec![gw_name(ns, name), rule_name(r, url)],
            );
        }
    }
}
