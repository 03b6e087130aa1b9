//! Desired vs observed rules -> the smallest set of loxilb calls (docs/loxilb-api.md#updates).
//!
//! Comparison is on [`Rule::observable`]: only what `GET /config/loadbalancer/all` can show
//! (so a rule read back from loxilb, which never lists probe request/response/timeout/retries
//! and lists the effective `inactiveTimeOut`/`monitor`, equals the rule that was POSTed).
//!
//! How a difference is applied:
//! - loxilb's change set (endpoints and weights, `sel`, probe type/port, `proxyprotocolv2`,
//!   `allowedSources`) is updated in place by re-POSTing the whole rule; the other POSTed
//!   fields (`inactiveTimeOut`, probe timeout/retries/payloads) are applied along with it.
//! - `name`, `monitor`, `managed`, `mode` and `secondaryIPs` are never updated in place (or,
//!   for `mode`, not fully): DELETE then POST.
//! - `inactiveTimeOut` is not in loxilb's change set: a re-POST that changes only it is
//!   answered 409 and ignored, so such a difference also needs DELETE then POST.

use std::collections::{HashMap, HashSet};

use crate::model::{Rule, RuleKey};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Not in loxilb: POST it.
    Create(Rule),
    /// In loxilb with a difference loxilb updates in place: POST the whole rule, loxilb keeps
    /// the sessions of unchanged endpoints.
    Update(Rule),
    /// In loxilb with a difference it never applies in place (name, monitor, managed, mode,
    /// secondary IPs, or an idle timeout alone): DELETE, then POST.
    Recreate(Rule),
    /// Owned by us but no longer wanted: DELETE.
    Delete(Rule),
    /// A rule we do not own sits on a key we want: never touched, reported.
    Conflict { wanted: Rule, foreign_name: String },
}

/// Fields loxilb only sets at creation, and the source allow-list: loxilb compares a new
/// list with the stored one the wrong way round, so a change to a list of the same length is
/// answered 409 and never applied (docs/loxilb-api.md#source-ranges).
fn fixed_at_create_differs(have: &Rule, want: &Rule) -> bool {
    have.name != want.name
        || have.monitor != want.monitor
        || have.managed != want.managed
        || have.mode != want.mode
        || have.secondary_ips != want.secondary_ips
        || have.allowed_sources != want.allowed_sources
        || have.bgp != want.bgp
        || have.egress != want.egress
}

/// Fields whose change makes loxilb apply a re-POST (docs/loxilb-api.md#updates), as far as a
/// listing shows them.
fn change_set_differs(have: &Rule, want: &Rule) -> bool {
    have.endpoints != want.endpoints
        || have.selection != want.selection
        || have.probe.kind != want.probe.kind
        || have.probe.port != want.probe.port
        || have.proxy_protocol_v2 != want.proxy_protocol_v2
}

