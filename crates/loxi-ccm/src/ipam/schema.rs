//! What the CRD schemas say beyond the Rust types: what the API server checks when an
//! `AddressPool` or an `AddressClaim` is written (CEL validation rules,
//! `x-kubernetes-validations`, and the bounds they need), and descriptions as prose for
//! `kubectl explain`. Put into the schemas by `#[schemars(transform = ...)]` on the types, so
//! that the CRDs in `deploy/` stay rendered from the code (`ipam::crds`).
//!
//! `kubectl apply` of a bad object answers 422 with the field (`spec.addresses[1]`) and the
//! reason. The rules mirror the controller's own checks (`loxi_domain::pools::validate_pool`,
//! `AddressBlock::parse`, `parse_duration`, `PortProto`), which stay: objects written before
//! the rules existed are still served as they are (and may be edited as long as their flawed
//! fields are left alone or fixed), so the controller checks every pool itself.
//!
//! Left to the controller: blocks of one pool overlapping each other (pools overlapping other
//! pools are allowed and reported in the status).
//!
//! What shapes the rules (Kubernetes 1.31+ for the IP and CIDR functions): CEL in the API
//! server has no `cel.bind` (a one-element list and `all` stand in for a variable); IP
//! addresses cannot be compared with `<` (a range's order is found bit by bit with CIDR
//! containment); and each rule's cost is estimated for the largest input, times the largest
//! list around it, so strings and lists under a rule need bounds (`maxLength`, `maxItems`).
//! Inside a claim's owners, lists the controller does not bound, the checks are OpenAPI
//! `pattern`s and `enum`s instead, which cost nothing.

use kube::core::{Message, Reason, Rule};
use schemars::Schema;
use serde_json::Value;

use crate::k8s::schema::{Object, add, rule, set};

/// At most this many entries in `spec.addresses` (the range rule's cost, times this, must
/// stay within the API server's per-rule budget).
pub const MAX_POOL_BLOCKS: u32 = 64;
/// Longest `spec.addresses` entry: an IPv6 range with embedded IPv4 text and spaces.
pub const MAX_BLOCK_LEN: u32 = 100;

/// A label value: empty, or at most 63 characters, alphanumeric at both ends, `-`, `_`, `.`
/// inside.
const LABEL_VALUE: &str = "^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$";
/// A label key: an optional DNS-subdomain prefix and `/`, then a non-empty label value.
const LABEL_KEY: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// A DNS-1123 label (namespace and Service names).
const DNS_LABEL: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";
/// What `loxi_domain::duration::parse_duration` reads (after trimming): a decimal number and
/// an optional unit.
const DURATION: &str = "^([0-9]+[.]?[0-9]*|[.][0-9]+)(ms|s|m|h)?$";
/// `<port>/<protocol>` as `PortProto` reads it: `u16` text (an optional `+`, leading zeros)
/// and TCP, UDP or SCTP in any case, spaces around.
const PORT_PROTO: &str = r"^\s*[+]?0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])/(?i:tcp|udp|sctp)\s*$";
/// An RFC 3339 time, as the claims' `retainUntil` is written.
const RFC3339: &str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$";

/// The schema of a list's items (`items`) or of a map's values (`additionalProperties`).
fn inner<'a>(schema: &'a mut Schema, key: &str) -> Option<&'a mut Object> {
    schema.get_mut(key).and_then(Value::as_object_mut)
}

/// The order of a range's ends, in CEL. IP addresses cannot be compared with `<`, so: a and b
/// (same family, a != b) first differ at the bit i where a/i still contains b and a/(i+1)
/// does not; a < b when that bit of a is 0, that is when a/(i+1) and a/i have the same
/// network address. `string(i)` has no size bound for the cost estimate, hence the literal
/// list of prefix lengths as strings.
fn range_ordered(start: &str, end: &str) -> String {
    let steps: Vec<String> = (0..128).map(|i| i.to_string()).collect();
    let lengths: Vec<String> = (0..=128).map(|n| format!("'{n}'")).collect();
    let lengths = format!("[{}]", lengths.join(", "));
    format!(
        "!self.contains('-') || [{start}].all(a, [{end}].all(b, \
         !isIP(a) || !isIP(b) || ip(a).family() != ip(b).family() || ip(a) == ip(b) || \
         [{steps}].exists(i, isCIDR(a + '/' + {lengths}[i + 1]) && \
         [cidr(a + '/' + {lengths}[i])].all(lo, [cidr(a + '/' + {lengths}[i + 1])].all(hi, \
         lo.containsIP(b) && !hi.containsIP(b) && hi.masked().ip() == lo.masked().ip())))))",
        steps = steps.join(", "),
    )
}

