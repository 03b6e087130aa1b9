//! The config file (`--config`): the keys of each option (camelCase of its long flag, and
//! kube-loxilb's and loxi-ccm (Go)'s spellings), the settings refused by name, and the
//! reading of the YAML into text values by clap id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction};
use loxi_domain::text::shown;

use crate::config::ConfigError;

/// File keys accepted besides the camelCase of the long flag: kube-loxilb's flag and config
/// spellings, and loxi-ccm (Go)'s ConfigMap keys (`apiServerURL` is its list of loxilb API
/// URLs, `externalIPcidr` its pool).
pub(super) const LEGACY_KEYS: &[(&str, &[&str])] = &[
    ("loxilb_urls", &["loxiURL", "apiServerURL"]),
    ("external_cidr", &["externalCIDR", "externalIPcidr"]),
    ("external_cidr6", &["externalCIDR6"]),
    ("cidr_pools", &["cidrPools"]),
    ("cidr6_pools", &["cidr6Pools"]),
    (
        "external_secondary_cidrs",
        &["externalSecondaryCIDRs", "ExternalSecondaryCIDRs"],
    ),
    ("set_unique_ip", &["setUniqueIP", "setExclIPAM"]),
    ("bgp_local_as", &["setBGP"]),
    ("bgp_listen_port", &["listenBGPPort"]),
    ("bgp_peers", &["extBGPPeers"]),
    ("bgp_multihop", &["eBGPMultiHop"]),
    ("bgp_crds", &["enableBGPCRDs"]),
    ("gateway_api", &["gatewayAPI"]),
    ("loxilb_gateway_class", &["loxilbGatewayClass"]),
    ("lb_mode", &["setLBMode"]),
    ("monitor", &["monitor"]),
    ("use_pod_network", &["usePodNetwork"]),
    ("private_cidr", &["privateCIDR"]),
    ("append_endpoints", &["appendEPs"]),
    ("k8s_metadata", &["enableK8sMetadata"]),
    ("load_balancer_class", &["loxilbLoadBalancerClass"]),
];

/// kube-loxilb settings (flags and config-file keys) whose feature loxi-ccm does not have
/// yet. Refused with an explanation rather than ignored: silently dropping e.g.
/// `externalSecondaryCIDRs6` would change which addresses Services get. What each did and
/// what to do meanwhile:
/// [`NOT_YET_SUPPORTED_DOC`].
pub const NOT_YET_SUPPORTED: &[&str] = &["externalSecondaryCIDRs6"];

/// The section of the documentation the refusal of a [`NOT_YET_SUPPORTED`] setting names.
pub const NOT_YET_SUPPORTED_DOC: &str = "docs/migration.md#what-is-not-supported-yet";

/// kube-loxilb / loxi-ccm (Go) config-file keys that mean nothing here (its own process
/// settings); refused by name as well, so that a reused file is read knowingly.
pub(super) const WITHOUT_MEANING: &[&str] = &[
    "hostProcPathPrefix",
    "withNamespace",
    "nodePortServiceVirtIP",
    "clientConnection",
];

/// Why the kube-loxilb / loxi-ccm (Go) setting `name` is refused, if it is one loxi-ccm
/// knows and does not take.
pub(super) fn unsupported(name: &str) -> Option<String> {
    if NOT_YET_SUPPORTED.contains(&name) {
        return Some(format!(
            "kube-loxilb's {name} is not supported by loxi-ccm yet: remove it \
             ({NOT_YET_SUPPORTED_DOC} says what it did and what to do instead)"
        ));
    }
    WITHOUT_MEANING.contains(&name).then(|| {
        format!(
            "{name} is a kube-loxilb / loxi-ccm (Go) setting that means nothing to loxi-ccm: \
             remove it (docs/migration.md#from-kube-loxilb)"
        )
    })
}

/// `loxilb-url` -> `loxilbUrl`, `external-cidr6` -> `externalCidr6`.
pub fn camel_case(long: &str) -> String {
    let mut out = String::with_capacity(long.len());
    for (i, part) in long.split('-').filter(|p| !p.is_empty()).enumerate() {
        if i == 0 {
            out.push_str(part);
        } else {
            let mut chars = part.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        }
    }
    out
}

