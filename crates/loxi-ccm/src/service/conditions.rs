//! The Service's conditions, decided from plain inputs: what the apply to each loxilb
//! instance reported, what the plan left out, what the operator configured. No I/O here.

use loxi_domain::plan::MAX_ENDPOINTS;
use loxilb_client::ClientError;

use super::status::{COND_ENDPOINTS, COND_PROGRAMMED, COND_SOURCE_RANGES, Cond};
use crate::loxilb::{ApplyReport, Blocked, REASON_CAPACITY};

/// What applying a Service's rules met on one loxilb instance.
#[derive(Debug)]
pub enum InstanceResult {
    /// Unreachable (before or during the call): it gets every rule replayed when it is back.
    /// With the TLS refusal's text when its certificate was refused (`ClientError::Tls`).
    Down(Option<String>),
    Applied(ApplyReport),
    /// The apply failed as a whole.
    Failed(ClientError),
}

/// What applying a Service's rules everywhere amounts to.
#[derive(Debug)]
pub struct Programmed {
    pub condition: Cond,
    /// A failure that may pass by itself (a timeout, a 5xx), with where it happened (the
    /// loxilb, and the rule): retried with backoff.
    pub retry: Option<(String, ClientError)>,
    /// Rules created, changed or deleted, and of those, updated in place.
    pub changes: usize,
    pub updated: usize,
    /// Instances that hold every rule, of `total`.
    pub complete: usize,
    pub total: usize,
}

impl Programmed {
    /// Whether this pass is worth a Normal Event: rules appeared, went or were re-created
    /// (not in-place updates: a Node change updates every Service's endpoints, and one
    /// Event each would flood the API server), or the Service became programmed (also when
    /// another path, a drift check or a replay, made the calls first).
    pub fn worth_an_event(&self, shown_programmed: bool) -> bool {
        self.changes > self.updated || (self.condition.ok && !shown_programmed)
    }
}

/// The addresses a Service shows after a pass that applied its rules. Users (and tools such
/// as `kubectl wait`) read an address in the status as "ready", so a new address appears
/// only once the Service's rules are whole on at least one loxilb — kube-loxilb's order too;
/// until then the Service shows only the addresses it already showed and still holds
/// (`kept`), which a slow or unreachable loxilb never takes away
/// (docs/architecture.md#writing-to-a-slow-loxilb).
pub fn addresses_to_show(
    programmed: &Programmed,
    wanted: &[std::net::IpAddr],
    kept: Vec<std::net::IpAddr>,
) -> Vec<std::net::IpAddr> {
    if programmed.complete > 0 {
        wanted.to_vec()
    } else {
        kept
    }
}

/// The `Programmed=False` reason when no loxilb is reachable because TLS was refused.
pub const REASON_TLS: &str = "LoxilbTLSError";

/// Whether a failed call is tried again for the Service (with backoff): what may pass by
/// itself (a timeout, a 5xx), and refused credentials, which are fixed outside the Service
/// (a rotated token reaches the clients without a restart, docs/configuration.md) and so
/// would otherwise leave it unprogrammed until it is next edited.
fn worth_retrying(e: &ClientError) -> bool {
    e.is_retryable() || matches!(e, ClientError::Unauthorized { .. })
}

