//! The CRDs refuse bad input at apply time (`src/ipam/cel.rs`): every bad `AddressPool` and
//! `AddressClaim` below is answered 422 by the real API server, naming the field and the
//! reason; every good one, including every pool shape the other tests use, is accepted.
//! Requests are server-side dry runs: nothing is stored. Where the controller reads the same
//! text (`validate_pool`), it agrees with the API server on each example, except where a
//! row says otherwise. A pool written before the rules existed stays editable.

mod common;

use common::{WAIT, control_plane, store_in_etcd, wait_for};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Resource;
use loxi_ccm::ipam::address_pools::{AddressPool, AddressPoolSpec, to_spec};
use loxi_ccm::ipam::claims::AddressClaim;
use loxi_domain::pools::validate_pool;
use serde_json::{Value, json};

async fn client() -> kube::Client {
    control_plane().admin_client().await.unwrap()
}

/// `(field, message)` of each cause of a refusal.
type Causes = Vec<(String, String)>;

/// Creates an object of kind `K` with `spec` (dry run): `Ok` if accepted, the causes of a 422
/// otherwise (any other answer fails the test).
async fn dry_create<K: Resource<DynamicType = ()>>(
    client: &kube::Client,
    spec: &Value,
) -> Result<(), Causes> {
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": "crd-validation-example"},
        "spec": spec,
    }))
    .unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 422 => Err(status
            .details
            .map(|d| d.causes)
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.field, c.message))
            .collect()),
        Err(e) => panic!("{spec}: unexpected answer {e:?}"),
    }
}

/// Whether the controller's own checks accept `spec` as an AddressPool (`None`: it does not
/// even deserialize, as a priority past i32).
fn controller_accepts(spec: &Value) -> Option<bool> {
    let spec: AddressPoolSpec = serde_json::from_value(spec.clone()).ok()?;
    Some(validate_pool(&to_spec(&AddressPool::new("example", spec))).is_ok())
}