/// `spec.addresses` of an AddressPool: each entry a CIDR or a range `a-b` of two addresses of
/// one family with a <= b (`AddressBlock::parse`, which also trims spaces).
pub fn pool_addresses(schema: &mut Schema) {
    set(schema.ensure_object(), "minItems", 1);
    set(schema.ensure_object(), "maxItems", MAX_POOL_BLOCKS);
    let start = "self.substring(0, self.indexOf('-')).trim()";
    let end = "self.substring(self.indexOf('-') + 1).trim()";
    let Some(items) = inner(schema, "items") else {
        return;
    };
    set(items, "maxLength", MAX_BLOCK_LEN);
    add(
        items,
        [
            rule(
                "self.contains('-') || isCIDR(self.trim())",
                "neither a CIDR (192.0.2.0/24, 2001:db8::/120) nor a range a-b (192.0.2.10-192.0.2.20); one address is a/32, a/128 or a-a",
            ),
            rule(
                format!("!self.contains('-') || isIP({start})"),
                "the start of the range is not an IP address",
            ),
            rule(
                format!("!self.contains('-') || isIP({end})"),
                "the end of the range is not an IP address",
            ),
            rule(
                format!(
                    "!self.contains('-') || !isIP({start}) || !isIP({end}) || ip({start}).family() == ip({end}).family()"
                ),
                "the start and the end of the range are of different families (IPv4 and IPv6)",
            ),
            rule(
                range_ordered(start, end),
                "the start of the range is after its end",
            ),
        ],
    );
}

/// `spec.retainAddresses` of an AddressPool: what `parse_duration` accepts, blank meaning
/// absent.
pub fn retain_duration(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 64);
    add(
        at,
        [
            rule(
                format!("self.trim() == '' || self.trim().matches('{DURATION}')"),
                "not a duration: a number and an optional unit ms, s, m or h (500ms, 90s, 24h; a bare number is seconds)",
            ),
            rule(
                format!(
                    "!self.trim().matches('{DURATION}') || \
                     double(self.trim().find('^[0-9.]+')) \
                     / (self.trim().endsWith('ms') ? 1000.0 : 1.0) \
                     * (self.trim().endsWith('h') ? 3600.0 : self.trim().endsWith('m') ? 60.0 : 1.0) \
                     < 18446744073709551616.0"
                ),
                "too long a duration",
            ),
        ],
    );
}

/// `key` of a label selector requirement.
pub fn label_key(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 317);
    add(
        at,
        [rule(
            format!(
                "self.matches('{LABEL_KEY}') && (!self.contains('/') || self.indexOf('/') <= 253)"
            ),
            "not a label key: an optional DNS subdomain prefix and /, then at most 63 characters, alphanumeric at both ends, -, _ or . inside",
        )],
    );
}

fn label_value_rule() -> Rule {
    rule(
        format!("self.matches('{LABEL_VALUE}')"),
        "not a label value: at most 63 characters, alphanumeric at both ends, -, _ or . inside",
    )
}

/// `values` of a label selector requirement.
pub fn label_values(schema: &mut Schema) {
    set(schema.ensure_object(), "maxItems", 256);
    if let Some(items) = inner(schema, "items") {
        set(items, "maxLength", 63);
        add(items, [label_value_rule()]);
    }
}

/// `matchExpressions` of a label selector.
pub fn match_expressions(schema: &mut Schema) {
    set(schema.ensure_object(), "maxItems", 64);
}

