//! The fleet on its own (crates/loxi-ccm/src/fleet/mod.rs), without an API server: in-process
//! loxilb simulators, the records in memory (`fleet::record::MemoryRecord`), BGP from the
//! flags alone, and a replay that brings each loxilb to a fixed set of rules (in the
//! controller the Services' rules: crates/loxi-ccm/src/service/drift.rs). What the fleet does
//! with the cluster's objects (discovery's EndpointSlices, `LoxiURL` resources, the records
//! as ConfigMaps) is in tests/fleet.rs, against a real API server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use loxi_ccm::bgp::Bgp;
use loxi_ccm::fleet::placement::{Entry, GroupNow, Placed, Placement, Request};
use loxi_ccm::fleet::record::MemoryRecord;
use loxi_ccm::fleet::roles::Roles;
use loxi_ccm::fleet::workers::Replay;
use loxi_ccm::fleet::{Fleet, Running, Settings, Source};
use loxi_ccm::leader::{Gate, WriteLease};
use loxi_ccm::loxilb::{Fleet as Instances, Instance, Member, ServiceRules};
use loxi_ccm::metrics::Metrics;
use loxi_domain::bgp::{BgpInput, BgpSettings};
use loxi_domain::model::Probe as RuleProbe;
use loxi_domain::placement::PlacementError;
use loxi_domain::roles::HaSettings;
use loxi_domain::{
    ClusterId, Endpoint, EndpointSelection, NatMode, Protocol, Rule, RuleKey, RuleName,
};
use loxilb_client::{ClientConfig, LoxilbClient};
use loxilb_sim::{Fault, SimConfig, Simulator};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(20);
const INTERVAL: Duration = Duration::from_millis(100);

fn cluster() -> ClusterId {
    ClusterId::new("alone").unwrap()
}

/// The one rule every loxilb of these tests holds.
fn rule() -> Rule {
    Rule {
        key: RuleKey {
            ip: "192.0.2.10".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        },
        name: RuleName::new(&cluster(), "ns", "web", 80, Protocol::Tcp).to_string(),
        mode: NatMode::Default,
        selection: EndpointSelection::RoundRobin,
        endpoints: vec![Endpoint {
            ip: "10.0.0.1".parse().unwrap(),
            target_port: 30000,
            weight: 1,
        }],
        monitor: false,
        managed: true,
        probe: RuleProbe::default(),
        inactive_timeout: 0,
        proxy_protocol_v2: false,
        egress: false,
        allowed_sources: vec![],
        secondary_ips: vec![],
        bgp: false,
        private_ip: None,
    }
}

async fn sim(bgp: bool) -> Simulator {
    let cfg = SimConfig {
        bgp,
        ..SimConfig::default()
    };
    Simulator::start("127.0.0.1:0".parse().unwrap(), cfg)
        .await
        .unwrap()
}

/// Brings a loxilb to [`rule`]; complete when nothing failed (as the controller's replay).
fn replay(metrics: Metrics) -> Replay {
    Arc::new(move |inst: Arc<Instance>| {
        let metrics = metrics.clone();
        Box::pin(async move {
            inst.converge_all(
                &cluster(),
                None,
                || std::iter::once(ServiceRules::Want(vec![rule()])),
                &metrics,
            )
            .await
            .is_ok_and(|report| report.failed.is_empty())
        })
    })
}

/// What a test turns on.
#[derive(Default)]
struct With {
    roles: bool,
    bgp: bool,
}

/// A started fleet and its records.
struct Alone {
    fleet: Fleet,
    metrics: Metrics,
    roles: Arc<MemoryRecord>,
    _running: Running,
}

impl Alone {
    /// The fleet of `configured` (the `--loxilb-url` loxilbs), started.
    fn start(configured: &[&Simulator], with: With) -> Alone {
        let metrics = Metrics::new();
        let clients = configured
            .iter()
            .map(|s| LoxilbClient::new(ClientConfig::new(&s.url())).unwrap())
            .collect();
        let gate = Arc::new(Gate::new(watch::channel(true).1, WriteLease::always()));
        gate.set_ready();
        let roles_record = Arc::new(MemoryRecord::default());
        let roles = with.roles.then(|| {
            let settings = HaSettings {
                vip: "0.0.0.0".into(),
                instance_count: 1,
                excluded: vec![],
            };
            Arc::new(Roles::new(
                settings,
                Duration::from_secs(30),
                roles_record.clone(),
            ))
        });
        let bgp = with.bgp.then(|| {
            let settings = BgpSettings::from_input(&BgpInput {
                local_asn: Some("65100"),
                router_id: None,
                listen_port: None,
                multihop: false,
                peers: Some("192.0.2.250:65001"),
            })
            .unwrap()
            .unwrap();
            Arc::new(Bgp::from_flags(settings, metrics.clone()))
        });
        let fleet = Fleet::new(
            Settings {
                cluster: cluster(),
                metrics: metrics.clone(),
                interval: INTERVAL,
                zone: "llb".into(),
                zone_instances: 1,
                template: ClientConfig::new(""),
                bgp,
                roles,
                record: Arc::new(MemoryRecord::default()),
            },
            Instances::new(clients, &cluster()),
            gate,
        );
        let running = fleet.start(replay(metrics.clone()));
        Alone {
            fleet,
            metrics,
            roles: roles_record,
            _running: running,
        }
    }

