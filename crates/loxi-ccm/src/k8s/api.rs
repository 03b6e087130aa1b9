//! The Kubernetes API client: kube's default stack (TLS, authentication, timeouts), built
//! here for three settings kube's `Client::try_from` does not offer.
//!
//! - **A client-side rate limit** (`--kube-api-qps`, `--kube-api-burst`): a token bucket in
//!   front of every request, as client-go's QPS/Burst. Off by default: the API server
//!   protects itself with API Priority and Fairness, and a limit sized for a small cluster
//!   throttles a burst of new Services needlessly (1,000 new Services make ~5,000 requests
//!   within seconds). Operators who want a cap set one.
//! - **A bounded retry of 429, 503 and 504** ([`RETRY_MAX_TRIES`]): kube's default retries
//!   for minutes in silence; here the error reaches the reconcile within seconds.
//! - **A smaller HTTP/1 read buffer per connection** (16 KiB instead of hyper's ~400 KiB).
//!   hyper grows a connection's read buffer while large bodies (list pages, busy watches)
//!   arrive and keeps it as long as the connection lives; with 16 reconciles and the watches
//!   in flight, 30 to 40 pooled connections held up to ~400 KiB each, several MB of a 17 to
//!   19 MB heap peak (heaptrack, docs/BENCHMARKS.md). A smaller buffer costs more reads
//!   per list page, each still far cheaper than parsing what it read.
//!
//! What kube's default stack has and this one leaves out: its debug-level HTTP trace spans
//! (`RUST_LOG=kube=debug` no longer shows each request) and gzip, which kube's features
//! as used here never enabled.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceBuilder};
use tracing::info;

/// The field manager of every server-side apply this controller makes (Service and pool
/// status): what it stops saying is removed, other writers' fields are left alone.
pub const FIELD_MANAGER: &str = "loxi-ccm";

/// Retries of a request the API server answered 429, 503 or 504: waits from 5 ms doubling up
/// to 2 s (or the server's `Retry-After` when longer), at most 8 times, so a request gives up
/// within ~10 s and its error reaches the caller. kube's own policy waits up to 1,000 s
/// between 15 tries: under sustained 429s a request lost every race and slept for minutes
/// with nothing logged (found by `fault_matrix.rs::api_throttling_under_load`). A failed
/// reconcile is logged and retried with the controller's own backoff instead.
const RETRY_MIN_DELAY: Duration = Duration::from_millis(5);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(2);
const RETRY_MAX_TRIES: u32 = 8;

/// hyper's read buffer limit per connection (its minimum is 8 KiB, its default ~400 KiB).
const READ_BUFFER: usize = 16 * 1024;
/// A request that waited this long for the rate limit is logged (client-go logs waits of
/// over a second, "client-side throttling").
const LOG_WAIT: Duration = Duration::from_secs(1);

/// Client-side request rate limit; `qps` 0 means none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: u32,
}

impl RateLimit {
    pub const NONE: RateLimit = RateLimit { qps: 0.0, burst: 0 };
}

/// A client from an explicit kubeconfig, or the usual inference (in-cluster, then
/// `$KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>, limit: RateLimit) -> anyhow::Result<kube::Client> {
    from_config(config(kubeconfig).await?, limit)
}

/// The client configuration from an explicit kubeconfig, or the usual inference. Errors say
/// which file is wrong and how, once: a kubeconfig that cannot be read, and a certificate
/// authority (file or `certificate-authority-data`) holding no certificate, which would
/// otherwise surface later as a TLS failure on every request.
pub async fn config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    loxilb_client::install_crypto_provider();
    let Some(path) = kubeconfig else {
        let config = kube::Config::infer().await.map_err(|e| {
            anyhow::anyhow!(
                "no usable kubeconfig given or found (in-cluster, $KUBECONFIG, ~/.kube/config): {}",
                error_chain(&e)
            )
        })?;
        if config.root_cert.as_ref().is_some_and(|c| c.is_empty()) {
            anyhow::bail!("the Kubernetes API's certificate authority holds no certificate");
        }
        return Ok(config);
    };
    let shown = path.display();
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| match e {
        kube::config::KubeconfigError::ReadConfig(io, _) => {
            anyhow::anyhow!("cannot read kubeconfig {shown}: {io}")
        }
        other => anyhow::anyhow!("kubeconfig {shown}: {}", error_chain(&other)),
    })?;
    // The CA file the kubeconfig names, checked here so the error names it (kube's own
    // error names neither the file nor the kubeconfig, and an empty file passes it).
    if let Some(cluster) = current_cluster(&kc)
        && cluster.certificate_authority_data.is_none()
        && let Some(ca) = &cluster.certificate_authority
    {
        let pem = std::fs::read(ca).map_err(|e| {
            anyhow::anyhow!(
                "cannot read CA file {ca} (certificate-authority of kubeconfig {shown}): {e}"
            )
        })?;
        check_ca_bundle(&pem, Path::new(ca))
            .map_err(|e| anyhow::anyhow!("kubeconfig {shown}: {e}"))?;
    }
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| anyhow::anyhow!("kubeconfig {shown}: {}", error_chain(&e)))?;
    if config.root_cert.as_ref().is_some_and(|c| c.is_empty()) {
        anyhow::bail!(
            "kubeconfig {shown}: the certificate-authority-data holds no certificate (expected \
             PEM blocks -----BEGIN CERTIFICATE-----)"
        );
    }
    Ok(config)
}

