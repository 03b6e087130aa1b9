use clap::Parser;
use tracing_subscriber::EnvFilter;

use loxi_ccm::cli::{Cli, Command, LogFormat};
use loxi_ccm::config::Config;

fn init_logging(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    loxilb_client::install_crypto_provider();
    match cli.command {
        Command::Run(args) => {
            init_logging(args.log_format, &args.log_level);
            let cfg = Config::from_args(&args)?;
            let client = loxi_ccm::kube_client(args.kubeconfig.as_deref()).await?;
            loxi_ccm::controller::run(client, cfg, Some(args.admin_addr), shutdown_signal()).await
        }
    }
}
