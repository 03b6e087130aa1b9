//! Rule names that say who owns a rule.
//!
//! loxilb rule names are free text and not part of a rule's identity
//! (docs/loxilb-api.md#rule-names), so loxi-ccm encodes ownership in them: `ccm-<cluster>_<namespace>_<service>_<port>_<proto>:<instance>`.
//! Namespaces and Service names are DNS labels and cannot contain `_`, so the fields split
//! unambiguously. The part after `:` is the HA instance name, where kube-loxilb and loxilb
//! expect it (default `llb-inst0`). A rule whose name does not parse with *our* cluster id is
//! never touched: two clusters can share one loxilb.

use std::fmt;

use crate::model::Protocol;

/// The loxilb HA instance whose MASTER/BACKUP state governs a VIP (kube-loxilb's default).
pub const DEFAULT_INSTANCE: &str = "llb-inst0";

const PREFIX: &str = "ccm-";

/// A short, stable identifier of one Kubernetes cluster (by default derived from the
/// `kube-system` namespace UID, which never changes for the life of a cluster).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClusterId(String);

impl ClusterId {
    /// Accepts lower-case alphanumerics and `-`, 1 to 32 characters.
    pub fn new(id: &str) -> Result<ClusterId, String> {
        let ok = !id.is_empty()
            && id.len() <= 32
            && id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if ok {
            Ok(ClusterId(id.to_string()))
        } else {
            Err(format!(
                "cluster id {id:?} must be 1-32 characters of [a-z0-9-]"
            ))
        }
    }

    /// Derives an id from a namespace UID: its first 8 hex digits are unique enough to tell
    /// apart the handful of clusters that share one loxilb, and keep names readable.
    pub fn from_uid(uid: &str) -> ClusterId {
        let short: String = uid
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        ClusterId(if short.is_empty() {
            "unknown".into()
        } else {
            short
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The parts of an owned rule's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleName {
    pub cluster: String,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    pub protocol: Protocol,
    pub instance: String,
}

impl RuleName {
    pub fn new(
        cluster: &ClusterId,
        namespace: &str,
        service: &str,
        port: u16,
        protocol: Protocol,
    ) -> RuleName {
        RuleName {
            cluster: cluster.as_str().to_string(),
            namespace: namespace.to_string(),
            service: service.to_string(),
            port,
            protocol,
            instance: DEFAULT_INSTANCE.to_string(),
        }
    }

    /// Parses a name written by [`RuleName`]'s `Display`; `None` for anything else
    /// (kube-loxilb's `ns_svc:inst` names, hand-made rules, other tools).
    pub fn parse(name: &str) -> Option<RuleName> {
        let (main, instance) = name.split_once(':')?;
        let rest = main.strip_prefix(PREFIX)?;
        let mut parts = rest.split('_');
        let cluster = parts.next()?;
        let namespace = parts.next()?;
        let service = parts.next()?;
        let port = parts.next()?.parse().ok()?;
        let protocol = Protocol::parse(parts.next()?)?;
        if parts.next().is_some() || cluster.is_empty() || namespace.is_empty() {
            return None;
        }
        Some(RuleName {
            cluster: cluster.to_string(),
            namespace: namespace.to_string(),
            service: service.to_string(),
            port,
            protocol,
            instance: instance.to_string(),
        })
    }

    /// True when `name` is a rule name written by loxi-ccm for this cluster.
    pub fn is_owned_by(name: &str, cluster: &ClusterId) -> bool {
        RuleName::parse(name).is_some_and(|n| n.cluster == cluster.as_str())
    }
}

impl fmt::Display for RuleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}{}_{}_{}_{}_{}:{}",
            self.cluster,
            self.namespace,
            self.service,
            self.port,
            self.protocol.as_loxilb(),
            self.instance
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_round_trips() {
        let c = ClusterId::new("ab12cd34").unwrap();
        let n = RuleName::new(&c, "default", "web", 80, Protocol::Tcp);
        let s = n.to_string();
        assert_eq!(s, "ccm-ab12cd34_default_web_80_tcp:llb-inst0");
        assert_eq!(RuleName::parse(&s), Some(n));
        assert!(RuleName::is_owned_by(&s, &c));
        assert!(!RuleName::is_owned_by(
            &s,
            &ClusterId::new("other").unwrap()
        ));
    }

    #[test]
    fn foreign_names_are_not_owned() {
        let c = ClusterId::new("ab12cd34").unwrap();
        for foreign in [
            "default_web:llb-inst0",
            "",
            "ccm-ab12cd34_default_web_80_tcp",
            "ccm-ab12cd34_default_web_x_tcp:llb-inst0",
            "ccm-ab12cd34_default_web_80_icmp:llb-inst0",
            "ccm-ab12cd34_default_web_80_tcp_extra:llb-inst0",
        ] {
            assert!(!RuleName::is_owned_by(foreign, &c), "{foreign}");
        }
    }

    #[test]
    fn cluster_id_from_uid() {
        let id = ClusterId::from_uid("3F2504E0-4F89-11D3-9A0C-0305E82C3301");
        assert_eq!(id.as_str(), "3f2504e0");
        assert!(ClusterId::new("Bad_Id").is_err());
    }
}