/// The cluster of the kubeconfig's current context (what kube connects to by default).
fn current_cluster(kc: &kube::config::Kubeconfig) -> Option<&kube::config::Cluster> {
    let context = kc.current_context.as_deref()?;
    let cluster = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .as_str();
    kc.clusters
        .iter()
        .find(|c| c.name == cluster)?
        .cluster
        .as_ref()
}

// ---------------------------------------------------------------------------------------------
// Errors as people read them.

/// The cluster identity used in rule names: `configured` (`--cluster-id`), else derived from
/// the kube-system namespace's UID, which lives as long as the cluster.
pub async fn cluster_id(
    client: &kube::Client,
    configured: Option<&loxi_domain::ClusterId>,
) -> anyhow::Result<loxi_domain::ClusterId> {
    if let Some(id) = configured {
        return Ok(id.clone());
    }
    let ns: k8s_openapi::api::core::v1::Namespace = kube::Api::all(client.clone())
        .get("kube-system")
        .await
        .context("reading namespace kube-system for the cluster id (or pass --cluster-id)")?;
    Ok(loxi_domain::ClusterId::from_uid(
        ns.metadata.uid.as_deref().unwrap_or_default(),
    ))
}

/// A failed Kubernetes call as messages show it: an answer of the API server as its HTTP
/// code, reason and message (`403 Forbidden: services is forbidden: User "x" cannot list
/// ...`), anything else (a connection failure, a timeout) as its chain of causes, each said
/// once. Never kube's Debug dump of the answer.
/// Writes the ConfigMap `name` of `api` with exactly `data` by server-side apply under field
/// manager `manager` (created the first time), labelled as ours: the records the controller
/// keeps for operators to read (HA roles, the fleet's status).
pub async fn apply_config_map(
    api: &kube::Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: &str,
    manager: &str,
    data: &std::collections::BTreeMap<String, String>,
) -> kube::Result<()> {
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": { "app.kubernetes.io/managed-by": "loxi-ccm" },
        },
        "data": data,
    });
    api.patch(
        name,
        &kube::api::PatchParams::apply(manager).force(),
        &kube::api::Patch::Apply(&cm),
    )
    .await?;
    Ok(())
}

pub fn error_text(e: &kube::Error) -> String {
    error_chain(e)
}

/// The HTTP code of the API server's answer, when the error is one.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// `401 Unauthorized`, `403 Forbidden: services is forbidden: ...`, `500 InternalError: x`.
pub fn status_text(s: &kube::core::Status) -> String {
    let reason = s.reason.as_str();
    let mut text = match (s.code, reason.is_empty()) {
        (0, true) => String::new(),
        (0, false) => reason.to_string(),
        (code, true) => code.to_string(),
        (code, false) => format!("{code} {reason}"),
    };
    if !s.message.is_empty() && s.message != reason {
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s.message);
    }
    if text.is_empty() {
        text.push_str("the API server refused the request without a reason");
    }
    text
}

/// [`error_text`] for any error: its Display, then each cause the text before does not
/// already say; an API server's answer found on the way is shown by [`status_text`] and
/// ends the chain (what it wraps only repeats it).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    chain_text(std::iter::successors(Some(e), |e| e.source()))
}

