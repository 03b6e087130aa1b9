//! Services sharing one address by port against the real API server: shared mode by port and
//! sharing key, ports edited onto a sharer (the soak's two bugs), unique mode and the switch to
//! it, kube-loxilb's shared addresses adopted together, retained addresses in shared mode.

mod common;

use common::addresses::{address_reason, names, stop_when_serving};
use common::{CLASS, Options, WAIT, World, annotated, wait_for};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use loxi_ccm::ipam::claims::AddressClaim;
use loxilb_client::{ClientConfig, LoxilbClient};
use serde_json::json;
use std::collections::BTreeSet;

// ---------------------------------------------------------------------------------------
// Sharing one address between Services (kube-loxilb's shared mode, the default).

/// Owners (Service names) listed by the claim of `ip`.
async fn claim_owners(w: &World, ip: &str) -> Option<BTreeSet<String>> {
    let api: Api<AddressClaim> = Api::all(w.client.clone());
    let name = ip.replace(':', "-");
    let c = api.get_opt(&name).await.unwrap()?;
    Some(c.owners().iter().map(|o| o.name.clone()).collect())
}

#[tokio::test]
async fn shared_mode_shares_an_address_by_port_and_sharing_key() {
    let w = World::new("share").await;
    w.add_node("node-a", "10.1.8.1").await;
    // Services on different ports share the first address; the same port takes another.
    w.create(&World::lb_service("http", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("http").await;
    w.create(&World::lb_service("https", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("https").await, x);
    w.create(&World::lb_service(
        "dns",
        Some(CLASS),
        &[(53, "UDP"), (53, "TCP")],
    ))
    .await;
    assert_eq!(w.wait_for_ip("dns").await, x);
    w.create(&World::lb_service("http2", Some(CLASS), &[(80, "TCP")]))
        .await;
    let y = w.wait_for_ip("http2").await;
    assert_ne!(y, x, "same port: another address");
    // One claim lists every owner; each Service has its own rules on the address.
    wait_for("claim with three owners", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["http", "https", "dns"])).then_some(())
    })
    .await;
    wait_for("rules of every sharer", WAIT, || async {
        let ports: Vec<(u16, String)> = w
            .rules_for(&x)
            .into_iter()
            .map(|(p, proto, _)| (p, proto))
            .collect();
        (ports
            == [
                (53, "tcp".to_string()),
                (53, "udp".to_string()),
                (80, "tcp".to_string()),
                (443, "tcp".to_string()),
            ])
        .then_some(())
    })
    .await;
    assert_eq!(w.rules_for(&y).len(), 1);

    // A sharing key: only with the same key, never with key-less Services.
    let keyed = |name: &str, port: i32, key: &str| {
        annotated(
            World::lb_service(name, Some(CLASS), &[(port, "TCP")]),
            &[("loxilb.io/sharing-key", key)],
        )
    };
    w.create(&keyed("k1", 8080, "team-a")).await;
    let z = w.wait_for_ip("k1").await;
    assert!(z != x && z != y, "{z}");
    w.create(&keyed("k2", 8081, "team-a")).await;
    assert_eq!(w.wait_for_ip("k2").await, z);
    w.create(&keyed("k3", 8082, "team-b")).await;
    let k3 = w.wait_for_ip("k3").await;
    assert!(![&x, &y, &z].contains(&&k3), "{k3}");
    // A requested address: joined with the same key, in use without one.
    let mut static_keyed = keyed("s1", 9090, "team-a");
    static_keyed.spec.as_mut().unwrap().load_balancer_ip = Some(z.clone());
    w.create(&static_keyed).await;
    assert_eq!(w.wait_for_ip("s1").await, z);
    let mut static_plain = World::lb_service("s2", Some(CLASS), &[(9091, "TCP")]);
    static_plain.spec.as_mut().unwrap().load_balancer_ip = Some(x.clone());
    w.create(&static_plain).await;
    assert_eq!(address_reason(&w, "s2").await, "AddressInUse");

    // One sharer leaves: the address and the others' rules stay, its rules go.
    w.services
        .delete("https", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("https off the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["http", "dns"])).then_some(())
    })
    .await;
    wait_for("443 rule gone, others kept", WAIT, || async {
        let ports: Vec<u16> = w.rules_for(&x).into_iter().map(|(p, _, _)| p).collect();
        (ports == [53, 53, 80]).then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("http").await, x);
    // The port it freed is free for a newcomer on that address.
    w.create(&World::lb_service("tls", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("tls").await, x);
    // The last owners leave: the address is free, and s2, which asked for it by name, gets
    // it at last (a fresh claim, its rule alone on the address).
    for name in ["http", "dns", "tls"] {
        w.services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for("the freed address claimed by s2 alone", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["s2"])).then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("s2").await, x);
    wait_for("only s2's rule on the address", WAIT, || async {
        let ports: Vec<u16> = w.rules_for(&x).into_iter().map(|(p, _, _)| p).collect();
        (ports == [9091]).then_some(())
    })
    .await;
    w.finish().await;
}

#[tokio::test]
async fn ports_edited_onto_a_sharer_move_the_service() {
    let w = World::new("sharemove").await;
    w.add_node("node-a", "10.1.9.1").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    // b now also wants 80, which a holds on x: b moves, a stays.
    w.services
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [
                {"name": "tcp-443", "port": 443, "protocol": "TCP"},
                {"name": "tcp-80", "port": 80, "protocol": "TCP"}
            ]}})),
        )
        .await
        .unwrap();
    let moved = wait_for("b on another address", WAIT, || async {
        let ip = w.wait_for_ip("b").await;
        (ip != x).then_some(ip)
    })
    .await;
    wait_for("b off x, rules in place", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a"])
            && w.rules_for(&moved).len() == 2
            && w.rules_for(&x).len() == 1)
            .then_some(())
    })
    .await;
    assert_eq!(w.wait_for_ip("a").await, x);
    w.finish().await;
}

