//! The bare-metal inventory: which rack, site and hardware each Node is, and whether it is
//! retired. The cloud node controller (loxi-ccm `node_init`) turns a matching entry into the
//! well-known topology labels, the way a cloud CCM asks its cloud's API.
//!
//! # Format
//!
//! YAML or JSON, one map with a single key `nodes`, a list of entries:
//!
//! ```yaml
//! nodes:
//!   - match: { name: "rack1-*" }            # glob on the node name
//!     zone: rack1                           # -> topology.kubernetes.io/zone
//!     region: dc-east                       # -> topology.kubernetes.io/region
//!     instanceType: r640                    # -> node.kubernetes.io/instance-type
//!   - match: { cidr: "10.0.2.0/24" }        # any of the node's IPs in this block
//!     zone: rack2
//!     region: dc-east
//!   - match: { name: "old-node-3" }
//!     retired: true                         # -> taint node.cloudprovider.kubernetes.io/shutdown
//! ```
//!
//! * `match` is required and holds `name`, `cidr` or both (then both must hold).
//!   - `name` is a glob over the whole node name: `*` is any run of characters (also none),
//!     `?` exactly one; every other character is literal and must be one a node name can
//!     hold (lowercase letters, digits, `-`, `.`), so a pattern that could never match is
//!     refused instead of silently matching nothing.
//!   - `cidr` is an IPv4 or IPv6 block (`10.0.2.0/24`, `fd00::/64`) or a single address.
//!     Host bits are ignored (`10.0.2.9/24` is `10.0.2.0/24`).
//! * `zone`, `region`, `instanceType`: optional label values (at most 63 characters of
//!   letters, digits, `-`, `_`, `.`, starting and ending alphanumeric). Unquoted integers
//!   (`zone: 3`) are taken as their text; other non-strings are refused.
//! * `retired`: optional boolean, default `false`.
//! * Entries are tried in order; the first match wins (put specific entries first).
//!
//! Unknown keys, wrong types, bad globs, bad CIDRs and bad label values are errors naming the
//! entry's index (0-based) and the field ([`InventoryError::index`], [`InventoryError::field`]):
//! a typo such as `zonee:` must not quietly produce unlabelled nodes.
//!
//! Parsing is split in two so this crate stays free of format crates: the caller deserializes
//! the text (with any serde format) into a [`Document`], a small untyped tree that accepts
//! whatever the text holds, and [`Inventory::from_document`] validates it with precise errors.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use thiserror::Error;

/// A deserialized document before validation: what a YAML/JSON text holds, with no schema.
/// Map keys are kept in order, as text.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Document>),
    Map(Vec<(String, Document)>),
}

impl Document {
    /// What kind of value this is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Document::Null => "null",
            Document::Bool(_) => "a boolean",
            Document::Int(_) => "an integer",
            Document::Float(_) => "a number",
            Document::Str(_) => "a string",
            Document::Seq(_) => "a list",
            Document::Map(_) => "a map",
        }
    }

    fn as_key(&self) -> String {
        match self {
            Document::Str(s) => s.clone(),
            Document::Null => "null".into(),
            Document::Bool(b) => b.to_string(),
            Document::Int(i) => i.to_string(),
            Document::Float(f) => f.to_string(),
            Document::Seq(_) | Document::Map(_) => format!("<{}>", self.kind()),
        }
    }
}

