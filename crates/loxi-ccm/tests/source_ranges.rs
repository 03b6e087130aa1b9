//! Source ranges enforced in loxilb's firewall (`--source-ranges=firewall`, the default;
//! docs/configuration.md#source-ranges), against a real kube-apiserver and the loxilb
//! simulator's traffic model (docs/loxilb-api.md#firewall): the listed sources reach the
//! Service, other sources do not, every other Service stays reachable (loxilb issue #1036
//! is modelled and never triggered), a loxilb restart gets the firewall rules back, a
//! deleted Service leaves none behind, and the auditor checks them.

mod common;

use std::net::IpAddr;

use common::{CLASS, Options, WAIT, World, wait_for};
use kube::api::{DeleteParams, Patch, PatchParams};
use loxilb_sim::{Simulator, Traffic};
use serde_json::json;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const INSIDE: &str = "198.51.100.7";
const OTHER_RANGE: &str = "203.0.113.9";
const OUTSIDE: &str = "192.0.2.200";

/// Waits until the model answers `want` for a new connection from `src` to `vip:80/tcp`.
async fn wait_traffic(sim: &Simulator, src: &str, vip: &str, want: fn(&Traffic) -> bool) {
    let (s, v) = (ip(src), ip(vip));
    wait_for(&format!("{src} -> {vip}:80 as wanted"), WAIT, || async {
        let t = sim.traffic(s, v, 80, "tcp");
        want(&t).then_some(())
    })
    .await;
}

/// New connections from each of `sources` to each of `vips` (port 80, tcp) in the model:
/// (balanced, dropped by the firewall, anything else).
fn census(sim: &Simulator, vips: &[String], sources: &[&str]) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for vip in vips {
        for src in sources {
            match sim.traffic(ip(src), ip(vip), 80, "tcp") {
                Traffic::Balanced { .. } => counts.0 += 1,
                Traffic::DroppedByFirewall { .. } => counts.1 += 1,
                _ => counts.2 += 1,
            }
        }
    }
    counts
}

/// Five open Services and one restricted to 198.51.100.0/24, the restricted one's address
/// last.
async fn six_services(w: &World) -> Vec<String> {
    let mut vips = Vec::new();
    for i in 0..5 {
        vips.push(w.serve_one_port(&format!("open{i}"), 80).await);
    }
    let mut svc = World::lb_service("restricted", Some(CLASS), &[(80, "TCP")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    w.create(&svc).await;
    vips.push(w.wait_for_ip("restricted").await);
    vips
}

const SOURCES: [&str; 3] = [INSIDE, OTHER_RANGE, OUTSIDE];

fn balanced(t: &Traffic) -> bool {
    t.is_balanced()
}

fn dropped(t: &Traffic) -> bool {
    matches!(t, Traffic::DroppedByFirewall { .. })
}

#[tokio::test]
async fn firewall_ranges_block_other_sources_and_nothing_else() {
    let opts = Options {
        drift: "2s",
        ..Options::default()
    };
    let w = World::with("fwranges", opts.clone()).await;
    w.add_node("node-a", "10.3.1.1").await;
    let vips = six_services(&w).await;
    let (open, vip) = (vips[0].clone(), vips[5].clone());

    // The range reaches it; other sources do not; the other Service is reachable by all.
    wait_traffic(&w.sim, OUTSIDE, &vip, dropped).await;
    wait_traffic(&w.sim, INSIDE, &vip, balanced).await;
    for src in [INSIDE, OUTSIDE, OTHER_RANGE] {
        assert!(
            w.sim.traffic(ip(src), ip(&open), 80, "tcp").is_balanced(),
            "{src} -> open"
        );
    }
    // No rule carries allowedSources (loxilb issue #1036 cannot trigger).
    assert!(w.sim.rules().iter().all(|r| r.allowed_sources.is_empty()));
    let s = w.get("restricted").await.unwrap();
    let (status, reason, _) = World::condition(&s, "loxilb.io/SourceRangesEnforced").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Enforced"));
    // The model's census: every flow the ranges allow is balanced (5 open Services x 3
    // sources + 1 source to the restricted one), the 2 others are dropped, nothing is lost.
    let counts = census(&w.sim, &vips, &SOURCES);
    eprintln!(
        "firewall: (balanced, dropped, other) = {counts:?} of {} flows",
        vips.len() * 3
    );
    assert_eq!(counts, (16, 2, 0));
    let fw = w.sim.firewall_rules();
    assert_eq!(fw.len(), 2, "one allow, one drop: {fw:#?}");
    assert!(fw.iter().all(|r| r.destination == format!("{vip}/32")));

    // New ranges replace the old ones.
    w.services
        .patch(
            "restricted",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": ["203.0.113.0/24"]}})),
        )
        .await
        .unwrap();
    wait_traffic(&w.sim, INSIDE, &vip, dropped).await;
    wait_traffic(&w.sim, OTHER_RANGE, &vip, balanced).await;
    assert_eq!(w.sim.firewall_rules().len(), 2);

    // A loxilb restart loses everything: the replay brings the firewall rules back.
    w.sim.restart();
    assert!(w.sim.firewall_rules().is_empty());
    wait_traffic(&w.sim, OUTSIDE, &vip, dropped).await;
    wait_traffic(&w.sim, OTHER_RANGE, &vip, balanced).await;
    wait_traffic(&w.sim, OUTSIDE, &open, balanced).await;

    // Rules deleted behind our back come back with the drift check.
    let client =
        loxilb_client::LoxilbClient::new(loxilb_client::ClientConfig::new(&w.sim.url())).unwrap();
    for entry in client.list_firewall().await.unwrap() {
        client
            .delete_firewall_rule(&entry.rule_arguments)
            .await
            .unwrap();
    }
    wait_traffic(&w.sim, OUTSIDE, &vip, dropped).await;

    // The auditor finds the firewall as it should be.
    let findings = w.audit(&opts).await;
    assert!(findings.clean(), "{findings}");

    // Ranges removed: open to all, no firewall rule left.
    w.services
        .patch(
            "restricted",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": null}})),
        )
        .await
        .unwrap();
    wait_traffic(&w.sim, OUTSIDE, &vip, balanced).await;
    wait_for("no firewall rule", WAIT, || async {
        w.sim.firewall_rules().is_empty().then_some(())
    })
    .await;

    // Ranges again, then the Service deleted: none leaked.
    w.services
        .patch(
            "restricted",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"loadBalancerSourceRanges": ["198.51.100.0/24"]}})),
        )
        .await
        .unwrap();
    wait_traffic(&w.sim, OUTSIDE, &vip, dropped).await;
    w.services
        .delete("restricted", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the Service gone", WAIT, || async {
        w.get("restricted").await.is_none().then_some(())
    })
    .await;
    assert!(
        w.sim.firewall_rules().is_empty(),
        "{:#?}",
        w.sim.firewall_rules()
    );
    assert!(
        w.sim
            .traffic(ip(OUTSIDE), ip(&open), 80, "tcp")
            .is_balanced()
    );
    w.finish().await;
}