/// A pool with one `addresses` entry and `extra` fields.
fn pool(addresses: &[&str], extra: Value) -> Value {
    let mut spec = json!({ "addresses": addresses });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

/// Asserts that `causes` has one for `field` whose message says `reason`.
fn assert_refused(spec: &Value, result: Result<(), Causes>, field: &str, reason: &str) {
    let causes = match result {
        Ok(()) => panic!("{spec} was accepted; expected {field}: {reason}"),
        Err(causes) => causes,
    };
    assert!(
        causes
            .iter()
            .any(|(f, message)| f == field && message.contains(reason)),
        "{spec}: expected {field}: ...{reason}..., got {causes:#?}"
    );
}

#[tokio::test]
async fn bad_address_pools_are_refused_naming_the_field_and_the_reason() {
    let client = client().await;
    let not_block = "neither a CIDR (192.0.2.0/24, 2001:db8::/120) nor a range a-b";
    let after = "the start of the range is after its end";
    let not_duration = "not a duration: a number and an optional unit ms, s, m or h";
    let many: Vec<String> = (0..65).map(|i| format!("10.9.{i}.0/24")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let ns = |expr: Value| json!({"namespaceSelector": {"matchExpressions": [expr]}});
    // (spec, field, reason, whether the controller refuses it too)
    let cases: Vec<(Value, &str, &str, bool)> = vec![
        (
            pool(&["nope"], json!({})),
            "spec.addresses[0]",
            not_block,
            true,
        ),
        (
            pool(&["10.251.1.0/33"], json!({})),
            "spec.addresses[0]",
            not_block,
            true,
        ),
        (
            pool(&["2001:db8::/129"], json!({})),
            "spec.addresses[0]",
            not_block,
            true,
        ),
        (
            pool(&["192.0.2.1"], json!({})),
            "spec.addresses[0]",
            not_block,
            true,
        ),
        (
            pool(&["192.0.2.0/24", "10.0.0.5-10.0.0.4"], json!({})),
            "spec.addresses[1]",
            after,
            true,
        ),
        (
            pool(&["10.0.1.0-10.0.0.255"], json!({})),
            "spec.addresses[0]",
            after,
            true,
        ),
        (
            pool(&["255.255.255.255-0.0.0.0"], json!({})),
            "spec.addresses[0]",
            after,
            true,
        ),
        (
            pool(&["2001:db8::1:0-2001:db8::ffff"], json!({})),
            "spec.addresses[0]",
            after,
            true,
        ),
        (
            pool(&["::1-::"], json!({})),
            "spec.addresses[0]",
            after,
            true,
        ),
        (
            pool(&["2001:db8::8000-2001:db8::7fff"], json!({})),
            "spec.addresses[0]",
            after,
            true,
        ),
        (
            pool(&["10.0.0.1-2001:db8::1"], json!({})),
            "spec.addresses[0]",
            "the start and the end of the range are of different families",
            true,
        ),
        (
            pool(&["x-10.0.0.1"], json!({})),
            "spec.addresses[0]",
            "the start of the range is not an IP address",
            true,
        ),
        (
            pool(&["10.0.0.1-y"], json!({})),
            "spec.addresses[0]",
            "the end of the range is not an IP address",
            true,
        ),
        (
            pool(&["10.0.0.1-10.0.0.2-10.0.0.3"], json!({})),
            "spec.addresses[0]",
            "the end of the range is not an IP address",
            true,
        ),
        (
            pool(&[], json!({})),
            "spec.addresses",
            "should have at least 1 items",
            true,
        ),
        // Bounds the rules' cost needs; the controller has none.
        (
            pool(&many, json!({})),
            "spec.addresses",
            "must have at most 64 items",
            false,
        ),
        // CEL refuses IPv4-mapped IPv6 blocks; the controller reads them.
        (
            pool(&["::ffff:192.0.2.0/120"], json!({})),
            "spec.addresses[0]",
            not_block,
            false,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "1d"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "-1s"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "1e5"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "."})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "ms"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "5 s"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"retainAddresses": "1.2.3s"})),
            "spec.retainAddresses",
            not_duration,
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                json!({"retainAddresses": "99999999999999999999"}),
            ),
            "spec.retainAddresses",
            "too long a duration",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                json!({"retainAddresses": "5124095576030431h"}),
            ),
            "spec.retainAddresses",
            "too long a duration",
            true,
        ),
        (
            pool(&["10.0.0.0/24"], json!({"priority": 3_000_000_000_i64})),
            "spec.priority",
            "should be less than or equal to 2147483647",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "team", "operator": "Has", "values": ["a"]})),
            ),
            "spec.namespaceSelector.matchExpressions[0].operator",
            "Unsupported value: \"Has\"",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "team", "operator": "In"})),
            ),
            "spec.namespaceSelector.matchExpressions[0].values",
            "In needs at least one value",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "team", "operator": "NotIn", "values": []})),
            ),
            "spec.namespaceSelector.matchExpressions[0].values",
            "NotIn needs at least one value",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "team", "operator": "Exists", "values": ["a"]})),
            ),
            "spec.namespaceSelector.matchExpressions[0].values",
            "Exists takes no values",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "-team", "operator": "Exists"})),
            ),
            "spec.namespaceSelector.matchExpressions[0].key",
            "not a label key",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "Example.com/team", "operator": "Exists"})),
            ),
            "spec.namespaceSelector.matchExpressions[0].key",
            "not a label key",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "a/b/c", "operator": "Exists"})),
            ),
            "spec.namespaceSelector.matchExpressions[0].key",
            "not a label key",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "t".repeat(64), "operator": "Exists"})),
            ),
            "spec.namespaceSelector.matchExpressions[0].key",
            "not a label key",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                ns(json!({"key": "team", "operator": "In", "values": ["ok", "bad value"]})),
            ),
            "spec.namespaceSelector.matchExpressions[0].values[1]",
            "not a label value",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                json!({"serviceSelector": {"matchLabels": {"bad key": "a"}}}),
            ),
            "spec.serviceSelector.matchLabels",
            "every key must be a label key",
            true,
        ),
        (
            pool(
                &["10.0.0.0/24"],
                json!({"serviceSelector": {"matchLabels": {"tier": "-edge"}}}),
            ),
            "spec.serviceSelector.matchLabels[tier]",
            "not a label value",
            true,
        ),
    ];
    for (spec, field, reason, controller_refuses) in &cases {
        let result = dry_create::<AddressPool>(&client, spec).await;
        assert_refused(spec, result, field, reason);
        if let Some(accepted) = controller_accepts(spec) {
            assert_eq!(
                accepted, !controller_refuses,
                "{spec}: the controller's own checks disagree"
            );
        }
    }
}

