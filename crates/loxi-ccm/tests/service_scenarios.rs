//! Scenario tests of the Service reconcile below the integration tier, in the style of
//! kube-rs's controller examples: the reconcile runs against a mock API server (a
//! `tower-test` pair behind `kube::Client::new`) and the loxilb simulator, and each test
//! asserts the exact API calls in the order they arrived.
//!
//! The mock API server answers as the real one would for what the reconcile sends (create,
//! get, replace, merge and apply patches, delete with preconditions, `409` on a stale
//! resourceVersion, `404` for absent objects) and records each call with the number of
//! rules the simulator held when it arrived: that number orders the API calls against the
//! loxilb calls. Events are written by a background task, so their order against the other
//! calls is not asserted; they are counted after the recorder is flushed.
//!
//! The stores are filled by hand, as the watches would have filled them; the `Context` is
//! built as `runtime::run` builds it.

mod common;
#[path = "common/scenario.rs"]
mod scenario;

use scenario::*;

// --- The scenarios -------------------------------------------------------------------------

/// A new Service: the finalizer first, then the claim (before anything reaches loxilb),
/// then the rule, then one status write publishing the address. The pass that write
/// triggers writes nothing more.
#[tokio::test]
async fn new_service_is_finalized_then_claimed_then_programmed_then_reported_once() {
    let mut s = Scenario::start().await;
    let svc = new_service();
    s.seed_service(&svc);
    s.ready();

    s.reconcile(&svc).await.expect("the pass succeeds");
    s.flush_events().await;

    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("PATCH {SERVICE_PATH}"),
            format!("POST {CLAIMS_PATH}"),
            format!("PATCH {SERVICE_PATH}/status"),
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].summary,
        format!("finalizers=[\"{CLASS_FINALIZER}\"]")
    );
    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    let vip = claims[0].spec.address.clone();
    assert_eq!(claims[0].spec.service.uid, UID);
    assert_eq!(calls[1].summary, format!("address=\"{vip}\""));
    assert_eq!(
        calls[1].rules_on_sim, 0,
        "claimed before anything is programmed"
    );
    assert_eq!(
        calls[2].rules_on_sim, 1,
        "programmed before the address is published"
    );
    assert!(
        calls[2].summary.contains(&format!("addresses=[\"{vip}\"]"))
            && calls[2].summary.contains("loxilb.io/Programmed=True"),
        "{}",
        calls[2].summary
    );

    let rules = s.sim.rules();
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(
        (rules[0].external_ip.as_str(), rules[0].port),
        (vip.as_str(), 80)
    );
    let endpoints: Vec<(&str, u16)> = rules[0]
        .endpoints
        .iter()
        .map(|e| (e.ip.as_str(), e.target_port))
        .collect();
    assert_eq!(endpoints, [(NODE_IP, NODE_PORT as u16)]);
    assert_eq!(
        s.events(),
        [
            "POST Normal AddressAllocated",
            "POST Normal RulesProgrammed"
        ]
    );

    // The watch brings the Service as the status write left it, and the claim: the pass this
    // triggers finds everything in place.
    s.deliver_watch_events();
    s.api.forget_calls();
    let written = s.ctx.inputs.service(&svc).expect("in the store");
    let posts = s.sim.rule_posts();
    s.reconcile(&written)
        .await
        .expect("the second pass succeeds");
    s.flush_events().await;
    let calls = s.api.calls();
    assert!(calls.is_empty(), "nothing more to write: {calls:#?}");
    assert_eq!(s.sim.rule_posts(), posts);
    assert_eq!(s.sim.rules(), rules);
}

/// A bad annotation on a Service that holds its address and its rule: nothing is sent to
/// loxilb, the rule stays, and the owner is told once (one Warning Event, one status write
/// keeping the address).
#[tokio::test]
async fn invalid_annotation_keeps_the_rule_warns_once_and_calls_no_loxilb() {
    let (mut s, svc) = served().await;
    let rules = s.sim.rules();
    let requests = s.sim.request_count();
    s.api.forget_calls();

    let mut bad = svc.clone();
    bad.metadata.resource_version = Some("8".into());
    bad.metadata.annotations = Some(BTreeMap::from([(
        "loxilb.io/lbmode".to_string(),
        "bogus".to_string(),
    )]));
    s.seed_service(&bad);

    s.reconcile(&bad)
        .await
        .expect("a problem of the Service is no error to retry");
    s.flush_events().await;

    assert_eq!(s.sim.request_count(), requests, "no call to loxilb at all");
    assert_eq!(s.sim.rules(), rules, "the old rule is kept");
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [format!("PATCH {SERVICE_PATH}/status")],
        "{calls:#?}"
    );
    assert!(
        calls[0].summary.contains(&format!("addresses=[\"{VIP}\"]"))
            && calls[0].summary.contains("loxilb.io/Programmed=False"),
        "the address stays published, not programmed as asked: {}",
        calls[0].summary
    );
    let events = s.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with("POST Warning "), "{events:?}");
    let claim: Option<AddressClaim> = s.api.get(&format!(
        "{CLAIMS_PATH}/{}",
        claim_name(&VIP.parse().unwrap())
    ));
    assert!(claim.is_some(), "the claim stays");
}

