//! Waiting on a condition: polled with a generous timeout, never a fixed sleep.

use std::future::Future;
use std::time::{Duration, Instant};

/// The default timeout of a wait.
pub const WAIT: Duration = Duration::from_secs(30);

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_for(what, timeout, Duration::from_millis(50), String::new, check).await
}

/// Polls `check` every `every` until it returns `Some`, or panics after `timeout` naming
/// `what`, followed by what `context` tells then (e.g. the control plane's log tails).
pub async fn poll_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    context: impl Fn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}{}",
                context()
            );
        }
        tokio::time::sleep(every).await;
    }
}
