//! `loxi-ccm check`'s look at the write queues of a controller running beside it: the admin
//! server's `/queues` at `--admin-addr` (`crate::loxilb::queues`). Run inside the leader's Pod
//! (`kubectl exec`), `check` shows what waits for each loxilb; elsewhere nothing answers
//! there, which is no failure: the queues are informational.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::check_line::CheckLine;
use crate::loxilb::queues::Queues;

/// Upper bound for the whole call: the admin server answers from memory.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound for the document (ten Services per loxilb, a few hundred bytes each).
const MAX_BYTES: usize = 1 << 20;

/// Where a client reaches an admin server that listens on `addr` (an unspecified address
/// means this host's loopback).
fn reachable(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// The report lines: one per loxilb of the running controller, or one saying why there are
/// none. Always `OK`.
pub async fn lines(admin_addr: SocketAddr) -> Vec<CheckLine> {
    let url = format!("http://{}/queues", reachable(admin_addr));
    let line = |name: String, detail: String| CheckLine {
        ok: true,
        name,
        detail,
    };
    let queues = match tokio::time::timeout(TIMEOUT, fetch(&url)).await {
        Ok(Ok(queues)) => queues,
        Ok(Err(e)) => {
            return vec![line(
                "write queues".into(),
                format!(
                    "no controller answers at {url} ({e}): run `loxi-ccm check` in the \
                     leader's Pod to see what waits for each loxilb"
                ),
            )];
        }
        Err(_) => {
            return vec![line(
                "write queues".into(),
                format!("{url} did not answer within {} s", TIMEOUT.as_secs()),
            )];
        }
    };
    if queues.role != "leader" {
        return vec![line(
            "write queues".into(),
            format!(
                "the controller at {url} is a {}: only the leader writes to loxilb",
                queues.role
            ),
        )];
    }
    if queues.loxilbs.is_empty() {
        return vec![line(
            "write queues".into(),
            "the leader has no loxilb yet".into(),
        )];
    }
    queues
        .loxilbs
        .iter()
        .map(|q| line(format!("loxilb {} writes", q.url), q.describe()))
        .collect()
}

async fn fetch(url: &str) -> Result<Queues, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<axum::body::Body>();
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    let response = client.get(uri).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_BYTES)
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_slice(&body).map_err(|e| format!("not a /queues document: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_listen_address_is_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:9090".parse().unwrap()),
            "127.0.0.1:9090".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:9090".parse().unwrap()),
            "[::1]:9090".parse().unwrap()
        );
        assert_eq!(
            reachable("10.0.0.5:9090".parse().unwrap()),
            "10.0.0.5:9090".parse().unwrap()
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_no_failure() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let lines = lines(SocketAddr::from(([127, 0, 0, 1], port))).await;
        assert_eq!(lines.len(), 1);
        assert!(lines[0].ok);
        assert!(
            lines[0].detail.contains("no controller answers"),
            "{:?}",
            lines[0]
        );
    }
}
