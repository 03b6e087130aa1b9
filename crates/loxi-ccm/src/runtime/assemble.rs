//! The controller's parts built from the configuration, in the order `super::run` needs
//! them: the loxilbs (every write gated by the Lease), the watches and their stores, the
//! fleet, the Service reconcile's context, and the optional Egress and metadata senders
//! with the replay that a restarted loxilb gets.

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use loxi_domain::ClusterId;
use tokio::sync::mpsc;

use crate::bgp::{Bgp, Resources as BgpResources};
use crate::config::Config;
use crate::egress::{self, Egresses};
use crate::fleet::record::ConfigMapRecord;
use crate::fleet::roles::Roles;
use crate::fleet::{self, Fleet};
use crate::ipam::address_pools::Pools;
use crate::ipam::{self, Ipam};
use crate::k8s::events::EventRecorder;
use crate::k8s::view::Selection;
use crate::k8s_metadata::{self, K8sMetadata};
use crate::leader::{Gate, WriteLease};
use crate::loxilb::Fleet as Instances;
use crate::metrics::Metrics;
use crate::service::backoff::Backoff;
use crate::service::departures::{Departures, Injected, Relisted};
use crate::service::inputs::{InputWatches, Inputs};
use crate::service::reporter::Report;
use crate::service::rules_first::RulesFirst;
use crate::service::watch::Deletion;
use crate::service::{self, Context};

/// The configured loxilbs (`--loxilb-url`), each write asking the Lease first, at the moment
/// it is sent.
pub(super) fn loxilb_instances(
    cfg: &Config,
    write_lease: &WriteLease,
    cluster: &ClusterId,
) -> anyhow::Result<Instances> {
    let mut clients = Vec::new();
    for c in &cfg.loxilb {
        let client = fleet::members::gated_client(c.client.clone(), write_lease)?;
        clients.push((c.group.clone(), client));
    }
    let instances = Instances::with_capacity(clients, cfg.loxilb_max_rules, cluster);
    instances.set_parallel_calls(usize::from(cfg.concurrency));
    instances.set_write_window(cfg.loxilb_write_window);
    instances.set_gone_after(cfg.loxilb_gone_after);
    instances.set_append_endpoints(cfg.append_endpoints);
    Ok(instances)
}

/// The watches the controller reads: their stores and APIs go into the context; their event
/// streams are consumed by the tasks `super::tasks` starts.
pub(super) struct Watches {
    pub services: Api<Service>,
    pub selection: Selection,
    /// The reconcile loop over the Service watch's events.
    pub controller: Controller<Service>,
    pub service_store: Store<Service>,
    /// The Service watch filters by type (`service::departures`).
    pub filtered: bool,
    pub inject: mpsc::UnboundedSender<Injected>,
    pub relisted: Relisted,
    pub deletions: mpsc::UnboundedReceiver<Deletion>,
    pub inputs: InputWatches,
    pub ipam: ipam::watch::Watches,
    /// kube-loxilb's BGP resources (`--bgp-crds`), taken by the BGP subsystem.
    pub bgp_resources: Option<BgpResources>,
    pub bgp: Vec<BoxFuture<'static, ()>>,
}

impl Watches {
    pub async fn start(client: &kube::Client, cfg: &Config) -> anyhow::Result<Watches> {
        let services: Api<Service> = match &cfg.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let selection = Selection::new(&cfg.class, cfg.ccm_mode, cfg.controller.clone());
        let watched = service::watch::watch(&services, &selection).await;
        let controller = Controller::for_stream(watched.events, watched.store.clone())
            .with_config(kube::runtime::controller::Config::default().concurrency(cfg.concurrency));
        let inputs = service::inputs::watch(client, cfg.namespace.as_deref(), cfg.multus);
        let ipam = ipam::watch::watch(client)
            .await
            .map_err(anyhow::Error::msg)?;
        // kube-loxilb's BGP resources (--bgp-crds): CRDs not installed yet are waited for.
        let (bgp_resources, bgp) = if cfg.bgp.is_some() && cfg.bgp_crds {
            let (resources, watches) = BgpResources::watch(client).await;
            (Some(resources), watches)
        } else {
            (None, Vec::new())
        };
        Ok(Watches {
            services,
            selection,
            controller,
            service_store: watched.store,
            filtered: watched.filtered,
            inject: watched.inject,
            relisted: watched.relisted,
            deletions: watched.deletions,
            inputs,
            ipam,
            bgp_resources,
            bgp,
        })
    }
}

/// The Service reconcile's context and the fleet it places Services on (built, not started).
pub(super) fn context(
    client: kube::Client,
    cfg: &Config,
    cluster: ClusterId,
    gate: Arc<Gate>,
    instances: Instances,
    watches: &mut Watches,
    requeue_tx: mpsc::UnboundedSender<ObjectRef<Service>>,
) -> (Arc<Context>, Fleet) {
    let reporter = Reporter {
        controller: cfg.controller.suffixed("loxi-ccm"),
        instance: std::env::var("POD_NAME").ok(),
    };
    let metrics = Metrics::new();
    let recorder = EventRecorder::new(client.clone(), reporter, metrics.events_dropped());
    let ipam = address_index(cfg, &watches.ipam, requeue_tx.clone(), metrics.clone());
    let bgp = cfg.bgp.clone().map(|settings| {
        let resources = watches.bgp_resources.take();
        Arc::new(Bgp::new(
            settings,
            resources,
            recorder.clone(),
            metrics.clone(),
        ))
    });
    let fleet = fleet(
        &client,
        cfg,
        &cluster,
        &metrics,
        bgp,
        instances,
        gate.clone(),
    );
    let inputs = &watches.inputs;
    let ctx = Arc::new(Context {
        report: Report::new(
            recorder,
            metrics,
            cfg.controller.suffixed(crate::k8s::api::FIELD_MANAGER),
        ),
        settings: service::Settings::of(cfg),
        selection: watches.selection.clone(),
        kube: client,
        cluster,
        inputs: Inputs::new(
            watches.service_store.clone(),
            inputs.node_store.clone(),
            inputs.slice_store.clone(),
            inputs.pod_store.clone(),
        ),
        ipam,
        fleet: fleet.instances(),
        gate,
        backoff: Backoff::default(),
        room_requeue: service::context::room_requeue(requeue_tx.clone()),
        requeue: requeue_tx,
        departures: Departures::new(
            watches.filtered,
            watches.inject.clone(),
            watches.relisted.clone(),
        ),
        teardown: RulesFirst::new(usize::from(cfg.concurrency)),
        placement: fleet.placement(),
    });
    (ctx, fleet)
}

