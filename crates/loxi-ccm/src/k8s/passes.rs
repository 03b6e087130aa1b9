//! The loop of the subsystems that bring loxilb to what their watches show in whole passes
//! (`egress`, `k8s_metadata`): a pass after each change, once a short settling delay has
//! gathered the changes that come with it, and one on every tick, so that a loxilb that lost
//! what it was sent is repaired even when nothing changes.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// Calls `pass` after each change `changes` counts (`settle` after it) and every `interval`;
/// returns once the change counter's sender is gone (its subsystem dropped).
pub async fn run_passes<Fut: Future<Output = ()>>(
    mut changes: watch::Receiver<u64>,
    settle: Duration,
    interval: Duration,
    mut pass: impl FnMut() -> Fut,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            r = changes.changed() => {
                if r.is_err() {
                    return;
                }
                tokio::time::sleep(settle).await;
                changes.mark_unchanged();
            }
            _ = tick.tick() => {}
        }
        pass().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A burst of changes within the settling delay makes one pass; the tick makes its own;
    /// the loop ends with its sender.
    #[tokio::test(start_paused = true)]
    async fn a_burst_makes_one_pass_and_the_tick_its_own() {
        let (tx, rx) = watch::channel(0u64);
        let passes = Arc::new(AtomicUsize::new(0));
        let counted = passes.clone();
        let task = tokio::spawn(run_passes(
            rx,
            Duration::from_millis(200),
            Duration::from_secs(60),
            move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            },
        ));
        // The interval's first tick is at once.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 1);
        for _ in 0..5 {
            tx.send_modify(|n| *n += 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 2, "one pass for the burst");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "one pass for the tick");
        drop(tx);
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the loop ends with its sender")
            .unwrap();
    }
}