/// The soak's first bug (docs/RELIABILITY.md): a Service's ports edited onto a sharer's
/// while no other address is free. It keeps its address on its old record (the claim lists
/// its old ports) and says why; the drift check must not program its new ports there from
/// that record, which put its rule on the sharer's address and port, and the next check the
/// sharer's again (a flap every drift interval).
#[tokio::test]
async fn ports_edited_onto_a_sharer_with_no_address_free_never_take_the_sharers_rule() {
    let opts = Options {
        // Two usable addresses (network and broadcast addresses are skipped).
        cidr: "192.0.2.8/30".into(),
        drift: "2s",
        ..Options::default()
    };
    let w = World::with("sharefull", opts).await;
    w.add_node("node-a", "10.1.9.2").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    w.create(&World::lb_service("c", Some(CLASS), &[(80, "TCP")]))
        .await;
    let y = w.wait_for_ip("c").await;
    assert_ne!(y, x);
    let rule_at = |ip: &str, port: u16| {
        w.sim
            .rules()
            .into_iter()
            .find(|r| r.external_ip == ip && r.port == port)
            .map(|r| r.name)
    };
    let a_rule = wait_for("a's rule on x", WAIT, || async { rule_at(&x, 80) }).await;
    wait_for("b's and c's rules", WAIT, || async {
        (rule_at(&x, 443).is_some() && rule_at(&y, 80).is_some()).then_some(())
    })
    .await;
    // b now also wants 80: a holds it on x, c on y, no address is free.
    w.services
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [
                {"name": "tcp-443", "port": 443, "protocol": "TCP"},
                {"name": "tcp-80", "port": 80, "protocol": "TCP"}
            ]}})),
        )
        .await
        .unwrap();
    wait_for("b reports that it has no new address", WAIT, || async {
        let b = w.get("b").await?;
        World::condition(&b, "loxilb.io/AddressAllocated")
            .is_some_and(|c| c.0 == "False")
            .then_some(())
    })
    .await;
    // Three drift checks, each seen repairing c's rule deleted by hand: none of them may
    // have put b's rule on a's address and port.
    let loxilb = LoxilbClient::new(ClientConfig::new(&w.sim.url())).unwrap();
    for round in 0..3 {
        loxilb.delete_rule(&y, 80, "tcp", false).await.unwrap();
        wait_for("a drift check puts c's rule back", WAIT, || async {
            rule_at(&y, 80).map(|_| ())
        })
        .await;
        assert_eq!(
            rule_at(&x, 80).as_ref(),
            Some(&a_rule),
            "after drift check {round}, {x}:80 is not a's rule any more"
        );
    }
    // b keeps what it had, and says why.
    assert_eq!(w.wait_for_ip("b").await, x);
    assert!(rule_at(&x, 443).is_some());
    w.finish().await;
}

