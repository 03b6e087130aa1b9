//! Admin HTTP server: `/metrics`, `/healthz`, `/readyz`, and `/queues` (each loxilb's write
//! window, JSON, for `loxi-ccm check`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::Shared;

/// Binds `--admin-addr`, before anything else starts: a controller that cannot serve
/// `/healthz`, `/readyz` and `/metrics` must not run (the kubelet's probes would fail for a
/// reason nobody sees, and it would lead meanwhile). The error names the flag, the address
/// and the system's answer.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "--admin-addr {addr}: cannot listen for /healthz, /readyz and /metrics: {e}; \
             free the address or set --admin-addr to another one"
        )
    })
}

pub async fn serve(listener: tokio::net::TcpListener, ctx: Arc<Shared>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/queues", get(queues))
        .with_state(ctx);
    // The bound address: with port 0 the system picked one, and this line is how to find it.
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "admin server listening");
    }
    axum::serve(listener, app).await
}

async fn metrics(State(ctx): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ctx.service.report.metrics.encode(),
    )
}

/// What waits in each loxilb's write window (`crate::loxilb::queues`).
async fn queues(State(ctx): State<Arc<Shared>>) -> impl IntoResponse {
    let role = if *ctx.service.gate.leader().borrow() {
        "leader"
    } else {
        "standby"
    };
    axum::Json(crate::loxilb::queues::Queues {
        role: role.to_string(),
        loxilbs: ctx
            .service
            .fleet
            .instances()
            .iter()
            .map(|i| i.write_queue())
            .collect(),
    })
}

/// Alive as long as the reconcile loop runs (it flips `running` off when it stops).
async fn healthz(State(ctx): State<Arc<Shared>>) -> impl IntoResponse {
    if ctx.running.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "controller loop stopped\n".to_string(),
        )
    }
}

/// Ready once the stores are synced, on the leader and on standbys alike (a standby with warm
/// caches is exactly what a disruption budget should count). loxilb instances that are down
/// are reported as degraded, still ready: restarting this pod would not bring loxilb back.
async fn readyz(State(ctx): State<Arc<Shared>>) -> impl IntoResponse {
    if !ctx.synced.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "stores not synced\n".to_string(),
        );
    }
    let role = if *ctx.service.gate.leader().borrow() {
        "leader"
    } else {
        "standby"
    };
    let instances = ctx.service.fleet.instances();
    let down: Vec<&str> = instances
        .iter()
        .filter(|i| !i.is_healthy())
        .map(|i| i.url())
        .collect();
    if down.is_empty() || role == "standby" {
        (StatusCode::OK, format!("ok ({role})\n"))
    } else {
        (
            StatusCode::OK,
            format!("ok ({role}; degraded: loxilb down: {})\n", down.join(", ")),
        )
    }
}
