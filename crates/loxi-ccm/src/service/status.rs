//! What the Service status should say, and writing it with server-side apply (one field
//! manager, so what we stop saying is removed and other writers' fields are left alone).
//!
//! ## How addresses are published (`status.loadBalancer.ingress[]`)
//!
//! Each address is one ingress entry with the Service's ports (`ports[]`: port and protocol
//! per Service port). Its form decides what kube-proxy does with in-cluster traffic to it:
//!
//! - `ipMode: VIP`: kube-proxy short-circuits the address, pods and nodes reach the
//!   endpoints directly without going through loxilb.
//! - `ipMode: Proxy` (Kubernetes >= 1.30): kube-proxy leaves the address alone, in-cluster
//!   traffic goes to loxilb like external traffic does.
//! - `hostname: llb-<ip>`: kube-loxilb's form, for the same purpose on clusters older than
//!   1.30 (kube-proxy never programs a hostname). IPv6 addresses cannot be written so (a
//!   hostname may not contain `:`), they are published as `ipMode: Proxy` instead.
//!
//! The default follows the Service's NAT mode (`IngressMode::for_nat_mode` in
//! `loxi_domain::ingress`); the annotation `loxilb.io/ingress-mode` (`vip`, `proxy` or
//! `hostname`) overrides it. Either form is read back as the Service's address
//! (`crate::k8s::view::published_addresses`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, PortStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use loxi_domain::Defaults;
use loxi_domain::ingress::IngressMode;
use serde_json::json;

use crate::k8s::view::{LLB_HOSTNAME_PREFIX, published_addresses};

/// Condition messages are cut to this many bytes: room for every message the controller
/// composes (a list of unreachable instances included), while a hostile annotation value
/// cannot make a status write of tens of kilobytes (the API allows 32 KiB).
pub const COND_MESSAGE_MAX_BYTES: usize = 4096;
pub const COND_ADDRESS: &str = "loxilb.io/AddressAllocated";
pub const COND_PROGRAMMED: &str = "loxilb.io/Programmed";
/// False when loxilb's 32-endpoint limit left candidates out.
pub const COND_ENDPOINTS: &str = "loxilb.io/EndpointsComplete";
/// Only on Services with `spec.loadBalancerSourceRanges`: whether loxilb enforces them
/// (`--source-ranges`).
pub const COND_SOURCE_RANGES: &str = "loxilb.io/SourceRangesEnforced";

/// The form for `svc`: its `loxilb.io/ingress-mode` annotation, else its NAT mode's default;
/// with a bad annotation the form it shows now (`loxi_domain::ingress`).
pub fn ingress_mode(svc: &Service, defaults: Defaults) -> IngressMode {
    let empty = BTreeMap::new();
    let annotations = svc.metadata.annotations.as_ref().unwrap_or(&empty);
    IngressMode::choose(annotations, shown_ingress_mode(svc), defaults)
}

/// The form the Service's first ingress entry has now, if any.
fn shown_ingress_mode(svc: &Service) -> Option<IngressMode> {
    let first = current_ingress(svc).first()?;
    if first
        .hostname
        .as_deref()
        .is_some_and(|h| h.starts_with(LLB_HOSTNAME_PREFIX))
    {
        return Some(IngressMode::Hostname);
    }
    match first.ip_mode.as_deref()? {
        "Proxy" => Some(IngressMode::Proxy),
        _ => Some(IngressMode::Vip),
    }
}

/// One condition as we want it (the transition time is filled in when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

impl Cond {
    /// The message is cut to [`COND_MESSAGE_MAX_BYTES`]: it may quote what a user wrote.
    pub fn new(type_: &'static str, ok: bool, reason: &str, message: impl Into<String>) -> Cond {
        Cond {
            type_,
            ok,
            reason: reason.to_string(),
            message: loxi_domain::text::cut_to_bytes(&message.into(), COND_MESSAGE_MAX_BYTES),
        }
    }
}