/// Compares `desired` with `observed`. `observed` may hold rules of other Services and of
/// other owners: only rules for which `owned` is true are ever deleted or replaced.
pub fn diff_rules<'a>(
    desired: &[Rule],
    observed: impl IntoIterator<Item = &'a Rule>,
    owned: impl Fn(&Rule) -> bool,
) -> Vec<Action> {
    // References only: in a drift check `observed` is every rule an instance holds.
    let observed: Vec<&Rule> = observed.into_iter().collect();
    let by_key: HashMap<RuleKey, &Rule> = observed.iter().map(|r| (r.key, *r)).collect();
    let mut actions = Vec::new();
    for want in desired {
        let want = want.clone().normalized();
        match by_key.get(&want.key) {
            None => actions.push(Action::Create(want)),
            Some(have) if !owned(have) => actions.push(Action::Conflict {
                foreign_name: have.name.clone(),
                wanted: want,
            }),
            Some(have) => {
                let (h, w) = (have.observable(), want.observable());
                if h == w {
                    continue;
                }
                // Not fixed at create and nothing in the change set differs: the difference
                // is the idle timeout alone, which loxilb ignores on a re-POST.
                let in_place = !fixed_at_create_differs(&h, &w) && change_set_differs(&h, &w);
                actions.push(if in_place {
                    Action::Update(want)
                } else {
                    Action::Recreate(want)
                });
            }
        }
    }
    let wanted: HashSet<RuleKey> = desired.iter().map(|r| r.key).collect();
    for have in observed {
        if owned(have) && !wanted.contains(&have.key) {
            actions.push(Action::Delete((*have).clone()));
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        Endpoint, EndpointSelection, NatMode, Probe, ProbeType, Protocol, default_inactive_timeout,
    };

    fn rule(port: u16, name: &str, eps: &[&str]) -> Rule {
        Rule {
            key: RuleKey {
                ip: "192.0.2.1".parse().unwrap(),
                port,
                protocol: Protocol::Tcp,
            },
            name: name.into(),
            mode: NatMode::Default,
            selection: EndpointSelection::RoundRobin,
            endpoints: eps
                .iter()
                .map(|ip| Endpoint {
                    ip: ip.parse().unwrap(),
                    target_port: 30000,
                    weight: 1,
                })
                .collect(),
            monitor: false,
            managed: true,
            probe: Probe::default(),
            inactive_timeout: 0,
            proxy_protocol_v2: false,
            egress: false,
            allowed_sources: vec![],
            secondary_ips: vec![],
            bgp: false,
            private_ip: None,
        }
    }

    fn ours(r: &Rule) -> bool {
        r.name.starts_with("ccm-")
    }

    #[test]
    fn converged_state_needs_nothing() {
        let d = vec![rule(80, "ccm-a", &["10.0.0.1", "10.0.0.2"])];
        let o = vec![rule(80, "ccm-a", &["10.0.0.2", "10.0.0.1"])];
        assert!(diff_rules(&d, &o, ours).is_empty());
    }

    #[test]
    fn create_update_recreate_delete() {
        let d = vec![
            rule(80, "ccm-a", &["10.0.0.1"]),
            rule(81, "ccm-a", &["10.0.0.3"]),
            rule(82, "ccm-b", &["10.0.0.1"]),
        ];
        let o = vec![
            rule(81, "ccm-a", &["10.0.0.1"]),
            rule(82, "ccm-old", &["10.0.0.1"]),
            rule(83, "ccm-a", &["10.0.0.1"]),
            rule(84, "someone-else", &["10.0.0.9"]),
        ];
        let a = diff_rules(&d, &o, ours);
        assert_eq!(
            a,
            vec![
                Action::Create(d[0].clone()),
                Action::Update(d[1].clone()),
                Action::Recreate(d[2].clone()),
                Action::Delete(o[2].clone()),
            ]
        );
    }

    #[test]
    fn foreign_rule_on_wanted_key_is_a_conflict() {
        let d = vec![rule(80, "ccm-a", &["10.0.0.1"])];
        let o = vec![rule(80, "kube-loxilb-rule", &["10.0.0.1"])];
        assert_eq!(
            diff_rules(&d, &o, ours),
            vec![Action::Conflict {
                wanted: d[0].clone(),
                foreign_name: "kube-loxilb-rule".into()
            }]
        );
    }

    #[test]
    fn listing_shows_effective_values_and_hides_write_only_fields() {
        let mut want = rule(80, "ccm-a", &["10.0.0.1"]);
        want.probe = Probe {
            kind: ProbeType::Tcp,
            port: 8080,
            request: "hello".into(),
            response: "world".into(),
            timeout: 10,
            retries: 3,
        };
        want.allowed_sources = vec!["10.1.2.3/8".parse().unwrap()];
        want.secondary_ips = vec!["192.0.2.9".parse().unwrap()];
        // What GET returns after POSTing `want`.
        let mut listed = want.clone();
        listed.inactive_timeout = 240;
        listed.monitor = true;
        listed.probe = Probe {
            kind: ProbeType::Tcp,
            port: 8080,
            ..Probe::default()
        };
        listed.allowed_sources = vec!["10.0.0.0/8".parse().unwrap()];
        listed.secondary_ips.clear();
        assert!(diff_rules(&[want], &[listed], ours).is_empty());
    }

    #[test]
    fn in_place_fields_update_and_fixed_fields_recreate() {
        let base = rule(80, "ccm-a", &["10.0.0.1"]);
        let update = |f: &dyn Fn(&mut Rule)| {
            let mut w = base.clone();
            f(&mut w);
            diff_rules(std::slice::from_ref(&w), std::slice::from_ref(&base), ours)
        };
        let in_place: [&dyn Fn(&mut Rule); 6] = [
            &|r| r.endpoints[0].weight = 50,
            &|r| r.selection = EndpointSelection::Hash,
            &|r| r.probe.kind = ProbeType::None,
            &|r| r.proxy_protocol_v2 = true,
            &|r| {
                r.endpoints[0].target_port = 8080;
                r.inactive_timeout = 600;
            },
            &|r| {
                r.probe.kind = ProbeType::None;
                r.probe.timeout = 5;
            },
        ];
        for (i, f) in in_place.iter().enumerate() {
            assert!(matches!(update(f)[..], [Action::Update(_)]), "case {i}");
        }
        let recreate: [&dyn Fn(&mut Rule); 9] = [
            // loxilb applies no source-range change of the same length (inverted compare).
            &|r| r.allowed_sources = vec!["10.0.0.0/8".parse().unwrap()],
            &|r| {
                r.allowed_sources = vec!["10.0.0.0/8".parse().unwrap()];
                r.endpoints[0].weight = 50;
            },
            &|r| r.name = "ccm-b".into(),
            &|r| r.monitor = true,
            &|r| r.probe.kind = ProbeType::Ping, // forces monitor, fixed at create
            &|r| r.managed = false,
            &|r| r.mode = NatMode::FullNat,
            // loxilb ignores a re-POST that changes only the idle timeout.
            &|r| r.inactive_timeout = 600,
            // loxilb refuses to change it: "cant modify rule egress mode".
            &|r| r.egress = true,
        ];
        for (i, f) in recreate.iter().enumerate() {
            assert!(matches!(update(f)[..], [Action::Recreate(_)]), "case {i}");
        }
        let mut sctp = base.clone();
        sctp.key.protocol = Protocol::Sctp;
        let mut moved = sctp.clone();
        moved.secondary_ips = vec!["192.0.2.9".parse().unwrap()];
        assert!(matches!(
            diff_rules(&[moved], &[sctp], ours)[..],
            [Action::Recreate(_)]
        ));
        // "0" and the effective default are the same thing.
        let mut explicit = base.clone();
        explicit.inactive_timeout = default_inactive_timeout(Protocol::Tcp);
        assert!(diff_rules(&[explicit], std::slice::from_ref(&base), ours).is_empty());
        // Write-only fields alone are invisible to a listing.
        let mut payload = base.clone();
        payload.probe.request = "x".into();
        payload.probe.retries = 5;
        assert!(diff_rules(&[payload], &[base], ours).is_empty());
    }

    mod prop {
        use std::collections::BTreeMap;
        use std::net::IpAddr;

        use ipnet::IpNet;
        use proptest::collection::vec as vec_of;
        use proptest::prelude::{ProptestConfig, Strategy, any, prop_assert, prop_assert_eq};
        use proptest::proptest;
        use proptest::sample::{select, subsequence};

        use super::*;

        fn key() -> impl Strategy<Value = RuleKey> {
            (
                select(vec!["192.0.2.1", "192.0.2.2"]),
                select(vec![53u16, 80, 443]),
                select(vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]),
            )
                .prop_map(|(ip, port, protocol)| RuleKey {
                    ip: ip.parse().unwrap(),
                    port,
                    protocol,
                })
        }

        fn endpoints() -> impl Strategy<Value = Vec<Endpoint>> {
            vec_of(
                (
                    select(vec!["10.0.0.1", "10.0.0.2", "10.0.0.3"]),
                    select(vec![8080u16, 30080]),
                    select(vec![1u8, 50]),
                ),
                1..4,
            )
            .prop_map(|v| {
                v.into_iter()
                    .map(|(ip, target_port, weight)| Endpoint {
                        ip: ip.parse().unwrap(),
                        target_port,
                        weight,
                    })
                    .collect()
            })
        }

        fn probe() -> impl Strategy<Value = Probe> {
            (
                select(vec![
                    ProbeType::Default,
                    ProbeType::Tcp,
                    ProbeType::Ping,
                    ProbeType::None,
                ]),
                select(vec![8080u16, 9000]),
                select(vec!["", "req"]),
                select(vec![0u32, 10]),
                select(vec![0u32, 3]),
            )
                .prop_map(|(kind, port, request, timeout, retries)| Probe {
                    kind,
                    port: if kind.needs_port() { port } else { 0 },
                    request: request.into(),
                    response: String::new(),
                    timeout,
                    retries,
                })
        }

        fn rule(names: Vec<&'static str>) -> impl Strategy<Value = (RuleKey, Rule)> {
            (
                (
                    key(),
                    select(names),
                    select(vec![NatMode::Default, NatMode::FullNat, NatMode::OneArm]),
                    select(vec![
                        EndpointSelection::RoundRobin,
                        EndpointSelection::Hash,
                        EndpointSelection::Priority,
                    ]),
                    endpoints(),
                    any::<bool>(),
                    any::<bool>(),
                ),
                (
                    probe(),
                    select(vec![0u32, 20, 240, 600]),
                    any::<bool>(),
                    subsequence(vec!["10.0.0.0/8", "192.168.1.7/24"], 0..=2),
                    subsequence(vec!["192.0.2.50", "192.0.2.51"], 0..=2),
                ),
            )
                .prop_map(
                    |(
                        (key, name, mode, selection, endpoints, monitor, managed),
                        (probe, inactive_timeout, proxy, sources, secondary),
                    )| {
                        let rule = Rule {
                            key,
                            name: name.into(),
                            mode,
                            selection,
                            endpoints,
                            monitor,
                            managed,
                            probe,
                            inactive_timeout,
                            proxy_protocol_v2: proxy,
                            egress: false,
                            allowed_sources: sources
                                .iter()
                                .map(|s| s.parse::<IpNet>().unwrap())
                                .collect(),
                            secondary_ips: secondary
                                .iter()
                                .map(|s| s.parse::<IpAddr>().unwrap())
                                .collect(),
                            bgp: false,
                            private_ip: None,
                        };
                        (key, rule)
                    },
                )
        }

        fn rules(names: Vec<&'static str>) -> impl Strategy<Value = Vec<Rule>> {
            // One rule per key, as in loxilb (and as the planner produces).
            vec_of(rule(names), 0..10).prop_map(|v| {
                v.into_iter()
                    .collect::<BTreeMap<RuleKey, Rule>>()
                    .into_values()
                    .collect()
            })
        }

        /// A desired rule close to an observed one: a single field changed (or none), so that
        /// every kind of difference, alone, is exercised.
        fn tweak(observed: &Rule, how: u8) -> Rule {
            let mut r = observed.clone();
            if !ours(&r) {
                r.name = "ccm-a".into(); // ours, on a key a foreign rule holds
            }
            match how % 13 {
                0 => {}
                1 => r.inactive_timeout = if r.inactive_timeout == 600 { 0 } else { 600 },
                2 => r.inactive_timeout = 0,
                3 => r.endpoints[0].weight = r.endpoints[0].weight.wrapping_add(1),
                4 => r.probe.request = format!("{}x", r.probe.request),
                5 => r.probe.timeout += 7,
                6 => {
                    r.mode = if r.mode == NatMode::FullNat {
                        NatMode::Default
                    } else {
                        NatMode::FullNat
                    }
                }
                7 => r.monitor = !r.monitor,
                8 => r.secondary_ips = vec!["192.0.2.99".parse().unwrap()],
                9 => r.allowed_sources.push("172.16.0.0/12".parse().unwrap()),
                10 => {
                    r.probe.kind = ProbeType::None;
                    r.probe.port = 0;
                }
                11 => {
                    r.name = if r.name == "ccm-b" {
                        "ccm-a".into()
                    } else {
                        "ccm-b".into()
                    }
                }
                _ => r.proxy_protocol_v2 = !r.proxy_protocol_v2,
            }
            r
        }

        /// What `GET` shows of a stored rule, written independently of `Rule::observable`.
        fn listed(r: &Rule) -> Rule {
            let mut l = r.clone();
            l.endpoints.sort();
            l.endpoints.dedup();
            l.allowed_sources = r.allowed_sources.iter().map(IpNet::trunc).collect();
            l.allowed_sources.sort();
            l.allowed_sources.dedup();
            if l.inactive_timeout == 0 {
                l.inactive_timeout = match r.key.protocol {
                    Protocol::Udp => 20,
                    _ => 240,
                };
            }
            l.probe.request.clear();
            l.probe.response.clear();
            l.probe.timeout = 0;
            l.probe.retries = 0;
            l.secondary_ips.sort();
            if r.key.protocol != Protocol::Sctp {
                l.secondary_ips.clear();
            }
            l
        }

        /// loxilb's create: `monitor` is forced on by an explicit probe type, once.
        fn create(r: &Rule) -> Rule {
            let mut stored = r.clone();
            stored.monitor = r.monitor || matches!(r.probe.kind, ProbeType::Tcp | ProbeType::Ping);
            stored
        }

        /// loxilb's re-POST of an existing identity (docs/loxilb-api.md#updates): applied only when
        /// something in its change set differs; name/monitor/managed/secondaryIPs never.
        fn repost(stored: &Rule, req: &Rule) -> Rule {
            let norm = |r: &Rule| r.clone().normalized();
            let (s, q) = (norm(stored), norm(req));
            let sec = |r: &Rule| {
                if r.key.protocol == Protocol::Sctp {
                    r.secondary_ips.clone()
                } else {
                    Vec::new()
                }
            };
            if sec(&s) != sec(&q) {
                return stored.clone(); // 500 secIP modify error
            }
            // loxilb's inverted source-list comparison (docs/loxilb-api.md#source-ranges):
            // a length change counts, an equal single prefix counts, a different list of the
            // same length does not, and is never applied.
            let same_length = s.allowed_sources.len() == q.allowed_sources.len();
            let sources_seen_changed = if !same_length {
                true
            } else {
                s.allowed_sources == q.allowed_sources && q.allowed_sources.len() == 1
            };
            let changed = s.endpoints != q.endpoints
                || s.probe.kind != q.probe.kind
                || s.probe.port != q.probe.port
                || s.probe.request != q.probe.request
                || s.probe.response != q.probe.response
                || s.selection != q.selection
                || s.mode != q.mode
                || s.proxy_protocol_v2 != q.proxy_protocol_v2
                || sources_seen_changed;
            if !changed {
                return stored.clone(); // 409 exists
            }
            let allowed_sources = if same_length {
                s.allowed_sources.clone()
            } else {
                q.allowed_sources
            };
            Rule {
                endpoints: q.endpoints,
                selection: q.selection,
                probe: q.probe,
                mode: q.mode,
                proxy_protocol_v2: q.proxy_protocol_v2,
                allowed_sources,
                inactive_timeout: q.inactive_timeout,
                ..s
            }
        }

        /// Applies the actions to loxilb's state. `nat` is loxilb's hidden NAT action, chosen
        /// from `mode` at creation and never re-derived (docs/loxilb-api.md#updates, on `mode`).
        fn apply(
            state: &mut BTreeMap<RuleKey, Rule>,
            nat: &mut BTreeMap<RuleKey, NatMode>,
            actions: &[Action],
        ) {
            for a in actions {
                match a {
                    Action::Create(r) => {
                        assert!(!state.contains_key(&r.key), "create over {:?}", r.key);
                        state.insert(r.key, create(r));
                        nat.insert(r.key, r.mode);
                    }
                    Action::Update(r) => {
                        let stored = state.get(&r.key).expect("update of a missing rule");
                        let new = repost(stored, r);
                        state.insert(r.key, new);
                    }
                    Action::Recreate(r) => {
                        assert!(state.remove(&r.key).is_some(), "recreate of a missing rule");
                        state.insert(r.key, create(r));
                        nat.insert(r.key, r.mode);
                    }
                    Action::Delete(r) => {
                        assert!(ours(r));
                        assert!(state.remove(&r.key).is_some());
                    }
                    Action::Conflict { .. } => {}
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            #[test]
            fn diff_converges_and_is_idempotent(
                fresh in rules(vec!["ccm-a", "ccm-b"]),
                observed in rules(vec!["ccm-a", "ccm-b", "kube-loxilb"]),
                tweaks in vec_of(any::<Option<u8>>(), 10),
                from_listing in any::<bool>(),
            ) {
                // What loxilb holds was created by loxilb's rules.
                let observed: Vec<Rule> = observed.iter().map(create).collect();
                // Desired: tweaked copies of some observed rules, plus fresh ones elsewhere.
                let mut desired: BTreeMap<RuleKey, Rule> = observed
                    .iter()
                    .zip(&tweaks)
                    .filter_map(|(r, t)| t.map(|how| (r.key, tweak(r, how))))
                    .collect();
                for r in fresh {
                    desired.entry(r.key).or_insert(r);
                }
                let desired: Vec<Rule> = desired.into_values().collect();
                // The controller diffs either against a fresh listing or against its cache of
                // what it POSTed: both must work.
                let seen: Vec<Rule> = if from_listing {
                    observed.iter().map(listed).collect()
                } else {
                    observed.clone()
                };
                let mut state: BTreeMap<RuleKey, Rule> =
                    observed.iter().map(|r| (r.key, r.clone())).collect();
                let mut nat: BTreeMap<RuleKey, NatMode> =
                    observed.iter().map(|r| (r.key, r.mode)).collect();
                let actions = diff_rules(&desired, &seen, ours);
                apply(&mut state, &mut nat, &actions);

                // Minimality: a difference only in loxilb's change set is an in-place update
                // (a source-list change, tweak 9, is not: loxilb does not apply it in place).
                for (r, t) in observed.iter().zip(&tweaks) {
                    if let Some(how) = t
                        && ours(r)
                        && [3, 12].contains(&(how % 13))
                    {
                        let on_key: Vec<&Action> = actions
                            .iter()
                            .filter(|a| matches!(a, Action::Update(x) | Action::Recreate(x) if x.key == r.key))
                            .collect();
                        prop_assert!(
                            matches!(on_key[..], [Action::Update(_)]),
                            "tweak {} on {}: {:?}", how % 13, r.key, on_key
                        );
                    }
                }

                let wanted: BTreeMap<RuleKey, &Rule> =
                    desired.iter().map(|r| (r.key, r)).collect();
                for before in &observed {
                    if !ours(before) {
                        // Foreign rules are never touched.
                        prop_assert_eq!(state.get(&before.key), Some(before));
                    } else if !wanted.contains_key(&before.key) {
                        prop_assert!(!state.contains_key(&before.key));
                    }
                }
                for want in &desired {
                    let have = &state[&want.key];
                    if ours(have) {
                        // Listed exactly as a freshly created `want` would be, and really
                        // running in the wanted mode.
                        prop_assert_eq!(listed(have), listed(&create(want)));
                        prop_assert_eq!(nat[&want.key], want.mode);
                    } else {
                        let reported = actions.iter().any(|a| matches!(
                            a, Action::Conflict { wanted, .. } if wanted.key == want.key
                        ));
                        prop_assert!(reported, "conflict on {} not reported", want.key);
                    }
                }
                prop_assert!(state.values().all(|r| !ours(r) || wanted.contains_key(&r.key)));

                // Listing the result and diffing again: nothing left but the conflicts.
                let relisted: Vec<Rule> = state.values().map(listed).collect();
                let again = diff_rules(&desired, &relisted, ours);
                prop_assert!(
                    again.iter().all(|a| matches!(a, Action::Conflict { .. })),
                    "not idempotent: {:?}", again
                );
                let conflicts = |v: &[Action]| {
                    v.iter().filter(|a| matches!(a, Action::Conflict { .. })).count()
                };
                prop_assert_eq!(conflicts(&again), conflicts(&actions));
            }
        }
    }
}
