//! What the rules programmed on loxilb carry, against a real kube-apiserver and loxilb
//! simulators: source ranges (loxilb's limit on them, their changes), SCTP secondary
//! addresses, full NAT with liveness probes. (Split from `programming.rs`, which keeps the
//! instances, outages, capacity and drift.)

mod common;
#[path = "common/programming_setup.rs"]
mod programming_setup;

use common::{CLASS, Options, WAIT, World, annotated, wait_for};
use kube::api::{DeleteParams, Patch, PatchParams};
use programming_setup::*;
use serde_json::json;

#[tokio::test]
async fn source_ranges_past_loxilbs_28th_rule_are_reported_not_retried() {
    // The rules' allowedSources (`enforce`; the default `firewall` has no such limit).
    let enforce = Options {
        extra_args: vec!["--source-ranges=enforce".into()],
        ..Options::default()
    };
    let w = World::with("srcranges", enforce).await;
    w.add_node("node-a", "10.2.3.1").await;
    let ports: Vec<(i32, &str)> = (0..28).map(|i| (1000 + i, "TCP")).collect();
    w.create(&World::lb_service("big", Some(CLASS), &ports))
        .await;
    wait_programmed(&w, "big", "True", "Programmed").await;
    assert_eq!(w.sim.rules().len(), 28);

    let mut svc = World::lb_service("restricted", Some(CLASS), &[(80, "TCP")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    w.create(&svc).await;
    let msg = wait_programmed(&w, "restricted", "False", "SourceRangesUnsupported").await;
    assert!(msg.contains("loadBalancerSourceRanges"), "{msg}");
    // Not sent: no 400 from loxilb, nothing created.
    assert_eq!(w.sim.rules().len(), 28);

    // Others are not held up.
    w.create(&World::lb_service("open", Some(CLASS), &[(80, "TCP")]))
        .await;
    wait_programmed(&w, "open", "True", "Programmed").await;

    // Room among the first 28 rules: programmed, with its source ranges.
    w.services
        .delete("big", &DeleteParams::default())
        .await
        .unwrap();
    wait_programmed(&w, "restricted", "True", "Programmed").await;
    let ip = w.wait_for_ip("restricted").await;
    let rule = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == ip && r.port == 80)
        .unwrap();
    assert_eq!(rule.allowed_sources, ["198.51.100.0/24"]);
    assert!(
        event_count(&w, "restricted", "SourceRangesUnsupported").await >= 1,
        "a Warning says why it waited"
    );
    w.finish().await;
}

/// kube-loxilb's SCTP multi-homing shapes: secondary addresses allocated from the secondary
/// pools (`num-secondary-networks`, `poolSelectSecondary`) or given (`secondaryIPs`), each
/// claimed durably, put on the SCTP rules only, kept across a controller restart, never
/// handed to a second Service, and released with the Service.
#[tokio::test]
async fn sctp_rules_carry_claimed_secondary_addresses() {
    let opts = Options {
        extra_args: vec!["--external-secondary-cidrs=198.51.100.0/29,203.0.113.0/29".into()],
        ..Options::default()
    };
    let mut w = World::with("sctp-secondary", opts).await;
    w.add_node("n1", "10.0.0.1").await;

    // Two secondary networks: one address from each secondary pool, on the SCTP rule only.
    let multi = annotated(
        World::lb_service("multi", Some(CLASS), &[(38412, "SCTP"), (80, "TCP")]),
        &[("loxilb.io/num-secondary-networks", "2")],
    );
    w.create(&multi).await;
    let vip = w.wait_for_ip("multi").await;
    wait_programmed(&w, "multi", "True", "Programmed").await;
    let secondaries = wait_for("two secondary IPs on the SCTP rule", WAIT, || async {
        let s = secondaries_on(&w, &vip, 38412);
        (s.len() == 2).then_some(s)
    })
    .await;
    assert!(secondaries[0].starts_with("198.51.100."), "{secondaries:?}");
    assert!(secondaries[1].starts_with("203.0.113."), "{secondaries:?}");
    let tcp = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == vip && r.port == 80)
        .expect("tcp rule");
    assert!(tcp.secondary_ips.is_empty(), "only SCTP rules get them");
    let msg = wait_address(&w, "multi", "True", "Allocated").await;
    assert!(
        msg.contains(&format!("secondary {}", secondaries[0])),
        "{msg}"
    );
    // Each one durably claimed, as a secondary address of this Service.
    let claims = w.claims().await;
    for ip in &secondaries {
        let c = claims
            .iter()
            .find(|c| &c.spec.address == ip)
            .unwrap_or_else(|| panic!("no claim for {ip}"));
        assert_eq!(c.spec.service.name, "multi");
        assert_eq!(c.spec.service.role.as_deref(), Some("secondary"));
    }
    // The status shows the VIP only (secondary addresses are not ingress points).
    let shown: Vec<String> = ingress(&w.get("multi").await.unwrap())
        .into_iter()
        .filter_map(|i| i.ip)
        .collect();
    assert_eq!(shown, std::slice::from_ref(&vip));

    // A given secondary address, and one from a pool named by poolSelectSecondary.
    let given = annotated(
        World::lb_service("given", Some(CLASS), &[(38413, "SCTP")]),
        &[("loxilb.io/secondaryIPs", "198.51.100.5")],
    );
    w.create(&given).await;
    let named = annotated(
        World::lb_service("named", Some(CLASS), &[(38414, "SCTP")]),
        &[("loxilb.io/poolSelectSecondary", "secondary1")],
    );
    w.create(&named).await;
    let given_vip = w.wait_for_ip("given").await;
    let named_vip = w.wait_for_ip("named").await;
    wait_for("the given secondary on its rule", WAIT, || async {
        (secondaries_on(&w, &given_vip, 38413) == ["198.51.100.5"]).then_some(())
    })
    .await;
    let named_sec = wait_for("a secondary1 address on its rule", WAIT, || async {
        let s = secondaries_on(&w, &named_vip, 38414);
        (s.len() == 1 && s[0].starts_with("203.0.113.") && s[0] != secondaries[1]).then_some(s)
    })
    .await;

    // Another Service asking for an address already used as a secondary: refused, never
    // stolen; a bad count names the annotation. Both leave the others alone.
    let thief = annotated(
        World::lb_service("thief", Some(CLASS), &[(38415, "SCTP")]),
        &[("loxilb.io/secondaryIPs", secondaries[0].as_str())],
    );
    w.create(&thief).await;
    let msg = wait_address(&w, "thief", "False", "AddressInUse").await;
    assert!(msg.contains(&secondaries[0]), "{msg}");
    let greedy = annotated(
        World::lb_service("greedy", Some(CLASS), &[(38416, "SCTP")]),
        &[("loxilb.io/num-secondary-networks", "4")],
    );
    w.create(&greedy).await;
    let msg = wait_address(&w, "greedy", "False", "InvalidAnnotation").await;
    assert!(msg.contains("loxilb.io/num-secondary-networks"), "{msg}");
    // Events are published asynchronously: the condition can be there first.
    wait_for("the InvalidAnnotation Event", WAIT, || async {
        w.event_reasons("greedy")
            .await
            .contains(&"InvalidAnnotation".to_string())
            .then_some(())
    })
    .await;
    assert_eq!(secondaries_on(&w, &vip, 38412), secondaries);

    // A controller restart rebuilds the index from the claims: nothing moves.
    let restart = Options {
        extra_args: vec!["--external-secondary-cidrs=198.51.100.0/29,203.0.113.0/29".into()],
        ..Options::default()
    };
    w.stop_controller().await;
    w.start_controller(&restart).await;
    let probe = annotated(
        World::lb_service("after", Some(CLASS), &[(38417, "SCTP")]),
        &[("loxilb.io/num-secondary-networks", "2")],
    );
    w.create(&probe).await;
    let after_vip = w.wait_for_ip("after").await;
    let after = wait_for(
        "secondaries for the Service created after the restart",
        WAIT,
        || async {
            let s = secondaries_on(&w, &after_vip, 38417);
            (s.len() == 2).then_some(s)
        },
    )
    .await;
    for ip in &after {
        assert!(
            !secondaries.contains(ip) && !named_sec.contains(ip) && ip != "198.51.100.5",
            "{ip} handed out twice"
        );
    }
    assert_eq!(secondaries_on(&w, &vip, 38412), secondaries);

    // Deleting the Service removes its rules, then its secondary claims.
    w.services
        .delete("multi", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("multi's claims released", WAIT, || async {
        let claims = w.claims().await;
        (!claims.iter().any(|c| c.spec.service.name == "multi")).then_some(())
    })
    .await;
    assert!(rules_of(&w.sim, &w, "multi").is_empty());
    w.finish().await;
}

/// kube-loxilb's "fullnat with liveness probes" example: full NAT, liveness on, a TCP probe
/// with its own port, payloads, interval and retries. The rule carries them; ingress says
/// ipMode Proxy (full NAT terminates at loxilb); a probe loxilb refuses (http) is reported
/// and the rule stays as it was; turning liveness off re-creates the rule
/// (docs/loxilb-api.md#updates: monitor cannot change in place).
#[tokio::test]
async fn fullnat_with_liveness_probes() {
    let w = World::new("fullnat-probe").await;
    w.add_node("n1", "10.0.0.1").await;
    w.add_node("n2", "10.0.0.2").await;
    let svc = annotated(
        World::lb_service("probed", Some(CLASS), &[(8080, "TCP")]),
        &[
            ("loxilb.io/lbmode", "fullnat"),
            ("loxilb.io/liveness", "yes"),
            ("loxilb.io/probetype", "tcp"),
            ("loxilb.io/probeport", "3000"),
            ("loxilb.io/probereq", "ping"),
            ("loxilb.io/proberesp", "pong"),
            ("loxilb.io/probetimeout", "10"),
            ("loxilb.io/proberetries", "3"),
            ("loxilb.io/timeout", "600"),
        ],
    );
    w.create(&svc).await;
    let vip = w.wait_for_ip("probed").await;
    wait_programmed(&w, "probed", "True", "Programmed").await;
    let rule = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == vip && r.port == 8080)
        .expect("rule");
    assert_eq!(rule.mode, 2, "fullnat");
    assert!(rule.monitor, "liveness on");
    assert_eq!((rule.probetype.as_str(), rule.probeport), ("tcp", 3000));
    assert_eq!(rule.inactive_timeout, 600);
    assert_eq!(rule.endpoints.len(), 2);
    let ing = ingress(&w.get("probed").await.unwrap());
    assert_eq!(ing[0].ip_mode.as_deref(), Some("Proxy"), "{ing:?}");

    // http probes exist in kube-loxilb's vocabulary but loxilb refuses them on rules.
    annotate(&w, "probed", "loxilb.io/probetype", "http").await;
    let msg = wait_programmed(&w, "probed", "False", "InvalidAnnotation").await;
    assert!(msg.contains("loxilb.io/probetype"), "{msg}");
    let still = w
        .sim
        .rules()
        .into_iter()
        .find(|r| r.external_ip == vip && r.port == 8080)
        .expect("the rule stays");
    assert_eq!((still.probetype.as_str(), still.index), ("tcp", rule.index));

    // Back to a valid probe, liveness off: the rule is re-created without monitoring.
    w.services
        .patch(
            "probed",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "loxilb.io/probetype": null,
                "loxilb.io/probeport": null,
                "loxilb.io/probereq": null,
                "loxilb.io/proberesp": null,
                "loxilb.io/liveness": "no",
            }}})),
        )
        .await
        .unwrap();
    wait_programmed(&w, "probed", "True", "Programmed").await;
    wait_for("the rule without liveness", WAIT, || async {
        w.sim
            .rules()
            .into_iter()
            .find(|r| r.external_ip == vip && r.port == 8080)
            .filter(|r| !r.monitor && r.probetype.is_empty() && r.mode == 2)
    })
    .await;
    w.finish().await;
}