/// The `Programmed` condition from the results on each instance (`(url, result)` in
/// instance order) for `rules` rules.
///
/// True when every reachable instance holds the rules: reason Programmed, or
/// PartiallyProgrammed naming the unreachable ones. False, in this order of precedence: a
/// loxilb limit (CapacityExceeded first: a user fixes it by freeing room, not by editing the
/// Service; then SourceRangesUnsupported), a refused or failed call (its category), a rule
/// key held by a rule this cluster does not own (RuleConflict), or no instance reachable:
/// LoxilbTLSError when one of them refused TLS (a certificate or CA to fix: "unavailable"
/// would read as an outage to wait out), else LoxilbUnavailable.
pub fn programmed(results: &[(String, InstanceResult)], rules: usize) -> Programmed {
    let total = results.len();
    let mut complete = 0;
    let (mut changes, mut updated) = (0, 0);
    let mut down: Vec<&str> = Vec::new();
    let mut tls: Vec<String> = Vec::new();
    let mut failures: Vec<(String, &ClientError)> = Vec::new();
    let mut blocked: Vec<(&str, &Blocked)> = Vec::new();
    let mut conflicts: Vec<String> = Vec::new();
    for (url, result) in results {
        match result {
            InstanceResult::Down(refusal) => {
                down.push(url);
                if let Some(text) = refusal {
                    tls.push(text.clone());
                }
            }
            InstanceResult::Failed(e) => failures.push((url.clone(), e)),
            InstanceResult::Applied(report) => {
                changes += report.changes;
                updated += report.updated;
                if report.complete() {
                    complete += 1;
                }
                conflicts.extend(
                    report
                        .conflicts
                        .iter()
                        .map(|(k, n)| format!("{k} held by foreign rule {n:?} on {url}")),
                );
                blocked.extend(report.blocked.iter().map(|b| (url.as_str(), b)));
                failures.extend(
                    report
                        .failed
                        .iter()
                        .map(|(k, e)| (format!("{url} ({k})"), e)),
                );
            }
        }
    }
    let retry = failures
        .iter()
        .find(|(_, e)| worth_retrying(e))
        .map(|(url, e)| (url.clone(), (*e).clone()));
    blocked.sort_by_key(|(_, b)| b.reason() != REASON_CAPACITY);
    let condition = if let Some((_, first)) = blocked.first() {
        let text: Vec<String> = blocked
            .iter()
            .map(|(url, b)| format!("{url}: {b}"))
            .collect();
        Cond::new(COND_PROGRAMMED, false, first.reason(), text.join("; "))
    } else if let Some((url, e)) = failures.first() {
        Cond::new(COND_PROGRAMMED, false, e.category(), format!("{url}: {e}"))
    } else if !conflicts.is_empty() {
        Cond::new(COND_PROGRAMMED, false, "RuleConflict", conflicts.join("; "))
    } else if complete == 0 && !tls.is_empty() {
        Cond::new(
            COND_PROGRAMMED,
            false,
            REASON_TLS,
            format!("no loxilb instance is reachable: {}", tls.join("; ")),
        )
    } else if complete == 0 {
        Cond::new(
            COND_PROGRAMMED,
            false,
            "LoxilbUnavailable",
            format!("no loxilb instance is reachable ({})", down.join(", ")),
        )
    } else if !down.is_empty() {
        Cond::new(
            COND_PROGRAMMED,
            true,
            "PartiallyProgrammed",
            format!(
                "{rules} rule(s) on {complete}/{total} instances; unreachable, replayed when back: {}{}",
                down.join(", "),
                if tls.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", tls.join("; "))
                }
            ),
        )
    } else {
        Cond::new(
            COND_PROGRAMMED,
            true,
            "Programmed",
            format!("{rules} rule(s) on {complete}/{total} loxilb instance(s)"),
        )
    };
    Programmed {
        condition,
        retry,
        changes,
        updated,
        complete,
        total,
    }
}

/// loxilb takes at most 32 endpoints per rule: say so when candidates were left out (the
/// subset is stable: rendezvous hashing on the Service).
pub fn endpoints(dropped: usize) -> Cond {
    if dropped > 0 {
        Cond::new(
            COND_ENDPOINTS,
            false,
            "EndpointLimit",
            // No count here: it changes with every Node that comes or goes, and a status write
            // per Service per Node change would load the API server for nothing. The number
            // is in the metric loxi_ccm_endpoints_dropped.
            format!(
                "more candidate endpoints than loxilb takes per rule ({MAX_ENDPOINTS}): a stable subset is used"
            ),
        )
    } else {
        Cond::new(
            COND_ENDPOINTS,
            true,
            "AllEndpoints",
            "every candidate endpoint is used",
        )
    }
}