/// The soak's second bug (docs/RELIABILITY.md): a sharer taken off its address's claim
/// behind its back (here by hand; in the soak, around an API server restart) while it keeps
/// showing the address. The claim event that drops it gives it a pass, which claims the
/// address again; before, nothing re-queued it and it showed an address no claim backed.
#[tokio::test]
async fn a_sharer_taken_off_its_claim_claims_its_address_again() {
    let w = World::new("sharedrop").await;
    w.add_node("node-a", "10.1.9.3").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    wait_for("both on the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(())
    })
    .await;
    // Take b off the claim (a full update, as the controller's own leave does).
    let api: Api<AddressClaim> = Api::all(w.client.clone());
    let name = x.replace(':', "-");
    let mut c = api.get(&name).await.unwrap();
    c.spec.shared_with.retain(|o| o.name != "b");
    c.spec.service = if c.spec.service.name == "b" {
        c.spec.shared_with.remove(0)
    } else {
        c.spec.service
    };
    api.replace(&name, &PostParams::default(), &c)
        .await
        .unwrap();
    wait_for(
        "b back on the claim of the address it shows",
        WAIT,
        || async { (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(()) },
    )
    .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    w.finish().await;
}

#[tokio::test]
async fn unique_mode_never_shares() {
    let w = World::with(
        "unique",
        Options {
            extra_args: vec!["--set-unique-ip".into()],
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.1.10.1").await;
    w.create(&World::lb_service("http", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("http").await;
    w.create(&annotated(
        World::lb_service("https", Some(CLASS), &[(443, "TCP")]),
        &[("loxilb.io/sharing-key", "k")],
    ))
    .await;
    assert_ne!(w.wait_for_ip("https").await, x);
    // Claims still record the ports (switching back to shared mode moves nobody), and list
    // one owner each.
    let claims = w.claims().await;
    assert_eq!(claims.len(), 2);
    assert!(
        claims
            .iter()
            .all(|c| c.spec.service.ports.is_some() && c.spec.shared_with.is_empty()),
        "{claims:?}"
    );
    // Asked for by name with a key: still in use in unique mode.
    let mut wants_x = annotated(
        World::lb_service("dns", Some(CLASS), &[(53, "UDP")]),
        &[("loxilb.io/sharing-key", "k")],
    );
    wants_x.spec.as_mut().unwrap().load_balancer_ip = Some(x.clone());
    w.create(&wants_x).await;
    assert_eq!(address_reason(&w, "dns").await, "AddressInUse");
    w.finish().await;
}

#[tokio::test]
async fn switching_to_unique_mode_moves_nobody() {
    let mut w = World::new("sharemode").await;
    w.add_node("node-a", "10.1.11.1").await;
    w.create(&World::lb_service("a", Some(CLASS), &[(80, "TCP")]))
        .await;
    let x = w.wait_for_ip("a").await;
    w.create(&World::lb_service("b", Some(CLASS), &[(443, "TCP")]))
        .await;
    assert_eq!(w.wait_for_ip("b").await, x);
    wait_for("both on the claim", WAIT, || async {
        (claim_owners(&w, &x).await? == names(&["a", "b"])).then_some(())
    })
    .await;
    w.stop_controller().await;
    w.start_controller(&Options {
        extra_args: vec!["--set-unique-ip".into()],
        ..Options::default()
    })
    .await;
    // A newcomer that would fit on x gets its own address; the sharers stay.
    w.create(&World::lb_service("c", Some(CLASS), &[(8080, "TCP")]))
        .await;
    assert_ne!(w.wait_for_ip("c").await, x);
    for name in ["a", "b"] {
        assert_eq!(w.wait_for_ip(name).await, x, "{name} moved");
    }
    assert_eq!(claim_owners(&w, &x).await.unwrap(), names(&["a", "b"]));
    assert_eq!(w.rules_for(&x).len(), 2);
    w.finish().await;
}

#[tokio::test]
async fn kube_loxilb_shared_addresses_are_adopted_together() {
    let mut w = World::new("shareadopt").await;
    w.add_node("node-a", "10.1.12.1").await;
    stop_when_serving(&mut w).await;
    // kube-loxilb in shared mode left two Services on one address (by port), and a third on
    // the same port as one of them (it would not have: one of the two must move).
    for (name, port) in [("web", 80), ("tls", 443), ("clash", 80)] {
        w.create(&World::lb_service(name, Some(CLASS), &[(port, "TCP")]))
            .await;
        w.services
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"hostname": "llb-192.0.2.50"}]}}})),
            )
            .await
            .unwrap();
    }
    w.start_controller(&Options::default()).await;
    let shared = "192.0.2.50".to_string();
    // tls shares with whichever port-80 Service the index met first; the other moves.
    let (stayed, moved) = wait_for("sharers adopted, the clash moved", WAIT, || async {
        let owners = claim_owners(&w, &shared).await?;
        let stayed = ["web", "clash"].into_iter().find(|n| owners.contains(*n))?;
        let other = if stayed == "web" { "clash" } else { "web" };
        (owners == names(&[stayed, "tls"])).then_some((stayed, other))
    })
    .await;
    assert_eq!(w.wait_for_ip("tls").await, shared);
    assert_eq!(w.wait_for_ip(stayed).await, shared);
    let moved_ip = wait_for("the clashing one on another address", WAIT, || async {
        let ip = w.wait_for_ip(moved).await;
        (ip != shared).then_some(ip)
    })
    .await;
    wait_for("rules", WAIT, || async {
        (w.rules_for(&shared).len() == 2 && w.rules_for(&moved_ip).len() == 1).then_some(())
    })
    .await;
    w.finish().await;
}