#[tokio::test]
async fn good_address_pools_are_accepted() {
    let client = client().await;
    let only_ns = json!({"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apool-123"]}
    ]}});
    let cases: Vec<Value> = vec![
        // The shapes of tests/ipam_pools.rs.
        pool(&["198.51.100.0/29"], only_ns.clone()),
        pool(
            &["198.51.100.0/29"],
            json!({"namespaceSelector": {
                "matchLabels": {"loxi-test/team": "blue"},
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]}
                ]
            }}),
        ),
        pool(
            &["198.51.100.64/29"],
            json!({"priority": 5, "serviceSelector": {"matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["edge"]}
            ]}}),
        ),
        pool(
            &["198.51.100.128-198.51.100.130"],
            json!({"autoAssign": false}),
        ),
        pool(
            &["198.51.100.192/29"],
            json!({"priority": 10, "retainAddresses": "1h"}),
        ),
        pool(&["10.250.0.1-10.250.0.4"], json!({"disabled": true})),
        pool(&["10.251.0.0/30"], json!({})),
        pool(&["10.251.0.2-10.251.0.5"], json!({})),
        pool(&["::/126"], json!({})),
        // IPv6, dual-stack, every range shape.
        pool(&["2001:db8::/120"], json!({})),
        pool(
            &["192.0.2.0/24", "2001:db8::/120"],
            json!({"avoidBuggyIPs": false}),
        ),
        pool(
            &["192.0.2.10-192.0.2.20", "2001:db8::5-2001:db8::ff"],
            json!({}),
        ),
        pool(&["10.0.0.1-10.0.0.1", " 10.0.0.2 - 10.0.0.3 "], json!({})),
        pool(
            &["10.0.0.255-10.0.1.0", "2001:db8::7fff-2001:db8::8000"],
            json!({}),
        ),
        pool(&["0.0.0.0-255.255.255.255"], json!({})),
        pool(&["::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"], json!({})),
        pool(&["64:ff9b::192.0.2.0/120", "192.0.2.1/24"], json!({})),
        pool(&["192.0.2.0/32", "2001:db8::1/128"], json!({})),
        // Durations as parse_duration reads them; blank is absent.
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "24h"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "1.5h"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "500ms"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "90"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "1."})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": ".5s"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": " 3m "})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": "0"})),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": ""})),
        pool(
            &["10.0.0.0/24"],
            json!({"retainAddresses": "5124095576030430h"}),
        ),
        pool(&["10.0.0.0/24"], json!({"retainAddresses": null})),
        // Selectors of every operator, keys with and without a prefix, empty values.
        pool(
            &["10.0.0.0/24"],
            json!({
                "priority": -2147483648_i64,
                "namespaceSelector": {"matchLabels": {"team": "", "example.com/x_y.z": "A-1"}},
                "serviceSelector": {"matchExpressions": [
                    {"key": "tier", "operator": "NotIn", "values": ["a", "b"]},
                    {"key": "example.com/edge", "operator": "Exists"},
                    {"key": "legacy", "operator": "DoesNotExist", "values": []}
                ]}
            }),
        ),
    ];
    for spec in &cases {
        if let Err(causes) = dry_create::<AddressPool>(&client, spec).await {
            panic!("{spec} was refused: {causes:#?}");
        }
        assert_eq!(
            controller_accepts(spec),
            Some(true),
            "{spec}: the controller's own checks disagree"
        );
    }
    // Blocks of one pool that overlap are left to the controller.
    let overlapping = pool(&["10.252.0.0/24", "10.252.0.10-10.252.0.20"], json!({}));
    assert_eq!(
        dry_create::<AddressPool>(&client, &overlapping).await,
        Ok(())
    );
    assert_eq!(controller_accepts(&overlapping), Some(false));
}

fn claim(address: &str, service: Value, extra: Value) -> Value {
    let mut spec = json!({"address": address, "service": service});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

#[tokio::test]
async fn bad_address_claims_are_refused_naming_the_field_and_the_reason() {
    let client = client().await;
    let web = json!({"namespace": "default", "name": "web"});
    let with_ports =
        |ports: Value| json!({"namespace": "default", "name": "web", "uid": "u", "ports": ports});
    let pattern = "should match";
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            claim("192.0.2.256", web.clone(), json!({})),
            "spec.address",
            "not an IP address",
        ),
        (
            claim("nope", web.clone(), json!({})),
            "spec.address",
            "not an IP address",
        ),
        (
            claim("192.0.2.0/24", web.clone(), json!({})),
            "spec.address",
            "not an IP address",
        ),
        (
            claim("fe80::1%eth0", web.clone(), json!({})),
            "spec.address",
            "not an IP address",
        ),
        (
            claim("::ffff:1:2", web.clone(), json!({})),
            "spec.address",
            "not an IP address",
        ),
        (
            claim("192.0.2.5", web.clone(), json!({"retainUntil": "tomorrow"})),
            "spec.retainUntil",
            "not an RFC 3339 time",
        ),
        (
            claim(
                "192.0.2.5",
                web.clone(),
                json!({"retainUntil": "2030-01-01 00:00:00"}),
            ),
            "spec.retainUntil",
            "not an RFC 3339 time",
        ),
        (
            claim(
                "192.0.2.5",
                json!({"namespace": "Default", "name": "web"}),
                json!({}),
            ),
            "spec.service.namespace",
            pattern,
        ),
        (
            claim(
                "192.0.2.5",
                json!({"namespace": "default", "name": "web_1"}),
                json!({}),
            ),
            "spec.service.name",
            pattern,
        ),
        (
            claim("192.0.2.5", with_ports(json!(["65536/TCP"])), json!({})),
            "spec.service.ports[0]",
            pattern,
        ),
        (
            claim(
                "192.0.2.5",
                with_ports(json!(["80/TCP", "80/ICMP"])),
                json!({}),
            ),
            "spec.service.ports[1]",
            pattern,
        ),
        (
            claim("192.0.2.5", with_ports(json!(["80"])), json!({})),
            "spec.service.ports[0]",
            pattern,
        ),
        (
            claim(
                "192.0.2.5",
                web.clone(),
                json!({"sharedWith": [{"namespace": "a", "name": "b", "ports": ["x/UDP"]}]}),
            ),
            "spec.sharedWith[0].ports[0]",
            pattern,
        ),
        (
            claim(
                "192.0.2.5",
                json!({"namespace": "default", "name": "web", "role": "vip"}),
                json!({}),
            ),
            "spec.service.role",
            "Unsupported value: \"vip\"",
        ),
    ];
    for (spec, field, reason) in &cases {
        let result = dry_create::<AddressClaim>(&client, spec).await;
        assert_refused(spec, result, field, reason);
    }
}

