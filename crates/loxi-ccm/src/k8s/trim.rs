//! What the watch caches keep of each object. Every watched object stays in memory for the
//! life of the process, so fields the controller never reads are dropped as they arrive:
//! `managedFields` everywhere (often the largest part of an object), Node images and volumes,
//! EndpointSlice hints, and almost everything of the Services this controller does not
//! serve. Services of other types are not even sent where the API server filters by type
//! (crate::service::departures); load balancers of other classes keep only a name, a type and a class.

use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::ObjectMeta;

use crate::k8s::view::Selection;

/// Objects per page of a watcher's initial list. kube and client-go use 500; a page is read
/// whole and parsed whole (with the `managedFields` trimmed only afterwards), so 500 Services
/// were ~4 MB for a moment at every start-up and re-list. 100 keeps that under 1 MB for a few
/// more requests (10 for 1,000 objects).
const LIST_PAGE: u32 = 100;

/// How every watcher lists: consistent lists in pages of [`LIST_PAGE`] objects. Not
/// `any_semantic` (`resourceVersion=0`, served from the API server's cache): the watch cache
/// may answer that with the whole collection in one response whatever the page size, and a
/// response is held whole until it is parsed, so 10,000 Services would be one body of tens of
/// megabytes at start-up and after every re-list.
pub fn list_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().page_size(LIST_PAGE)
}

/// `kubectl apply`'s copy of the whole object, in an annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// A Service this controller serves, or holds a finalizer on, is kept whole (minus
/// bookkeeping). Any other is cut down to what decides whether it becomes ours: its identity,
/// finalizers, type and class. It comes back whole with the next change that makes it ours.
pub fn service(svc: &mut Service, selection: &Selection) {
    trim_meta(&mut svc.metadata);
    if selection.serves(svc) || !selection.our_finalizers(svc).is_empty() {
        return;
    }
    svc.metadata.annotations = None;
    svc.metadata.labels = None;
    svc.metadata.owner_references = None;
    svc.spec = svc.spec.take().map(|s| ServiceSpec {
        type_: s.type_,
        load_balancer_class: s.load_balancer_class,
        ..ServiceSpec::default()
    });
    svc.status = None;
}

/// A Node keeps its labels, addresses and Ready condition (what the planner reads).
pub fn node(node: &mut Node) {
    trim_meta(&mut node.metadata);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.retain(|c| c.type_ == "Ready");
            for c in conditions.iter_mut() {
                // Changes with every heartbeat; never read.
                c.last_heartbeat_time = None;
                c.message = None;
            }
        }
    }
}

/// An EndpointSlice keeps its endpoints' addresses, readiness, node and pod.
pub fn endpoint_slice(slice: &mut EndpointSlice) {
    trim_meta(&mut slice.metadata);
    slice.metadata.annotations = None;
    for ep in slice.endpoints.iter_mut().flatten() {
        ep.hints = None;
        ep.deprecated_topology = None;
        ep.zone = None;
    }
}

/// Any other object: bookkeeping only.
pub fn meta<K: kube::Resource>(obj: &mut K) {
    trim_meta(obj.meta_mut());
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, ServiceStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use std::collections::BTreeMap;

    fn selection() -> Selection {
        Selection::new(
            "loxilb.io/loxilb",
            false,
            loxi_domain::ControllerName::default(),
        )
    }

    fn svc(type_: &str, class: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("ns".into()),
                annotations: Some(BTreeMap::from([
                    (LAST_APPLIED.to_string(), "{...}".to_string()),
                    ("loxilb.io/lbmode".to_string(), "fullnat".to_string()),
                ])),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                load_balancer_class: class.map(str::to_string),
                selector: Some(BTreeMap::from([("app".into(), "x".into())])),
                ..Default::default()
            }),
            status: Some(ServiceStatus::default()),
        }
    }

    #[test]
    fn served_services_keep_what_they_say() {
        let mut s = svc("LoadBalancer", Some("loxilb.io/loxilb"));
        service(&mut s, &selection());
        assert!(s.metadata.managed_fields.is_none());
        let a = s.metadata.annotations.as_ref().unwrap();
        assert!(!a.contains_key(LAST_APPLIED) && a.contains_key("loxilb.io/lbmode"));
        assert!(s.spec.as_ref().unwrap().selector.is_some());
    }

    #[test]
    fn other_services_keep_only_what_decides_serving() {
        let sel = selection();
        for mut s in [
            svc("ClusterIP", None),
            svc("LoadBalancer", Some("other.io/lb")),
        ] {
            let before = sel.serves(&s);
            service(&mut s, &sel);
            assert_eq!(sel.serves(&s), before);
            assert!(s.metadata.annotations.is_none() && s.status.is_none());
            assert!(s.spec.as_ref().unwrap().selector.is_none());
            assert_eq!(s.metadata.name.as_deref(), Some("s"));
        }
        // Our finalizer still on it (being cleaned up): kept whole.
        let mut s = svc("ClusterIP", Some("loxilb.io/loxilb"));
        s.metadata.finalizers = Some(vec![sel.finalizer_for(&s).to_string()]);
        service(&mut s, &sel);
        assert!(s.spec.unwrap().selector.is_some());
    }

    #[test]
    fn nodes_keep_the_ready_condition() {
        let mut n = Node {
            status: Some(NodeStatus {
                conditions: Some(vec![
                    NodeCondition {
                        type_: "MemoryPressure".into(),
                        status: "False".into(),
                        ..Default::default()
                    },
                    NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        message: Some("kubelet is posting ready status".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        node(&mut n);
        let c = n.status.unwrap().conditions.unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].type_.as_str(), c[0].status.as_str()),
            ("Ready", "True")
        );
    }
}