/// For a Service with source ranges: whether its rules enforce them (`--source-ranges`).
pub fn source_ranges(ranges: &[String], enforced: bool) -> Option<Cond> {
    if ranges.is_empty() {
        return None;
    }
    Some(if enforced {
        Cond::new(
            COND_SOURCE_RANGES,
            true,
            "Enforced",
            format!("loxilb accepts connections only from {}", ranges.join(", ")),
        )
    } else {
        Cond::new(
            COND_SOURCE_RANGES,
            false,
            "SourceRangesIgnored",
            "not enforced: the controller runs with --source-ranges=ignore (loxilb issue \
             #1036), so loxilb accepts connections from every source",
        )
    })
}

/// What the Service is told when it keeps `ip` although its `loxilb.io/poolSelect` names
/// `pool`, which does not hold it (the selection came after the address was taken): in its
/// `loxilb.io/AddressAllocated` condition and one Normal `AddressKept` Event.
pub fn kept_outside_selection(ip: &std::net::IpAddr, pool: &str) -> String {
    format!(
        "{ip} is kept although loxilb.io/poolSelect names pool {}, which does not hold it: a \
         Service keeps the address it has, and the new pool applies only once this address \
         is released",
        loxi_domain::text::shown(pool)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use loxi_domain::{Protocol, RuleKey};

    #[test]
    fn a_kept_address_names_the_selected_pool() {
        let text = kept_outside_selection(&"192.0.2.10".parse().unwrap(), "web");
        assert!(
            text.starts_with("192.0.2.10 is kept although loxilb.io/poolSelect names pool \"web\"")
                && text.ends_with("applies only once this address is released"),
            "{text}"
        );
    }

    fn key() -> RuleKey {
        RuleKey {
            ip: "192.0.2.1".parse().unwrap(),
            port: 80,
            protocol: Protocol::Tcp,
        }
    }

    fn applied(report: ApplyReport) -> InstanceResult {
        InstanceResult::Applied(report)
    }

    fn at(url: &str, r: InstanceResult) -> (String, InstanceResult) {
        (url.to_string(), r)
    }

    #[test]
    fn every_instance_holding_the_rules_is_programmed() {
        let p = programmed(
            &[
                at(
                    "http://a",
                    applied(ApplyReport {
                        changes: 2,
                        ..Default::default()
                    }),
                ),
                at("http://b", applied(ApplyReport::default())),
            ],
            2,
        );
        assert!(p.condition.ok);
        assert_eq!(p.condition.reason, "Programmed");
        assert_eq!(p.condition.message, "2 rule(s) on 2/2 loxilb instance(s)");
        assert_eq!((p.complete, p.total, p.changes), (2, 2, 2));
        assert!(p.retry.is_none());
        assert!(p.worth_an_event(true), "rules appeared");
    }

    #[test]
    fn an_unreachable_instance_makes_it_partial_and_none_reachable_false() {
        let p = programmed(
            &[
                at("http://a", applied(ApplyReport::default())),
                at("http://b", InstanceResult::Down(None)),
            ],
            1,
        );
        assert!(p.condition.ok);
        assert_eq!(p.condition.reason, "PartiallyProgrammed");
        assert!(p.condition.message.contains("http://b"));
        let p = programmed(&[at("http://b", InstanceResult::Down(None))], 1);
        assert!(!p.condition.ok);
        assert_eq!(p.condition.reason, "LoxilbUnavailable");
        assert!(!p.worth_an_event(false));
    }

    #[test]
    fn a_new_address_shows_once_one_loxilb_holds_the_rules() {
        let new: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let old: std::net::IpAddr = "192.0.2.5".parse().unwrap();
        let one_of_two = programmed(
            &[
                at("http://a", applied(ApplyReport::default())),
                at("http://b", InstanceResult::Down(None)),
            ],
            1,
        );
        assert_eq!(addresses_to_show(&one_of_two, &[new], vec![]), [new]);
        let none = programmed(&[at("http://b", InstanceResult::Down(None))], 1);
        assert!(
            addresses_to_show(&none, &[new], vec![]).is_empty(),
            "not before its rules"
        );
        assert_eq!(
            addresses_to_show(&none, &[new], vec![old]),
            [old],
            "what it shows and holds stays while no loxilb answers"
        );
        let no_loxilb = programmed(&[], 1);
        assert!(addresses_to_show(&no_loxilb, &[new], vec![]).is_empty());
    }

    #[test]
    fn a_refused_certificate_is_named_not_an_outage() {
        let refusal = "loxilb at https://b: TLS handshake failed: invalid peer certificate: \
                       UnknownIssuer"
            .to_string();
        let p = programmed(
            &[at("https://b", InstanceResult::Down(Some(refusal.clone())))],
            1,
        );
        assert!(!p.condition.ok);
        assert_eq!(p.condition.reason, REASON_TLS);
        assert!(p.condition.message.contains("UnknownIssuer"), "{p:?}");
        // Another loxilb holds the rules: partial, the message still says why.
        let p = programmed(
            &[
                at("http://a", applied(ApplyReport::default())),
                at("https://b", InstanceResult::Down(Some(refusal))),
            ],
            1,
        );
        assert!(p.condition.ok);
        assert_eq!(p.condition.reason, "PartiallyProgrammed");
        assert!(p.condition.message.contains("UnknownIssuer"), "{p:?}");
    }

    #[test]
    fn capacity_wins_over_failures_and_conflicts() {
        let blocked = ApplyReport {
            blocked: vec![Blocked::Capacity {
                held: 3,
                new: 2,
                capacity: 4,
                refused: false,
            }],
            conflicts: vec![(key(), "other".into())],
            ..Default::default()
        };
        let failed = ApplyReport {
            failed: vec![(
                key(),
                ClientError::Timeout {
                    url: "http://a".into(),
                    timeout_ms: 1,
                },
            )],
            ..Default::default()
        };
        let p = programmed(
            &[
                at("http://a", applied(failed)),
                at("http://b", applied(blocked)),
            ],
            1,
        );
        assert!(!p.condition.ok);
        assert_eq!(p.condition.reason, REASON_CAPACITY);
        assert!(p.retry.is_some(), "the timeout is retried");
    }

    #[test]
    fn refused_credentials_are_reported_and_retried() {
        let report = ApplyReport {
            failed: vec![(
                key(),
                ClientError::Unauthorized {
                    status: 500,
                    message: "invalid token".into(),
                },
            )],
            ..Default::default()
        };
        let p = programmed(&[at("http://a", applied(report))], 1);
        assert!(!p.condition.ok);
        assert_eq!(p.condition.reason, "LoxilbUnauthorized");
        assert!(p.retry.is_some(), "a rotated token must reach the Service");
    }

    #[test]
    fn a_foreign_rule_on_the_key_is_a_conflict() {
        let report = ApplyReport {
            conflicts: vec![(key(), "foreign".into())],
            ..Default::default()
        };
        let p = programmed(&[at("http://a", applied(report))], 1);
        assert_eq!(p.condition.reason, "RuleConflict");
        assert!(p.condition.message.contains("foreign"));
    }

    #[test]
    fn in_place_updates_are_no_event_unless_the_service_becomes_programmed() {
        let report = ApplyReport {
            changes: 2,
            updated: 2,
            ..Default::default()
        };
        let p = programmed(&[at("http://a", applied(report))], 2);
        assert!(!p.worth_an_event(true));
        assert!(p.worth_an_event(false));
    }

    #[test]
    fn endpoint_and_source_range_conditions() {
        assert!(endpoints(0).ok);
        let c = endpoints(3);
        assert!(!c.ok && c.reason == "EndpointLimit");
        assert_eq!(source_ranges(&[], true), None);
        let ranges = ["10.0.0.0/8".to_string()];
        assert!(source_ranges(&ranges, true).unwrap().ok);
        let ignored = source_ranges(&ranges, false).unwrap();
        assert_eq!(ignored.reason, "SourceRangesIgnored");
    }
}
