//! Loading: command line > environment > config file > default (the module documentation of
//! `config` says how).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, FromArgMatches};
use loxi_domain::text::shown;
use thiserror::Error;

use crate::config::cli::{AUDIT, CHECK, RunArgs};
use crate::config::file::{FileLayer, parse_file, unsupported};
use crate::config::origins::{Origin, Origins};
use crate::config::{Config, ConfigError};

/// Which subcommand was invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Run,
    Check,
    Audit,
}

/// The options of `run` / `check`, every layer applied, and where each came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub mode: Mode,
    pub args: RunArgs,
    pub origins: Origins,
    /// The config file read, if any.
    pub config_file: Option<PathBuf>,
}

impl Loaded {
    /// Validates the options into the controller's [`Config`].
    pub fn config(&self) -> Result<Config, ConfigError> {
        Config::from_args_with(&self.args, &self.origins)
    }
}

#[derive(Debug, Error)]
pub enum LoadError {
    /// Command-line syntax, or `--help` / `--version`: clap renders it (`err.exit()`).
    #[error("{0}")]
    Clap(clap::Error),
    /// A value from the environment or the config file is wrong, or the file is.
    #[error("{error}")]
    Invalid { mode: Mode, error: ConfigError },
}

/// Parses `argv` (program name first) with every layer. `env` looks up environment variables
/// (`|k| std::env::var_os(k)` in the binary; a map in tests).
pub fn load<I, T>(argv: I, env: &dyn Fn(&str) -> Option<OsString>) -> Result<Loaded, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let full = crate::config::cli::command();
    // The same tree without environment lookups: clap then sees the command line only, and
    // the layers below it are applied here.
    let parser = full
        .clone()
        .mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None)));
    let first = parse_command_line(&full, &parser, &argv)?;
    let Some((name, sub)) = first.subcommand() else {
        // clap requires a subcommand; this is only reachable if that changes.
        return Err(LoadError::Clap(
            full.clone()
                .error(ErrorKind::MissingSubcommand, "a subcommand is required"),
        ));
    };
    let mode = match name {
        CHECK => Mode::Check,
        AUDIT => Mode::Audit,
        _ => Mode::Run,
    };
    let invalid = |error: ConfigError| LoadError::Invalid { mode, error };
    let sub_cmd = full
        .find_subcommand(name)
        .expect("the parsed subcommand exists");
    let args: Vec<&Arg> = sub_cmd
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    let (config_path, config_origin) = config_file_named(&args, sub, env);
    let file = match &config_path {
        Some(path) => Some(read_config_file(path, &config_origin, &args).map_err(invalid)?),
        None => None,
    };
    let lower = LowerLayers {
        typed: sub,
        env,
        file: file.as_ref(),
        config_origin: &config_origin,
    };
    let (extra, origins) = lower.apply(&args).map_err(invalid)?;

    let mut argv2 = argv;
    argv2.extend(extra);
    let second = parser
        .try_get_matches_from(&argv2)
        .map_err(|e| attribute(e, &origins, mode))?;
    let sub2 = second
        .subcommand_matches(name)
        .expect("the same subcommand parses again");
    let args = RunArgs::from_arg_matches(sub2).map_err(LoadError::Clap)?;
    Ok(Loaded {
        mode,
        args,
        origins,
        config_file: config_path,
    })
}

/// The first parse, of the command line alone (`parser` has no environment lookups); help and
/// version are rendered by the `full` tree so that they show the environment variables.
fn parse_command_line(
    full: &clap::Command,
    parser: &clap::Command,
    argv: &[OsString],
) -> Result<ArgMatches, LoadError> {
    let e = match parser.clone().try_get_matches_from(argv) {
        Ok(m) => return Ok(m),
        Err(e) => e,
    };
    let e = match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            full.clone().try_get_matches_from(argv).err().unwrap_or(e)
        }
        _ => e,
    };
    Err(unsupported_flag(&e, argv).unwrap_or(LoadError::Clap(e)))
}

/// The config file itself: flag, else environment.
fn config_file_named(
    args: &[&Arg],
    typed: &ArgMatches,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> (Option<PathBuf>, Origin) {
    let config_env = args
        .iter()
        .find(|a| a.get_id() == "config")
        .and_then(|a| a.get_env())
        .and_then(|e| e.to_str())
        .unwrap_or("LOXI_CCM_CONFIG")
        .to_string();
    if typed.value_source("config") == Some(ValueSource::CommandLine) {
        (typed.get_one::<PathBuf>("config").cloned(), Origin::Flag)
    } else if let Some(v) = env(&config_env) {
        (Some(PathBuf::from(v)), Origin::Env(config_env))
    } else {
        (None, Origin::Default)
    }
}

fn read_config_file(
    path: &std::path::Path,
    named_by: &Origin,
    args: &[&Arg],
) -> Result<FileLayer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::invalid(
            format!("config file {}", path.display()),
            format!(
                "cannot be read: {e} (named by {})",
                named_by.describe("config")
            ),
        )
    })?;
    parse_file(path, &text, args)
}

/// The layers below the command line: what the user typed (first parse), the environment
/// and the config file.
struct LowerLayers<'a> {
    typed: &'a ArgMatches,
    env: &'a dyn Fn(&str) -> Option<OsString>,
    file: Option<&'a FileLayer>,
    config_origin: &'a Origin,
}

