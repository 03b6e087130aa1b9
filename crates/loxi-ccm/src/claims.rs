//! Durable address claims (DESIGN.md §4).
//!
//! One cluster-scoped `AddressClaim` per allocated address, named after the address, created
//! **before** the address is published or programmed anywhere. The API server's name
//! uniqueness settles races between replicas or processes: of two creates for one address,
//! exactly one succeeds. The in-memory allocator is only an index of these objects, rebuilt
//! from them at start-up before any allocation and kept current by a watch.
//!
//! Retain and reservations use the same object: a claim whose `service` names a Service that
//! does not exist (yet) keeps the address for that namespace/name, either until `retainUntil`
//! passes or until someone deletes the claim.

use std::net::IpAddr;

use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The Service (or the future Service, for a reservation) an address belongs to.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedBy {
    pub namespace: String,
    pub name: String,
    /// UID of the Service holding the address; empty while the address is only reserved or
    /// retained for this namespace/name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

// kube's printcolumn(...) syntax repeats `type_ = "string"`, which this lint misreads.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "ipam.loxilb.io",
    version = "v1alpha1",
    kind = "AddressClaim",
    plural = "addressclaims",
    shortname = "lbaddr",
    category = "loxilb",
    doc = "One external address owned by one Service (or reserved for one). Named after the address; created before the address is used, deleted after its rules are gone.",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.service.namespace"
    ),
    printcolumn(name = "Service", type_ = "string", json_path = ".spec.service.name"),
    printcolumn(
        name = "Retain-Until",
        type_ = "string",
        json_path = ".spec.retainUntil"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AddressClaimSpec {
    /// The address, in canonical text form.
    pub address: String,
    /// The pool it was taken from (empty for a static address outside every pool).
    #[serde(default)]
    pub pool: String,
    pub service: ClaimedBy,
    /// RFC 3339 time after which a retained address (its Service deleted) goes back to the
    /// pool. Absent: held as long as the claim exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_until: Option<String>,
}

/// Object name for an address: IPv4 as is (a valid DNS subdomain), IPv6 with `:` as `-`.
pub fn claim_name(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

impl AddressClaim {
    pub fn ip(&self) -> Option<IpAddr> {
        self.spec.address.parse().ok()
    }

    /// `namespace/name`: the allocator's owner key.
    pub fn owner_key(&self) -> String {
        format!("{}/{}", self.spec.service.namespace, self.spec.service.name)
    }

    /// A retained claim whose time is up.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.spec
            .retain_until
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .is_some_and(|until| until <= now)
    }
}

/// Result of trying to claim an address.
#[derive(Debug)]
pub enum ClaimResult {
    /// The claim now exists for this Service (created, or already ours).
    Ours,
    /// Someone else holds it.
    Taken(Box<AddressClaim>),
}

/// Creates the claim for `ip`, or confirms an existing one belongs to the Service (same
/// namespace/name; a reserved or retained claim is taken over by filling in the UID and
/// dropping `retainUntil`).
pub async fn claim(
    api: &Api<AddressClaim>,
    ip: &IpAddr,
    pool: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> kube::Result<ClaimResult> {
    let spec = AddressClaimSpec {
        address: ip.to_string(),
        pool: pool.to_string(),
        service: ClaimedBy {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
        },
        retain_until: None,
    };
    let obj = AddressClaim::new(&claim_name(ip), spec);
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => return Ok(ClaimResult::Ours),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let existing = api.get(&claim_name(ip)).await?;
    let by = &existing.spec.service;
    if by.namespace != namespace || by.name != name || (!by.uid.is_empty() && by.uid != uid) {
        return Ok(ClaimResult::Taken(Box::new(existing)));
    }
    if by.uid != uid || existing.spec.retain_until.is_some() {
        // Reserved or retained for this namespace/name: the Service takes it over. The
        // resourceVersion makes a concurrent change fail instead of being overwritten.
        let patch = json!({
            "metadata": { "resourceVersion": existing.metadata.resource_version },
            "spec": { "service": { "uid": uid }, "retainUntil": null }
        });
        api.patch(
            &claim_name(ip),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(ClaimResult::Ours)
}

/// Deletes the claim of `ip` if it still belongs to `uid` (never someone else's).
pub async fn release(api: &Api<AddressClaim>, claim: &AddressClaim) -> kube::Result<()> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api
        .delete(&claim.metadata.name.clone().unwrap_or_default(), &dp)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Keeps the address for the Service's namespace/name until `until`: the Service is gone,
/// the address is not handed to anyone else, and a re-created Service gets it back.
pub async fn retain(
    api: &Api<AddressClaim>,
    claim: &AddressClaim,
    until: Timestamp,
) -> kube::Result<()> {
    let patch = json!({
        "metadata": { "resourceVersion": claim.metadata.resource_version },
        "spec": { "service": { "uid": "" }, "retainUntil": until.to_string() }
    });
    api.patch(
        &claim.metadata.name.clone().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_object_names() {
        assert_eq!(claim_name(&"192.0.2.1".parse().unwrap()), "192.0.2.1");
        assert_eq!(claim_name(&"2001:db8::1".parse().unwrap()), "2001-db8--1");
    }

    #[test]
    fn expiry() {
        let mut c = AddressClaim::new(
            "192.0.2.1",
            AddressClaimSpec {
                address: "192.0.2.1".into(),
                pool: "default".into(),
                service: ClaimedBy {
                    namespace: "ns".into(),
                    name: "svc".into(),
                    uid: String::new(),
                },
                retain_until: None,
            },
        );
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        assert!(!c.expired(now));
        c.spec.retain_until = Some("2025-12-31T23:59:59Z".into());
        assert!(c.expired(now));
        c.spec.retain_until = Some("2026-01-01T00:00:01Z".into());
        assert!(!c.expired(now));
        assert_eq!(c.owner_key(), "ns/svc");
    }
}
