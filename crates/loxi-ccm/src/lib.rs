//! loxi-ccm: the controller binary's library (the binary is a thin `main`; tests run the
//! controller in-process through [`controller::run`]).

pub mod admin;
pub mod check;
pub mod claims;
pub mod cli;
pub mod config;
pub mod context;
pub mod controller;
pub mod crds;
pub mod events;
pub mod fleet;
pub mod kube_view;
pub mod leader;
pub mod metrics;
pub mod node_init;
pub mod pools;
pub mod reconcile;
pub mod status;
pub mod trim;

/// A Kubernetes client from an explicit kubeconfig, or the usual inference (in-cluster,
/// then `$KUBECONFIG` / `~/.kube/config`).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    loxilb_client::install_crypto_provider();
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}
