//! Fuzzing of every parser in this crate that reads outside input: Service annotations
//! (`intent`, `addressing`), durations, BGP settings and kube-loxilb's BGP resources,
//! AddressPool specs (`pools`, address blocks, label selectors), claim owner ports and the
//! node inventory. Arbitrary text and structures, biased towards almost-valid values (the
//! pieces real values are made of, glued in random order), must never panic, and every
//! refusal must be a typed error that names the field it is about.
//!
//! CI runs a few hundred cases per property (a few seconds in all). A long run raises the
//! count: `PROPTEST_CASES=200000 cargo test -p loxi-domain --test fuzz_parsers --release`
//! (docs/testing.md lists the numbers run).

use std::collections::BTreeMap;

use loxi_domain::addressing::{
    ANN_IPAM, ANN_NUM_SECONDARY, ANN_POOL_SELECT, ANN_POOL_SELECT_SECONDARY, ANN_RETAIN,
    ANN_SECONDARY_IPS, ANN_STATIC_IP, AddressInput, address_slots, retention, secondary_slots,
};
use loxi_domain::bgp::{
    BGPPeerServiceSpec, BGPPolicyApplyServiceSpec, BGPPolicyDefinedSetsServiceSpec,
    BGPPolicyDefinitionServiceSpec, BgpInput, BgpSettings, Peer, parse_asn, parse_masklength_range,
    parse_peers, parse_router_id,
};
use loxi_domain::duration::parse_duration;
use loxi_domain::intent::{
    ANN_EP_SELECT, ANN_LB_MODE, ANN_LIVENESS, ANN_MULTUS_NETS, ANN_NODE_LABEL, ANN_PREF_LOCAL_POD,
    ANN_PRIO_WEIGHTS, ANN_PROBE_PORT, ANN_PROBE_REQ, ANN_PROBE_RESP, ANN_PROBE_RETRIES,
    ANN_PROBE_TIMEOUT, ANN_PROBE_TYPE, ANN_PROXY_PROTOCOL_V2, ANN_TIMEOUT,
    ANN_USE_EXTERNAL_ENDPOINT, ANN_USE_POD_NETWORK,
};
use loxi_domain::inventory::{Document, Inventory};
use loxi_domain::ipam::{AddressBlock, Family, PortProto};
use loxi_domain::mtls::{
    ANN_MTLS_BACKEND_VERIFY, ANN_MTLS_FRONTEND_MODE, ANN_MTLS_FRONTEND_SECRET,
};
use loxi_domain::pools::{PoolSpec, RawRequirement, RawSelector, validate_pool};
use loxi_domain::{Defaults, NatMode, parse_intent};
use proptest::prelude::*;

/// `ci` cases unless `PROPTEST_CASES` says otherwise (the long run).
fn cases(ci: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci;
    }
    config
}

/// Pieces real values are made of, and some that break parsers: separators, signs, huge
/// numbers, non-ASCII, control characters.
const PIECES: &[&str] = &[
    "0",
    "1",
    "7",
    "24",
    "32",
    "65",
    "128",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "99999999999999999999",
    "-1",
    "+1",
    "1.5",
    "1e400",
    "NaN",
    "inf",
    "10",
    ".",
    "..",
    ":",
    "::",
    "/",
    "-",
    ",",
    ";",
    "=",
    "[",
    "]",
    "*",
    "?",
    "%",
    " ",
    "\t",
    "\n",
    "\0",
    "é",
    "\u{202e}",
    "🙂",
    "10.0.0.1",
    "192.0.2.255",
    "0.0.0.0",
    "255.255.255.255",
    "::1",
    "2001:db8::",
    "fe80::1%eth0",
    "::ffff:10.0.0.1",
    "10.0.0.0/24",
    "/0",
    "/33",
    "/129",
    "ms",
    "s",
    "m",
    "h",
    "d",
    "yes",
    "no",
    "true",
    "false",
    "on",
    "off",
    "tcp",
    "udp",
    "sctp",
    "ping",
    "http",
    "https",
    "none",
    "TCP",
    "default",
    "onearm",
    "fullnat",
    "dsr",
    "fullproxy",
    "hostonearm",
    "rr",
    "roundrobin",
    "hash",
    "persist",
    "lc",
    "n2",
    "n3",
    "prio",
    "ipv4",
    "ipv6",
    "ipv6to4",
    "IPv4",
    "IPv6",
    "key",
    "value",
    "a-b",
    "net1",
    "rack1",
    "x",
    "In",
    "NotIn",
    "Exists",
    "DoesNotExist",
    "prefix",
    "neighbor",
    "import",
    "export",
    "accept",
    "reject",
    "1.10",
    "65000",
    "0.1",
];

