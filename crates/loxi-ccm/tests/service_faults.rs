//! Faults and bad input around a Service, against a real kube-apiserver (RBAC on) and the
//! loxilb simulator: loxilb restarts, outages and errors (reported, retried, repaired), a drift
//! check during writes, bad and huge annotations, a refused claim, repeated Events.

mod common;

use common::{CLASS, COND_PROGRAMMED, Options, WAIT, World, wait_for};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use loxilb_sim::Fault;

// A drift check lists loxilb while a Service's own pass may have writes under way: it must
// leave those rules to that pass instead of sending the same change again.
#[tokio::test]
async fn a_drift_check_leaves_rules_with_writes_under_way_alone() {
    let opts = Options {
        drift: "200ms",
        ..Options::default()
    };
    let w = World::with("inflight", opts).await;
    w.add_node("node-a", "10.0.5.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rule with one endpoint", WAIT, || async {
        (w.rules_for(&ip).first()?.2.len() == 1).then_some(())
    })
    .await;
    // Writes now take 2 s while listings stay fast: about ten drift checks see the old rule
    // while the reconcile's update is on its way.
    w.sim.set_write_latency(std::time::Duration::from_secs(2));
    let posts = w.sim.rule_posts();
    w.add_node("node-b", "10.0.5.2").await;
    wait_for("rule with both endpoints", WAIT, || async {
        (w.rules_for(&ip).first()?.2.len() == 2).then_some(())
    })
    .await;
    // A few more drift checks (health probes and drift listings are all counted).
    let seen = w.sim.request_count();
    wait_for("more drift checks", WAIT, || async {
        (w.sim.request_count() >= seen + 10).then_some(())
    })
    .await;
    w.sim.set_write_latency(std::time::Duration::ZERO);
    assert_eq!(
        w.sim.rule_posts() - posts,
        1,
        "one update for one endpoint change, not one per drift check"
    );
    w.finish().await;
}

#[tokio::test]
async fn loxilb_restart_and_outage_are_repaired() {
    let w = World::new("restart").await;
    w.add_node("node-a", "10.0.4.1").await;
    w.create(&World::lb_service(
        "web",
        Some(CLASS),
        &[(80, "TCP"), (81, "TCP")],
    ))
    .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rules", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    // Restart = wipe, faster than anything else happens: the controller notices the loss.
    w.sim.restart();
    assert!(w.sim.rules().is_empty());
    wait_for("rules replayed after restart", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    // Down, wiped, up: replayed when it comes back.
    w.sim.go_down().await;
    w.sim.restart();
    w.sim.come_up().await.unwrap();
    wait_for("rules replayed after outage", WAIT, || async {
        (w.rules_for(&ip).len() == 2).then_some(())
    })
    .await;
    w.finish().await;
}

/// A Service deleted while its loxilb does not answer keeps its address and finalizer (an
/// old rule may still forward there), with a Warning naming that loxilb, until the loxilb
/// has been unreachable for `--loxilb-gone-after`: then it counts as gone for good, both are
/// released, and the loxilb, once back, loses the rule in its replay.
#[tokio::test]
async fn a_deleted_service_waits_for_an_unreachable_loxilb_until_it_is_gone_for_good() {
    let gone_after = std::time::Duration::from_secs(4);
    let opts = Options {
        extra_args: vec![format!("--loxilb-gone-after={}s", gone_after.as_secs())],
        ..Options::default()
    };
    let w = World::with("gonegood", opts).await;
    w.add_node("node-a", "10.0.4.1").await;
    let ip = w.serve_one_port("web", 80).await;
    w.sim.go_down().await;
    let down_at = std::time::Instant::now();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(w.client.clone(), &w.ns);
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the Warning naming the unreachable loxilb",
        WAIT,
        || async {
            w.event_reasons("web")
                .await
                .iter()
                .any(|r| r == "LoxilbUnavailable")
                .then_some(())
        },
    )
    .await;
    let kept = w.get("web").await.is_some();
    let claimed = w.claims().await.iter().any(|c| c.spec.address == ip);
    assert!(
        down_at.elapsed() >= gone_after || (kept && claimed),
        "released while its loxilb was unreachable for less than {gone_after:?}: \
         Service kept {kept}, address claimed {claimed}"
    );
    wait_for(
        "the Service gone once its loxilb counts as gone for good",
        WAIT,
        || async { w.get("web").await.is_none().then_some(()) },
    )
    .await;
    assert!(
        down_at.elapsed() >= gone_after,
        "the finalizer went after {:?}, before --loxilb-gone-after",
        down_at.elapsed()
    );
    assert!(
        !w.claims().await.iter().any(|c| c.spec.address == ip),
        "its address is released with it"
    );
    // Back: its replay drops the rule nobody wants any more.
    w.sim.come_up().await.unwrap();
    wait_for(
        "the orphan rule gone after the loxilb's return",
        WAIT,
        || async { w.rules_for(&ip).is_empty().then_some(()) },
    )
    .await;
    w.finish().await;
}

