//! Wiring: starts the subsystems' tasks and connects them (watches and stores, the reconcile
//! loop, the fleet, the drift check, the admin server); no state of its own beyond the
//! readiness flags the admin server reads.

pub mod admin;
mod assemble;
pub mod node_watch;
mod start_up;
mod tasks;
mod watches;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::config::Config;
use crate::leader::{Gate, LeaderElector, WriteLease};
use crate::node_init::NodeInitArgs;
use crate::service::reconcile::{error_policy, reconcile};
use crate::service::{self, Context};

/// What the runtime's own loops and the admin server read, beside the Service reconcile's
/// context.
pub struct Shared {
    pub service: Arc<Context>,
    /// Stores synced (standbys too: their caches are warm).
    pub synced: AtomicBool,
    /// The reconcile loop is running (for /healthz).
    pub running: AtomicBool,
    pub node_init: NodeInitArgs,
}

/// How long a shutdown waits for the reconciles under way before it cancels them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// A shutdown signal that many tasks can wait on.
#[derive(Clone)]
struct Stop(watch::Receiver<bool>);

impl Stop {
    async fn wait(mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

/// Runs the controller until `shutdown` resolves. Returns an error when this replica lost
/// its leadership (the process then exits and restarts as a standby, so no two replicas
/// ever write at once), and, before anything else, when `admin_addr` cannot be listened on.
pub async fn run(
    client: kube::Client,
    cfg: Config,
    admin_addr: Option<std::net::SocketAddr>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    // First of all: without its admin address the controller does not start (no Lease is
    // taken, nothing is written).
    let admin = match admin_addr {
        Some(addr) => Some(admin::bind(addr).await?),
        None => None,
    };
    // Rule names and the restart marker carry this controller's name too, so that several
    // controllers in one cluster never take each other's rules for their own orphans.
    let cluster = crate::k8s::api::cluster_id(&client, cfg.cluster_id.as_ref())
        .await?
        .for_controller(&cfg.controller);
    info!(cluster = %cluster, controller = %cfg.controller, class = %cfg.class, "cluster identity");

    let (elector, leader_rx, write_lease) = Elector::start(&client, &cfg);
    let instances = assemble::loxilb_instances(&cfg, &write_lease, &cluster)?;
    // One stop signal for the reconcile loop: the caller's shutdown or a lost leadership.
    let (stop_tx, stop_rx) = stop_on(shutdown);
    crate::config::sources::warn_insecure_tls(&cfg);
    // The token: re-read or watched for the life of the process.
    let token_stop = Stop(stop_tx.subscribe()).wait();
    crate::config::token::follow(
        &client,
        &cfg.loxilb_token_source,
        &cfg.loxilb_token,
        token_stop,
    )
    .await;

    let mut watches = assemble::Watches::start(&client, &cfg).await?;
    let (requeue_tx, requeue_rx) = mpsc::unbounded_channel::<ObjectRef<Service>>();
    let gate = Arc::new(Gate::new(leader_rx.clone(), write_lease));
    let (ctx, fleet) = assemble::context(
        client,
        &cfg,
        cluster,
        gate,
        instances,
        &mut watches,
        requeue_tx,
    );
    let shared = Arc::new(Shared {
        service: ctx.clone(),
        synced: false.into(),
        running: true.into(),
        node_init: cfg.node_init.clone(),
    });
    let (egresses, metadata) = assemble::senders(&ctx, &cfg).await;
    // The loxilbs' workers, the health tick and the role decisions: they stop with this
    // function.
    let gateways = assemble::gateway_decided(&ctx, &cfg);
    let _fleet = fleet.start(assemble::replay(&ctx, &egresses, &metadata, &gateways));

    // Everything below ends with this function (dropping the set aborts its tasks): a
    // stopped controller must not keep probing, replaying or repairing from frozen stores.
    let mut tasks = tokio::task::JoinSet::new();
    tasks::admin_server(&mut tasks, admin, &shared);
    let controller = tasks::watch_consumers(&mut tasks, &ctx, watches);
    tasks::senders(&mut tasks, &ctx, &cfg, egresses, metadata);
    tasks::pool_status(&mut tasks, &shared, &cfg);
    tasks.spawn(start_up::start_up(shared.clone(), Stop(stop_rx.clone())));
    // Set once leadership is lost.
    let (lost_tx, mut lost) = watch::channel(false);
    tasks.spawn(watches::leadership(ctx.clone(), stop_tx.clone(), lost_tx));
    tasks::fleet_sources(&mut tasks, &ctx, &cfg, &fleet);
    tasks::gateway(&mut tasks, &ctx, &cfg, gateways);
    tasks.spawn(service::drift::drift_loop(ctx.clone(), cfg.drift_interval));

    let reconciling = reconcile_loop(controller, requeue_rx, &ctx, Stop(stop_rx.clone()));
    tokio::select! {
        () = reconciling => {}
        Ok(_) = lost.wait_for(|lost| *lost) => {
            warn!("leadership lost: reconciles under way cancelled");
        }
        () = shutdown_bounded(&shared, Stop(stop_rx)) => {}
    }
    wind_down(&shared, elector).await;
    if *lost.borrow() {
        anyhow::bail!("lost leadership: exiting so that a restart comes back as a standby");
    }
    Ok(())
}

/// Once the reconcile loop has ended: the last Events published, then the Lease released.
async fn wind_down(shared: &Shared, elector: Elector) {
    shared.running.store(false, Ordering::Relaxed);
    // The last Events (e.g. a RulesDeleted of a Service that left our class) are still on
    // their way.
    if !shared
        .service
        .report
        .recorder
        .flush(Duration::from_secs(2))
        .await
    {
        warn!("stopping with Events not yet published");
    }
    // Release the Lease only once no reconcile runs any more, so the next leader never
    // overlaps with this one.
    elector.release().await;
    info!("controller stopped");
}

/// The leader election's task (none without it: this replica then always leads).
struct Elector {
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Elector {
    /// Starts electing when `--leader-elect` is on; with it, whether this replica leads
    /// and the guard every loxilb write asks.
    fn start(client: &kube::Client, cfg: &Config) -> (Elector, watch::Receiver<bool>, WriteLease) {
        let (stop, stop_rx) = watch::channel(false);
        let (leader_rx, write_lease, elector) = match &cfg.leader {
            Some(lease) => {
                let elector = LeaderElector::new(client.clone(), lease.clone());
                (elector.subscribe(), elector.write_lease(), Some(elector))
            }
            None => (watch::channel(true).1, WriteLease::always(), None),
        };
        let task = elector.map(|elector| tokio::spawn(elector.run(Stop(stop_rx).wait())));
        (Elector { stop, task }, leader_rx, write_lease)
    }

    /// Steps down (the Lease released), waiting 3 s at most.
    async fn release(self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task {
            let _ = tokio::time::timeout(Duration::from_secs(3), task).await;
        }
    }
}

/// A stop signal set once `shutdown` resolves (and by whoever else holds the sender). The
/// receiver is kept from the start: a `send` with no receiver left would not be seen.
fn stop_on(
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> (Arc<watch::Sender<bool>>, watch::Receiver<bool>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let on_shutdown = stop_tx.clone();
    tokio::spawn(async move {
        shutdown.await;
        let _ = on_shutdown.send(true);
    });
    (stop_tx, stop_rx)
}

/// The reconcile loop over the Service watch and the requeues, until `stop`.
async fn reconcile_loop(
    controller: Controller<Service>,
    requeue_rx: mpsc::UnboundedReceiver<ObjectRef<Service>>,
    ctx: &Arc<Context>,
    stop: Stop,
) {
    let requeues = service::watch::channel_stream(requeue_rx);
    controller
        .reconcile_on(requeues)
        .graceful_shutdown_on(stop.wait())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await
}

/// A shutdown lets the reconciles under way finish, for SHUTDOWN_GRACE at most: a reconcile
/// can wait far longer (a loxilb that does not answer, an API server that throttles or
/// conflicts), and a process that ignores SIGTERM is killed by the kubelet anyway. Cancelling
/// one is safe: every pass is written to survive a kill -9. A lost Lease cancels them at once
/// (dropped at their next await), since another replica may already be writing. A shutdown
/// before the stores synced ends at once: kube-runtime's graceful shutdown would wait for a
/// store that nothing polls any more, and no reconcile has run yet.
async fn shutdown_bounded(shared: &Shared, stop: Stop) {
    stop.wait().await;
    if shared.synced.load(Ordering::Relaxed) {
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        warn!(
            grace = ?SHUTDOWN_GRACE,
            "reconciles still under way at shutdown: cancelled"
        );
    }
}
