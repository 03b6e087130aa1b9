//! Where a Service goes among the groups of loxilbs: what the fleet's placement book
//! (crates/loxi-ccm/src/fleet/placement.rs, docs/fleet.md#groups-and-placement) needs to
//! know of a Service (its recorded group, the rules it needs, the Services of the store
//! placed already), and its waiting Services re-queued when one leaves.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use loxi_domain::placement::PlacementError;

use super::context::{Context, recorded_group};
use crate::fleet::placement::{Entry, GroupNow, Placed, Request};

/// The group of `svc`. `already_ours`: it carries our finalizer, so it was served before;
/// without a recorded group its rules are on the default group, where it stays.
pub async fn place(
    svc: &Service,
    ctx: &Context,
    already_ours: bool,
) -> Result<Placed, PlacementError> {
    let request = Request {
        key: ObjectRef::from_obj(svc),
        uid: svc.uid().unwrap_or_default(),
        recorded: recorded_group(svc).map(str::to_string),
        already_ours,
        rules: rules_needed(svc),
    };
    let groups = GroupNow::of(&ctx.fleet.groups());
    ctx.placement.place(request, &groups, || placed(ctx)).await
}

/// The Services of the store placed on a group: with a recorded group, or served before
/// groups existed (the default group).
fn placed(ctx: &Context) -> Vec<Entry<ObjectRef<Service>>> {
    ctx.inputs
        .services
        .state()
        .into_iter()
        .filter(|svc| ctx.selection.serves(svc) && svc.metadata.deletion_timestamp.is_none())
        .filter_map(|svc| {
            let group = match recorded_group(&svc) {
                Some(g) => g.to_string(),
                None if !ctx.selection.our_finalizers(&svc).is_empty() => ctx.settings.zone.clone(),
                None => return None,
            };
            Some(Entry {
                key: ObjectRef::from_obj(&*svc),
                uid: svc.uid().unwrap_or_default(),
                group,
                rules: rules_needed(&svc),
            })
        })
        .collect()
}

/// `svc` left (deleted, or no longer ours): its rules no longer count, and the Services
/// waiting for room are re-queued, since room may have freed.
pub async fn service_left(svc: &Service, ctx: &Context) {
    for key in ctx.placement.left(&ObjectRef::from_obj(svc)).await {
        let _ = ctx.requeue.send(key);
    }
}

/// The rules a Service needs on its group's loxilbs: one per port (TCP, UDP, SCTP) and
/// address family it asks for. Counted from the spec, before it has an address.
pub fn rules_needed(svc: &Service) -> usize {
    let ports = crate::ipam::service_ports(svc).len().max(1);
    let spec = svc.spec.as_ref();
    let dual = spec
        .and_then(|s| s.ip_family_policy.as_deref())
        .is_some_and(|p| p == "RequireDualStack" || p == "PreferDualStack")
        && spec
            .and_then(|s| s.ip_families.as_ref())
            .is_some_and(|f| f.len() > 1);
    ports * if dual { 2 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(ports: &[(i32, &str)], policy: Option<&str>, families: &[&str]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, proto)| ServicePort {
                            port: *p,
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ip_family_policy: policy.map(str::to_string),
                ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn one_rule_per_port_and_family() {
        assert_eq!(
            rules_needed(&svc(&[(80, "TCP"), (443, "TCP")], None, &["IPv4"])),
            2
        );
        assert_eq!(
            rules_needed(&svc(
                &[(80, "TCP"), (53, "UDP")],
                Some("RequireDualStack"),
                &["IPv4", "IPv6"]
            )),
            4
        );
        assert_eq!(
            rules_needed(&svc(&[(80, "TCP")], Some("SingleStack"), &["IPv6"])),
            1
        );
        assert_eq!(rules_needed(&svc(&[], None, &[])), 1);
    }
}
