//! The audit's I/O: one read-only [`Snapshot`] of the cluster (Services, Nodes,
//! EndpointSlices, AddressClaims, AddressPools) and of every loxilb of the fleet, as the
//! controller finds them (`crate::config::sources`: `--loxilb-url`, discovered, `LoxiURL`
//! resources): its rule listing, and the BGP advertisement counts where the loxilb exposes
//! them. Nothing is written: the
//! loxilb clients carry a write gate that refuses every write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use loxi_domain::pools::{merge_pools, validate_pool};
use loxilb_client::LoxilbClient;
use loxilb_client::convert::from_entry;

use super::checks::{GatewaySnapshot, InstanceSnapshot, Snapshot};
use crate::config::Config;
use crate::egress::crds::Egress;
use crate::ipam::address_pools::{AddressPool, cidrpool_spec, to_spec, with_cidrpools};
use crate::ipam::claims::AddressClaim;
use crate::k8s::pod::PodView;
use crate::k8s::view::{NETWORK_STATUS_ANNOTATION, Selection, multus_networks, node_view};
use crate::service::Settings;

/// The pools of kube-loxilb's `LoxiURL` resources of type `cidrpool`, as the controller
/// takes them (`crate::ipam::address_pools::cidrpool_spec`); none without that CRD. Read as
/// untyped objects: the resource's type belongs to the runtime, which the audit does not use.
async fn cidrpools(client: &kube::Client) -> Vec<loxi_domain::pools::PoolSpec> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("loxiurl.loxilb.io", "v1", "LoxiURL");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "loxiurls");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter(|o| o.data["spec"]["type"].as_str().map(str::trim) == Some("cidrpool"))
        .filter_map(|o| {
            let name = o.metadata.name.as_deref()?;
            let cidrs = o.data["spec"]["loxiURL"].as_str()?;
            Some(cidrpool_spec(name, cidrs))
        })
        .collect()
}

/// Upper bound for one loxilb listing.
const LOXILB_TIMEOUT: Duration = Duration::from_secs(30);

fn scoped<K>(client: &kube::Client, cfg: &Config) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Reads everything the checks need. Fails when the API server cannot be read (a loxilb that
/// cannot be listed is recorded as such instead: the audit notes it).
pub async fn snapshot(client: &kube::Client, cfg: &Config) -> anyhow::Result<Snapshot> {
    let cluster = crate::k8s::api::cluster_id(client, cfg.cluster_id.as_ref())
        .await?
        .for_controller(&cfg.controller);
    let lp = ListParams::default();
    let services = scoped::<Service>(client, cfg)
        .list(&lp)
        .await
        .context("listing Services")?
        .items;
    let nodes = Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .context("listing Nodes")?
        .items;
    let endpoint_slices = scoped::<EndpointSlice>(client, cfg)
        .list(&lp)
        .await
        .context("listing EndpointSlices")?
        .items;
    let mut pod_networks = HashMap::new();
    if cfg.multus {
        let pods: Api<Pod> = scoped(client, cfg);
        for p in pods.list_metadata(&lp).await.context("listing Pods")?.items {
            if let Some(a) = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NETWORK_STATUS_ANNOTATION))
            {
                pod_networks.insert(
                    (
                        p.metadata.namespace.clone().unwrap_or_default(),
                        p.metadata.name.clone().unwrap_or_default(),
                    ),
                    multus_networks(a),
                );
            }
        }
    }
    let claims = Api::<AddressClaim>::all(client.clone())
        .list(&lp)
        .await
        .context("listing AddressClaims")?
        .items;
    // As the controller: a pool being deleted is gone already; without the CRD, flag pools.
    let resources = match Api::<AddressPool>::all(client.clone()).list(&lp).await {
        Ok(list) => list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    validate_pool(&to_spec(p)),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    let resources = with_cidrpools(resources, &cidrpools(client).await);
    let pools = merge_pools(&cfg.pools, &cfg.secondary_pools, resources);

    // With --egress, the Egresses (when their kind is served) and the pods they select.
    let egresses = if cfg.egress {
        match scoped::<Egress>(client, cfg).list(&lp).await {
            Ok(list) => {
                let pods = scoped::<PodView>(client, cfg)
                    .list(&lp)
                    .await
                    .context("listing Pods")?
                    .items;
                Some(crate::egress::inputs(list.items.iter(), pods.iter()))
            }
            Err(e) if crate::k8s::served::not_installed(&e) => None,
            Err(e) => return Err(e).context("listing Egresses"),
        }
    } else {
        None
    };
    let gateways = match &cfg.gateway_class {
        Some(controller_name) => gateway_snapshot(client, controller_name).await?,
        None => None,
    };
    // Every loxilb of the fleet: --loxilb-url, discovered, LoxiURL resources.
    let loxilbs = crate::config::sources::loxilbs(client, cfg).await?;
    let mut instances = Vec::new();
    for c in &loxilbs {
        let mut snapshot = instance(c.client.clone(), cfg.bgp.is_some()).await;
        snapshot.group = c.group.clone();
        instances.push(snapshot);
    }
    Ok(Snapshot {
        cluster,
        selection: Selection::new(&cfg.class, cfg.ccm_mode, cfg.controller.clone()),
        settings: Settings::of(cfg),
        services,
        nodes: nodes.iter().map(node_view).collect(),
        endpoint_slices,
        pod_networks,
        claims,
        pools,
        instances,
        roles: cfg.roles.clone(),
        egresses,
        gateways,
    })
}

