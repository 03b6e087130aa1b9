//! Writes what `http` decides: the Gateways' ingress Services (server-side apply, their
//! status showing the Gateway's address) and the HTTPRoutes' Ingresses, and removes those
//! no Gateway wants any more (found by their label). Every failure is logged and tried
//! again at the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{debug, warn};

use super::http::{MANAGED_LABEL, SecretFound, ingress_service_name};
use super::tls;

/// The field manager of these writes.
const MANAGER: &str = "loxi-ccm-gateway";

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Puts the Gateway's ingress Service in place and its status on `addresses`.
pub async fn apply_service(client: &kube::Client, svc: &Service, addresses: &[IpAddr]) {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let api: Api<Service> = Api::namespaced(client.clone(), &ns);
    if let Err(e) = api.patch(&name, &apply_params(), &Patch::Apply(svc)).await {
        warn!(service = %format!("{ns}/{name}"), error = %e, "could not write a Gateway's ingress Service");
        return;
    }
    let ingress: Vec<_> = addresses
        .iter()
        .map(|ip| json!({"ip": ip.to_string()}))
        .collect();
    let status = json!({"status": {"loadBalancer": {"ingress": ingress}}});
    if let Err(e) = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        warn!(service = %format!("{ns}/{name}"), error = %e, "could not write a Gateway's ingress Service status");
    }
}

/// Deletes the Gateway `ns/gateway`'s ingress Service if it has one; true once it is gone.
pub async fn delete_service(client: &kube::Client, ns: &str, gateway: &str) -> bool {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    match api
        .delete(&ingress_service_name(gateway), &DeleteParams::default())
        .await
    {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => true,
        Err(e) => {
            warn!(gateway = %format!("{ns}/{gateway}"), error = %e, "could not delete a Gateway's ingress Service");
            false
        }
    }
}

/// What each of `secrets` (namespace, name) is, by a GET each (the controller may only
/// `get` Secrets: it never lists or watches them); a Secret that could not be read counts
/// as missing until the next pass. Its data is only checked (`tls::problem`), not kept.
pub async fn secrets(
    client: &kube::Client,
    secrets: &BTreeSet<(String, String)>,
) -> BTreeMap<(String, String), SecretFound> {
    let mut out = BTreeMap::new();
    for (ns, name) in secrets {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let found = match api.get_opt(name).await {
            Ok(Some(secret)) => match tls::problem(secret.data.as_ref()) {
                None => SecretFound::Usable,
                Some(why) => SecretFound::Unusable(why),
            },
            Ok(None) => SecretFound::Missing,
            Err(e) => {
                debug!(secret = %format!("{ns}/{name}"), error = %e, "could not read a Secret");
                SecretFound::Missing
            }
        };
        out.insert((ns.clone(), name.clone()), found);
    }
    out
}

/// Brings the Ingresses of ours to `desired` (by namespace and name): each applied, every
/// other Ingress with our label deleted.
pub async fn sync(client: &kube::Client, desired: &BTreeMap<(String, String), Ingress>) {
    for ((ns, name), ing) in desired {
        let api: Api<Ingress> = Api::namespaced(client.clone(), ns);
        if let Err(e) = api.patch(name, &apply_params(), &Patch::Apply(ing)).await {
            warn!(ingress = %format!("{ns}/{name}"), error = %e, "could not write an HTTPRoute's Ingress");
        }
    }
    let api: Api<Ingress> = Api::all(client.clone());
    let selector = format!("{}={}", MANAGED_LABEL.0, MANAGED_LABEL.1);
    let list = match api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            debug!(error = %e, "could not list the HTTPRoutes' Ingresses");
            return;
        }
    };
    for ing in list {
        let key = (ing.namespace().unwrap_or_default(), ing.name_any());
        if desired.contains_key(&key) {
            continue;
        }
        let api: Api<Ingress> = Api::namespaced(client.clone(), &key.0);
        match api.delete(&key.1, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                warn!(ingress = %format!("{}/{}", key.0, key.1), error = %e, "could not delete an HTTPRoute's Ingress");
            }
        }
    }
}
