//! Fuzzing of the controller's parsers of outside input: the command line, environment and
//! config file (`loxi_ccm::config::load` and the validation into a `Config`), `AddressPool`
//! and `AddressClaim` objects as the API server could hand them over (arbitrary JSON, also
//! what no CRD schema would admit: objects written before the schema's rules, or straight
//! into etcd), the Service's sharing annotations, and the inventory file's YAML/JSON text.
//! Arbitrary input never panics, and every refusal names where the bad value came from.
//!
//! CI runs a few hundred cases per property (a few seconds); a long run:
//! `PROPTEST_CASES=20000 cargo test -p loxi-ccm --test fuzz_inputs --release`
//! (docs/testing.md). No control plane is needed.

use std::collections::BTreeMap;
use std::ffi::OsString;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use loxi_ccm::config::{ConfigError, LoadError, load};
use loxi_ccm::ipam::address_pools::{AddressPool, to_spec};
use loxi_ccm::ipam::claims::AddressClaim;
use loxi_domain::pools::validate_pool;
use proptest::prelude::*;

fn cases(ci: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci;
    }
    config
}

const PIECES: &[&str] = &[
    "0",
    "1",
    "24",
    "65535",
    "65536",
    "4294967296",
    "99999999999999999999",
    "-1",
    "1.5",
    "NaN",
    ".",
    ":",
    "/",
    "-",
    ",",
    "=",
    " ",
    "\n",
    "\t",
    "\0",
    "é",
    "[",
    "]",
    "{",
    "}",
    "'",
    "\"",
    "#",
    "&a",
    "*a",
    "!!str",
    "---",
    "...",
    "|",
    ">",
    "true",
    "false",
    "yes",
    "null",
    "~",
    "http://",
    "https://",
    "127.0.0.1",
    ":11111",
    "192.0.2.0/24",
    "2001:db8::/64",
    "10.0.0.1-10.0.0.9",
    "a=10.0.0.0/24",
    "5s",
    "500ms",
    "1h",
    "fullnat",
    "dsr",
    "2",
    "loxilb.io/loxilb",
    "kube-system",
    "ms",
    "enforce",
    "ignore",
    "65001",
    "[::1]:65000",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        4 => prop::collection::vec(prop::sample::select(PIECES), 0..7).prop_map(|p| p.concat()),
        1 => (1usize..200).prop_map(|n| "9".repeat(n)),
    ]
}

/// Long flags of `run`, and a few that do not exist.
fn flags() -> Vec<String> {
    let cmd = loxi_ccm::config::cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    let mut longs: Vec<String> = run
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|l| !matches!(l.as_str(), "help" | "version" | "config"))
        .collect();
    longs.extend(["loxiURL", "externalCIDR", "setLBMode", "no-such-flag"].map(str::to_string));
    longs
}

/// Config-file keys: the camelCase of every flag, legacy spellings, unknown ones.
fn file_keys() -> Vec<String> {
    let cmd = loxi_ccm::config::cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    let mut keys: Vec<String> = run
        .get_arguments()
        .flat_map(loxi_ccm::config::file_keys)
        .collect();
    keys.extend(["zone", "setRoles", "externalcidr", "nope"].map(str::to_string));
    keys
}

fn env_vars() -> Vec<String> {
    let cmd = loxi_ccm::config::cli::command();
    let run = cmd.find_subcommand("run").unwrap();
    run.get_arguments()
        .filter_map(|a| a.get_env().and_then(|e| e.to_str()).map(str::to_string))
        .filter(|e| e != "LOXI_CCM_CONFIG" && e != "KUBECONFIG")
        .collect()
}

/// A YAML file: random text, or a mapping of (mostly known) keys to scalars, lists and maps.
fn yaml() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        text().prop_map(|t| format!("{t:?}")),
        text(),
        prop::collection::vec(text().prop_map(|t| format!("{t:?}")), 0..3)
            .prop_map(|v| format!("[{}]", v.join(", "))),
        text().prop_map(|t| format!("{{a: {t:?}}}")),
    ];
    prop_oneof![
        1 => text(),
        3 => prop::collection::vec((prop::sample::select(file_keys()), value), 0..6).prop_map(
            |pairs| pairs
                .into_iter()
                .map(|(k, v)| format!("{k}: {v}\n"))
                .collect::<String>()
        ),
    ]
}

/// A refusal names the layer and option (or both options of a conflict).
fn names_its_origin(e: &ConfigError) -> bool {
    match e {
        ConfigError::Invalid { origin, message } => {
            !message.is_empty()
                && (origin.starts_with("flag --")
                    || origin.starts_with("environment LOXI_CCM_")
                    || origin.starts_with("config file ")
                    || origin.starts_with("default of --")
                    || origin.starts_with("--"))
        }
        ConfigError::Conflict(message) => !message.is_empty(),
    }
}

fn json(keys: &'static [&'static str]) -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        5 => prop::sample::select(keys).prop_map(str::to_string),
                        1 => text(),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|e| serde_json::Value::Object(e.into_iter().collect())),
        ]
    })
}

const POOL_KEYS: &[&str] = &[
    "addresses",
    "autoAssign",
    "avoidBuggyIPs",
    "priority",
    "disabled",
    "namespaceSelector",
    "serviceSelector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "retainAddresses",
];

const CLAIM_KEYS: &[&str] = &[
    "address",
    "pool",
    "service",
    "sharedWith",
    "retainUntil",
    "namespace",
    "name",
    "uid",
    "ports",
    "sharingKey",
    "role",
];