/// The config-file keys of an option: the camelCase of its long flag first, then legacy
/// spellings. Empty for `--config` itself (a config file cannot name another one) and for
/// `--help` / `--version`.
pub fn file_keys(arg: &Arg) -> Vec<String> {
    let id = arg.get_id().as_str();
    if matches!(id, "config" | "help" | "version") {
        return Vec::new();
    }
    let Some(long) = arg.get_long() else {
        return Vec::new();
    };
    let mut keys = vec![camel_case(long)];
    for (_, extra) in LEGACY_KEYS.iter().filter(|(i, _)| *i == id) {
        for k in *extra {
            if !keys.iter().any(|have| have == k) {
                keys.push(k.to_string());
            }
        }
    }
    keys
}

/// Values found in the config file, by clap id: (the key used, the values as text).
#[derive(Debug, Default)]
pub(super) struct FileLayer {
    pub(super) path: PathBuf,
    pub(super) values: HashMap<String, (String, Vec<String>)>,
}

fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
}

pub(super) fn parse_file(path: &Path, text: &str, args: &[&Arg]) -> Result<FileLayer, ConfigError> {
    let at = format!("config file {}", path.display());
    let doc: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(text)
            .map_err(|e| ConfigError::invalid(&at, format!("not valid YAML: {e}")))?
    };
    let map = match doc {
        serde_json::Value::Null => serde_json::Map::new(),
        serde_json::Value::Object(m) => m,
        other => {
            return Err(ConfigError::invalid(
                &at,
                format!(
                    "expected a mapping of option keys to values at the top level, found {}",
                    json_kind(&other)
                ),
            ));
        }
    };
    let mut by_key: HashMap<String, &Arg> = HashMap::new();
    for arg in args {
        for key in file_keys(arg) {
            by_key.insert(key, arg);
        }
    }
    let mut layer = FileLayer {
        path: path.to_path_buf(),
        values: HashMap::new(),
    };
    for (key, value) in map {
        let Some(arg) = by_key.get(key.as_str()) else {
            if let Some(why) = unsupported(&key) {
                return Err(ConfigError::invalid(
                    format!("{at}: key {}", shown(&key)),
                    why,
                ));
            }
            let hint = suggest(&key, by_key.keys().map(String::as_str))
                .map(|k| format!(" (did you mean {k:?}?)"))
                .unwrap_or_default();
            return Err(ConfigError::invalid(
                &at,
                format!("unknown key {}{hint}", shown(&key)),
            ));
        };
        let origin = format!("{at}: key {}", shown(&key));
        let Some(values) = scalars(&value).map_err(|m| ConfigError::invalid(&origin, m))? else {
            continue; // `key:` with no value: as if absent
        };
        if values.is_empty() && takes_many(arg) {
            continue;
        }
        if !takes_many(arg) && values.len() != 1 {
            return Err(ConfigError::invalid(
                &origin,
                format!("expects one value, got a list of {}", values.len()),
            ));
        }
        let id = arg.get_id().to_string();
        if let Some((other, _)) = layer.values.get(&id) {
            let (first, second) = if *other < key {
                (other.as_str(), key.as_str())
            } else {
                (key.as_str(), other.as_str())
            };
            return Err(ConfigError::invalid(
                &at,
                format!(
                    "keys {} and {} both set --{}: keep one",
                    shown(first),
                    shown(second),
                    arg.get_long().unwrap_or(&id)
                ),
            ));
        }
        layer.values.insert(id, (key, values));
    }
    Ok(layer)
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

/// A YAML value as the text values clap would receive: a scalar is one value, a list of
/// scalars several. `None` for null.
fn scalars(v: &serde_json::Value) -> Result<Option<Vec<String>>, String> {
    fn one(v: &serde_json::Value) -> Result<String, String> {
        match v {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Bool(b) => Ok(b.to_string()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            other => Err(format!(
                "expected a value or a list of values, found {} in the list",
                json_kind(other)
            )),
        }
    }
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Array(items) => {
            items.iter().map(one).collect::<Result<_, _>>().map(Some)
        }
        serde_json::Value::Object(_) => {
            Err("expected a value or a list of values, found a mapping".to_string())
        }
        scalar => Ok(Some(vec![one(scalar)?])),
    }
}

/// The known key closest to a mistyped one: at most 2 edits apart ignoring case, the
/// exact-case distance breaking ties.
fn suggest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    known
        .filter_map(|k| {
            let d = edit_distance(&lower, &k.to_ascii_lowercase());
            (d <= 2).then(|| ((d, edit_distance(key, k)), k))
        })
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