/// The address index over the pools (flags and AddressPools) and the claims.
fn address_index(
    cfg: &Config,
    watches: &ipam::watch::Watches,
    requeue_tx: mpsc::UnboundedSender<ObjectRef<Service>>,
    metrics: Metrics,
) -> Arc<Ipam> {
    Arc::new(Ipam::new(
        ipam::Settings {
            pools: cfg.pools.clone(),
            secondary_pools: cfg.secondary_pools.clone(),
            unique_ip: cfg.unique_ip,
            namespace: cfg.namespace.clone(),
            zone: cfg.zone.clone(),
            controller: cfg.controller.clone(),
        },
        Pools::new(
            watches.pools_api.clone(),
            watches.pool_store.clone(),
            watches.namespace_store.clone(),
        ),
        watches.claim_store.clone(),
        watches.claims_api.clone(),
        requeue_tx,
        metrics,
    ))
}

/// The loxilb fleet: the configured loxilbs, their HA roles and BGP, and its records.
fn fleet(
    client: &kube::Client,
    cfg: &Config,
    cluster: &ClusterId,
    metrics: &Metrics,
    bgp: Option<Arc<Bgp>>,
    instances: Instances,
    gate: Arc<Gate>,
) -> Fleet {
    let roles = cfg.roles.clone().map(|settings| {
        let (namespace, name) = &cfg.roles_record;
        let record =
            ConfigMapRecord::shared(client.clone(), namespace, name, fleet::roles::MANAGER);
        Arc::new(Roles::new(settings, cfg.ha_bgp_hold, record))
    });
    Fleet::new(
        fleet::Settings {
            cluster: cluster.clone(),
            metrics: metrics.clone(),
            interval: cfg.health_interval,
            zone: cfg.zone.clone(),
            zone_instances: cfg.zone_instances,
            template: cfg.loxilb_template.clone(),
            bgp,
            roles,
            record: ConfigMapRecord::shared(
                client.clone(),
                &cfg.fleet_record.0,
                &cfg.fleet_record.1,
                fleet::record::MANAGER,
            ),
        },
        instances,
        gate,
    )
}

/// kube-loxilb's Egress resource (`--egress`): its sender and its watches.
pub(super) type EgressWiring = (Arc<Egresses>, Vec<BoxFuture<'static, ()>>);
/// kube-loxilb's `--enableK8sMetadata`: its sender and its Pod watch.
pub(super) type MetadataWiring = (Arc<K8sMetadata>, BoxFuture<'static, ()>);

/// The optional senders besides the Service rules: the Egresses' SNAT rules (watched, and
/// replayed with every loxilb's rules after it restarted) and the Kubernetes metadata (off:
/// not even its Pod watch exists).
pub(super) async fn senders(
    ctx: &Context,
    cfg: &Config,
) -> (Option<EgressWiring>, Option<MetadataWiring>) {
    let egresses = if cfg.egress {
        let recorder = ctx.report.recorder.clone();
        let metrics = ctx.report.metrics.clone();
        let namespace = cfg.namespace.as_deref();
        Some(Egresses::watch(&ctx.kube, namespace, &ctx.cluster, recorder, metrics).await)
    } else {
        None
    };
    let metadata = cfg.k8s_metadata.then(|| {
        K8sMetadata::watch(
            &ctx.kube,
            cfg.namespace.as_deref(),
            ctx.inputs.services.clone(),
            ctx.inputs.nodes.clone(),
            ctx.selection.clone(),
            ctx.report.metrics.clone(),
        )
    });
    (egresses, metadata)
}

/// The Gateways' rules as their passes decided them (`--gatewayAPI`), for the replay.
pub(super) fn gateway_decided(ctx: &Context, cfg: &Config) -> Option<Arc<crate::gateway::Decided>> {
    cfg.gateway_class.as_ref().map(|_| {
        crate::gateway::Decided::new(
            crate::gateway::rule_owner(&ctx.cluster),
            cfg.zone.clone(),
            ctx.report.metrics.clone(),
        )
    })
}

/// What a restarted loxilb gets back: every Service's rules, then the Egresses', the
/// metadata and the Gateways' rules when they are on.
pub(super) fn replay(
    ctx: &Arc<Context>,
    egresses: &Option<EgressWiring>,
    metadata: &Option<MetadataWiring>,
    gateways: &Option<Arc<crate::gateway::Decided>>,
) -> fleet::workers::Replay {
    let replay = service::drift::replay(ctx.clone());
    let replay: fleet::workers::Replay = match egresses {
        Some((egresses, _)) => egress::with_replay(egresses.clone(), replay),
        None => replay,
    };
    let replay: fleet::workers::Replay = match metadata {
        Some((metadata, _)) => k8s_metadata::with_replay(metadata.clone(), replay),
        None => replay,
    };
    match gateways {
        Some(decided) => crate::gateway::with_replay(decided.clone(), replay),
        None => replay,
    }
}