#[tokio::test]
async fn loxilb_errors_are_reported_and_retried() {
    let w = World::new("faults").await;
    w.add_node("node-a", "10.0.5.1").await;
    w.sim.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let svc = wait_for("Programmed=False with the loxilb error", WAIT, || async {
        let s = w.get("web").await?;
        let (status, reason, _) = World::condition(&s, COND_PROGRAMMED)?;
        (status == "False" && reason == "LoxilbServerError").then_some(s)
    })
    .await;
    // The address is allocated (its condition names it) but not shown before its rule is
    // on loxilb: users read an address in the status as ready.
    let (status, _, message) = World::condition(&svc, "loxilb.io/AddressAllocated").unwrap();
    assert_eq!(status, "True", "{message}");
    let shown = svc.status.and_then(|s| s.load_balancer?.ingress);
    assert!(
        shown.unwrap_or_default().is_empty(),
        "shown before its rule"
    );
    w.sim.set_fault(None);
    wait_for("Programmed=True after loxilb recovers", WAIT, || async {
        let s = w.get("web").await?;
        (World::condition(&s, COND_PROGRAMMED)?.0 == "True").then_some(())
    })
    .await;
    w.wait_for_ip("web").await;
    assert_eq!(w.sim.rules().len(), 1);
    w.finish().await;
}

