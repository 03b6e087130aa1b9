//! Kinds whose CRD is optional (kube-loxilb's `LoxiURL` and BGP resources): their watches
//! wait until the API server serves the kind, so a CRD installed while the controller runs is
//! followed without a restart, and keep retrying (at most [`POLL`] apart) when it goes away
//! and comes back. Their CRDs, shipped as optional manifests, are kept by Helm
//! ([`kept_by_helm`]).

use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::runtime::utils::{Backoff, ResetTimerBackoff};
use kube::runtime::watcher::ExponentialBackoff;
use tracing::{info, warn};

/// How often a kind that is not served is asked for again.
pub const POLL: Duration = Duration::from_secs(5);

/// Whether the API server lists `K` now (one item, metadata only).
pub async fn probe<K>(api: &Api<K>) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list_metadata(&ListParams::default().limit(1))
        .await
        .map(drop)
}

/// The API server does not know the kind: its CRD is not installed (or not established yet).
pub fn not_installed(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Waits until the API server lists `K`, asking every [`POLL`]. Says once why it waits (the
/// CRD not installed: `info`, with `hint`; anything else, such as a missing permission:
/// `warn`), again when the reason changes, and when the kind is served.
pub async fn until_served<K>(api: &Api<K>, kind: &str, hint: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut said: Option<String> = None;
    loop {
        match probe(api).await {
            Ok(()) => {
                if said.is_some() {
                    info!(kind, "{kind} resources served now: followed");
                }
                return;
            }
            Err(e) => {
                let why = e.to_string();
                if said.as_ref() != Some(&why) {
                    if not_installed(&e) {
                        info!(
                            kind,
                            "{kind} resources not served (CRD not installed): followed once they are; {hint}"
                        );
                    } else {
                        warn!(kind, error = %e, "{kind} resources cannot be listed: asking again every {}s; {hint}", POLL.as_secs());
                    }
                    said = Some(why);
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The watch back-off of an optional kind: kube's default (from 0.8 s, doubling, with
/// jitter, reset after 2 minutes without error) but at most [`POLL`] apart, so a CRD deleted
/// and installed again is followed within seconds.
pub fn backoff() -> impl Backoff {
    ResetTimerBackoff::new(
        ExponentialBackoff::from(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(800))
                .with_max_delay(POLL)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times(),
        ),
        Duration::from_secs(120),
    )
}

/// Helm's annotation that keeps an object on `helm upgrade` (when the chart no longer renders
/// it) and on `helm uninstall`: an optional CRD (kube-loxilb's) is never deleted, and with it
/// every resource of its kind. Written into the CRD files the chart renders.
pub fn kept_by_helm(meta: &mut kube::api::ObjectMeta) {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert("helm.sh/resource-policy".into(), "keep".into());
}