/// The status loxi-ccm wants on a Service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DesiredStatus {
    pub addresses: Vec<IpAddr>,
    pub conditions: Vec<Cond>,
    /// How `addresses` are published.
    pub ingress: IngressMode,
}

/// The ingress entries `want` means for `svc`, in address order.
pub fn ingress_entries(svc: &Service, want: &DesiredStatus) -> Vec<LoadBalancerIngress> {
    let ports: Vec<PortStatus> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .map(|p| PortStatus {
                    port: p.port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    error: None,
                })
                .collect()
        })
        .unwrap_or_default();
    let ports = (!ports.is_empty()).then_some(ports);
    want.addresses
        .iter()
        .map(|ip| {
            let hostname = want.ingress == IngressMode::Hostname && ip.is_ipv4();
            if hostname {
                // The API server refuses ipMode without ip.
                LoadBalancerIngress {
                    hostname: Some(format!("{LLB_HOSTNAME_PREFIX}{ip}")),
                    ports: ports.clone(),
                    ..Default::default()
                }
            } else {
                let mode = match want.ingress {
                    IngressMode::Vip => "VIP",
                    IngressMode::Proxy | IngressMode::Hostname => "Proxy",
                };
                LoadBalancerIngress {
                    ip: Some(ip.to_string()),
                    ip_mode: Some(mode.into()),
                    ports: ports.clone(),
                    ..Default::default()
                }
            }
        })
        .collect()
}

fn current_ingress(svc: &Service) -> &[LoadBalancerIngress] {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
}

/// The condition of this type the Service shows now.
pub fn current_condition<'a>(svc: &'a Service, type_: &str) -> Option<&'a Condition> {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
}

fn status_word(ok: bool) -> &'static str {
    if ok { "True" } else { "False" }
}

/// True when the Service already shows exactly `want` (no write needed).
pub fn is_current(svc: &Service, want: &DesiredStatus) -> bool {
    if current_ingress(svc) != ingress_entries(svc, want) {
        return false;
    }
    // A condition that exists only for some Services must also go when it no longer applies.
    if current_condition(svc, COND_SOURCE_RANGES).is_some()
        && !want
            .conditions
            .iter()
            .any(|c| c.type_ == COND_SOURCE_RANGES)
    {
        return false;
    }
    let generation = svc.metadata.generation;
    want.conditions.iter().all(|c| {
        current_condition(svc, c.type_).is_some_and(|have| {
            have.status == status_word(c.ok)
                && have.reason == c.reason
                && have.message == c.message
                && have.observed_generation == generation
        })
    })
}

/// Writes `want` with server-side apply. The transition time of a condition is kept when
/// its status did not change, as the Kubernetes API conventions ask.
pub async fn write(
    api: &Api<Service>,
    svc: &Service,
    want: &DesiredStatus,
    field_manager: &str,
) -> kube::Result<Service> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut conditions: Vec<Condition> = want
        .conditions
        .iter()
        .map(|c| Condition {
            type_: c.type_.to_string(),
            status: status_word(c.ok).to_string(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            observed_generation: None,
            last_transition_time: now.clone(),
        })
        .collect();
    let shown = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    crate::k8s::conditions::stamp_all(&mut conditions, shown, svc.metadata.generation, &now);
    let ingress = ingress_entries(svc, want);
    let mut status = json!({ "conditions": conditions });
    if !ingress.is_empty() {
        status["loadBalancer"] = json!({ "ingress": ingress });
    }
    let mut patch = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "status": status,
    });
    // Publishing a different address is conditional on the Service being unchanged since we
    // read it: of two writers that raced for one Service, only one address is ever shown.
    // Another form of the same addresses (ipMode, hostname, ports) is not a new address.
    if published_addresses(svc) != want.addresses {
        patch["metadata"]["resourceVersion"] = json!(svc.metadata.resource_version);
    }
    // Forced: on adoption the ingress field may belong to kube-loxilb's or loxi-ccm's
    // manager; the address is unchanged, only its owner.
    let params = PatchParams::apply(field_manager).force();
    api.patch_status(&name, &params, &Patch::Apply(&patch))
        .await
}