impl LowerLayers<'_> {
    /// For every option not typed, the value of the environment, else of the file, as the
    /// flags (`--long=value`) the second parse is given; and where every option came from.
    fn apply(&self, args: &[&Arg]) -> Result<(Vec<OsString>, Origins), ConfigError> {
        let mut origins = Origins::default();
        let mut extra: Vec<OsString> = Vec::new();
        for arg in args {
            let id = arg.get_id().as_str();
            let long = arg.get_long().unwrap_or(id);
            if id == "config" {
                origins.insert(id, long, self.config_origin.clone());
                continue;
            }
            if self.typed.value_source(id) == Some(ValueSource::CommandLine) {
                origins.insert(id, long, Origin::Flag);
                continue;
            }
            let Some((values, origin)) = self.lookup(arg, long)? else {
                origins.insert(id, long, Origin::Default);
                continue;
            };
            extra.extend(as_flags(arg, long, &values, &origin)?);
            origins.insert(id, long, origin);
        }
        Ok((extra, origins))
    }

    /// The values of `arg` from the environment, else from the config file.
    fn lookup(&self, arg: &Arg, long: &str) -> Result<Option<(Vec<String>, Origin)>, ConfigError> {
        let from_env = arg
            .get_env()
            .and_then(|var| var.to_str())
            .and_then(|var| (self.env)(var).map(|value| (var, value)));
        if let Some((var, value)) = from_env {
            let origin = Origin::Env(var.to_string());
            let value = value.into_string().map_err(|_| {
                ConfigError::invalid(origin.describe(long), "the value is not valid UTF-8")
            })?;
            return Ok(Some((vec![value], origin)));
        }
        let id = arg.get_id().as_str();
        Ok(self.file.and_then(|f| {
            f.values.get(id).map(|(key, values)| {
                let origin = Origin::File {
                    path: f.path.clone(),
                    key: key.clone(),
                };
                (values.clone(), origin)
            })
        }))
    }
}

/// Values of a lower layer as the command-line flags that set them.
fn as_flags(
    arg: &Arg,
    long: &str,
    values: &[String],
    origin: &Origin,
) -> Result<Vec<OsString>, ConfigError> {
    if !matches!(arg.get_action(), ArgAction::SetTrue) {
        return Ok(values
            .iter()
            .map(|v| OsString::from(format!("--{long}={v}")))
            .collect());
    }
    // A flag that takes no value on the command line.
    let mut flags = Vec::new();
    for v in values {
        match v.trim() {
            "true" => flags.push(format!("--{long}").into()),
            "false" => {}
            _ => {
                return Err(ConfigError::invalid(
                    origin.describe(long),
                    format!("invalid value {}: expected true or false", shown(v)),
                ));
            }
        }
    }
    Ok(flags)
}

fn context_strings(e: &clap::Error, kind: ContextKind) -> Vec<String> {
    match e.get(kind) {
        Some(ContextValue::String(s)) => vec![s.clone()],
        Some(ContextValue::Strings(v)) => v.clone(),
        _ => Vec::new(),
    }
}

/// Turns an error of the second parse into one naming the environment variable or the
/// config-file key the bad value came from.
fn attribute(e: clap::Error, origins: &Origins, mode: Mode) -> LoadError {
    let mut involved: Vec<(String, Origin)> = Vec::new();
    for kind in [ContextKind::InvalidArg, ContextKind::PriorArg] {
        for text in context_strings(&e, kind) {
            // "--lb-mode <LB_MODE>", "--monitor[=<MONITOR>]": the flag is the leading word.
            let long = text.strip_prefix("--").map(|rest| {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .unwrap_or(rest.len());
                &rest[..end]
            });
            if let Some(long) = long
                && let Some(origin) = origins.by_long(long)
            {
                involved.push((long.to_string(), origin.clone()));
            }
        }
    }
    let Some((long, origin)) = involved
        .iter()
        .find(|(_, o)| !matches!(o, Origin::Flag | Origin::Default))
        .cloned()
    else {
        return LoadError::Clap(e);
    };
    let error = match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let value = context_strings(&e, ContextKind::InvalidValue)
                .into_iter()
                .next()
                .unwrap_or_default();
            let valid = context_strings(&e, ContextKind::ValidValue);
            let reason = if !valid.is_empty() {
                format!("expected one of {}", valid.join(", "))
            } else if let Some(source) = std::error::Error::source(&e) {
                source.to_string()
            } else {
                clap_sentence(&e)
            };
            ConfigError::invalid(
                origin.describe(&long),
                format!("invalid value {}: {reason}", shown(&value)),
            )
        }
        _ => {
            let whence: Vec<String> = involved
                .iter()
                .map(|(l, o)| format!("--{l} from {}", o.describe(l)))
                .collect();
            ConfigError::Conflict(format!("{} ({})", clap_sentence(&e), whence.join("; ")))
        }
    };
    LoadError::Invalid { mode, error }
}

/// The first line of a clap error without its `error: ` prefix.
fn clap_sentence(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let line = rendered.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// A command line refused by clap because of an argument that is a
/// [`NOT_YET_SUPPORTED`](crate::config::NOT_YET_SUPPORTED) kube-loxilb flag (or a config-file
/// key without meaning written as a flag): the error that says
/// so, naming the flag, instead of clap's "unexpected argument".
fn unsupported_flag(e: &clap::Error, argv: &[OsString]) -> Option<LoadError> {
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = arg.strip_prefix("--")?;
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    let message = unsupported(name)?;
    let mode = match argv
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .and_then(|a| a.to_str())
    {
        Some(CHECK) => Mode::Check,
        Some(AUDIT) => Mode::Audit,
        _ => Mode::Run,
    };
    Some(LoadError::Invalid {
        mode,
        error: ConfigError::invalid(format!("flag --{name}"), message),
    })
}