    fn instance(&self, s: &Simulator) -> Option<Arc<Instance>> {
        self.fleet
            .instances()
            .instances()
            .iter()
            .find(|i| i.url() == s.url())
            .cloned()
    }

    /// The gauge series of `s` on `/metrics`: up, rules, capacity, write window, HA roles.
    fn gauges_of(&self, s: &Simulator) -> Vec<String> {
        let (instance, loxilb) = (
            format!("instance=\"{}\"", s.url()),
            format!("loxilb=\"{}\"", s.url()),
        );
        let per_instance = [
            "loxi_ccm_loxilb_up{",
            "loxi_ccm_loxilb_rules{",
            "loxi_ccm_loxilb_capacity{",
            "loxi_ccm_loxilb_write_queue{",
        ];
        self.metrics
            .encode()
            .lines()
            .filter(|l| {
                (per_instance.iter().any(|p| l.starts_with(p)) && l.contains(&instance))
                    || (l.starts_with("loxi_ccm_ha_roles{") && l.contains(&loxilb))
            })
            .map(str::to_string)
            .collect()
    }
}

/// Polls `check` every 20 ms until it gives a value, for `WAIT` at most ([`common::poll_for`]).
async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let every = Duration::from_millis(20);
    common::poll_for(what, WAIT, every, String::new, || {
        std::future::ready(check())
    })
    .await
}

fn holds_rule(s: &Simulator) -> bool {
    s.rules().iter().any(|r| r.name == rule().name)
}

/// A loxilb that restarts empty gets its HA role back first, then its BGP settings, then its
/// rules (docs/loxilb-api.md#replay-order), from its worker alone.
#[tokio::test]
async fn a_restarted_loxilb_gets_its_role_then_bgp_then_its_rules() {
    let s = sim(true).await;
    let alone = Alone::start(
        &[&s],
        With {
            roles: true,
            bgp: true,
        },
    );
    let configured = || {
        (s.cluster_state("llb-inst0").as_deref() == Some("MASTER")
            && s.bgp().global.is_some()
            && !s.bgp().neighbors.is_empty()
            && holds_rule(&s))
        .then_some(())
    };
    wait_for("role, BGP and rule at start-up", configured).await;
    assert_eq!(
        alone.roles.get().unwrap().get("llb-inst0"),
        Some(&s.url()),
        "the role recorded"
    );

    s.restart();
    wait_for("role, BGP and rule after the restart", configured).await;
    let log = s.writes_since_restart();
    // The global BGP settings the restart caused come last of BGP's writes (the worker's pass
    // at each interval may write before the restart is seen, never a rule); the restart
    // marker is placed again by the replay, before it lists the loxilb.
    let global = log
        .iter()
        .rposition(|l| l == "POST /config/bgp/global")
        .unwrap_or_else(|| panic!("no BGP global in {log:?}"));
    assert!(
        global > 0 && log[global - 1] == "POST /config/cistate",
        "the role right before BGP: {log:?}"
    );
    let rules: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| *l == "POST /config/loadbalancer")
        .map(|(i, _)| i)
        .collect();
    assert!(
        !rules.is_empty() && rules.iter().all(|i| *i > global),
        "the rules after BGP: {log:?}"
    );
}