/// Arbitrary text: unstructured strings, or pieces glued together (which reach far deeper
/// into the parsers than random characters do).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        1 => "[ -~]{0,24}",
        4 => prop::collection::vec(prop::sample::select(PIECES), 0..8).prop_map(|p| p.concat()),
        1 => (1usize..300).prop_map(|n| "9".repeat(n)),
    ]
}

const ANNOTATIONS: &[&str] = &[
    ANN_LB_MODE,
    ANN_EP_SELECT,
    ANN_PRIO_WEIGHTS,
    ANN_LIVENESS,
    ANN_TIMEOUT,
    ANN_PROBE_TYPE,
    ANN_PROBE_PORT,
    ANN_PROBE_REQ,
    ANN_PROBE_RESP,
    ANN_PROBE_TIMEOUT,
    ANN_PROBE_RETRIES,
    ANN_USE_POD_NETWORK,
    ANN_MULTUS_NETS,
    ANN_NODE_LABEL,
    ANN_PREF_LOCAL_POD,
    ANN_PROXY_PROTOCOL_V2,
    ANN_USE_EXTERNAL_ENDPOINT,
    ANN_MTLS_FRONTEND_MODE,
    ANN_MTLS_FRONTEND_SECRET,
    ANN_MTLS_BACKEND_VERIFY,
    ANN_POOL_SELECT,
    ANN_IPAM,
    ANN_STATIC_IP,
    ANN_SECONDARY_IPS,
    ANN_NUM_SECONDARY,
    ANN_POOL_SELECT_SECONDARY,
    ANN_RETAIN,
    "loxilb.io/sharing-key",
    "loxilb.io/somethingnew",
    "example.com/other",
];

fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop_oneof![
            6 => prop::sample::select(ANNOTATIONS).prop_map(str::to_string),
            1 => text(),
        ],
        text(),
        0..8,
    )
}

fn defaults() -> impl Strategy<Value = Defaults> {
    (0u8..6, any::<bool>(), any::<bool>()).prop_map(|(mode, monitor, use_pod_network)| Defaults {
        mode: mode.to_string().parse::<NatMode>().unwrap_or_default(),
        monitor,
        use_pod_network,
    })
}

/// A refusal names a field the input really has: an annotation the Service carries, or
/// the spec field it came from.
fn names_a_given_field(
    field: &str,
    annotations: &BTreeMap<String, String>,
    spec_fields: &[&str],
) -> bool {
    annotations.contains_key(field) || spec_fields.contains(&field)
}

/// An arbitrary JSON value whose object keys are often the ones the decoder looks for.
fn json(keys: &'static [&'static str]) -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        4 => prop::sample::select(keys).prop_map(str::to_string),
                        1 => text(),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|entries| serde_json::Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// The inventory's untyped tree, with the keys the validator looks for.
fn document() -> impl Strategy<Value = Document> {
    const KEYS: &[&str] = &[
        "nodes",
        "match",
        "name",
        "cidr",
        "zone",
        "region",
        "instanceType",
        "retired",
    ];
    let leaf = prop_oneof![
        Just(Document::Null),
        any::<bool>().prop_map(Document::Bool),
        any::<i128>().prop_map(Document::Int),
        any::<f64>().prop_map(Document::Float),
        text().prop_map(Document::Str),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Document::Seq),
            prop::collection::vec(
                (
                    prop_oneof![
                        5 => prop::sample::select(KEYS).prop_map(str::to_string),
                        1 => text(),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(Document::Map),
        ]
    })
}

fn selector() -> impl Strategy<Value = RawSelector> {
    (
        prop::collection::btree_map(text(), text(), 0..3),
        prop::collection::vec(
            (text(), text(), prop::collection::vec(text(), 0..3)).prop_map(
                |(key, operator, values)| RawRequirement {
                    key,
                    operator,
                    values,
                },
            ),
            0..3,
        ),
    )
        .prop_map(|(match_labels, match_expressions)| RawSelector {
            match_labels,
            match_expressions,
        })
}

