//! A layer in the controller's API client that holds back the answers to chosen requests
//! until the test releases them: a watch that cannot reconnect for a while (a slow network,
//! an API server still starting), so that a test can change objects while the controller's
//! store of them stays behind. The requests themselves reach the real API server at once;
//! only their answers (or the connection error) wait.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use kube::client::Body;
use tokio::sync::watch;

/// Which requests are held: e.g. [`claim_watch`].
pub type Matcher = fn(&http::Request<Body>) -> bool;

/// A watch of AddressClaims (not the list that a re-list starts with).
pub fn claim_watch(req: &http::Request<Body>) -> bool {
    req.uri().path().ends_with("/addressclaims")
        && req.uri().query().is_some_and(|q| q.contains("watch=true"))
}

/// The switch: while on, answers to matching requests wait.
#[derive(Clone)]
pub struct Hold {
    on: watch::Sender<bool>,
    matches: Matcher,
}

impl Hold {
    pub fn new(matches: Matcher) -> Hold {
        Hold {
            on: watch::channel(false).0,
            matches,
        }
    }

    pub fn hold(&self) {
        self.on.send_replace(true);
    }

    pub fn release(&self) {
        self.on.send_replace(false);
    }

    /// An admin client of the shared control plane with this hold in its stack.
    pub async fn client(&self) -> kube::Client {
        self.client_with(super::admin_config().await)
    }

    /// A client of `cfg` with this hold in its stack.
    pub fn client_with(&self, cfg: kube::Config) -> kube::Client {
        kube::client::ClientBuilder::try_from(cfg)
            .unwrap()
            .with_layer(self)
            .build()
    }
}

impl<S> tower::Layer<S> for Hold {
    type Service = Held<S>;

    fn layer(&self, inner: S) -> Held<S> {
        Held {
            inner,
            on: self.on.subscribe(),
            matches: self.matches,
        }
    }
}

pub struct Held<S> {
    inner: S,
    on: watch::Receiver<bool>,
    matches: Matcher,
}

impl<S> tower::Service<http::Request<Body>> for Held<S>
where
    S: tower::Service<http::Request<Body>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let held = (self.matches)(&req);
        let mut on = self.on.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            if held {
                let _ = on.wait_for(|on| !*on).await;
            }
            result
        })
    }
}