impl<'de> Deserialize<'de> for Document {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML/JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Document, E> {
        Ok(Document::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Document, E> {
        Ok(Document::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Document, D::Error> {
        Document::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Document, E> {
        Ok(Document::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Document, E> {
        Ok(Document::Int(v.into()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Document, E> {
        Ok(Document::Int(v.into()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Document, E> {
        Ok(Document::Int(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Document, E> {
        Ok(Document::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Document, E> {
        Ok(Document::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Document, E> {
        Ok(Document::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Document, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Document>()? {
            items.push(item);
        }
        Ok(Document::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Document, Document>()? {
            entries.push((k.as_key(), v));
        }
        Ok(Document::Map(entries))
    }
}

/// Why a node-name pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GlobError {
    #[error("the pattern is empty")]
    Empty,
    #[error(
        "{ch:?} at position {position} cannot be in a node name (only lowercase letters, digits, \
         '-', '.', and the wildcards '*' and '?')"
    )]
    InvalidChar { ch: char, position: usize },
}

/// A node-name pattern: `*` matches any run of characters, `?` exactly one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: Vec<char>,
    text: String,
}

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if let Some((position, ch)) = pattern.chars().enumerate().find(|(_, c)| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '*' | '?'))
        }) {
            return Err(GlobError::InvalidChar { ch, position });
        }
        Ok(Glob {
            pattern: pattern.chars().collect(),
            text: pattern.to_string(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whole-string match, two-pointer algorithm: on a mismatch after a `*`, the
    /// star absorbs one more character and matching resumes. Worst case is
    /// O(pattern × name), never exponential, whatever the pattern.
    pub fn matches(&self, name: &str) -> bool {
        let p = &self.pattern;
        let s: Vec<char> = name.chars().collect();
        let (mut pi, mut si) = (0, 0);
        // Position of the last `*` seen and the text index it is currently matched up to.
        let mut star: Option<(usize, usize)> = None;
        while si < s.len() {
            if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
                pi += 1;
                si += 1;
            } else if pi < p.len() && p[pi] == '*' {
                star = Some((pi, si));
                pi += 1;
            } else if let Some((sp, ss)) = star {
                pi = sp + 1;
                si = ss + 1;
                star = Some((sp, ss + 1));
            } else {
                return false;
            }
        }
        p[pi..].iter().all(|&c| c == '*')
    }
}

/// How an entry recognizes its Node. At least one of the two is set; both must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub name: Option<Glob>,
    pub cidr: Option<IpNet>,
}

impl Matcher {
    /// `ips` are the Node's known addresses (kubelet-provided and InternalIP).
    pub fn matches(&self, node_name: &str, ips: &[IpAddr]) -> bool {
        self.name.as_ref().is_none_or(|g| g.matches(node_name))
            && self
                .cidr
                .as_ref()
                .is_none_or(|net| ips.iter().any(|ip| net.contains(ip)))
    }
}

/// One validated inventory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub matcher: Matcher,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub instance_type: Option<String>,
    pub retired: bool,
}

/// A validated inventory; entries in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    pub entries: Vec<Entry>,
}

/// An inventory the controller must not act on, naming where the problem is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InventoryError {
    #[error("inventory: the document must be a map with a `nodes` list, found {found}")]
    NotAMap { found: &'static str },
    #[error("inventory: unknown top-level key `{key}` (the only key is `nodes`)")]
    UnknownTopLevelKey { key: String },
    #[error("inventory: `nodes` must be a list, found {found}")]
    NodesNotAList { found: &'static str },
    #[error("inventory entry {index}: must be a map, found {found}")]
    EntryNotAMap { index: usize, found: &'static str },
    #[error("inventory entry {index}: unknown key `{field}`")]
    UnknownField { index: usize, field: String },
    #[error("inventory entry {index}: `{field}` must be {expected}, found {found}")]
    WrongType {
        index: usize,
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("inventory entry {index}: `match` with `name` and/or `cidr` is required")]
    MissingMatch { index: usize },
    #[error("inventory entry {index}: `match.cidr` {value:?} is not an IP block: {reason}")]
    BadCidr {
        index: usize,
        value: String,
        reason: String,
    },
    #[error("inventory entry {index}: `match.name` {pattern:?} is not a valid pattern: {reason}")]
    BadGlob {
        index: usize,
        pattern: String,
        reason: GlobError,
    },
    #[error("inventory entry {index}: `{field}` {value:?} is not a valid label value: {reason}")]
    BadLabelValue {
        index: usize,
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

impl InventoryError {
    /// The 0-based entry the error is about; `None` for document-level errors.
    pub fn index(&self) -> Option<usize> {
        match self {
            InventoryError::NotAMap { .. }
            | InventoryError::UnknownTopLevelKey { .. }
            | InventoryError::NodesNotAList { .. } => None,
            InventoryError::EntryNotAMap { index, .. }
            | InventoryError::UnknownField { index, .. }
            | InventoryError::WrongType { index, .. }
            | InventoryError::MissingMatch { index }
            | InventoryError::BadCidr { index, .. }
            | InventoryError::BadGlob { index, .. }
            | InventoryError::BadLabelValue { index, .. } => Some(*index),
        }
    }

    /// The field (dotted path inside the entry, e.g. `match.cidr`) the error is about.
    pub fn field(&self) -> Option<&str> {
        match self {
            InventoryError::UnknownTopLevelKey { key } => Some(key),
            InventoryError::NodesNotAList { .. } => Some("nodes"),
            InventoryError::UnknownField { field, .. } => Some(field),
            InventoryError::WrongType { field, .. }
            | InventoryError::BadLabelValue { field, .. } => Some(field),
            InventoryError::MissingMatch { .. } => Some("match"),
            InventoryError::BadCidr { .. } => Some("match.cidr"),
            InventoryError::BadGlob { .. } => Some("match.name"),
            InventoryError::NotAMap { .. } | InventoryError::EntryNotAMap { .. } => None,
        }
    }
}

impl Inventory {
    /// Validates a deserialized document. `null` (an empty file) is an empty inventory.
    pub fn from_document(doc: &Document) -> Result<Inventory, InventoryError> {
        let top = match doc {
            Document::Null => return Ok(Inventory::default()),
            Document::Map(m) => m,
            other => {
                return Err(InventoryError::NotAMap {
                    found: other.kind(),
                });
            }
        };
        let mut entries = Vec::new();
        for (key, value) in top {
            if key != "nodes" {
                return Err(InventoryError::UnknownTopLevelKey { key: key.clone() });
            }
            match value {
                Document::Null => {}
                Document::Seq(items) => {
                    for (index, item) in items.iter().enumerate() {
                        entries.push(parse_entry(index, item)?);
                    }
                }
                other => {
                    return Err(InventoryError::NodesNotAList {
                        found: other.kind(),
                    });
                }
            }
        }
        Ok(Inventory { entries })
    }

    /// The first entry matching the Node, with its index.
    pub fn lookup(&self, node_name: &str, ips: &[IpAddr]) -> Option<(usize, &Entry)> {
        self.entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.matcher.matches(node_name, ips))
    }
}

fn parse_entry(index: usize, doc: &Document) -> Result<Entry, InventoryError> {
    let fields = match doc {
        Document::Map(m) => m,
        other => {
            return Err(InventoryError::EntryNotAMap {
                index,
                found: other.kind(),
            });
        }
    };
    let mut matcher = None;
    let mut entry = Entry {
        matcher: Matcher {
            name: None,
            cidr: None,
        },
        zone: None,
        region: None,
        instance_type: None,
        retired: false,
    };
    for (key, value) in fields {
        match key.as_str() {
            "match" => matcher = Some(parse_matcher(index, value)?),
            "zone" => entry.zone = label_value(index, "zone", value)?,
            "region" => entry.region = label_value(index, "region", value)?,
            "instanceType" => entry.instance_type = label_value(index, "instanceType", value)?,
            "retired" => {
                entry.retired = match value {
                    Document::Bool(b) => *b,
                    Document::Null => false,
                    other => {
                        return Err(InventoryError::WrongType {
                            index,
                            field: "retired",
                            expected: "a boolean",
                            found: other.kind(),
                        });
                    }
                }
            }
            _ => {
                return Err(InventoryError::UnknownField {
                    index,
                    field: key.clone(),
                });
            }
        }
    }
    entry.matcher = matcher.ok_or(InventoryError::MissingMatch { index })?;
    Ok(entry)
}

fn parse_matcher(index: usize, doc: &Document) -> Result<Matcher, InventoryError> {
    let fields = match doc {
        Document::Map(m) => m,
        other => {
            return Err(InventoryError::WrongType {
                index,
                field: "match",
                expected: "a map with `name` and/or `cidr`",
                found: other.kind(),
            });
        }
    };
    let mut m = Matcher {
        name: None,
        cidr: None,
    };
    for (key, value) in fields {
        match key.as_str() {
            "name" => {
                let pattern = string_field(index, "match.name", value)?;
                let glob = Glob::new(&pattern).map_err(|reason| InventoryError::BadGlob {
                    index,
                    pattern: pattern.clone(),
                    reason,
                })?;
                m.name = Some(glob);
            }
            "cidr" => {
                let text = string_field(index, "match.cidr", value)?;
                m.cidr = Some(parse_cidr(&text).map_err(|reason| InventoryError::BadCidr {
                    index,
                    value: text.clone(),
                    reason,
                })?);
            }
            _ => {
                return Err(InventoryError::UnknownField {
                    index,
                    field: format!("match.{key}"),
                });
            }
        }
    }
    if m.name.is_none() && m.cidr.is_none() {
        return Err(InventoryError::MissingMatch { index });
    }
    Ok(m)
}

fn string_field(
    index: usize,
    field: &'static str,
    doc: &Document,
) -> Result<String, InventoryError> {
    match doc {
        Document::Str(s) => Ok(s.trim().to_string()),
        other => Err(InventoryError::WrongType {
            index,
            field,
            expected: "a string",
            found: other.kind(),
        }),
    }
}

/// A block, or a single address as a host route (a common way to name one machine).
fn parse_cidr(text: &str) -> Result<IpNet, String> {
    match text.parse::<IpNet>() {
        Ok(net) => Ok(net.trunc()),
        Err(e) => match text.parse::<IpAddr>() {
            Ok(ip) => Ok(IpNet::from(ip)),
            Err(_) => Err(e.to_string()),
        },
    }
}

/// A label value; `null` means absent. Unquoted YAML integers (`zone: 3`) are accepted as their
/// text because that is what the author meant; booleans and floats are not (`zone: no` is a
/// YAML 1.1 boolean, `1.10` would lose its zero), so those ask to be quoted.
fn label_value(
    index: usize,
    field: &'static str,
    doc: &Document,
) -> Result<Option<String>, InventoryError> {
    let value = match doc {
        Document::Null => return Ok(None),
        Document::Str(s) => s.trim().to_string(),
        Document::Int(i) => i.to_string(),
        other => {
            return Err(InventoryError::WrongType {
                index,
                field,
                expected: "a string (quote it)",
                found: other.kind(),
            });
        }
    };
    check_label_value(&value).map_err(|reason| InventoryError::BadLabelValue {
        index,
        field,
        value: value.clone(),
        reason,
    })?;
    Ok(Some(value))
}

/// Kubernetes label value syntax; an empty value is refused here since it would label the
/// Node with an empty zone, which no scheduler rule can use.
pub fn check_label_value(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("it is empty");
    }
    if value.len() > 63 {
        return Err("it is longer than 63 characters");
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("only letters, digits, '-', '_' and '.' are allowed");
    }
    let first = value.chars().next().unwrap_or('-');
    let last = value.chars().last().unwrap_or('-');
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Document {
        Document::Str(v.into())
    }
    fn map(fields: Vec<(&str, Document)>) -> Document {
        Document::Map(fields.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
    fn inv(entries: Vec<Document>) -> Result<Inventory, InventoryError> {
        Inventory::from_document(&map(vec![("nodes", Document::Seq(entries))]))
    }
    fn ip(v: &str) -> IpAddr {
        v.parse().unwrap()
    }

    #[test]
    fn glob_matching() {
        let cases = [
            ("rack1-*", "rack1-a", true),
            ("rack1-*", "rack1-", true),
            ("rack1-*", "rack2-a", false),
            ("rack1-*", "xrack1-a", false),
            ("node-?", "node-1", true),
            ("node-?", "node-12", false),
            ("node-?", "node-", false),
            ("*", "anything", true),
            ("*-gpu-*", "r1-gpu-07", true),
            ("*-gpu-*", "r1-cpu-07", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXcYYb", false),
            ("a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
            ("exact.name", "exact.name", true),
            ("exact.name", "exact-name", false),
            ("**", "", true),
            ("?*", "", false),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(
                Glob::new(pattern).unwrap().matches(name),
                want,
                "{pattern} vs {name}"
            );
        }
    }

    #[test]
    fn glob_refuses_what_cannot_match() {
        assert_eq!(Glob::new(""), Err(GlobError::Empty));
        assert_eq!(
            Glob::new("rack[12]-*"),
            Err(GlobError::InvalidChar {
                ch: '[',
                position: 4
            })
        );
        assert!(matches!(
            Glob::new("Rack1"),
            Err(GlobError::InvalidChar { ch: 'R', .. })
        ));
    }

    #[test]
    fn first_match_wins_by_name_and_cidr() {
        let inv = inv(vec![
            map(vec![
                ("match", map(vec![("name", s("rack1-*"))])),
                ("zone", s("rack1")),
                ("region", s("dc-east")),
                ("instanceType", s("r640")),
            ]),
            map(vec![
                ("match", map(vec![("cidr", s("10.0.2.0/24"))])),
                ("zone", s("rack2")),
            ]),
            map(vec![
                ("match", map(vec![("name", s("old-node-3"))])),
                ("retired", Document::Bool(true)),
            ]),
            map(vec![
                ("match", map(vec![("name", s("*"))])),
                ("zone", s("catch-all")),
            ]),
        ])
        .unwrap();
        let (i, e) = inv.lookup("rack1-a", &[ip("10.0.2.5")]).unwrap();
        assert_eq!((i, e.zone.as_deref()), (0, Some("rack1")));
        assert_eq!(e.instance_type.as_deref(), Some("r640"));
        let (i, e) = inv
            .lookup("other", &[ip("fd00::1"), ip("10.0.2.5")])
            .unwrap();
        assert_eq!(
            (i, e.zone.as_deref(), e.region.as_deref()),
            (1, Some("rack2"), None)
        );
        let (i, e) = inv.lookup("old-node-3", &[]).unwrap();
        assert!(e.retired && i == 2);
        assert_eq!(inv.lookup("zzz", &[ip("10.0.3.1")]).unwrap().0, 3);
    }

    #[test]
    fn both_matchers_must_hold_and_cidr_needs_an_ip() {
        let inv = inv(vec![map(vec![(
            "match",
            map(vec![("name", s("gpu-*")), ("cidr", s("fd00:1::/64"))]),
        )])])
        .unwrap();
        assert!(inv.lookup("gpu-1", &[ip("fd00:1::9")]).is_some());
        assert!(inv.lookup("gpu-1", &[ip("fd00:2::9")]).is_none());
        assert!(inv.lookup("cpu-1", &[ip("fd00:1::9")]).is_none());
        assert!(inv.lookup("gpu-1", &[]).is_none());
    }

    #[test]
    fn single_address_and_host_bits() {
        let inv = inv(vec![
            map(vec![("match", map(vec![("cidr", s("10.0.0.7"))]))]),
            map(vec![("match", map(vec![("cidr", s("10.0.2.9/24"))]))]),
        ])
        .unwrap();
        assert_eq!(inv.lookup("n", &[ip("10.0.0.7")]).unwrap().0, 0);
        assert!(inv.lookup("n", &[ip("10.0.0.8")]).is_none());
        assert_eq!(inv.lookup("n", &[ip("10.0.2.200")]).unwrap().0, 1);
    }

    #[test]
    fn empty_documents() {
        assert_eq!(
            Inventory::from_document(&Document::Null),
            Ok(Inventory::default())
        );
        assert_eq!(
            Inventory::from_document(&map(vec![("nodes", Document::Null)])),
            Ok(Inventory::default())
        );
    }

    #[test]
    fn integer_label_values_are_text() {
        let inv = inv(vec![map(vec![
            ("match", map(vec![("name", s("a"))])),
            ("zone", Document::Int(3)),
            ("region", Document::Null),
        ])])
        .unwrap();
        assert_eq!(inv.entries[0].zone.as_deref(), Some("3"));
        assert_eq!(inv.entries[0].region, None);
    }

    #[test]
    fn errors_name_the_entry_and_field() {
        let good = || map(vec![("match", map(vec![("name", s("a"))]))]);
        let with = |k: &str, v: Document| {
            let Document::Map(mut m) = good() else {
                unreachable!()
            };
            m.push((k.into(), v));
            Document::Map(m)
        };
        type IsKind = fn(&InventoryError) -> bool;
        let cases: Vec<(Document, Option<&str>, IsKind)> = vec![
            (with("zonee", s("x")), Some("zonee"), |e| {
                matches!(e, InventoryError::UnknownField { .. })
            }),
            (
                map(vec![("match", map(vec![("nmae", s("a"))]))]),
                Some("match.nmae"),
                |e| matches!(e, InventoryError::UnknownField { .. }),
            ),
            (
                map(vec![("match", map(vec![("cidr", s("10.0.2.0/33"))]))]),
                Some("match.cidr"),
                |e| matches!(e, InventoryError::BadCidr { .. }),
            ),
            (
                map(vec![("match", map(vec![("cidr", s("rack2"))]))]),
                Some("match.cidr"),
                |e| matches!(e, InventoryError::BadCidr { .. }),
            ),
            (
                map(vec![("match", map(vec![("name", s("rack[1]"))]))]),
                Some("match.name"),
                |e| matches!(e, InventoryError::BadGlob { .. }),
            ),
            (
                map(vec![("match", map(vec![("name", s(""))]))]),
                Some("match.name"),
                |e| {
                    matches!(
                        e,
                        InventoryError::BadGlob {
                            reason: GlobError::Empty,
                            ..
                        }
                    )
                },
            ),
            (map(vec![("zone", s("x"))]), Some("match"), |e| {
                matches!(e, InventoryError::MissingMatch { .. })
            }),
            (map(vec![("match", map(vec![]))]), Some("match"), |e| {
                matches!(e, InventoryError::MissingMatch { .. })
            }),
            (map(vec![("match", s("rack1-*"))]), Some("match"), |e| {
                matches!(e, InventoryError::WrongType { .. })
            }),
            (with("retired", s("yes")), Some("retired"), |e| {
                matches!(e, InventoryError::WrongType { .. })
            }),
            (with("zone", Document::Bool(false)), Some("zone"), |e| {
                matches!(e, InventoryError::WrongType { .. })
            }),
            (with("region", s("dc east")), Some("region"), |e| {
                matches!(e, InventoryError::BadLabelValue { .. })
            }),
            (
                with("instanceType", s(&"x".repeat(64))),
                Some("instanceType"),
                |e| matches!(e, InventoryError::BadLabelValue { .. }),
            ),
            (with("zone", s("")), Some("zone"), |e| {
                matches!(e, InventoryError::BadLabelValue { .. })
            }),
            (s("rack1"), None, |e| {
                matches!(e, InventoryError::EntryNotAMap { .. })
            }),
        ];
        for (bad, field, is_kind) in cases {
            // The bad entry is second, so the index proves it is the one reported.
            let err = inv(vec![good(), bad.clone()]).unwrap_err();
            assert!(is_kind(&err), "{bad:?}: {err:?}");
            assert_eq!(err.index(), Some(1), "{err}");
            assert_eq!(err.field(), field, "{err}");
            assert!(err.to_string().contains("entry 1"), "{err}");
        }
    }

    #[test]
    fn document_level_errors() {
        assert!(matches!(
            Inventory::from_document(&s("nodes")),
            Err(InventoryError::NotAMap { .. })
        ));
        let err =
            Inventory::from_document(&map(vec![("node", Document::Seq(vec![]))])).unwrap_err();
        assert_eq!(err.field(), Some("node"));
        assert_eq!(err.index(), None);
        assert!(matches!(
            Inventory::from_document(&map(vec![("nodes", map(vec![]))])),
            Err(InventoryError::NodesNotAList { found: "a map" })
        ));
    }

    #[test]
    fn label_values() {
        for ok in ["r640", "dc-east", "a", "A_b.c-9", &"x".repeat(63)] {
            assert_eq!(check_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "ä", &"x".repeat(64)] {
            assert!(check_label_value(bad).is_err(), "{bad}");
        }
    }
}
