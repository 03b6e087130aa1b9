//! Reading Kubernetes objects into the domain's plain views, and the rules of which Services
//! loxi-ccm serves.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use loxi_domain::{
    ControllerName, EndpointPortView, EndpointView, NodeView, ServicePortView, ServiceView,
    TrafficPolicy,
};

/// Finalizer on Services of our class. The upstream service controller treats any Service
/// with a class as not its own and would strip the standard finalizer
/// (docs/architecture.md#finalizers).
pub const CLASS_FINALIZER: &str = "loxilb.io/loadbalancer-cleanup";
/// The standard finalizer, for class-less Services served in CCM mode, as the upstream
/// service controller uses it.
pub const CCM_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// Nodes with this label are never used as endpoints.
pub const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// kube-loxilb publishes addresses as hostnames `llb-<ip>` (to stop kube-proxy from
/// short-circuiting the VIP); such addresses are read back as theirs.
pub const LLB_HOSTNAME_PREFIX: &str = "llb-";

/// Which Services this controller serves, and the finalizer that marks them as its own.
#[derive(Debug, Clone)]
pub struct Selection {
    pub class: String,
    pub ccm_mode: bool,
    /// This controller among several in one cluster: its finalizer on Services of its class
    /// is [`CLASS_FINALIZER`] for the default controller, `CLASS_FINALIZER-<name>` for
    /// another (docs/architecture.md#several-controllers-in-one-cluster).
    pub controller: ControllerName,
    class_finalizer: String,
}

impl Selection {
    pub fn new(class: &str, ccm_mode: bool, controller: ControllerName) -> Selection {
        Selection {
            class: class.to_string(),
            ccm_mode,
            class_finalizer: controller.suffixed(CLASS_FINALIZER),
            controller,
        }
    }

    /// Type LoadBalancer and either our class, or no class while in CCM mode.
    pub fn serves(&self, svc: &Service) -> bool {
        let Some(spec) = &svc.spec else { return false };
        if spec.type_.as_deref() != Some("LoadBalancer") {
            return false;
        }
        match spec.load_balancer_class.as_deref() {
            Some(class) => class == self.class,
            None => self.ccm_mode,
        }
    }

    /// The finalizer a served Service carries.
    pub fn finalizer_for(&self, svc: &Service) -> &str {
        let classless = svc
            .spec
            .as_ref()
            .is_none_or(|s| s.load_balancer_class.is_none());
        if classless {
            CCM_FINALIZER
        } else {
            &self.class_finalizer
        }
    }

    /// Finalizers of ours present on `svc`. The standard one counts only in CCM mode on a
    /// class-less Service: otherwise it belongs to another cloud provider. Another loxi-ccm's
    /// finalizer is never ours, whatever class the Service has now.
    pub fn our_finalizers(&self, svc: &Service) -> Vec<&str> {
        let classless = svc
            .spec
            .as_ref()
            .is_none_or(|s| s.load_balancer_class.is_none());
        self.finalizers_in(svc.metadata.finalizers.as_deref(), classless)
    }

    /// Our finalizers among `present`; `classless`: the Service has no class (the standard
    /// finalizer is ours only then, and only in CCM mode).
    pub fn finalizers_in(&self, present: Option<&[String]>, classless: bool) -> Vec<&str> {
        let present = present.unwrap_or_default();
        let mut ours = Vec::new();
        if present.contains(&self.class_finalizer) {
            ours.push(self.class_finalizer.as_str());
        }
        if self.ccm_mode && classless && present.iter().any(|f| f == CCM_FINALIZER) {
            ours.push(CCM_FINALIZER);
        }
        ours
    }
}