fn pool_spec() -> impl Strategy<Value = PoolSpec> {
    (
        text(),
        prop::collection::vec(text(), 0..5),
        (any::<bool>(), any::<bool>(), any::<i32>(), any::<bool>()),
        prop::option::of(selector()),
        prop::option::of(selector()),
        prop::option::of(text()),
    )
        .prop_map(
            |(
                name,
                addresses,
                (auto_assign, avoid_buggy_ips, priority, disabled),
                ns,
                svc,
                retain,
            )| {
                PoolSpec {
                    name,
                    addresses,
                    auto_assign,
                    avoid_buggy_ips,
                    priority,
                    disabled,
                    namespace_selector: ns,
                    service_selector: svc,
                    retain,
                    advertise: true,
                }
            },
        )
}

const POOL_FIELDS: &[&str] = &[
    "addresses:",
    "namespaceSelector:",
    "serviceSelector:",
    "retainAddresses:",
];

proptest! {
    #![proptest_config(cases(512))]

    /// Every annotation the controller reads, in any combination and with any value.
    #[test]
    fn annotations_never_panic_and_name_the_annotation(
        annotations in annotations(),
        defaults in defaults(),
        families in prop::collection::vec(prop_oneof![Just("IPv4".to_string()), Just("IPv6".to_string()), text()], 0..3),
        policy in prop::option::of(prop_oneof![Just("SingleStack".to_string()), Just("PreferDualStack".to_string()), Just("RequireDualStack".to_string()), text()]),
        lb_ip in prop::option::of(text()),
        pools in (any::<bool>(), any::<bool>()),
    ) {
        if let Err(e) = parse_intent(&annotations, defaults) {
            // The annotation at fault, or one the others make required (`probetype: tcp`
            // without `probeport`): a known one, and the message says so.
            prop_assert!(
                names_a_given_field(e.annotation, &annotations, &[])
                    || (ANNOTATIONS.contains(&e.annotation) && e.reason.starts_with("required")),
                "{e}"
            );
            prop_assert!(e.to_string().contains(e.annotation));
        }
        let input = AddressInput {
            annotations: Some(&annotations),
            ip_families: &families,
            ip_family_policy: policy.as_deref(),
            load_balancer_ip: lb_ip.as_deref(),
        };
        let has_pool = |f: Family| if f == Family::V4 { pools.0 } else { pools.1 };
        match address_slots(&input, has_pool) {
            Err(e) => {
                prop_assert!(names_a_given_field(e.annotation, &annotations, &["spec.loadBalancerIP"]), "{e}");
            }
            Ok(slots) => {
                prop_assert!(!slots.is_empty() && slots.len() <= 2);
                for family in [Family::V4, Family::V6] {
                    if let Err(e) = secondary_slots(Some(&annotations), family) {
                        prop_assert!(names_a_given_field(e.annotation, &annotations, &[]), "{e}");
                    }
                }
            }
        }
        if let Err(e) = retention(Some(&annotations)) {
            prop_assert_eq!(e.annotation, ANN_RETAIN);
        }
    }

    /// Durations (flags, annotations, pool settings): never a panic, never a negative or
    /// non-finite value read as something.
    #[test]
    fn durations_never_panic(s in text()) {
        if let Ok(d) = parse_duration(&s) {
            prop_assert!(d.as_secs_f64().is_finite());
        }
    }

    /// BGP flags: each refusal names the setting it is about.
    #[test]
    fn bgp_settings_never_panic_and_name_the_setting(
        local_as in prop::option::of(text()),
        router_id in prop::option::of(text()),
        listen_port in prop::option::of(any::<u16>()),
        multihop in any::<bool>(),
        peers in prop::option::of(text()),
        loxilb in prop::option::of(any::<[u8; 4]>()),
    ) {
        let input = BgpInput {
            local_asn: local_as.as_deref(),
            router_id: router_id.as_deref(),
            listen_port,
            multihop,
            peers: peers.as_deref(),
        };
        match BgpSettings::from_input(&input) {
            Err(e) => prop_assert!(
                ["setBGP", "bgpRouterId", "listenBGPPort", "extBGPPeers"].contains(&e.field.as_str()),
                "{e}"
            ),
            Ok(Some(settings)) => {
                let ip = loxilb.map(std::net::IpAddr::from);
                if let Err(e) = settings.router_id_for(ip) {
                    prop_assert!(!e.field.is_empty());
                }
            }
            Ok(None) => {}
        }
        if let Some(list) = &peers {
            let _ = parse_peers(list);
            for item in list.split(',') {
                if let Err(e) = Peer::parse(item) {
                    prop_assert!(!e.field.is_empty());
                }
            }
        }
        if let Some(text) = &local_as && let Err(e) = parse_asn("setBGP", text) {
            prop_assert_eq!(e.field.as_str(), "setBGP");
        }
        if let Some(text) = &router_id && let Err(e) = parse_router_id(text) {
            prop_assert!(!e.field.is_empty());
        }
        if let Some(text) = &peers && let Err(e) = parse_masklength_range("spec.x", text) {
            prop_assert_eq!(e.field.as_str(), "spec.x");
        }
    }

    /// kube-loxilb's BGP resources, from arbitrary JSON: decoding may refuse them (the API
    /// server's schema would), and whatever decodes is checked with errors naming a
    /// `spec.` field.
    #[test]
    fn bgp_resources_never_panic_and_name_the_field(
        peer in json(&["ipAddress", "remoteAs", "remotePort", "setMultiHop"]),
        sets in json(&["name", "definedType", "List", "prefixList", "ipPrefix", "masklengthRange"]),
        definition in json(&["name", "statement", "conditions", "actions", "prefixSet", "neighborSet",
            "matchSetOption", "bgpConditions", "routeDisposition", "bgpActions", "setMed",
            "setLocalPerf", "setNextHop", "setCommunity", "setAsPathPrepend", "asPathLength",
            "operator", "value", "afiSafiIn", "rpki", "communities", "options", "as", "repeatN",
            "asPathSet", "communitySet", "routeType", "nextHopInList"]),
        apply in json(&["ipAddress", "policyType", "policies", "routeAction"]),
    ) {
        if let Ok(spec) = serde_json::from_value::<BGPPeerServiceSpec>(peer)
            && let Err(e) = spec.peer()
        {
            prop_assert!(e.field.starts_with("spec."), "{e}");
        }
        if let Ok(spec) = serde_json::from_value::<BGPPolicyDefinedSetsServiceSpec>(sets)
            && let Err(e) = spec.validate()
        {
            prop_assert!(e.field.starts_with("spec."), "{e}");
        }
        if let Ok(spec) = serde_json::from_value::<BGPPolicyDefinitionServiceSpec>(definition)
            && let Err(e) = spec.validate()
        {
            prop_assert!(e.field.starts_with("spec."), "{e}");
        }
        if let Ok(spec) = serde_json::from_value::<BGPPolicyApplyServiceSpec>(apply)
            && let Err(e) = spec.validate()
        {
            prop_assert!(e.field.starts_with("spec."), "{e}");
        }
    }

    /// AddressPool specs: every problem is prefixed by the spec field it is about.
    #[test]
    fn pool_specs_never_panic_and_name_the_field(spec in pool_spec()) {
        match validate_pool(&spec) {
            Err(problems) => {
                prop_assert!(!problems.is_empty());
                for p in &problems {
                    prop_assert!(POOL_FIELDS.iter().any(|f| p.starts_with(f)), "{p}");
                }
            }
            Ok(def) => {
                // A valid pool can be used: sizes and membership never panic.
                let _ = def.pool.size(Family::V4);
                let _ = def.pool.size(Family::V6);
            }
        }
    }

    /// Address blocks (flags and pools) and owner ports (claims) alone.
    #[test]
    fn blocks_and_ports_never_panic(s in text(), skip in any::<bool>()) {
        if let Ok(block) = AddressBlock::parse(&s, skip) {
            prop_assert!(!block.to_string().is_empty());
        }
        if let Ok(p) = s.parse::<PortProto>() {
            // What parses prints back to something that parses to the same.
            prop_assert_eq!(p.to_string().parse::<PortProto>(), Ok(p));
        }
    }

    /// The node inventory, as any document a YAML or JSON file can hold.
    #[test]
    fn inventory_never_panics_and_names_the_place(doc in document()) {
        if let Err(e) = Inventory::from_document(&doc) {
            let message = e.to_string();
            prop_assert!(message.starts_with("inventory"), "{message}");
            prop_assert!(e.index().is_some() || e.field().is_some()
                || matches!(doc, Document::Seq(_) | Document::Bool(_) | Document::Int(_)
                    | Document::Float(_) | Document::Str(_)), "{message}");
        }
    }

    /// The inventory from raw JSON text.
    #[test]
    fn inventory_text_never_panics(text in text()) {
        if let Ok(doc) = serde_json::from_str::<Document>(&text) {
            let _ = Inventory::from_document(&doc);
        }
    }
}