/// [`error_chain`] for an `anyhow` error (its contexts first).
pub fn anyhow_text(e: &anyhow::Error) -> String {
    chain_text(e.chain())
}

fn chain_text<'a>(causes: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut text = String::new();
    for cause in causes {
        let (part, last) = if let Some(kube::Error::Api(s)) = cause.downcast_ref::<kube::Error>() {
            (status_text(s), true)
        } else if let Some(s) = cause.downcast_ref::<kube::core::Status>() {
            (status_text(s), true)
        } else {
            (cause.to_string(), false)
        };
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        if last {
            break;
        }
    }
    text
}

/// The client for `config` (see the module docs for how it differs from kube's).
pub fn from_config(config: kube::Config, limit: RateLimit) -> anyhow::Result<kube::Client> {
    if let Some(proxy) = &config.proxy_url {
        anyhow::bail!("the kubeconfig names a proxy ({proxy}): proxies are not supported");
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = config
        .rustls_https_connector_with_connector(http)
        .context("TLS settings of the kubeconfig")?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER)
        .build(connector);
    let throttled = Throttled {
        inner: hyper,
        bucket: TokenBucket::new(limit).map(|b| Arc::new(Mutex::new(b))),
    };
    // 429 (API Priority and Fairness, max-in-flight), 503 and 504 are retried, bounded.
    let retry = config.default_retry.then(|| {
        tower::retry::RetryLayer::new(
            kube::client::retry::RetryPolicy::new(
                RETRY_MIN_DELAY,
                RETRY_MAX_DELAY,
                RETRY_MAX_TRIES,
                true,
            )
            .expect("valid retry bounds"),
        )
    });
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(throttled);
    Ok(kube::client::ClientBuilder::new(service, config.default_namespace).build())
}

/// A token bucket on Tokio's clock: `burst` requests at once, then `qps` per second. A
/// request takes a token or reserves the next one and sleeps until it is due, so waiting
/// requests go in arrival order.
#[derive(Debug)]
struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Negative when requests are waiting for future tokens.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(limit: RateLimit) -> Option<TokenBucket> {
        (limit.qps > 0.0).then(|| {
            let burst = f64::from(limit.burst.max(1));
            TokenBucket {
                qps: limit.qps,
                burst,
                tokens: burst,
                at: Instant::now(),
            }
        })
    }

    /// Takes a token; returns how long the caller must wait before using it.
    fn take(&mut self, now: Instant) -> Duration {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.qps;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// The innermost service: waits for the rate limit, then hands the request to hyper.
#[derive(Clone)]
struct Throttled<S> {
    inner: S,
    bucket: Option<Arc<Mutex<TokenBucket>>>,
}

impl<S, R> Service<R> for Throttled<S>
where
    S: Service<R> + Clone + Send + 'static,
    S::Future: Send,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let wait = self
            .bucket
            .as_ref()
            .and_then(|b| b.lock().ok().map(|mut b| b.take(Instant::now())))
            .unwrap_or_default();
        if wait.is_zero() {
            return Box::pin(self.inner.call(req));
        }
        // The ready service goes with this request; its clone serves the next one.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if wait >= LOG_WAIT {
                info!(
                    waited_ms = wait.as_millis() as u64,
                    "Kubernetes API request delayed by the client-side rate limit (--kube-api-qps)"
                );
            }
            tokio::time::sleep(wait).await;
            ready.call(req).await
        })
    }
}