#[tokio::test]
async fn bad_annotation_is_reported_and_keeps_existing_rules() {
    let w = World::new("badann").await;
    w.add_node("node-a", "10.0.6.1").await;
    w.create(&World::lb_service("web", Some(CLASS), &[(80, "TCP")]))
        .await;
    let ip = w.wait_for_ip("web").await;
    wait_for("rule", WAIT, || async {
        (w.rules_for(&ip).len() == 1).then_some(())
    })
    .await;
    let before = w.sim.rules();
    w.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata":{"annotations":{"loxilb.io/lbmode":"fastest"}}}),
            ),
        )
        .await
        .unwrap();
    let (_, reason, message) = wait_for("InvalidAnnotation condition", WAIT, || async {
        let s = w.get("web").await?;
        let c = World::condition(&s, COND_PROGRAMMED)?;
        (c.1 == "InvalidAnnotation").then_some(c)
    })
    .await;
    assert_eq!(reason, "InvalidAnnotation");
    assert!(
        message.contains("loxilb.io/lbmode") && message.contains("fastest"),
        "{message}"
    );
    wait_for("Warning event", WAIT, || async {
        w.event_reasons("web")
            .await
            .contains(&"InvalidAnnotation".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(w.sim.rules(), before, "existing rule must stay as it was");
    // The same IP is still shown.
    assert_eq!(w.wait_for_ip("web").await, ip);
    w.finish().await;
}

/// The same Event about the same object is counted (`series`), not created again, whatever
/// the Service's version; another note is another Event; one deleted in the API server is
/// created anew.
#[tokio::test]
async fn a_repeated_event_is_one_event_with_a_count() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource;
    use kube::api::{Api, ListParams};
    use kube::runtime::events::{Event, EventType, Reporter};
    use loxi_ccm::k8s::events::EventRecorder;

    let w = World::new("events").await;
    // Of a class the controller does not serve: the Events listed below are the test's own,
    // never the controller's (AddressAllocated, ...) for the same Service.
    let svc = w
        .create(&World::lb_service(
            "web",
            Some("example.com/not-ours"),
            &[(80, "TCP")],
        ))
        .await;
    let dropped = prometheus_client::metrics::counter::Counter::<u64>::default();
    let recorder = EventRecorder::new(
        w.client.clone(),
        Reporter {
            controller: "loxi-ccm".into(),
            instance: None,
        },
        dropped.clone(),
    );
    let warn = |note: &str| Event {
        type_: EventType::Warning,
        reason: "PoolExhausted".into(),
        note: Some(note.into()),
        action: "Allocate".into(),
        secondary: None,
    };
    let events: Api<K8sEvent> = Api::namespaced(w.client.clone(), &w.ns);
    let ours = || async {
        let mut list: Vec<K8sEvent> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
            .collect();
        list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
        list
    };
    let count = |e: &K8sEvent| e.series.as_ref().map_or(1, |s| s.count);
    let publish = |note: &'static str, svc: &k8s_openapi::api::core::v1::Service| {
        let reference = svc.object_ref(&());
        let event = warn(note);
        let recorder = &recorder;
        // Queued: written by the recorder's task, in order; flush waits for it.
        async move {
            recorder.publish(event, reference);
            assert!(recorder.flush(WAIT).await, "event not written");
        }
    };

    publish("pool full", &svc).await;
    // A later version of the Service: still the same Event.
    let newer = w
        .services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await
        .unwrap();
    assert_ne!(
        newer.metadata.resource_version,
        svc.metadata.resource_version
    );
    publish("pool full", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(count(&list[0]), 2);
    assert_eq!(recorder.cached(), 1);

    publish("pool gone", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 2, "{list:?}");

    // Deleted behind the recorder's back (or expired): published anew.
    for e in &list {
        events
            .delete(
                e.metadata.name.as_deref().unwrap(),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    publish("pool full", &newer).await;
    let list = ours().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(count(&list[0]), 1);
    assert_eq!(list[0].note.as_deref(), Some("pool full"));
    assert_eq!(dropped.get(), 0);
    w.finish().await;
}

/// A bad address annotation added to a served Service: it keeps its address (status, claim)
/// and its rules, and the AddressAllocated condition says what is wrong until it is fixed.
#[tokio::test]
async fn a_bad_address_annotation_keeps_the_served_address() {
    let w = World::new("badaddrann").await;
    w.add_node("node-a", "10.5.0.1").await;
    let ip = w.serve_one_port("web", 80).await;
    let rules = w.rules_for(&ip);
    for (annotation, value) in [
        ("loxilb.io/staticIP", "not-an-ip"),
        ("loxilb.io/ipam", "ipv5"),
    ] {
        w.services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    "loxilb.io/staticIP": null, "loxilb.io/ipam": null, annotation: value
                }}})),
            )
            .await
            .unwrap();
        let s = wait_for("AddressAllocated=False", WAIT, || async {
            let s = w.get("web").await?;
            World::condition(&s, "loxilb.io/AddressAllocated")
                .filter(|c| c.0 == "False" && c.2.contains(value))
                .map(|_| s)
        })
        .await;
        let (_, reason, message) = World::condition(&s, "loxilb.io/AddressAllocated").unwrap();
        assert_eq!(reason, "InvalidAnnotation");
        assert!(
            message.contains(annotation) && message.contains(&ip),
            "{message}"
        );
        assert_eq!(
            w.published().await.get("web"),
            Some(&ip),
            "address unpublished"
        );
        let programmed = World::condition(&s, "loxilb.io/Programmed").unwrap();
        assert_eq!(programmed.0, "True", "{programmed:?}");
        assert_eq!(w.rules_for(&ip), rules);
        assert_eq!(w.claims().await.len(), 1);
    }
    w.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "loxilb.io/ipam": null
            }}})),
        )
        .await
        .unwrap();
    wait_for("AddressAllocated=True again", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/AddressAllocated").filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(w.published().await.get("web"), Some(&ip));
    w.finish().await;
}

