//! Listener lifecycle. A hand-written accept loop (rather than `axum::serve`)
//! so that "going down" really closes the listening socket (connections are
//! refused, like a dead loxilb) and also closes every open keep-alive
//! connection, and so that coming back up can rebind the same address.
//!
//! It also closes a connection without answering when a handler asks for it
//! ([`crate::errors::DropConnection`]): that is what loxilb's Go server does when a handler
//! crashes on a nil pointer (docs/loxilb-api.md#bgp).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long in-flight requests may take to finish when going down before
/// their connections are cut.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTPS serving: the certificate and key every connection is accepted with.
#[derive(Clone)]
pub(crate) struct Tls(TlsAcceptor);

impl Tls {
    pub(crate) fn new(cert_chain_pem: &str, key_pem: &str) -> std::io::Result<Tls> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}: {e}"))
        };
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_chain_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| invalid("certificate PEM", &e))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| invalid("private key PEM", &e))?;
        // The ring provider, as everywhere else in the workspace (one provider per process).
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS versions", &e))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| invalid("certificate and key", &e))?;
        Ok(Tls(TlsAcceptor::from(Arc::new(config))))
    }
}

/// A listening server; dropping it also stops it (the stop channel closes).
pub(crate) struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    pub(crate) fn spawn(listener: TcpListener, router: axum::Router, tls: Option<Tls>) -> Running {
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, router, tls, stop_rx));
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

async fn accept_loop(
    listener: TcpListener,
    router: axum::Router,
    tls: Option<Tls>,
    mut stop: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    // Connections watch their own receiver; `stop` is borrowed by select!.
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let (router, stop) = (router.clone(), conn_stop.clone());
                    match &tls {
                        None => {
                            conns.spawn(serve_conn(stream, router, stop));
                        }
                        Some(Tls(acceptor)) => {
                            let handshake = acceptor.accept(stream);
                            conns.spawn(async move {
                                // A client that refuses the certificate ends the handshake
                                // with an alert: nothing to serve.
                                match handshake.await {
                                    Ok(stream) => serve_conn(stream, router, stop).await,
                                    Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                                }
                            });
                        }
                    }
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

/// The service error that makes hyper close the connection without writing an answer.
#[derive(Debug)]
struct Crashed;

impl std::fmt::Display for Crashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("simulated handler crash")
    }
}

impl std::error::Error for Crashed {}

/// The axum router as a hyper service; a response marked [`crate::errors::DropConnection`]
/// becomes a service error, on which hyper drops the connection unanswered.
#[derive(Clone)]
struct AppService(axum::Router);

impl hyper::service::Service<hyper::Request<Incoming>> for AppService {
    type Response = axum::response::Response;
    type Error = Crashed;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Crashed>> + Send>>;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let mut router = self.0.clone();
        Box::pin(async move {
            // The router is always ready and never fails (`Infallible`).
            let resp = match tower_service::Service::call(&mut router, req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            if resp
                .extensions()
                .get::<crate::errors::DropConnection>()
                .is_some()
            {
                return Err(Crashed);
            }
            Ok(resp)
        })
    }
}

async fn serve_conn<S>(stream: S, router: axum::Router, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(stream), AppService(router));
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