/// `operator` of a label selector requirement.
pub fn label_operator(schema: &mut Schema) {
    set(
        schema.ensure_object(),
        "enum",
        vec!["In", "NotIn", "Exists", "DoesNotExist"],
    );
}

/// A label selector requirement as a whole: `values` given for `In`/`NotIn` only.
pub fn label_requirement(schema: &mut Schema) {
    add(
        schema.ensure_object(),
        [
            Rule::new(
                "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
            )
            .message(Message::Expression(
                "self.operator + ' needs at least one value'".into(),
            ))
            .field_path(".values")
            .reason(Reason::FieldValueRequired),
            Rule::new(
                "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
            )
            .message(Message::Expression("self.operator + ' takes no values'".into()))
            .field_path(".values")
            .reason(Reason::FieldValueForbidden),
        ],
    );
}

/// `matchLabels` of a label selector: label keys to label values.
pub fn match_labels(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxProperties", 256);
    add(
        at,
        [rule(
            format!(
                "self.all(k, k.matches('{LABEL_KEY}') && (!k.contains('/') || k.indexOf('/') <= 253))"
            ),
            "every key must be a label key: an optional DNS subdomain prefix and /, then at most 63 characters, alphanumeric at both ends, -, _ or . inside",
        )],
    );
    if let Some(values) = inner(schema, "additionalProperties") {
        set(values, "maxLength", 63);
        add(values, [label_value_rule()]);
    }
}

/// `spec.address` of an AddressClaim: an IP address. CEL's `isIP` refuses IPv4-mapped IPv6
/// addresses, which a flag pool may hand out (`::ffff:192.0.2.1`, as Rust writes them), so
/// those are let through too.
pub fn claim_address(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 64);
    add(
        at,
        [rule(
            "isIP(self) || (self.lowerAscii().startsWith('::ffff:') && self.substring(7).matches('^[0-9.]+$') && isIP(self.substring(7)))",
            "not an IP address",
        )],
    );
}

/// `namespace` and `name` of a claim owner. An OpenAPI `pattern`, not a CEL rule: rules inside
/// `sharedWith` would be charged for as many owners as the largest object could hold, and the
/// lists would need bounds the controller does not have.
pub fn dns_label(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 63);
    set(at, "pattern", DNS_LABEL);
}

/// `controller` of a claim: a `--controller-name` (`loxi_domain::ControllerName`).
pub fn controller_name(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 40);
    set(at, "pattern", "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
}

/// `ports` of a claim owner: `80/TCP` entries (a `pattern`, as for `dns_label`).
pub fn owner_ports(schema: &mut Schema) {
    if let Some(items) = inner(schema, "items") {
        set(items, "pattern", PORT_PROTO);
    }
}

/// `role` of a claim owner: `secondary`, `gateway` or absent.
pub fn owner_role(schema: &mut Schema) {
    set(schema.ensure_object(), "enum", vec!["secondary", "gateway"]);
}

/// `spec.retainUntil` of a claim.
pub fn rfc3339(schema: &mut Schema) {
    let at = schema.ensure_object();
    set(at, "maxLength", 64);
    add(
        at,
        [rule(
            format!("self.matches('{RFC3339}')"),
            "not an RFC 3339 time (2030-01-01T00:00:00Z)",
        )],
    );
}

/// Descriptions as prose: the line breaks of doc comments joined, paragraphs kept, everywhere
/// in the schema (given to the types whose schema holds the others inline: the specs and the
/// status), so that `kubectl explain` wraps them itself.
pub fn prose(schema: &mut Schema) {
    fn object(at: &mut Object) {
        if let Some(Value::String(text)) = at.get_mut("description") {
            *text = text
                .split("\n\n")
                .map(|paragraph| paragraph.split('\n').collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n\n");
        }
        at.values_mut().for_each(value);
    }
    fn value(v: &mut Value) {
        match v {
            Value::Object(at) => object(at),
            Value::Array(list) => list.iter_mut().for_each(value),
            _ => {}
        }
    }
    object(schema.ensure_object());
}