/// An address whose AddressClaim the API server refuses (here a ValidatingAdmissionPolicy)
/// is reported on the Service and never programmed: not by its reconcile, not by the drift
/// check, not by the replay after loxilb restarted empty.
#[tokio::test]
async fn an_address_whose_claim_is_refused_is_reported_and_never_programmed() {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::discovery::ApiResource;

    let admin_port = testenv::free_port().unwrap();
    let w = World::with(
        "claimrefused",
        Options {
            drift: "1s",
            admin_port: Some(admin_port),
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.6.0.1").await;
    let refused = "192.0.2.77";
    let policy_name = format!("refuse-{}", w.ns);
    let policy = |kind: &str, plural: &str, spec: serde_json::Value| {
        let ar = ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": policy_name},
            "spec": spec,
        }))
        .unwrap();
        (Api::<DynamicObject>::all_with(w.client.clone(), &ar), obj)
    };
    let (policies, p) = policy(
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        serde_json::json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["ipam.loxilb.io"], "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"], "resources": ["addressclaims"]
            }]},
            "validations": [{
                "expression": format!("object.spec.address != '{refused}'"),
                "message": format!("{refused} is kept out of every pool by policy")
            }]
        }),
    );
    policies.create(&PostParams::default(), &p).await.unwrap();
    let (bindings, b) = policy(
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        serde_json::json!({"policyName": policy_name, "validationActions": ["Deny"]}),
    );
    bindings.create(&PostParams::default(), &b).await.unwrap();
    // The API server enforces a new policy after a moment: until a dry run is refused.
    let claims: Api<loxi_ccm::ipam::claims::AddressClaim> = Api::all(w.client.clone());
    let probe: loxi_ccm::ipam::claims::AddressClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.loxilb.io/v1alpha1", "kind": "AddressClaim",
        "metadata": {"name": refused},
        "spec": {"address": refused, "service": {"namespace": w.ns, "name": "web"}}
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for("the policy in force", WAIT, || async {
        claims.create(&dry_run, &probe).await.is_err().then_some(())
    })
    .await;

    w.create(&common::annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/staticIP", refused)],
    ))
    .await;
    let (_, reason, message) = wait_for("AddressAllocated=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/AddressAllocated").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "AddressClaimRefused", "{message}");
    assert!(message.contains("kept out of every pool"), "{message}");
    wait_for("a Warning AddressClaimRefused", WAIT, || async {
        w.event_reasons("web")
            .await
            .contains(&"AddressClaimRefused".to_string())
            .then_some(())
    })
    .await;
    // Drift checks (every second) and a replay after loxilb restarted empty come and go.
    let lists = || World::metric_sum(admin_port, "loxi_ccm_loxilb_calls_total", &["op=\"list\""]);
    let before = lists().await.unwrap_or(0.0);
    wait_for("two more listings", WAIT, || async {
        (lists().await? >= before + 2.0).then_some(())
    })
    .await;
    w.sim.restart();
    let before = lists().await.unwrap_or(0.0);
    wait_for("the replay and a drift check", WAIT, || async {
        (lists().await? >= before + 2.0).then_some(())
    })
    .await;
    assert!(
        w.rules_for(refused).is_empty(),
        "an unclaimed address programmed"
    );
    assert!(w.claims().await.is_empty());
    assert_eq!(w.published().await.get("web"), None);
    let _ = bindings.delete(&policy_name, &Default::default()).await;
    let _ = policies.delete(&policy_name, &Default::default()).await;
    w.finish().await;
}

/// A huge multi-byte annotation value: the condition message and the Warning's note are cut
/// by bytes at a character boundary (the API server takes the Event), the value is quoted
/// once and shown cut with its size.
#[tokio::test]
async fn huge_annotation_values_give_bounded_messages_and_their_warning() {
    let w = World::new("hugeann").await;
    w.add_node("node-a", "10.5.1.1").await;
    let value = "é".repeat(20_000); // 40,000 bytes
    w.create(&common::annotated(
        World::lb_service("web", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/lbmode", &value)],
    ))
    .await;
    let (_, reason, message) = wait_for("Programmed=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/Programmed").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "InvalidAnnotation");
    assert!(message.len() <= 4096, "{} bytes", message.len());
    assert_eq!(
        message.matches("(40000 bytes)").count(),
        1,
        "the value shown once, cut: {message}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(w.client.clone(), &w.ns);
    let note = wait_for("the Warning", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("InvalidAnnotation"))
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.len() <= 1024, "{} bytes", note.len());
    w.finish().await;
}
