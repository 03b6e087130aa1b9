//! Writing into a CRD's OpenAPI schema from a `#[schemars(transform = ...)]`: CEL validation
//! rules (`x-kubernetes-validations`) and plain keywords. The schemas of the address
//! resources (`ipam::schema`) and of kube-loxilb's BGP resources (`bgp::schema`) are written
//! with these.

use kube::core::Rule;
use serde_json::{Map, Value};

/// One JSON object of a schema.
pub type Object = Map<String, Value>;

/// A rule and its message. The API server's answer shows the field and its value before it
/// (`spec.addresses[1]: Invalid value: "nope": <message>`).
pub fn rule(expr: impl Into<String>, message: &str) -> Rule {
    Rule::new(expr).message(message)
}

/// Appends `rules` to the `x-kubernetes-validations` of the schema object `at`.
pub fn add(at: &mut Object, rules: impl IntoIterator<Item = Rule>) {
    let list = at
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = list {
        list.extend(
            rules
                .into_iter()
                .filter_map(|r| serde_json::to_value(r).ok()),
        );
    }
}

/// Sets the keyword `key` of the schema object `at` (`maxLength`, `pattern`, `enum`, ...).
pub fn set(at: &mut Object, key: &str, value: impl Into<Value>) {
    at.insert(key.to_string(), value.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_appended_with_their_message() {
        let mut at = Object::new();
        add(&mut at, [rule("self.size() > 0", "must not be empty")]);
        add(&mut at, [rule("self != 'x'", "not x")]);
        set(&mut at, "maxLength", 10);
        let rules = at["x-kubernetes-validations"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["rule"], "self.size() > 0");
        assert_eq!(rules[0]["message"], "must not be empty");
        assert_eq!(at["maxLength"], 10);
    }
}