/// A custom resource around an arbitrary spec (or an arbitrary spec that mostly looks like
/// one).
fn resource(
    kind: &'static str,
    keys: &'static [&'static str],
) -> impl Strategy<Value = serde_json::Value> {
    (
        json(keys),
        prop::collection::vec((prop::sample::select(keys), json(keys)), 0..6),
    )
        .prop_map(move |(any, fields)| {
            let spec = if fields.is_empty() {
                any
            } else {
                serde_json::Value::Object(
                    fields
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect(),
                )
            };
            serde_json::json!({
                "apiVersion": "ipam.loxilb.io/v1alpha1",
                "kind": kind,
                "metadata": {"name": "x"},
                "spec": spec,
            })
        })
}

proptest! {
    #![proptest_config(cases(192))]

    /// Command line, environment and config file together, as the binary reads them.
    #[test]
    fn configuration_never_panics_and_names_the_origin(
        args in prop::collection::vec((prop::sample::select(flags()), prop::option::of(text())), 0..6),
        env in prop::collection::btree_map(prop::sample::select(env_vars()), text(), 0..4),
        file in prop::option::of(yaml()),
        url in prop::sample::select(vec![None, Some("http://127.0.0.1:11111"), Some("https://loxilb:8091")]),
    ) {
        let mut argv: Vec<OsString> = vec!["loxi-ccm".into(), "run".into()];
        if let Some(url) = url {
            argv.push(format!("--loxilb-url={url}").into());
        }
        for (flag, value) in &args {
            argv.push(match value {
                Some(v) => format!("--{flag}={v}"),
                None => format!("--{flag}"),
            }.into());
        }
        let path = std::env::temp_dir()
            .join(format!("loxi-ccm-fuzz-{}.yaml", std::process::id()));
        let mut env: BTreeMap<String, String> = env;
        if let Some(text) = &file {
            std::fs::write(&path, text).unwrap();
            env.insert("LOXI_CCM_CONFIG".into(), path.display().to_string());
        }
        let lookup = |k: &str| env.get(k).map(OsString::from);
        match load(argv, &lookup) {
            Ok(loaded) => {
                if let Err(e) = loaded.config() {
                    prop_assert!(names_its_origin(&e), "{e:?}");
                }
            }
            Err(LoadError::Invalid { error, .. }) => {
                prop_assert!(names_its_origin(&error), "{error:?}");
            }
            // clap's own errors name the argument in their text.
            Err(LoadError::Clap(e)) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// AddressPools as the API server might hand them over: whatever decodes is validated
    /// with each problem naming its field; what does not decode is skipped by the watch.
    #[test]
    fn address_pools_never_panic_and_name_the_field(obj in resource("AddressPool", POOL_KEYS)) {
        if let Ok(pool) = serde_json::from_value::<AddressPool>(obj)
            && let Err(problems) = validate_pool(&to_spec(&pool))
        {
            for p in &problems {
                prop_assert!(
                    ["addresses:", "namespaceSelector:", "serviceSelector:", "retainAddresses:"]
                        .iter()
                        .any(|f| p.starts_with(f)),
                    "{p}"
                );
            }
        }
    }

    /// AddressClaims, including hand-edited ones: reading their address, owners, sharing and
    /// retention never panics.
    #[test]
    fn address_claims_never_panic(obj in resource("AddressClaim", CLAIM_KEYS)) {
        if let Ok(claim) = serde_json::from_value::<AddressClaim>(obj) {
            let _ = claim.ip();
            let _ = claim.owner_key();
            for owner in claim.owners() {
                let _ = owner.sharing();
                let _ = owner.key();
            }
            let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
            let _ = claim.expired(now);
        }
    }

    /// The sharing annotations of a Service with arbitrary ports.
    #[test]
    fn service_sharing_never_panics_and_names_the_annotation(
        key in prop::option::of(text()),
        ports in prop::collection::vec((any::<i32>(), prop::option::of(text())), 0..4),
    ) {
        let mut annotations = BTreeMap::new();
        if let Some(k) = &key {
            annotations.insert("loxilb.io/sharing-key".to_string(), k.clone());
        }
        let svc = Service {
            metadata: ObjectMeta {
                name: Some("s".into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(ports.into_iter().map(|(port, protocol)| ServicePort {
                    port,
                    protocol,
                    ..Default::default()
                }).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        if let Err(e) = loxi_ccm::ipam::service_sharing(&svc, "llb") {
            prop_assert_eq!(e.annotation, "loxilb.io/sharing-key");
        }
    }

    /// The inventory file's text (YAML or JSON): a refusal is a syntax error or names the
    /// entry and field.
    #[test]
    fn inventory_text_never_panics(text in prop_oneof![
        text(),
        json(&["nodes", "match", "name", "cidr", "zone", "region", "instanceType", "retired"])
            .prop_map(|v| serde_json::to_string(&v).unwrap()),
        yaml(),
    ]) {
        match loxi_ccm::node_init::parse_inventory(&text, "fuzz") {
            Ok(_) | Err(loxi_ccm::node_init::LoadError::Syntax { .. }) => {}
            Err(loxi_ccm::node_init::LoadError::Invalid { error, .. }) => {
                prop_assert!(error.to_string().starts_with("inventory"), "{error}");
            }
            Err(other) => prop_assert!(false, "reading text cannot be unavailable: {other}"),
        }
    }
}