/// Removes everything this manager wrote in the status (the Service is no longer ours).
pub async fn clear(api: &Api<Service>, svc: &Service, field_manager: &str) -> kube::Result<()> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "status": {},
    });
    api.patch_status(
        &name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use loxi_domain::NatMode;
    use loxi_domain::ingress::ANN_INGRESS_MODE;

    fn svc(annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: kube::api::ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![
                    ServicePort {
                        port: 80,
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    },
                    ServicePort {
                        port: 53,
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ingress_mode_follows_the_nat_mode() {
        let d = Defaults::default();
        assert_eq!(ingress_mode(&svc(&[]), d), IngressMode::Vip);
        for mode in ["onearm", "fullnat", "fullproxy"] {
            let s = svc(&[("loxilb.io/lbmode", mode)]);
            assert_eq!(ingress_mode(&s, d), IngressMode::Proxy, "{mode}");
        }
        let dsr = svc(&[("loxilb.io/lbmode", "dsr"), ("loxilb.io/epselect", "hash")]);
        assert_eq!(ingress_mode(&dsr, d), IngressMode::Proxy);
        let ppv2 = svc(&[("loxilb.io/useproxyprotov2", "yes")]);
        assert_eq!(ingress_mode(&ppv2, d), IngressMode::Proxy);
        // The operator's default mode counts too.
        let fullnat = Defaults {
            mode: NatMode::FullNat,
            ..d
        };
        assert_eq!(ingress_mode(&svc(&[]), fullnat), IngressMode::Proxy);
        // The annotation wins; a bad one is an error, and publishing falls back.
        let s = svc(&[
            (ANN_INGRESS_MODE, "Hostname"),
            ("loxilb.io/lbmode", "fullnat"),
        ]);
        assert_eq!(ingress_mode(&s, d), IngressMode::Hostname);
        let mut bad = svc(&[(ANN_INGRESS_MODE, "magic"), ("loxilb.io/lbmode", "fullnat")]);
        assert!(IngressMode::from_annotations(bad.metadata.annotations.as_ref().unwrap()).is_err());
        assert_eq!(ingress_mode(&bad, d), IngressMode::Proxy);
        // ... unless a form is shown already: it stays.
        bad.status = Some(k8s_openapi::api::core::v1::ServiceStatus {
            load_balancer: Some(k8s_openapi::api::core::v1::LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    hostname: Some("llb-192.0.2.5".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        assert_eq!(ingress_mode(&bad, d), IngressMode::Hostname);
        // Another bad annotation: the NAT mode alone still decides.
        let other = svc(&[("loxilb.io/lbmode", "fullnat"), ("loxilb.io/timeout", "x")]);
        assert_eq!(ingress_mode(&other, d), IngressMode::Proxy);
    }

    #[test]
    fn ingress_entries_by_mode() {
        let s = svc(&[]);
        let mut want = DesiredStatus {
            addresses: vec!["192.0.2.5".parse().unwrap(), "2001:db8::5".parse().unwrap()],
            ..Default::default()
        };
        let entries = ingress_entries(&s, &want);
        assert_eq!(entries[0].ip.as_deref(), Some("192.0.2.5"));
        assert_eq!(entries[0].ip_mode.as_deref(), Some("VIP"));
        let ports: Vec<(i32, &str)> = entries[0]
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| (p.port, p.protocol.as_str()))
            .collect();
        assert_eq!(ports, [(80, "TCP"), (53, "UDP")]);
        want.ingress = IngressMode::Hostname;
        let entries = ingress_entries(&s, &want);
        assert_eq!(entries[0].hostname.as_deref(), Some("llb-192.0.2.5"));
        assert_eq!(
            (entries[0].ip.as_ref(), entries[0].ip_mode.as_ref()),
            (None, None)
        );
        // No hostname can hold an IPv6 address: published as Proxy instead.
        assert_eq!(entries[1].ip.as_deref(), Some("2001:db8::5"));
        assert_eq!(entries[1].ip_mode.as_deref(), Some("Proxy"));
    }
}