pub fn service_view(svc: &Service) -> ServiceView {
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .map(|p| ServicePortView {
                    name: p.name.clone().unwrap_or_default(),
                    port: u16::try_from(p.port).unwrap_or(0),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
                })
                .collect()
        })
        .unwrap_or_default();
    let spec = svc.spec.as_ref();
    ServiceView {
        namespace: svc.metadata.namespace.clone().unwrap_or_default(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        ports,
        external_traffic_policy: match spec.and_then(|s| s.external_traffic_policy.as_deref()) {
            Some("Local") => TrafficPolicy::Local,
            _ => TrafficPolicy::Cluster,
        },
        source_ranges: spec
            .and_then(|s| s.load_balancer_source_ranges.clone())
            .unwrap_or_default(),
        secondary_ips: Vec::new(),
    }
}

/// The label EndpointSlices carry to name their Service.
/// The role recorded on a claim's owner entry for a secondary (SCTP multi-homing) address.
pub const ROLE_SECONDARY: &str = "secondary";

/// The field selector of the Service watch: only LoadBalancer Services are sent.
pub const TYPE_SELECTOR: &str = "spec.type=LoadBalancer";

pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Multus' per-pod annotation: one entry per attached network with its addresses.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

/// Reads Multus' network-status annotation into network name -> addresses. Malformed
/// content yields nothing (the pod then has no secondary addresses for us).
pub fn multus_networks(annotation: &str) -> BTreeMap<String, Vec<IpAddr>> {
    #[derive(serde::Deserialize)]
    struct Net {
        name: String,
        #[serde(default)]
        ips: Vec<String>,
    }
    serde_json::from_str::<Vec<Net>>(annotation)
        .unwrap_or_default()
        .into_iter()
        .map(|n| {
            (
                n.name,
                n.ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
            )
        })
        .collect()
}

/// One view per endpoint address of the Service's EndpointSlices. `pod_networks` gives the
/// Multus addresses of the pod behind an endpoint (by its targetRef), when known.
pub fn endpoint_views<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
    pod_networks: impl Fn(&str, &str) -> BTreeMap<String, Vec<IpAddr>>,
) -> Vec<EndpointView> {
    let mut out = Vec::new();
    for slice in slices {
        let ports: Vec<EndpointPortView> = slice
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| {
                Some(EndpointPortView {
                    name: p.name.clone().unwrap_or_default(),
                    port: u16::try_from(p.port?).ok()?,
                    protocol: p.protocol.clone().unwrap_or_default(),
                })
            })
            .collect();
        for ep in slice.endpoints.as_deref().unwrap_or_default() {
            // The API's rule: an unset ready condition means ready.
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let networks = ep
                .target_ref
                .as_ref()
                .filter(|r| r.kind.as_deref() == Some("Pod"))
                .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)))
                .map(|(ns, name)| pod_networks(&ns, &name))
                .unwrap_or_default();
            for addr in &ep.addresses {
                if let Ok(ip) = addr.parse::<IpAddr>() {
                    out.push(EndpointView {
                        ip,
                        node_name: ep.node_name.clone(),
                        ready,
                        ports: ports.clone(),
                        networks: networks.clone(),
                    });
                }
            }
        }
    }
    out
}

pub fn node_view(node: &Node) -> NodeView {
    let status = node.status.as_ref();
    let internal_ip = status.and_then(|s| s.addresses.as_ref()).and_then(|addrs| {
        addrs
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .find_map(|a| a.address.parse::<IpAddr>().ok())
    });
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True");
    NodeView {
        name: node.metadata.name.clone().unwrap_or_default(),
        internal_ip,
        excluded: node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(EXCLUDE_LB_LABEL)),
        deleting: node.metadata.deletion_timestamp.is_some(),
        ready,
        labels: node.metadata.labels.clone().unwrap_or_default(),
    }
}

