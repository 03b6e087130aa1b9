//! Where each option came from (flag, environment, config file, default), so that every
//! error names the layer its value came from.

use std::collections::HashMap;
use std::path::PathBuf;

use loxi_domain::text::shown;

use crate::config::ConfigError;

/// The layer an option's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Env(String),
    File { path: PathBuf, key: String },
    Default,
}

impl Origin {
    /// `flag --lb-mode`, `environment LOXI_CCM_LB_MODE`, `config file X: key "lbMode"`,
    /// `default of --lb-mode`.
    pub fn describe(&self, long: &str) -> String {
        match self {
            Origin::Flag => format!("flag --{long}"),
            Origin::Env(var) => format!("environment {var}"),
            Origin::File { path, key } => {
                format!("config file {}: key {}", path.display(), shown(key))
            }
            Origin::Default => format!("default of --{long}"),
        }
    }
}

/// The origin of every option, by clap argument id.
#[derive(Debug, Clone, Default)]
pub struct Origins {
    /// id -> (long flag name, origin)
    entries: HashMap<String, (String, Origin)>,
}

impl Origins {
    pub(super) fn insert(&mut self, id: &str, long: &str, origin: Origin) {
        self.entries
            .insert(id.to_string(), (long.to_string(), origin));
    }

    /// Where the option with clap id `id` came from ([`Origin::Default`] when unknown).
    pub fn of(&self, id: &str) -> Origin {
        self.entries
            .get(id)
            .map(|(_, o)| o.clone())
            .unwrap_or(Origin::Default)
    }

    /// The source of option `id` as error messages name it. Without recorded origins (a
    /// [`Config::from_args`] caller) simply `--long-name`.
    pub fn describe(&self, id: &str) -> String {
        match self.entries.get(id) {
            Some((long, origin)) => origin.describe(long),
            None => format!("--{}", long_of(id)),
        }
    }

    /// The refusal of `value` of option `id`: `<source>: invalid value "<value>": <reason>`.
    pub(super) fn invalid_value(&self, id: &str, value: &str, reason: &str) -> ConfigError {
        ConfigError::invalid(
            self.describe(id),
            format!("invalid value {}: {reason}", shown(value)),
        )
    }

    /// The refusal of option `id` as a whole: `<source>: <message>`.
    pub(super) fn invalid(&self, id: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.describe(id), message)
    }

    pub(super) fn by_long(&self, long: &str) -> Option<&Origin> {
        self.entries
            .values()
            .find(|(l, _)| l == long)
            .map(|(_, o)| o)
    }
}

/// The long flag of the `run` option with clap id `id`.
fn long_of(id: &str) -> String {
    crate::config::cli::command()
        .find_subcommand("run")
        .and_then(|run| {
            run.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_long().map(str::to_string))
        })
        .unwrap_or_else(|| id.replace('_', "-"))
}