/// The message of the Service's condition `type_` as the API server holds it.
fn condition_message(s: &Scenario, type_: &str) -> String {
    let svc: Service = s.api.get(SERVICE_PATH).expect("the Service exists");
    svc.status
        .and_then(|st| st.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message)
        .unwrap_or_default()
}

/// Two overlapping pools, the Service naming the inner one: its address lies in both, and
/// the claim, the condition and the Event credit the pool it named, not merely the first
/// pool holding the address.
#[tokio::test]
async fn an_address_in_two_pools_is_credited_to_the_pool_named() {
    let mut s = Scenario::start_with(vec![
        Pool::new(POOL, vec![CIDR.parse().unwrap()]),
        Pool::new("inner", vec!["192.0.2.128/25".parse().unwrap()]),
    ])
    .await;
    let svc = selecting("inner", new_service());
    s.seed_service(&svc);
    s.ready();

    s.reconcile(&svc).await.expect("the pass succeeds");
    s.flush_events().await;

    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(claims[0].spec.address, "192.0.2.129");
    assert_eq!(claims[0].spec.pool, "inner", "the pool the Service named");
    let message = condition_message(&s, "loxilb.io/AddressAllocated");
    assert_eq!(message, "192.0.2.129 from pool inner");
    let notes: Vec<String> = s
        .api
        .stored_events()
        .iter()
        .filter(|e| e["reason"] == "AddressAllocated")
        .map(|e| e["note"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(notes, ["allocated 192.0.2.129 from pool inner"]);
}

/// `loxilb.io/poolSelect` added to a Service that holds an address from another pool: it
/// keeps the address and its rule, and says so once: in its condition and one Normal Event.
#[tokio::test]
async fn a_pool_selected_after_the_address_is_kept_and_told_once() {
    let scenario = Scenario::start_with(vec![
        Pool::new(POOL, vec![CIDR.parse().unwrap()]),
        Pool::new("other", vec!["198.51.100.0/24".parse().unwrap()]),
    ])
    .await;
    let (mut s, svc) = served_with(scenario).await;
    let rules = s.sim.rules();
    s.api.forget_calls();

    let mut selected = selecting("other", svc.clone());
    selected.metadata.resource_version = Some("8".into());
    s.seed_service(&selected);
    s.reconcile(&selected).await.expect("the pass succeeds");
    s.flush_events().await;

    assert_eq!(s.sim.rules(), rules, "the rule stays on the address");
    assert_eq!(s.api.claims().len(), 1, "no address from the new pool");
    let message = condition_message(&s, "loxilb.io/AddressAllocated");
    assert_eq!(
        message,
        format!(
            "{VIP} from pool default; {VIP} is kept although loxilb.io/poolSelect names pool \
             \"other\", which does not hold it: a Service keeps the address it has, and the new \
             pool applies only once this address is released"
        )
    );
    // (The Service seeded shows no conditions: the pass also reports it programmed.)
    let events = s.events();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.ends_with(" AddressKept"))
            .count(),
        1,
        "{events:?}"
    );
    assert!(
        events.contains(&"POST Normal AddressKept".to_string()),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e.contains("Warning")), "{events:?}");

    // The next pass (the status write's watch event) says nothing new.
    s.deliver_watch_events();
    s.api.forget_calls();
    let written = s.ctx.inputs.service(&selected).expect("in the store");
    s.reconcile(&written).await.expect("the pass succeeds");
    s.flush_events().await;
    let calls = s.api.calls();
    assert!(calls.is_empty(), "told once: {calls:#?}");
}

/// An `AddressPool` resource over `cidr`, as `kubectl apply` would give it.
fn address_pool(name: &str, cidr: &str, priority: i32, retain: Option<&str>) -> AddressPool {
    let mut spec = json!({"addresses": [cidr], "priority": priority});
    if let Some(retain) = retain {
        spec["retainAddresses"] = json!(retain);
    }
    serde_json::from_value(json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1",
        "kind": "AddressPool",
        "metadata": {"name": name, "uid": format!("pool-{name}"), "resourceVersion": "1"},
        "spec": spec,
    }))
    .unwrap()
}