/// In shared mode, an address retained for a deleted Service is skipped by the sharing
/// search: a new Service with other ports gets a free address at once, and the pool is not
/// reported exhausted while it has free addresses.
#[tokio::test]
async fn a_retained_address_does_not_block_new_services_in_shared_mode() {
    let w = World::with(
        "retainshare",
        Options {
            cidr: "192.0.2.64/28".into(),
            ..Options::default()
        },
    )
    .await;
    w.add_node("node-a", "10.1.10.1").await;
    let kept = annotated(
        World::lb_service("kept", Some(CLASS), &[(80, "TCP")]),
        &[("loxilb.io/retain-address", "1h")],
    );
    w.create(&kept).await;
    let retained = w.wait_for_ip("kept").await;
    w.services
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("retained for the deleted Service", WAIT, || async {
        w.claims()
            .await
            .into_iter()
            .find(|c| c.spec.address == retained)
            .filter(|c| c.spec.service.uid.is_empty() && c.spec.retain_until.is_some())
            .map(|_| ())
    })
    .await;
    // Other ports: it could share an owned address, but not a reservation.
    w.create(&World::lb_service("fresh", Some(CLASS), &[(443, "TCP")]))
        .await;
    let ip = w.wait_for_ip("fresh").await;
    assert_ne!(ip, retained);
    let s = w.get("fresh").await.unwrap();
    let (status, reason, _) = World::condition(&s, "loxilb.io/AddressAllocated").unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Allocated"));
    assert!(
        !w.event_reasons("fresh")
            .await
            .contains(&"PoolExhausted".to_string())
    );
    w.finish().await;
}
