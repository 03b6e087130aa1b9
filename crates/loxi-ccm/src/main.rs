use std::io::IsTerminal as _;
use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

use loxi_ccm::config::check::Report;
use loxi_ccm::config::cli::LogFormat;
use loxi_ccm::config::{LoadError, Loaded, Mode, load};

/// Where log lines go: standard output for `run`, standard error for `check` (whose report
/// is on standard output).
#[derive(Clone, Copy)]
enum LogTo {
    Stdout,
    Stderr,
}

/// Text logs are coloured only when they go to a terminal: a file or a pipe (a container
/// runtime's log, `| grep`) gets plain text, without ANSI escape codes.
fn init_logging(format: LogFormat, filter: &str, to: LogTo) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = match to {
        LogTo::Stdout => std::io::stdout().is_terminal(),
        LogTo::Stderr => std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    match (format, to) {
        (LogFormat::Text, LogTo::Stdout) => builder.init(),
        (LogFormat::Text, LogTo::Stderr) => builder.with_writer(std::io::stderr).init(),
        (LogFormat::Json, LogTo::Stdout) => builder.json().flatten_event(true).init(),
        (LogFormat::Json, LogTo::Stderr) => builder
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .init(),
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

/// Exit code of a configuration that cannot be used (as clap's usage errors).
const EXIT_CONFIG: u8 = 2;

fn print_report(report: &Report) -> ExitCode {
    print!("{report}");
    eprintln!("{}", report.summary());
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The configuration and the Kubernetes client `run` and `audit` start from (the file read is
/// logged). What fails is printed; the exit code is `EXIT_CONFIG` for the configuration,
/// `client_failure` for the client (`run` was started and failed; `audit` could not run at all).
async fn config_and_client(
    loaded: &Loaded,
    client_failure: ExitCode,
) -> Result<(loxi_ccm::config::Config, kube::Client), ExitCode> {
    let cfg = loaded.config().map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(EXIT_CONFIG)
    })?;
    // Logged before the client is made: a client that fails still shows which file was used.
    if let Some(path) = &loaded.config_file {
        tracing::info!(file = %path.display(), "configuration file read");
    }
    let kubeconfig = loaded.args.kube_api.kubeconfig.as_deref();
    match loxi_ccm::k8s::api::client(kubeconfig, cfg.kube_api).await {
        Ok(client) => Ok((cfg, client)),
        Err(e) => {
            let text = loxi_ccm::k8s::api::anyhow_text(&e);
            eprintln!("error: Kubernetes client: {text}");
            Err(client_failure)
        }
    }
}

async fn run(loaded: Loaded) -> ExitCode {
    init_logging(
        loaded.args.admin.log_format,
        &loaded.args.admin.log_level,
        LogTo::Stdout,
    );
    let (cfg, client) = match config_and_client(&loaded, ExitCode::FAILURE).await {
        Ok(both) => both,
        Err(code) => return code,
    };
    match loxi_ccm::runtime::run(
        client,
        cfg,
        Some(loaded.args.admin.admin_addr),
        shutdown_signal(),
    )
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", loxi_ccm::k8s::api::anyhow_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// `loxi-ccm audit`: the findings on standard output, the summary on standard error; exit 0
/// when clean, 1 on any violation, 2 when the audit could not run (configuration, API).
async fn audit(loaded: &Loaded) -> ExitCode {
    let (cfg, client) = match config_and_client(loaded, ExitCode::from(EXIT_CONFIG)).await {
        Ok(both) => both,
        Err(code) => return code,
    };
    match loxi_ccm::audit::audit(&client, &cfg).await {
        Ok(findings) => {
            print!("{findings}");
            eprintln!("{}", findings.summary());
            if findings.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!(
                "error: audit could not run: {}",
                loxi_ccm::k8s::api::anyhow_text(&e)
            );
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// glibc gives threads their own malloc arenas (up to 8 per core) and memory freed in one
/// arena is not reused by the others. The controller's allocations move between threads
/// all the time (tokio workers, the blocking thread parsing a loxilb listing), so every
/// arena ends up holding a fragmented share of the peak: one arena took the peak RSS with
/// 1,000 Services from 47.5 to 39.7 MiB for no measurable CPU (docs/BENCHMARKS.md). Small
/// allocations still go through per-thread caches, so the shared arena is not a hot lock.
/// An operator's `MALLOC_ARENA_MAX` wins.
///
/// glibc also raises its mmap threshold to the size of the largest block freed (up to
/// 32 MiB) and keeps twice that free at the top of the heap: after one large list page or
/// loxilb listing, megabytes freed stay resident. Fixed thresholds (128 KiB: larger blocks
/// are mapped and unmapped on their own; 512 KiB kept at most) return them. An operator's
/// `GLIBC_TUNABLES` wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only sets allocator parameters; no other thread exists yet.
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 512 * 1024);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run_main()),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run_main() -> ExitCode {
    loxilb_client::install_crypto_provider();
    let loaded = match load(std::env::args_os(), &|k| std::env::var_os(k)) {
        Ok(loaded) => loaded,
        Err(LoadError::Clap(e)) => e.exit(),
        Err(LoadError::Invalid {
            mode: Mode::Check,
            error,
        }) => return print_report(&Report::config_failure(&error)),
        Err(LoadError::Invalid { error, .. }) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match loaded.mode {
        Mode::Run => run(loaded).await,
        Mode::Audit => {
            init_logging(
                loaded.args.admin.log_format,
                &loaded.args.admin.log_level,
                LogTo::Stderr,
            );
            audit(&loaded).await
        }
        Mode::Check => {
            init_logging(
                loaded.args.admin.log_format,
                &loaded.args.admin.log_level,
                LogTo::Stderr,
            );
            print_report(&loxi_ccm::config::check::run(&loaded).await)
        }
    }
}