/// The same Services under `--source-ranges=enforce` (kube-loxilb's behaviour): in the
/// model, as on an affected loxilb, one Service with source ranges stops every Service.
/// This is what the default avoids.
#[tokio::test]
async fn enforce_in_rules_stops_every_service_in_the_model() {
    let opts = Options {
        extra_args: vec!["--source-ranges=enforce".into()],
        ..Options::default()
    };
    let w = World::with("rulesranges", opts).await;
    w.add_node("node-a", "10.3.2.1").await;
    let open = w.serve_one_port("first", 80).await;
    wait_traffic(&w.sim, OUTSIDE, &open, balanced).await;
    let vips = six_services(&w).await;
    let vip = vips[5].clone();
    wait_traffic(&w.sim, INSIDE, &vip, |t| *t == Traffic::Issue1036).await;
    assert_eq!(
        w.sim.traffic(ip(OUTSIDE), ip(&open), 80, "tcp"),
        Traffic::Issue1036
    );
    // The same census as under `firewall`: no flow at all is balanced.
    let counts = census(&w.sim, &vips, &SOURCES);
    eprintln!(
        "enforce: (balanced, dropped, other) = {counts:?} of {} flows",
        vips.len() * 3
    );
    assert_eq!(counts, (0, 0, 18));
    assert!(w.sim.firewall_rules().is_empty());
    w.finish().await;
}

/// A firewall that refuses our rules: the Service's rule is not created (never open to every
/// source), the Service says why, others go on, and once loxilb takes them (the Service's
/// retry with back-off, or the drift check) both arrive.
#[tokio::test]
async fn a_restricted_rule_never_goes_in_without_its_firewall_rules() {
    let w = World::new("fwrefused").await;
    w.add_node("node-a", "10.3.3.1").await;
    // A full firewall table: loxilb refuses our rules (and only them).
    w.sim.set_firewall_capacity(0);
    let mut svc = World::lb_service("restricted", Some(CLASS), &[(80, "TCP")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["198.51.100.0/24".into()]);
    w.create(&svc).await;
    wait_for("Programmed=False", WAIT, || async {
        let s = w.get("restricted").await?;
        World::condition(&s, "loxilb.io/Programmed").filter(|c| c.0 == "False")
    })
    .await;
    // Its address is claimed (the condition names it) but not shown: no rule holds it yet.
    let s = w.get("restricted").await.unwrap();
    let (_, _, allocated) = World::condition(&s, "loxilb.io/AddressAllocated").unwrap();
    let vip = allocated.split(' ').next().unwrap().to_string();
    assert!(
        s.status
            .and_then(|st| st.load_balancer?.ingress)
            .unwrap_or_default()
            .is_empty(),
        "shown before its rule"
    );
    assert!(
        w.rules_for(&vip).is_empty(),
        "no rule without its firewall: {:#?}",
        w.sim.writes_since_restart()
    );
    assert!(w.sim.firewall_rules().is_empty());
    // The other Service is not held up.
    let open = w.serve_one_port("open", 80).await;
    assert!(
        w.sim
            .traffic(ip(OUTSIDE), ip(&open), 80, "tcp")
            .is_balanced()
    );
    w.sim.set_firewall_capacity(8192);
    wait_traffic(&w.sim, OUTSIDE, &vip, dropped).await;
    wait_traffic(&w.sim, INSIDE, &vip, balanced).await;
    assert_eq!(w.wait_for_ip("restricted").await, vip);
    w.finish().await;
}
