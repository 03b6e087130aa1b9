//! A TCP proxy in front of the API server whose live connections can be cut at once while it
//! keeps accepting new ones: the "watch connections cut" fault (a load balancer or NAT
//! dropping idle flows), without restarting the API server.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct CutProxy {
    pub port: u16,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`127.0.0.1:port`).
    pub async fn start(upstream: String) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = {
            let conns = conns.clone();
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let upstream = upstream.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    conns.lock().unwrap().push(task);
                }
            })
        };
        CutProxy {
            port,
            conns,
            accept,
        }
    }

    /// How many connections are open now.
    pub fn open(&self) -> usize {
        let conns = self.conns.lock().unwrap();
        conns.iter().filter(|c| !c.is_finished()).count()
    }

    /// A proxy in front of the shared control plane's API server.
    pub async fn to_control_plane() -> CutProxy {
        let upstream = super::control_plane()
            .server()
            .trim_start_matches("https://")
            .to_string();
        CutProxy::start(upstream).await
    }

    /// Drops every connection open now (both sides see it closed); returns how many.
    pub fn cut(&self) -> usize {
        let mut conns = self.conns.lock().unwrap();
        let live = conns.iter().filter(|c| !c.is_finished()).count();
        for c in conns.drain(..) {
            c.abort();
        }
        live
    }

    /// A client of the shared control plane's admin that goes through this proxy (TLS is
    /// end to end: the serving certificate is for 127.0.0.1).
    pub async fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config().await).unwrap()
    }

    /// The shared control plane's admin configuration, pointed at this proxy.
    pub async fn config(&self) -> kube::Config {
        let mut cfg = super::admin_config().await;
        cfg.cluster_url = format!("https://127.0.0.1:{}", self.port).parse().unwrap();
        cfg
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
