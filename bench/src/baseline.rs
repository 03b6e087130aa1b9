//! The baseline: the least work any controller must do for the same Services, in process,
//! with the same client settings and concurrency as loxi-ccm's defaults.
//!
//! Triggered by a watch on the namespace's Services (so it pays the watch too). Per new
//! Service: one finalizer merge patch, one durable address claim (an `AddressClaim` created
//! before the address is used, as docs/architecture.md#invariants requires of any correct
//! controller), two rule POSTs (32 endpoints each, the same subset loxi-ccm picks, with
//! loxilb-client's `apply_rule`), one server-side-apply status patch with a sequential
//! ingress IP. Per deleted Service: two rule DELETEs, the claim's deletion and one finalizer
//! merge patch. No Events, no conditions, no re-planning, no bookkeeping beyond a name ->
//! rules map. It watches no Node: the benchmark tells it of a Node change
//! ([`Baseline::reprogram`]) as it tells it of a loxilb restart ([`Baseline::replay`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use loxi_domain::selection::stable_subset;
use loxi_domain::{ClusterId, Protocol, RuleName};
use loxilb_client::dto::{EndpointEntry, LoadbalanceEntry, ServiceArguments};
use loxilb_client::{ClientConfig, LoxilbClient};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

pub const FINALIZER: &str = "bench.loxilb.io/cleanup";
const FIELD_MANAGER: &str = "loxi-bench-baseline";
const MAX_ENDPOINTS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Working,
    Programmed,
    Cleaning,
    Done,
    Failed,
}

struct Shared {
    api: Api<Service>,
    namespace: String,
    /// `AddressClaim`s (ipam.loxilb.io/v1alpha1), untyped: the baseline knows nothing of
    /// loxi-ccm's code.
    claims: Api<DynamicObject>,
    claim_resource: ApiResource,
    lb: LoxilbClient,
    cluster: ClusterId,
    node_ips: Vec<IpAddr>,
    first_ip: u32,
    next_ip: AtomicU32,
    permits: Arc<Semaphore>,
    phase: Mutex<HashMap<String, Phase>>,
    rules: Mutex<HashMap<String, Vec<LoadbalanceEntry>>>,
}

pub struct Baseline {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
    concurrency: usize,
}

impl Baseline {
    pub fn start(
        client: &kube::Client,
        namespace: &str,
        loxilb_url: &str,
        node_ips: Vec<IpAddr>,
        first_ip: Ipv4Addr,
        concurrency: usize,
    ) -> Result<Baseline> {
        let claim_resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ipam.loxilb.io", "v1alpha1", "AddressClaim"),
            "addressclaims",
        );
        let shared = Arc::new(Shared {
            api: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_string(),
            claims: Api::all_with(client.clone(), &claim_resource),
            claim_resource,
            lb: LoxilbClient::new(ClientConfig::new(loxilb_url))?,
            cluster: ClusterId::new("bench").map_err(anyhow::Error::msg)?,
            node_ips,
            first_ip: u32::from(first_ip),
            next_ip: AtomicU32::new(0),
            permits: Arc::new(Semaphore::new(concurrency)),
            phase: Mutex::default(),
            rules: Mutex::default(),
        });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            let api = s.api.clone();
            let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) => {
                        s.clone().on_change(svc);
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("loxi-bench baseline: watch error: {e}"),
                }
            }
        });
        Ok(Baseline {
            shared,
            task,
            concurrency,
        })
    }

    /// Services that failed (errors are printed as they happen).
    pub fn failures(&self) -> usize {
        self.shared
            .phase
            .lock()
            .map(|p| p.values().filter(|x| **x == Phase::Failed).count())
            .unwrap_or(0)
    }

    /// Re-POSTs every rule it has programmed (what a replay after a loxilb restart must do).
    pub async fn replay(&self) -> Result<usize> {
        let all: Vec<LoadbalanceEntry> = self
            .shared
            .rules
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .values()
            .flatten()
            .cloned()
            .collect();
        self.post_all(all).await
    }

    /// Re-POSTs every rule it has programmed with the endpoints `node_ips` give (what a Node
    /// deleted or added asks of any controller when every rule forwards to every Node: one
    /// update per rule); the rules written.
    pub async fn reprogram(&self, node_ips: &[IpAddr]) -> Result<usize> {
        let all: Vec<LoadbalanceEntry> = {
            let mut rules = self
                .shared
                .rules
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?;
            for (name, list) in rules.iter_mut() {
                let chosen = stable_subset(
                    &format!("{}/{name}", self.shared.namespace),
                    node_ips,
                    MAX_ENDPOINTS,
                );
                for rule in list.iter_mut() {
                    let node_port = rule.endpoints.first().map_or(0, |e| e.target_port);
                    rule.endpoints = endpoints(&chosen, node_port);
                }
            }
            rules.values().flatten().cloned().collect()
        };
        self.post_all(all).await
    }

    /// POSTs `rules`, as many in flight as Services are worked on at once.
    async fn post_all(&self, rules: Vec<LoadbalanceEntry>) -> Result<usize> {
        let n = rules.len();
        let lb = &self.shared.lb;
        futures::stream::iter(rules)
            .map(move |rule| async move { lb.apply_rule(&rule).await })
            .buffer_unordered(self.concurrency)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        Ok(n)
    }
}