/// A discovered loxilb joins not serving; a replay that did not program every rule keeps it
/// so, and it serves only once a replay completed (then it holds every rule).
#[tokio::test]
async fn a_discovered_loxilb_serves_only_after_a_complete_replay() {
    let (a, b) = (sim(false).await, sim(false).await);
    let alone = Alone::start(&[&a], With::default());
    wait_for("the configured loxilb programmed", || {
        holds_rule(&a).then_some(())
    })
    .await;
    // Every write refused: the marker (then probed by listing) and the replay's rule.
    b.set_fault(Some(Fault {
        status: 500,
        rate: 1.0,
        only_writes: true,
    }));
    alone
        .fleet
        .set_source(Source::Discovered, vec![Member::new("llb", &b.url())]);
    let joined = wait_for("the discovered loxilb joined", || alone.instance(&b)).await;
    assert!(!joined.is_serving(), "a loxilb joins not serving");
    wait_for("the discovered loxilb probed up", || {
        joined.is_healthy().then_some(())
    })
    .await;
    // Several replays fail meanwhile (one per probe).
    tokio::time::sleep(INTERVAL * 10).await;
    assert!(!holds_rule(&b));
    assert!(
        b.write_log()
            .iter()
            .any(|w| w.path == "/config/loadbalancer" && w.status == 500),
        "a replay was tried: {:?}",
        b.writes_since_restart()
    );
    assert!(
        !joined.is_serving(),
        "serving after an incomplete replay ({:?})",
        b.writes_since_restart()
    );

    b.set_fault(None);
    wait_for("serving after a complete replay", || {
        // Serving is only ever seen with every rule in place.
        let serving = joined.is_serving();
        assert!(!serving || holds_rule(&b), "serving without its rule");
        serving.then_some(())
    })
    .await;
    assert!(alone.instance(&a).unwrap().is_serving());
}

/// A loxilb that leaves the fleet while it still runs is told BACKUP for the role it held,
/// and the role moves to another loxilb (recorded).
#[tokio::test]
async fn a_loxilb_that_leaves_is_told_backup() {
    let (a, b) = (sim(false).await, sim(false).await);
    let alone = Alone::start(
        &[],
        With {
            roles: true,
            bgp: false,
        },
    );
    alone.fleet.set_source(
        Source::Discovered,
        vec![Member::new("llb", &a.url()), Member::new("llb", &b.url())],
    );
    let sims = [&a, &b];
    let state = |s: &Simulator| s.cluster_state("llb-inst0");
    let master = wait_for("one MASTER, one BACKUP", || {
        let states: Vec<Option<String>> = sims.iter().map(|s| state(s)).collect();
        match (states[0].as_deref(), states[1].as_deref()) {
            (Some("MASTER"), Some("BACKUP")) => Some(0),
            (Some("BACKUP"), Some("MASTER")) => Some(1),
            _ => None,
        }
    })
    .await;
    let (gone, stays) = (sims[master], sims[1 - master]);

    alone
        .fleet
        .set_source(Source::Discovered, vec![Member::new("llb", &stays.url())]);
    wait_for("the loxilb that left made BACKUP", || {
        (state(gone).as_deref() == Some("BACKUP")).then_some(())
    })
    .await;
    assert!(alone.instance(gone).is_none(), "no longer a member");
    wait_for("the role moved and recorded", || {
        (state(stays).as_deref() == Some("MASTER")
            && alone.roles.get()?.get("llb-inst0") == Some(&stays.url()))
        .then_some(())
    })
    .await;
}

/// The fleet of the configured loxilb `a`, with HA roles, that the discovered loxilb `b`
/// joins (in the default group).
async fn b_joining_a() -> (Simulator, Simulator, Alone) {
    let (a, b) = (sim(false).await, sim(false).await);
    let with = With {
        roles: true,
        bgp: false,
    };
    let alone = Alone::start(&[&a], with);
    alone
        .fleet
        .set_source(Source::Discovered, vec![Member::new("llb", &b.url())]);
    (a, b, alone)
}

