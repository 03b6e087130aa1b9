//! Services as the tests make and read them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;

/// The condition type of a Service's address.
pub const COND_ADDRESS: &str = "loxilb.io/AddressAllocated";
/// The condition type of a Service's rules.
pub const COND_PROGRAMMED: &str = "loxilb.io/Programmed";

/// A LoadBalancer Service with the given class and (port, protocol) list.
pub fn lb_service(name: &str, class: Option<&str>, ports: &[(i32, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_class: class.map(str::to_string),
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(
                ports
                    .iter()
                    .map(|(port, proto)| ServicePort {
                        name: Some(format!("{}-{port}", proto.to_lowercase())),
                        port: *port,
                        protocol: Some(proto.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `svc` with exactly these annotations.
pub fn annotated(mut svc: Service, pairs: &[(&str, &str)]) -> Service {
    svc.metadata.annotations = Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    svc
}

/// A condition of `svc` as (status, reason, message).
pub fn condition(svc: &Service, type_: &str) -> Option<(String, String, String)> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The nodePorts of `svc`, as the API server assigned them.
pub fn node_ports(svc: &Service) -> Vec<i32> {
    svc.spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.node_port.expect("nodePort assigned by the API server"))
        .collect()
}