#[tokio::test]
async fn good_address_claims_are_accepted() {
    let client = client().await;
    let web = json!({"namespace": "default", "name": "web"});
    let cases: Vec<Value> = vec![
        // A reservation as deploy/README.md shows it.
        claim("192.168.80.205", web.clone(), json!({})),
        claim("2001:db8::a", web.clone(), json!({"pool": "default6"})),
        claim("::", web.clone(), json!({})),
        // An IPv4-mapped address a flag pool may hand out, as the controller writes it.
        claim("::ffff:192.0.2.1", web.clone(), json!({})),
        claim(
            "192.0.2.5",
            json!({"namespace": "default", "name": "web", "uid": "u",
                   "ports": ["80/TCP", " +0080/sctp ", "65535/udp", "0/TCP"], "sharingKey": "k"}),
            json!({
                "sharedWith": [{"namespace": "other", "name": "api", "uid": "v", "ports": ["443/TCP"]}],
                "retainUntil": "2030-01-01T00:00:00Z"
            }),
        ),
        claim(
            "192.0.2.6",
            json!({"namespace": "default", "name": "web", "uid": "u", "role": "secondary"}),
            json!({"retainUntil": "2030-01-01T00:00:00.123456789+02:00"}),
        ),
    ];
    for spec in &cases {
        if let Err(causes) = dry_create::<AddressClaim>(&client, spec).await {
            panic!("{spec} was refused: {causes:#?}");
        }
    }
}

/// A pool stored before the rules existed (straight into etcd) is served as it is and stays
/// editable: a change elsewhere only warns about its flaws, a change of a flawed field must
/// fix it.
#[tokio::test]
async fn a_pool_written_before_the_rules_stays_editable() {
    let client = client().await;
    let pools: Api<AddressPool> = Api::all(client.clone());
    let name = format!("crd-validation-old-{}", std::process::id());
    let object = json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1",
        "kind": "AddressPool",
        "metadata": {
            "name": name,
            "uid": "00000000-0000-4000-8000-00000000cafe",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "generation": 1
        },
        "spec": {"addresses": ["10.253.0.0/33", "nope"], "retainAddresses": "1d"}
    });
    store_in_etcd(&format!("ipam.loxilb.io/addresspools/{name}"), &object).await;
    let stored = wait_for("the stored pool is served", WAIT, || async {
        pools.get_opt(&name).await.unwrap()
    })
    .await;
    assert_eq!(stored.spec.addresses, ["10.253.0.0/33", "nope"]);
    assert_eq!(controller_accepts(&json!(stored.spec)), Some(false));

    let patch = |spec: Value| Patch::Merge(json!({ "spec": spec }));
    // An unrelated field: accepted (the API server warns about the flaws it keeps).
    pools
        .patch(
            &name,
            &PatchParams::default(),
            &patch(json!({"disabled": true})),
        )
        .await
        .unwrap();
    // The status, as the controller writes it.
    pools
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "x"}
            ]}})),
        )
        .await
        .unwrap();
    // A flawed field changed to another flaw: refused.
    let err = pools
        .patch(
            &name,
            &PatchParams::default(),
            &patch(json!({"addresses": ["10.253.0.0/34"]})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.addresses[0]")),
        "{err:?}"
    );
    // Fixed: accepted.
    let fixed = pools
        .patch(
            &name,
            &PatchParams::default(),
            &patch(json!({"addresses": ["10.253.0.0/30"], "retainAddresses": "1h"})),
        )
        .await
        .unwrap();
    assert_eq!(controller_accepts(&json!(fixed.spec)), Some(true));
    pools.delete(&name, &DeleteParams::default()).await.unwrap();
}