/// Checks that a CA bundle (`pem`, read from `path`) holds at least one PEM certificate: a
/// file without one is accepted by the TLS libraries and makes every connection fail later,
/// with an error that names neither the file nor the cause. Used for the API server's CA and
/// for loxilb's (`--loxilb-ca-file`).
pub fn check_ca_bundle(pem: &[u8], path: &Path) -> Result<(), String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut certificates = 0;
    for item in CertificateDer::pem_slice_iter(pem) {
        match item {
            Ok(_) => certificates += 1,
            Err(e) => {
                return Err(format!(
                    "CA file {} is not a valid PEM bundle: {e}",
                    path.display()
                ));
            }
        }
    }
    if certificates == 0 {
        return Err(format!(
            "CA file {} holds no certificate (expected PEM blocks -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn limit(qps: f64, burst: u32) -> RateLimit {
        RateLimit { qps, burst }
    }

    fn status(code: u16, reason: &str, message: &str) -> kube::core::Status {
        kube::core::Status::failure(message, reason).with_code(code)
    }

    #[test]
    fn api_errors_read_as_code_reason_and_message() {
        let unauthorized = kube::Error::Api(Box::new(status(401, "Unauthorized", "Unauthorized")));
        assert_eq!(error_text(&unauthorized), "401 Unauthorized");
        assert_eq!(status_code(&unauthorized), Some(401));
        let forbidden = kube::Error::Api(Box::new(status(
            403,
            "Forbidden",
            "services is forbidden: User \"x\" cannot list resource \"services\"",
        )));
        assert_eq!(
            error_text(&forbidden),
            "403 Forbidden: services is forbidden: User \"x\" cannot list resource \"services\""
        );
        // Inside an anyhow chain, after its context; never the Debug dump.
        let e = anyhow::Error::new(forbidden).context("reading namespace kube-system");
        let text = anyhow_text(&e);
        assert_eq!(
            text,
            "reading namespace kube-system: 403 Forbidden: services is forbidden: User \"x\" \
             cannot list resource \"services\""
        );
        assert!(
            !text.contains("Status {") && !text.contains("ApiError"),
            "{text}"
        );
        assert_eq!(status_text(&status(500, "", "")), "500");
    }

    #[test]
    fn causes_are_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = io.to_string();
        let e = anyhow::Error::new(kube::config::KubeconfigError::ReadConfig(io, "/x".into()))
            .context("Kubernetes client");
        let text = anyhow_text(&e);
        assert_eq!(text.matches(&said).count(), 1, "{text}");
    }

    #[tokio::test]
    async fn a_kubeconfig_names_what_is_wrong() {
        let dir = std::env::temp_dir().join(format!("loxi-ccm-kube-api-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.kubeconfig");
        let e = anyhow_text(&config(Some(&missing)).await.unwrap_err());
        assert!(
            e.starts_with(&format!("cannot read kubeconfig {}: ", missing.display())),
            "{e}"
        );
        let ca = dir.join("empty-ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let kc = dir.join("ca.kubeconfig");
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
                 https://127.0.0.1:1\n    certificate-authority: {}\nusers:\n- name: u\n  \
                 user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: \
                 u\ncurrent-context: x\n",
                ca.display()
            ),
        )
        .unwrap();
        let e = anyhow_text(&config(Some(&kc)).await.unwrap_err());
        assert_eq!(
            e,
            format!(
                "kubeconfig {}: CA file {} holds no certificate (expected PEM blocks \
                 -----BEGIN CERTIFICATE-----)",
                kc.display(),
                ca.display()
            )
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_qps_means_no_bucket() {
        assert!(TokenBucket::new(RateLimit::NONE).is_none());
        assert!(TokenBucket::new(limit(0.0, 10)).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_qps_per_second_in_order() {
        let mut b = TokenBucket::new(limit(10.0, 3)).unwrap();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..6).map(|_| b.take(t0)).collect();
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(ms, vec![0, 0, 0, 100, 200, 300]);
        // A second later the debt is paid and 7 tokens came back, capped at the burst.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(b.take(later), Duration::ZERO);
        assert_eq!(b.take(later), Duration::ZERO);
        assert_eq!(b.take(later), Duration::ZERO);
        assert!(b.take(later) > Duration::ZERO);
    }

    /// Through the service: 21 requests at 10 per second with a burst of 1 take 2 s of
    /// (paused) time, and every request reaches the inner service.
    #[tokio::test(start_paused = true)]
    async fn the_service_delays_requests_beyond_the_burst() {
        let calls = Arc::new(AtomicUsize::new(0));
        let inner = {
            let calls = calls.clone();
            tower::service_fn(move |_: ()| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(())
                }
            })
        };
        let mut svc = Throttled {
            inner,
            bucket: TokenBucket::new(limit(10.0, 1)).map(|b| Arc::new(Mutex::new(b))),
        };
        let t0 = Instant::now();
        let futures: Vec<_> = (0..21).map(|_| svc.call(())).collect();
        futures::future::try_join_all(futures).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 21);
        assert_eq!(t0.elapsed().as_millis(), 2000);
    }

    #[tokio::test]
    async fn without_a_limit_requests_pass_straight_through() {
        let mut svc = Throttled {
            inner: tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) }),
            bucket: None,
        };
        assert_eq!(svc.call(7).await.unwrap(), 7);
    }
}