/// loxilb applies no change of `allowedSources` to a list of the same length (it answers 409
/// "exists"): source-range changes are a DELETE then a POST, and once converged nothing is
/// re-sent. With `--source-ranges=ignore` rules carry none and the Service says so.
#[tokio::test]
async fn source_range_changes_reach_loxilb_and_can_be_left_out() {
    let admin_port = testenv::free_port().unwrap();
    let opts = Options {
        drift: "1s",
        admin_port: Some(admin_port),
        extra_args: vec!["--source-ranges=enforce".into()],
        ..Options::default()
    };
    let mut w = World::with("srcchange", opts.clone()).await;
    w.add_node("node-a", "10.2.4.1").await;
    let mut svc = World::lb_service("web", Some(CLASS), &[(80, "TCP")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    w.create(&svc).await;
    let ip = w.wait_for_ip("web").await;
    let sim = w.sim.clone();
    let sources = || {
        sim.rules()
            .into_iter()
            .find(|r| r.external_ip == ip && r.port == 80)
            .map(|r| {
                let mut s = r.allowed_sources;
                s.sort();
                s
            })
    };
    for ranges in [
        vec!["198.51.100.0/24"],
        vec!["203.0.113.0/24"],
        vec!["203.0.113.0/24", "192.0.2.128/25"],
        vec!["10.10.0.0/16", "10.20.0.0/16"],
    ] {
        w.services
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": ranges}})),
            )
            .await
            .unwrap();
        let mut want: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
        want.sort();
        wait_for("the new source ranges on loxilb", WAIT, || async {
            (sources()? == want).then_some(())
        })
        .await;
    }
    let s = w.get("web").await.unwrap();
    let (status, reason, _) = World::condition(&s, "loxilb.io/SourceRangesEnforced").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Enforced"));
    // Converged: drift checks come and go, nothing is sent again.
    let lists = || World::metric_sum(admin_port, "loxi_ccm_loxilb_calls_total", &["op=\"list\""]);
    let posts = w.sim.rule_posts();
    let before = lists().await.unwrap_or(0.0);
    wait_for("two drift checks", WAIT, || async {
        (lists().await? >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(w.sim.rule_posts(), posts, "a converged rule was re-sent");

    // Left out on purpose (loxilb issue #1036), and said so.
    w.stop_controller().await;
    w.start_controller(&Options {
        extra_args: vec!["--source-ranges=ignore".into()],
        ..opts
    })
    .await;
    wait_for("no source ranges on loxilb", WAIT, || async {
        sources()?.is_empty().then_some(())
    })
    .await;
    let (status, reason, message) = wait_for("SourceRangesEnforced=False", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/SourceRangesEnforced").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SourceRangesIgnored")
    );
    assert!(message.contains("every source"), "{message}");
    // A Service without source ranges has no such condition.
    w.services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": null}})),
        )
        .await
        .unwrap();
    wait_for("the condition gone", WAIT, || async {
        let s = w.get("web").await?;
        World::condition(&s, "loxilb.io/SourceRangesEnforced")
            .is_none()
            .then_some(())
    })
    .await;
    w.finish().await;
}
