//! The cluster side of the benchmark: Nodes, Services, a watch that timestamps what the
//! controller publishes, and the loxilb simulator.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use loxilb_sim::Simulator;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

pub const CLASS: &str = "loxilb.io/loxilb";
pub const LABEL: &str = "loxi-bench";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One benchmark Node.
#[derive(Debug, Clone)]
pub struct BenchNode {
    pub name: String,
    pub ip: IpAddr,
}

/// Creates `count` Nodes with an InternalIP and `Ready=True` (no kubelet runs: nothing
/// else ever changes them).
pub async fn create_nodes(client: &kube::Client, count: usize) -> Result<Vec<BenchNode>> {
    let mut nodes = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("bench-node-{i:03}");
        let octet3 = u8::try_from(i / 250).context("too many nodes")?;
        let octet4 = u8::try_from(i % 250 + 1).context("too many nodes")?;
        let node = BenchNode {
            name,
            ip: IpAddr::V4(Ipv4Addr::new(10, 240, octet3, octet4)),
        };
        create_node(client, &node).await?;
        nodes.push(node);
    }
    Ok(nodes)
}

/// Creates `node` as a Ready Node with its InternalIP (as a kubelet would report it).
pub async fn create_node(client: &kube::Client, node: &BenchNode) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let name = &node.name;
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": LABEL}}
        }))?,
    )
    .await
    .with_context(|| format!("creating node {name}"))?;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "addresses": [
                {"type": "InternalIP", "address": node.ip.to_string()},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [ready_condition(true)],
        }})),
    )
    .await
    .with_context(|| format!("node {name} status"))?;
    Ok(())
}

pub async fn delete_node(client: &kube::Client, name: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .delete(name, &Default::default())
        .await
        .with_context(|| format!("deleting node {name}"))?;
    Ok(())
}

fn ready_condition(ready: bool) -> Value {
    json!({
        "type": "Ready",
        "status": if ready { "True" } else { "False" },
        "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
        "message": "set by loxi-bench",
    })
}

/// Flips a Node's Ready condition (a JSON merge patch of `status.conditions`).
pub async fn set_node_ready(client: &kube::Client, name: &str, ready: bool) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [ready_condition(ready)]}})),
        )
        .await
        .with_context(|| format!("flipping node {name}"))?;
    Ok(())
}

pub async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(name).await?.is_none() {
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    }
    Ok(())
}

/// A LoadBalancer Service of our class with `ports` TCP ports.
pub fn lb_service(name: &str, ports: usize) -> Result<Service> {
    let ports: Vec<Value> = (0..ports)
        .map(|i| json!({"name": format!("p{i}"), "port": 8000 + i, "protocol": "TCP"}))
        .collect();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": LABEL}},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": CLASS,
            "selector": {"app": name},
            "ports": ports,
        }
    }))?)
}

/// A ClusterIP Service (not ours: only watched and cached by the controller).
pub fn cluster_ip_service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": LABEL}},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))?)
}

pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// Creates Services with at most `concurrency` requests in flight, as fast as the API
/// server accepts them. `mark` is called right before each request is sent.
pub async fn create_burst(
    api: &Api<Service>,
    objects: Vec<Service>,
    concurrency: usize,
    tracker: Option<&Tracker>,
) -> Result<Duration> {
    let started = Instant::now();
    futures::stream::iter(objects)
        .map(move |svc| async move {
            let name = svc.metadata.name.clone().unwrap_or_default();
            if let Some(t) = tracker {
                t.mark_sent(&name);
            }
            api.create(&PostParams::default(), &svc)
                .await
                .with_context(|| format!("creating service {name}"))
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(started.elapsed())
}

/// Creates Services at a fixed rate (each create is its own task, so a slow answer does not
/// delay the next one).
pub async fn create_at_rate(
    api: &Api<Service>,
    objects: Vec<Service>,
    per_second: f64,
    tracker: &Tracker,
) -> Result<Duration> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second));
    let mut tasks = Vec::with_capacity(objects.len());
    for svc in objects {
        tick.tick().await;
        let name = svc.metadata.name.clone().unwrap_or_default();
        tracker.mark_sent(&name);
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            api.create(&PostParams::default(), &svc)
                .await
                .with_context(|| format!("creating service {name}"))
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// Deletes the named Services with at most `concurrency` requests in flight.
pub async fn delete_all(api: &Api<Service>, names: &[String], concurrency: usize) -> Result<()> {
    futures::stream::iter(names.iter())
        .map(move |name| async move {
            api.delete(name, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting service {name}"))
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await
}

/// What a Service looked like at one moment.
#[derive(Debug, Clone)]
pub struct Seen {
    pub ip: Option<String>,
    pub resource_version: String,
    /// `manager operation subresource time` of every managedFields entry.
    pub managed: Vec<String>,
    /// `type=status reason: message` of every status condition.
    pub conditions: Vec<String>,
}

/// name -> state of every Service in the namespace.
pub async fn snapshot(api: &Api<Service>) -> Result<HashMap<String, Seen>> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|s| {
            let managed = s
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .map(|m| {
                    format!(
                        "{} {} {} {}",
                        m.manager.as_deref().unwrap_or("?"),
                        m.operation.as_deref().unwrap_or("?"),
                        m.subresource.as_deref().unwrap_or("-"),
                        m.time.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
                    )
                })
                .collect();
            (
                s.metadata.name.clone().unwrap_or_default(),
                Seen {
                    ip: first_ingress_ip(&s),
                    resource_version: s.metadata.resource_version.clone().unwrap_or_default(),
                    managed,
                    conditions: s
                        .status
                        .as_ref()
                        .and_then(|st| st.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|c| {
                            format!(
                                "{}={} {}: {} (since {})",
                                c.type_, c.status, c.reason, c.message, c.last_transition_time.0
                            )
                        })
                        .collect(),
                },
            )
        })
        .collect())
}

pub fn first_ingress_ip(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

#[derive(Debug, Default)]
struct Track {
    sent: Option<Instant>,
    ip_seen: Option<Instant>,
    deleted: Option<Instant>,
}

#[derive(Debug, Default)]
struct TrackState {
    items: HashMap<String, Track>,
    with_ip: usize,
    deleted: usize,
    synced: bool,
    /// Last add/modify/delete seen after the initial listing.
    last_change: Option<Instant>,
    /// Adds and modifications seen after the initial listing (each is one write).
    changes: usize,
    /// Names seen by a re-list in progress.
    relisted: Option<HashSet<String>>,
}

/// Watches the Services of one namespace and timestamps, per Service, when its create was
/// sent, when an ingress IP was first observed and when the object disappeared. Clones share
/// the state; the watch stops when the first one is dropped.
#[derive(Clone)]
pub struct Tracker {
    state: Arc<Mutex<TrackState>>,
    task: Arc<JoinHandle<()>>,
}

impl Tracker {
    pub async fn start(client: &kube::Client, namespace: &str) -> Result<Tracker> {
        let api: Api<Service> = Api::namespaced(client.clone(), namespace);
        let state = Arc::new(Mutex::new(TrackState::default()));
        let s = state.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Some(ev) = stream.next().await {
                let now = Instant::now();
                let mut st = lock(&s);
                match ev {
                    Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) => {
                        if st.synced {
                            st.last_change = Some(now);
                            st.changes += 1;
                        }
                        let name = svc.metadata.name.clone().unwrap_or_default();
                        if let Some(listed) = st.relisted.as_mut() {
                            listed.insert(name.clone());
                        }
                        if first_ingress_ip(&svc).is_some() {
                            let t = st.items.entry(name).or_default();
                            if t.ip_seen.is_none() {
                                t.ip_seen = Some(now);
                                st.with_ip += 1;
                            }
                        }
                    }
                    Ok(watcher::Event::Delete(svc)) => {
                        st.last_change = Some(now);
                        let name = svc.metadata.name.clone().unwrap_or_default();
                        let t = st.items.entry(name).or_default();
                        if t.deleted.is_none() {
                            t.deleted = Some(now);
                            st.deleted += 1;
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        // A re-list after a broken watch: what it no longer holds was
                        // deleted meanwhile (no Delete event comes for it).
                        if let Some(listed) = st.relisted.take() {
                            let gone: Vec<String> = st
                                .items
                                .iter()
                                .filter(|(name, t)| {
                                    t.sent.is_some()
                                        && t.deleted.is_none()
                                        && !listed.contains(*name)
                                })
                                .map(|(name, _)| name.clone())
                                .collect();
                            for name in gone {
                                if let Some(t) = st.items.get_mut(&name) {
                                    t.deleted = Some(now);
                                }
                                st.deleted += 1;
                            }
                        }
                        st.synced = true;
                    }
                    Ok(watcher::Event::Init) => {
                        if st.synced {
                            eprintln!("loxi-bench: service watch restarted (re-list)");
                            st.relisted = Some(HashSet::new());
                        }
                    }
                    Err(e) => eprintln!("loxi-bench: service watch error: {e}"),
                }
            }
        });
        let t = Tracker {
            state,
            task: Arc::new(task),
        };
        let st = &t.state;
        crate::stats::wait_until(
            "the service watch to sync",
            Duration::from_secs(60),
            Duration::from_millis(10),
            move || async move { Ok(lock(st).synced) },
        )
        .await?;
        Ok(t)
    }

    pub fn mark_sent(&self, name: &str) {
        let mut st = lock(&self.state);
        st.items.entry(name.to_string()).or_default().sent = Some(Instant::now());
    }

    pub fn with_ip(&self) -> usize {
        lock(&self.state).with_ip
    }

    pub fn deleted(&self) -> usize {
        lock(&self.state).deleted
    }

    /// Creates and modifications of the namespace's Services seen so far (writes by anyone).
    pub fn changes(&self) -> usize {
        lock(&self.state).changes
    }

    /// When a Service of the namespace last changed (after the initial listing).
    pub fn last_change(&self) -> Option<Instant> {
        lock(&self.state).last_change
    }

    /// Create sent -> IP observed, for every Service that has both.
    pub fn latencies(&self) -> Vec<Duration> {
        lock(&self.state)
            .items
            .values()
            .filter_map(|t| Some(t.ip_seen?.saturating_duration_since(t.sent?)))
            .collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The in-process simulator plus a cheap rule counter (`GET /admin/stats` reads a counter;
/// `Simulator::rules()` clones every rule under the simulator's lock).
#[derive(Clone)]
pub struct Sim {
    pub sim: Simulator,
    http: reqwest::Client,
}

impl Sim {
    pub fn new(sim: Simulator) -> Result<Sim> {
        Ok(Sim {
            sim,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
        })
    }

    pub async fn rule_count(&self) -> Result<usize> {
        let v: Value = self
            .http
            .get(format!("{}/admin/stats", self.sim.url()))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(usize::try_from(v["rules"].as_u64().unwrap_or(0))?)
    }

    /// Size of `GET /config/loadbalancer/all`, bytes.
    pub async fn listing_bytes(&self) -> Result<usize> {
        let body = self
            .http
            .get(format!(
                "{}{}/config/loadbalancer/all",
                self.sim.url(),
                loxilb_sim::API_BASE
            ))
            .send()
            .await?
            .error_for_status()?
            .bytes()
            .await?;
        Ok(body.len())
    }

    /// How many stored rules forward to `ip`.
    pub fn rules_with_endpoint(&self, ip: &str) -> usize {
        // Counted in place: copying 2,000 rules of 32 endpoints at every 20 ms poll held the
        // simulator's lock most of the time and slowed the controller being measured.
        match ip.parse() {
            Ok(ip) => self.sim.count_rules_with_endpoint(ip),
            Err(_) => 0,
        }
    }
}
