//! Status conditions, as the Kubernetes API conventions keep them, for every kind the
//! controller reports on: Services (`metav1.Condition`), and its own and kube-loxilb's
//! resources — AddressPools (`ipam::address_pools`), Egress (`egress::crds`), the BGP
//! resources (`bgp::crds`) — which all write one [`StatusCondition`]. One rule for all: a
//! condition carries the `metadata.generation` it was written for, and its transition time
//! changes only when its status does.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A condition of one of the controller's status kinds.
pub trait Condition {
    /// How the kind writes times (`metav1.Time`, or RFC 3339 text).
    type Time: Clone;
    /// The condition's type (`Ready`, `loxilb.io/Programmed`, ...).
    fn type_name(&self) -> &str;
    /// `True`, `False` or `Unknown`.
    fn status(&self) -> &str;
    fn transition_time(&self) -> &Self::Time;
    /// Sets the generation the condition was written for and the time its status last changed.
    fn stamp(&mut self, observed_generation: Option<i64>, last_transition_time: Self::Time);
}

/// Stamps the conditions about to be written with the object's `generation`, and keeps the
/// transition time of each whose status is the one it shows (`have`); the others changed
/// `now`.
pub fn stamp_all<C: Condition>(want: &mut [C], have: &[C], generation: Option<i64>, now: &C::Time) {
    for c in want {
        let since = have
            .iter()
            .find(|h| h.type_name() == c.type_name() && h.status() == c.status())
            .map_or_else(|| now.clone(), |h| h.transition_time().clone());
        c.stamp(generation, since);
    }
}

/// A condition, as `metav1.Condition` (its fields, the time as RFC 3339 text).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusCondition {
    /// The condition's type, in CamelCase (`Ready`, `Accepted`, `Programmed`, ...: the
    /// status' `conditions` field lists those of the kind).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, in one CamelCase word (`Valid`, `InvalidSpec`, ...).
    pub reason: String,
    /// Why, for people: the invalid field, each loxilb's error, the conflicting objects.
    #[serde(default)]
    pub message: String,
    /// The `metadata.generation` the condition was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// RFC 3339 time of the last change of `status`.
    #[serde(default)]
    pub last_transition_time: String,
}

impl StatusCondition {
    /// A condition about to be written: [`stamp_all`] gives it its generation and time.
    pub fn new(type_: &str, status: &str, reason: &str, message: String) -> Self {
        StatusCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: None,
            last_transition_time: String::new(),
        }
    }
}

impl Condition for StatusCondition {
    type Time = String;

    fn type_name(&self) -> &str {
        &self.type_
    }

    fn status(&self) -> &str {
        &self.status
    }

    fn transition_time(&self) -> &String {
        &self.last_transition_time
    }

    fn stamp(&mut self, observed_generation: Option<i64>, last_transition_time: String) {
        self.observed_generation = observed_generation;
        self.last_transition_time = last_transition_time;
    }
}

impl Condition for k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    type Time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn type_name(&self) -> &str {
        &self.type_
    }

    fn status(&self) -> &str {
        &self.status
    }

    fn transition_time(&self) -> &Self::Time {
        &self.last_transition_time
    }

    fn stamp(&mut self, observed_generation: Option<i64>, last_transition_time: Self::Time) {
        self.observed_generation = observed_generation;
        self.last_transition_time = last_transition_time;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Plain(&'static str, &'static str, Option<i64>, String);

    impl Condition for Plain {
        type Time = String;
        fn type_name(&self) -> &str {
            self.0
        }
        fn status(&self) -> &str {
            self.1
        }
        fn transition_time(&self) -> &String {
            &self.3
        }
        fn stamp(&mut self, generation: Option<i64>, since: String) {
            self.2 = generation;
            self.3 = since;
        }
    }

    #[test]
    fn a_transition_time_changes_with_the_status_only() {
        let have = [
            Plain("Ready", "True", Some(1), "T1".into()),
            Plain("Exhausted", "False", Some(1), "T1".into()),
        ];
        let mut want = [
            Plain("Ready", "True", None, String::new()),
            Plain("Exhausted", "True", None, String::new()),
            Plain("New", "False", None, String::new()),
        ];
        stamp_all(&mut want, &have, Some(2), &"T2".to_string());
        let got: Vec<(&str, Option<i64>, &str)> =
            want.iter().map(|c| (c.0, c.2, c.3.as_str())).collect();
        assert_eq!(
            got,
            [
                ("Ready", Some(2), "T1"),
                ("Exhausted", Some(2), "T2"),
                ("New", Some(2), "T2")
            ]
        );
    }
}