/// A loxilb that leaves while its worker's probe is in flight (answered 600 ms late): its
/// gauges go, and stay gone once that probe would have been answered (its worker was
/// stopped before they were forgotten, crates/loxi-ccm/src/fleet/mod.rs `Fleet::depart`).
#[tokio::test]
async fn a_loxilb_that_leaves_during_a_probe_has_its_gauges_gone_for_good() {
    const LATE: Duration = Duration::from_millis(600);
    let (a, b, alone) = b_joining_a().await;
    wait_for("b serving, with its up, rules and role series", || {
        let gauges = alone.gauges_of(&b);
        let has = |p: &str| gauges.iter().any(|l| l.starts_with(p));
        (alone.instance(&b)?.is_serving()
            && has("loxi_ccm_loxilb_up{")
            && has("loxi_ccm_loxilb_rules{")
            && has("loxi_ccm_ha_roles{"))
        .then_some(())
    })
    .await;

    // Every answer of b late: the next request (its worker's probe) is then in flight.
    b.set_latency(LATE);
    let asked = b.request_count();
    wait_for("a request of b's worker in flight", || {
        (b.request_count() > asked).then_some(())
    })
    .await;
    alone.fleet.set_source(Source::Discovered, vec![]);
    let gone = std::time::Instant::now();
    wait_for("b's gauges gone", || {
        alone.gauges_of(&b).is_empty().then_some(())
    })
    .await;
    // Watched until well after the probe in flight would have been answered.
    while gone.elapsed() < LATE * 3 {
        let left = alone.gauges_of(&b);
        assert!(left.is_empty(), "set again after b left: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(alone.instance(&b).is_none(), "no longer a member");
    assert!(
        alone
            .gauges_of(&a)
            .iter()
            .any(|l| l.starts_with("loxi_ccm_loxilb_up{")),
        "a's gauges stay"
    );
}

/// A loxilb that leaves one group and joins another in the same change: its role series of
/// the group it left go, and its gauges are set under the new group (not suppressed as
/// those of a loxilb that left).
#[tokio::test]
async fn a_loxilb_that_moves_to_another_group_has_its_gauges_there() {
    let (_a, b, alone) = b_joining_a().await;
    let role_in = |group: &str, gauges: &[String]| {
        let ha = format!("ha_instance=\"{group}-inst0\"");
        gauges
            .iter()
            .any(|l| l.starts_with("loxi_ccm_ha_roles{") && l.contains(&ha))
    };
    wait_for("b serving in llb, with its role series there", || {
        (alone.instance(&b)?.is_serving() && role_in("llb", &alone.gauges_of(&b))).then_some(())
    })
    .await;

    alone
        .fleet
        .set_source(Source::Discovered, vec![Member::new("east", &b.url())]);
    wait_for("b serving in east", || {
        let inst = alone.instance(&b)?;
        (inst.group() == "east" && inst.is_serving()).then_some(())
    })
    .await;
    // It is east's only loxilb: MASTER there.
    wait_for("b MASTER of east-inst0", || {
        (b.cluster_state("east-inst0").as_deref() == Some("MASTER")).then_some(())
    })
    .await;
    let gauges = wait_for("b's gauges under east only", || {
        let gauges = alone.gauges_of(&b);
        let has = |p: &str| gauges.iter().any(|l| l.starts_with(p));
        (has("loxi_ccm_loxilb_up{")
            && has("loxi_ccm_loxilb_rules{")
            && role_in("east", &gauges)
            && !role_in("llb", &gauges))
        .then_some(gauges)
    })
    .await;
    let master = gauges
        .iter()
        .find(|l| l.contains("ha_instance=\"east-inst0\"") && l.contains("role=\"MASTER\""));
    assert!(
        master.is_some_and(|l| l.ends_with(" 1")),
        "MASTER of east-inst0: {gauges:?}"
    );
}

/// A BGP loxilb that leaves: its session series go with it and its sessions are forgotten.
/// Back at the same URL with its session not ESTABLISHED (yet), that is a new session, not
/// one that dropped: no drop counted, no Event (crates/loxi-ccm/src/bgp/mod.rs
/// `Bgp::loxilb_left`; before it, the session it had when it left was remembered).
#[tokio::test]
async fn a_bgp_loxilb_that_leaves_and_returns_starts_its_sessions_afresh() {
    const PEER: &str = "192.0.2.250";
    let (a, b) = (sim(true).await, sim(true).await);
    let with = With {
        roles: false,
        bgp: true,
    };
    let alone = Alone::start(&[&a], with);
    let b_member = || vec![Member::new("llb", &b.url())];
    let of_b = format!("loxilb=\"{}\"", b.url());
    let lines_of_b = |metric: &str| -> Vec<String> {
        alone
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with(metric) && l.contains(&of_b))
            .map(str::to_string)
            .collect()
    };
    let session_is = |state: &str| {
        let state = format!("state=\"{state}\"");
        lines_of_b("loxi_ccm_bgp_sessions{")
            .iter()
            .any(|l| l.contains(&state) && l.ends_with(" 1"))
    };

    alone.fleet.set_source(Source::Discovered, b_member());
    wait_for("the peer configured on b, its session ESTABLISHED", || {
        b.set_bgp_peer_state(PEER, "ESTABLISHED", None)
            .then_some(())
    })
    .await;
    wait_for("b's session ESTABLISHED in the metric", || {
        session_is("ESTABLISHED").then_some(())
    })
    .await;

    alone.fleet.set_source(Source::Discovered, vec![]);
    wait_for("b's session series gone", || {
        lines_of_b("loxi_ccm_bgp_sessions{")
            .is_empty()
            .then_some(())
    })
    .await;

    // Returns with its session still being set up (the simulator keeps the peer: the
    // controller's BGP pass finds it and adds nothing).
    b.set_bgp_peer_state(PEER, "ACTIVE", None);
    alone.fleet.set_source(Source::Discovered, b_member());
    wait_for("b's session ACTIVE in the metric", || {
        session_is("ACTIVE").then_some(())
    })
    .await;
    let drops = lines_of_b("loxi_ccm_bgp_session_drops");
    assert!(
        drops.iter().all(|l| l.ends_with(" 0")),
        "a returning loxilb's new session counted as a dropped one: {drops:?}"
    );
}

fn group(name: &str, capacity: usize, serving: bool) -> GroupNow {
    GroupNow {
        name: name.into(),
        capacity,
        serving,
    }
}

fn request(key: &str, recorded: Option<&str>, rules: usize) -> Request<String> {
    Request {
        key: key.into(),
        uid: format!("uid-{key}"),
        recorded: recorded.map(str::to_string),
        already_ours: false,
        rules,
    }
}

fn entry(key: &str, group: &str, rules: usize) -> Entry<String> {
    Entry {
        key: key.into(),
        uid: format!("uid-{key}"),
        group: group.into(),
        rules,
    }
}

/// The placement book on plain entries: one group needs no decision; among several, the
/// book is filled once from what is placed, a new Service goes where most room is (never to
/// a group that serves nothing), a full fleet makes it wait, and a Service that leaves frees
/// its room and hands back the waiting ones.
#[tokio::test]
async fn the_placement_book_on_plain_entries() {
    let book: Placement<String> = Placement::new("llb", Metrics::new());
    // One group, the default one: nothing chosen, nothing recorded, nothing counted.
    let one = [group("llb", 10, true)];
    let placed = book
        .place(request("a", None, 2), &one, || panic!("no fill needed"))
        .await
        .unwrap();
    assert_eq!(
        placed,
        Placed {
            group: "llb".into(),
            record: false
        }
    );

    let two = [group("east", 10, true), group("west", 10, true)];
    // Filled once from what is placed already: east holds 7 of 10.
    let placed = book
        .place(request("b", None, 2), &two, || vec![entry("x", "east", 7)])
        .await
        .unwrap();
    assert_eq!(
        placed,
        Placed {
            group: "west".into(),
            record: true
        }
    );
    assert_eq!(
        book.placed_rules().await,
        [("east".to_string(), 7), ("west".to_string(), 2)].into()
    );
    // A recorded group is kept, and counted.
    let placed = book
        .place(request("c", Some("east"), 1), &two, || unreachable!())
        .await
        .unwrap();
    assert_eq!(
        placed,
        Placed {
            group: "east".into(),
            record: false
        }
    );
    // A group that serves nothing takes no new Service, even with room.
    let west_down = [group("east", 10, true), group("west", 10, false)];
    let placed = book
        .place(request("d", None, 2), &west_down, || unreachable!())
        .await
        .unwrap();
    assert_eq!(placed.group, "east");
    // east 10 of 10, west 2 of 10: 9 rules fit nowhere; the Service waits.
    let refused = book
        .place(request("e", None, 9), &two, || unreachable!())
        .await
        .unwrap_err();
    assert!(matches!(refused, PlacementError::NoRoom { needed: 9, .. }));
    // A group no loxilb belongs to: a new Service is refused, one served already stays.
    assert!(matches!(
        book.place(request("f", Some("north"), 1), &two, || unreachable!())
            .await,
        Err(PlacementError::UnknownGroup { .. })
    ));
    let served = Request {
        already_ours: true,
        ..request("g", Some("north"), 1)
    };
    assert_eq!(
        book.place(served, &two, || unreachable!()).await.unwrap(),
        Placed {
            group: "north".into(),
            record: false
        }
    );
    // x leaves: its room frees and the waiting Service is handed back, once.
    assert_eq!(book.left(&"x".to_string()).await, vec!["e".to_string()]);
    assert!(book.left(&"b".to_string()).await.is_empty());
    let placed = book
        .place(request("e", None, 9), &two, || unreachable!())
        .await
        .unwrap();
    assert_eq!(placed.group, "west");
}
