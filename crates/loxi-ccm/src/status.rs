//! What the Service status should say, and writing it with server-side apply (one field
//! manager, so what we stop saying is removed and other writers' fields are left alone).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

pub const FIELD_MANAGER: &str = "loxi-ccm";
pub const COND_ADDRESS: &str = "loxilb.io/AddressAllocated";
pub const COND_PROGRAMMED: &str = "loxilb.io/Programmed";
/// False when loxilb's 32-endpoint limit left candidates out.
pub const COND_ENDPOINTS: &str = "loxilb.io/EndpointsComplete";

/// One condition as we want it (the transition time is filled in when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

impl Cond {
    pub fn new(type_: &'static str, ok: bool, reason: &str, message: impl Into<String>) -> Cond {
        Cond {
            type_,
            ok,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// The status loxi-ccm wants on a Service.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DesiredStatus {
    pub addresses: Vec<IpAddr>,
    pub conditions: Vec<Cond>,
}

fn current_ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default()
}

fn current_condition<'a>(svc: &'a Service, type_: &str) -> Option<&'a Condition> {
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
    let ips: Vec<String> = want.addresses.iter().map(ToString::to_string).collect();
    if current_ingress(svc) != ips {
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
pub async fn write(api: &Api<Service>, svc: &Service, want: &DesiredStatus) -> kube::Result<()> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions: Vec<Condition> = want
        .conditions
        .iter()
        .map(|c| {
            let status = status_word(c.ok).to_string();
            let last_transition_time = current_condition(svc, c.type_)
                .filter(|have| have.status == status)
                .map(|have| have.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: c.type_.to_string(),
                status,
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: svc.metadata.generation,
                last_transition_time,
            }
        })
        .collect();
    let ingress: Vec<serde_json::Value> = want
        .addresses
        .iter()
        .map(|ip| json!({ "ip": ip.to_string() }))
        .collect();
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
    let ips: Vec<String> = want.addresses.iter().map(ToString::to_string).collect();
    if current_ingress(svc) != ips {
        patch["metadata"]["resourceVersion"] = json!(svc.metadata.resource_version);
    }
    // Forced: on adoption the ingress field may belong to kube-loxilb's or loxi-ccm's
    // manager; the address is unchanged, only its owner.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&name, &params, &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// Removes everything this manager wrote in the status (the Service is no longer ours).
pub async fn clear(api: &Api<Service>, svc: &Service) -> kube::Result<()> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "status": {},
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}