/// Every object of `K` in the cluster; `None` when its kind is not served (a CRD not
/// installed).
async fn list_all<K>(client: &kube::Client) -> anyhow::Result<Option<Vec<K>>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    match Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(Some(list.items)),
        Err(e) if crate::k8s::served::not_installed(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("listing {}", K::kind(&Default::default()))),
    }
}

/// With `--gatewayAPI`: the Gateway API objects, every Service and EndpointSlice (backends
/// of any namespace) and the Namespaces' labels; `None` when the Gateway kind is not served.
/// A route kind that is not served counts as none of it.
async fn gateway_snapshot(
    client: &kube::Client,
    controller_name: &str,
) -> anyhow::Result<Option<GatewaySnapshot>> {
    use crate::gateway::types::{
        Gateway, GatewayClass, HTTPRoute, ReferenceGrant, TCPRoute, UDPRoute,
    };
    let Some(gateways) = list_all::<Gateway>(client).await? else {
        return Ok(None);
    };
    let namespaces = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .context("listing Namespaces")?
        .items;
    Ok(Some(GatewaySnapshot {
        controller_name: controller_name.to_string(),
        classes: list_all::<GatewayClass>(client).await?.unwrap_or_default(),
        gateways,
        tcp_routes: list_all::<TCPRoute>(client).await?.unwrap_or_default(),
        udp_routes: list_all::<UDPRoute>(client).await?.unwrap_or_default(),
        http_routes: list_all::<HTTPRoute>(client).await?.unwrap_or_default(),
        grants: list_all::<ReferenceGrant>(client)
            .await?
            .unwrap_or_default(),
        services: list_all::<Service>(client).await?.unwrap_or_default(),
        endpoint_slices: list_all::<EndpointSlice>(client).await?.unwrap_or_default(),
        namespace_labels: namespaces
            .into_iter()
            .map(|n| {
                (
                    n.metadata.name.unwrap_or_default(),
                    n.metadata.labels.unwrap_or_default(),
                )
            })
            .collect(),
    }))
}

/// One loxilb: its rules (read back into the domain model) and, with BGP, its advertisement
/// counts where it exposes them.
async fn instance(cfg: loxilb_client::ClientConfig, bgp: bool) -> InstanceSnapshot {
    let url = cfg.url.clone();
    let client = match LoxilbClient::new(cfg) {
        // Read-only: any write would be refused before it is sent.
        Ok(c) => c.with_write_gate(Arc::new(|| false)),
        Err(e) => {
            return InstanceSnapshot {
                url,
                group: String::new(),
                ha_states: None,
                rules: Err(e.to_string()),
                advertisements: None,
                firewall: None,
            };
        }
    };
    let url = client.url().to_string();
    let rules =
        match tokio::time::timeout(LOXILB_TIMEOUT, client.list_rules_map(|e| from_entry(&e))).await
        {
            Ok(Ok(listing)) => Ok(listing.items),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", LOXILB_TIMEOUT.as_secs())),
        };
    let advertisements = if bgp && rules.is_ok() {
        client.simulator_advertisements().await.ok().flatten()
    } else {
        None
    };
    let ha_states = match tokio::time::timeout(LOXILB_TIMEOUT, client.cluster_states()).await {
        Ok(Ok(states)) => Some(states.into_iter().map(|s| (s.instance, s.state)).collect()),
        _ => None,
    };
    let firewall = match tokio::time::timeout(LOXILB_TIMEOUT, client.list_firewall()).await {
        Ok(listed) => Some(listed.map_err(|e| e.to_string())),
        Err(_) => Some(Err(format!(
            "no answer within {}s",
            LOXILB_TIMEOUT.as_secs()
        ))),
    };
    InstanceSnapshot {
        url,
        group: String::new(),
        ha_states,
        rules,
        advertisements,
        firewall,
    }
}