/// Addresses already published in the Service status (ours, or kube-loxilb's / loxi-ccm's
/// when adopting), including kube-loxilb's `llb-<ip>` hostname form.
pub fn published_addresses(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| {
            ingress
                .iter()
                .filter_map(|i| {
                    i.ip.as_deref().and_then(|ip| ip.parse().ok()).or_else(|| {
                        i.hostname
                            .as_deref()
                            .and_then(|h| h.strip_prefix(LLB_HOSTNAME_PREFIX))
                            .and_then(|ip| ip.parse().ok())
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `namespace/name`, the owner key used by the allocator for the Service's VIPs.
pub fn owner_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The allocator's owner key for the Service's secondary (SCTP multi-homing) addresses; the
/// same as `ClaimedBy::key` of a secondary owner entry in an `AddressClaim`.
pub fn secondary_owner_key(svc: &Service) -> String {
    format!("{}#{}", owner_key(svc), ROLE_SECONDARY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multus_network_status_is_read() {
        let text = r#"[{"name":"kindnet","interface":"eth0","ips":["10.244.1.5"],"default":true},
            {"name":"default/macvlan1","interface":"net1","ips":["192.168.50.7","bad"]}]"#;
        let nets = multus_networks(text);
        assert_eq!(
            nets["default/macvlan1"],
            vec!["192.168.50.7".parse::<IpAddr>().unwrap()]
        );
        assert!(multus_networks("not json").is_empty());
    }
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };

    fn svc(type_: &str, class: Option<&str>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                load_balancer_class: class.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn selection_by_type_and_class() {
        let sel = Selection::new("loxilb.io/loxilb", false, ControllerName::default());
        assert!(sel.serves(&svc("LoadBalancer", Some("loxilb.io/loxilb"))));
        assert!(!sel.serves(&svc("LoadBalancer", Some("other.io/lb"))));
        assert!(!sel.serves(&svc("LoadBalancer", None)));
        assert!(!sel.serves(&svc("ClusterIP", Some("loxilb.io/loxilb"))));
        let ccm = Selection::new("loxilb.io/loxilb", true, ControllerName::default());
        assert!(ccm.serves(&svc("LoadBalancer", None)));
        assert_eq!(ccm.finalizer_for(&svc("LoadBalancer", None)), CCM_FINALIZER);
        assert_eq!(
            ccm.finalizer_for(&svc("LoadBalancer", Some("loxilb.io/loxilb"))),
            CLASS_FINALIZER
        );
    }

    #[test]
    fn another_controllers_finalizer_is_never_ours() {
        let default = Selection::new("loxilb.io/loxilb", true, ControllerName::default());
        let other = Selection::new(
            "example.com/other",
            false,
            ControllerName::for_class("example.com/other"),
        );
        let mut theirs = svc("LoadBalancer", Some("example.com/other"));
        let their_finalizer = other.finalizer_for(&theirs).to_string();
        assert_eq!(
            their_finalizer,
            "loxilb.io/loadbalancer-cleanup-example-com-other"
        );
        theirs.metadata.finalizers = Some(vec![their_finalizer.clone()]);
        assert!(default.our_finalizers(&theirs).is_empty());
        assert_eq!(
            other.our_finalizers(&theirs),
            vec![their_finalizer.as_str()]
        );
        // The default controller's Service, now moved to the other class: the default
        // controller cleans it up once; the other never counts the finalizer as its own.
        let mut moved = svc("LoadBalancer", Some("example.com/other"));
        moved.metadata.finalizers = Some(vec![CLASS_FINALIZER.to_string()]);
        assert_eq!(default.our_finalizers(&moved), vec![CLASS_FINALIZER]);
        assert!(other.our_finalizers(&moved).is_empty());
        assert!(!default.serves(&moved) && other.serves(&moved));
    }

    #[test]
    fn published_addresses_read_both_forms() {
        let mut s = svc("LoadBalancer", None);
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![
                    LoadBalancerIngress {
                        ip: Some("192.0.2.5".into()),
                        ..Default::default()
                    },
                    LoadBalancerIngress {
                        hostname: Some("llb-192.0.2.6".into()),
                        ..Default::default()
                    },
                    LoadBalancerIngress {
                        hostname: Some("lb.example.com".into()),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        });
        let ips: Vec<String> = published_addresses(&s)
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(ips, ["192.0.2.5", "192.0.2.6"]);
    }
}