/// One endpoint per chosen Node, `NodeIP:NodePort`, weight 1.
fn endpoints(chosen: &[IpAddr], node_port: u16) -> Vec<EndpointEntry> {
    chosen
        .iter()
        .map(|ip| EndpointEntry {
            endpoint_ip: ip.to_string(),
            target_port: node_port,
            weight: 1,
            ..EndpointEntry::default()
        })
        .collect()
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    fn set(&self, name: &str, p: Phase) {
        if let Ok(mut m) = self.phase.lock() {
            m.insert(name.to_string(), p);
        }
    }

    fn on_change(self: Arc<Self>, svc: Service) {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let deleting = svc.metadata.deletion_timestamp.is_some();
        let has_finalizer = svc
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER));
        let job = {
            let Ok(mut phases) = self.phase.lock() else {
                return;
            };
            match (phases.get(&name).copied(), deleting) {
                (None, false) if !has_finalizer => {
                    phases.insert(name.clone(), Phase::Working);
                    Some(false)
                }
                (Some(Phase::Programmed), true) if has_finalizer => {
                    phases.insert(name.clone(), Phase::Cleaning);
                    Some(true)
                }
                _ => None,
            }
        };
        let Some(cleanup) = job else { return };
        tokio::spawn(async move {
            let Ok(_permit) = self.permits.clone().acquire_owned().await else {
                return;
            };
            let result = if cleanup {
                self.cleanup(&svc).await
            } else {
                self.setup(&svc).await
            };
            match result {
                Ok(()) => self.set(
                    &name,
                    if cleanup {
                        Phase::Done
                    } else {
                        Phase::Programmed
                    },
                ),
                Err(e) => {
                    eprintln!("loxi-bench baseline: {name}: {e:#}");
                    self.set(&name, Phase::Failed);
                }
            }
        });
    }

    async fn setup(&self, svc: &Service) -> Result<()> {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        self.api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {
                    "finalizers": [FINALIZER],
                    "resourceVersion": svc.metadata.resource_version,
                }})),
            )
            .await
            .context("finalizer")?;
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        let vip = IpAddr::V4(Ipv4Addr::from(self.first_ip + n));
        let claim = DynamicObject::new(&vip.to_string(), &self.claim_resource).data(json!({
            "spec": {
                "address": vip.to_string(),
                "pool": "baseline",
                "service": {
                    "namespace": ns,
                    "name": name,
                    "uid": svc.metadata.uid.clone().unwrap_or_default(),
                },
            }
        }));
        self.claims
            .create(&PostParams::default(), &claim)
            .await
            .context("claim")?;
        let chosen = stable_subset(&format!("{ns}/{name}"), &self.node_ips, MAX_ENDPOINTS);
        let mut rules = Vec::new();
        for p in svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
        {
            let port = u16::try_from(p.port)?;
            let node_port = u16::try_from(p.node_port.unwrap_or(0))?;
            // The wire form directly (what loxi-ccm's planner + to_entry produce for a
            // default-mode TCP port), so domain-model changes do not touch the baseline.
            rules.push(LoadbalanceEntry {
                service_arguments: ServiceArguments {
                    external_ip: vip.to_string(),
                    port,
                    protocol: "tcp".into(),
                    managed: true,
                    name: RuleName::new(&self.cluster, &ns, &name, port, Protocol::Tcp).to_string(),
                    ..ServiceArguments::default()
                },
                endpoints: endpoints(&chosen, node_port),
                ..LoadbalanceEntry::default()
            });
        }
        for rule in &rules {
            self.lb.apply_rule(rule).await.context("POST")?;
        }
        if let Ok(mut m) = self.rules.lock() {
            m.insert(name.clone(), rules);
        }
        self.api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(json!({
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name},
                    "status": {"loadBalancer": {"ingress": [{"ip": vip.to_string()}]}},
                })),
            )
            .await
            .context("status")?;
        Ok(())
    }

    async fn cleanup(&self, svc: &Service) -> Result<()> {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let rules = self
            .rules
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&name))
            .unwrap_or_default();
        for r in &rules {
            let a = &r.service_arguments;
            self.lb
                .delete_rule(&a.external_ip, a.port, &a.protocol, false)
                .await
                .context("DELETE")?;
        }
        if let Some(r) = rules.first() {
            self.claims
                .delete(&r.service_arguments.external_ip, &DeleteParams::default())
                .await
                .context("claim deletion")?;
        }
        self.api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {
                    "finalizers": [],
                    "resourceVersion": svc.metadata.resource_version,
                }})),
            )
            .await
            .context("finalizer removal")?;
        Ok(())
    }
}