/// Overlapping pools, the Service naming the one that retains addresses (not the first
/// holding its address): deleted, its address is retained as that pool says.
#[tokio::test]
async fn a_deleted_service_keeps_its_address_as_the_pool_it_named_says() {
    let mut s = Scenario::start_with_resources(
        vec![Pool::new(POOL, vec!["10.9.0.0/24".parse().unwrap()])],
        vec![
            address_pool("wide", "192.0.2.0/24", 10, None),
            address_pool("narrow", "192.0.2.128/25", 0, Some("1h")),
        ],
    )
    .await;
    let svc = selecting("narrow", new_service());
    s.seed_service(&svc);
    s.ready();
    s.reconcile(&svc).await.expect("the pass succeeds");
    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(
        (
            claims[0].spec.address.as_str(),
            claims[0].spec.pool.as_str()
        ),
        ("192.0.2.129", "narrow")
    );

    s.deliver_watch_events();
    let mut deleting = s
        .ctx
        .inputs
        .service(&svc)
        .expect("in the store")
        .as_ref()
        .clone();
    deleting.metadata.resource_version = Some("99".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);
    s.reconcile(&deleting).await.expect("the cleanup succeeds");

    let claims = s.api.claims();
    assert_eq!(claims.len(), 1, "retained, not deleted: {claims:?}");
    assert!(
        claims[0].spec.retain_until.is_some(),
        "kept until the pool's retention ends: {:?}",
        claims[0].spec
    );
    assert!(s.sim.rules().is_empty());
}

/// A deleted Service: its rule leaves loxilb before its claim is deleted, and taking our
/// finalizer off is the last call.
#[tokio::test]
async fn deleted_service_loses_its_rule_then_its_claim_then_its_finalizer() {
    let (mut s, svc) = served().await;
    s.api.forget_calls();
    let mut deleting = svc.clone();
    deleting.metadata.resource_version = Some("9".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);

    s.reconcile(&deleting).await.expect("the cleanup succeeds");
    s.flush_events().await;

    let claim_path = format!("{CLAIMS_PATH}/{}", claim_name(&VIP.parse().unwrap()));
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("DELETE {claim_path}"),
            format!("PATCH {SERVICE_PATH}")
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].rules_on_sim, 0,
        "the rule is gone before the claim"
    );
    assert_eq!(
        calls[1].summary, "finalizers=[]",
        "the finalizer comes off last"
    );
    assert!(s.sim.rules().is_empty());
    assert!(s.api.get::<AddressClaim>(&claim_path).is_none());
    let now: Service = s.api.get(SERVICE_PATH).unwrap();
    assert!(now.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        s.events().is_empty(),
        "no Event about a Service being deleted: {:?}",
        s.events()
    );
}

/// A deleted Service's rule leaves loxilb as soon as the watch shows the deletion, before any
/// API call (`service::teardown`). A cleanup that starts while that removal is under way
/// waits for it instead of sending its own DELETE, then deletes the claim and takes the
/// finalizer off, in that order; no Event about a Service that is going (a log line).
#[tokio::test]
async fn deleted_service_loses_its_rule_at_once_and_the_cleanup_waits_for_that() {
    let (mut s, svc) = served().await;
    s.api.forget_calls();
    let mut deleting = svc.clone();
    deleting.metadata.resource_version = Some("9".into());
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    s.seed_service(&deleting);
    // Slow writes, so that the cleanup below starts while the early removal is under way.
    s.sim.set_write_latency(Duration::from_millis(300));
    let writes_before = s.sim.writes();

    let early =
        teardown::deleting(&s.ctx, &deleting).expect("a deleting Service of ours is removed early");
    assert!(
        teardown::deleting(&s.ctx, &deleting).is_none(),
        "one early removal per Service"
    );
    // The reconcile of the deletion comes while the DELETE is still on its way.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while s.sim.writes() == writes_before {
        assert!(tokio::time::Instant::now() < deadline, "no DELETE sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(s.api_calls().is_empty(), "{:#?}", s.api_calls());
    s.reconcile(&deleting).await.expect("the cleanup succeeds");
    tokio::time::timeout(TIMEOUT, early)
        .await
        .expect("the early removal ended")
        .expect("the early removal did not panic");
    s.flush_events().await;

    assert_eq!(
        s.sim.writes() - writes_before,
        1,
        "one DELETE: the cleanup waited for the early removal"
    );
    let claim_path = format!("{CLAIMS_PATH}/{}", claim_name(&VIP.parse().unwrap()));
    let calls = s.api_calls();
    assert_eq!(
        lines(&calls),
        [
            format!("DELETE {claim_path}"),
            format!("PATCH {SERVICE_PATH}")
        ],
        "{calls:#?}"
    );
    assert_eq!(
        calls[0].rules_on_sim, 0,
        "the rule is gone before the claim"
    );
    assert_eq!(calls[1].summary, "finalizers=[]");
    assert!(s.sim.rules().is_empty());
    assert!(
        s.events().is_empty(),
        "no Event about a Service being deleted: {:?}",
        s.events()
    );
    // A late watch event of the same deletion starts nothing; the deletion's own event
    // drops what was kept about it.
    assert!(teardown::deleting(&s.ctx, &deleting).is_none());
    s.ctx
        .teardown
        .gone(deleting.metadata.uid.as_deref().unwrap());
    assert!(s.ctx.teardown.is_empty());
}
