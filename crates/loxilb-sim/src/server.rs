//! Listener lifecycle. A hand-written accept loop (rather than `axum::serve`)
//! so that "going down" really closes the listening socket (connections are
//! refused, like a dead loxilb) and also closes every open keep-alive
//! connection, and so that coming back up can rebind the same address.

use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// How long in-flight requests may take to finish when going down before
/// their connections are cut.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A listening server; dropping it also stops it (the stop channel closes).
pub(crate) struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    pub(crate) fn spawn(listener: TcpListener, router: axum::Router) -> Running {
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, router, stop_rx));
        Running { stop, task }
    }

    /// Returns once the listener is closed and all connections are gone.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "accept loop ended abnormally");
        }
    }
}

async fn accept_loop(listener: TcpListener, router: axum::Router, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    // Connections watch their own receiver; `stop` is borrowed by select!.
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    conns.spawn(serve_conn(stream, router.clone(), conn_stop.clone()));
                }
                Err(e) => {
                    // E.g. EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            // Err = sender dropped (simulator gone): stop as well.
            () = stopped(&mut stop) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    // Close the socket first: from here on connects are refused.
    drop(listener);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        conns.shutdown().await;
    }
}

/// Resolves once told to stop or when the sender is gone. The watch guard is
/// dropped inside, so it never lives across an await of the caller.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|down| *down).await;
}

async fn serve_conn(stream: TcpStream, router: axum::Router, mut stop: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = stopped(&mut stop) => {}
    }
    // Idle keep-alive connections close at once; an in-flight request is
    // answered (with `Connection: close`) and then the connection closes.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
