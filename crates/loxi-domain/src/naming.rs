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

impl ClusterId {
    /// The id this controller writes into its rule names and restart marker: the cluster's
    /// id for the default controller, `<cluster>.<controller name>` for another one. A
    /// cluster id never contains `.`, so no controller's rules look like another's
    /// (docs/architecture.md#several-controllers-in-one-cluster).
    pub fn for_controller(&self, controller: &ControllerName) -> ClusterId {
        match controller.name() {
            None => self.clone(),
            Some(name) => ClusterId(format!("{}.{name}", self.0)),
        }
    }
}

/// Which loxi-ccm this is when several run in one cluster (one per load-balancer class, or
/// per zone as kube-loxilb is run). Its finalizer, its address claims, its rule names, its
/// status field manager and its default Lease carry the name, so that no controller ever
/// takes another's Services, addresses or rules for its own. The *default* controller (the
/// default class `loxilb.io/loxilb`, or `--controller-name=default`) has no name and keeps
/// the names of earlier releases, so existing clusters upgrade without a change.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ControllerName(Option<String>);

impl ControllerName {
    /// The load-balancer class served by the default controller.
    pub const DEFAULT_CLASS: &'static str = "loxilb.io/loxilb";
    /// What `--controller-name` accepts for the default controller.
    pub const DEFAULT: &'static str = "default";
    const MAX_LEN: usize = 40;

    /// The default controller (no name).
    pub fn default_controller() -> ControllerName {
        ControllerName(None)
    }

    /// A name given by the operator: 1-40 characters of `[a-z0-9-]`, starting and ending
    /// with a letter or digit (it becomes part of a finalizer, a Lease name and rule names);
    /// `default` is the default controller.
    pub fn new(name: &str) -> Result<ControllerName, String> {
        if name == Self::DEFAULT {
            return Ok(ControllerName(None));
        }
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if ok {
            Ok(ControllerName(Some(name.to_string())))
        } else {
            Err(format!(
                "controller name {name:?} must be 1-{} characters of [a-z0-9-], starting and ending with a letter or digit (or {:?})",
                Self::MAX_LEN,
                Self::DEFAULT
            ))
        }
    }

    /// The name a controller serving `class` gets when none is given: none for the default
    /// class; else the class in lower case with every other character turned into `-`
    /// (`example.com/other` -> `example-com-other`), shortened with a hash of the whole class
    /// when longer than 40 characters, so two classes never share a name by truncation.
    pub fn for_class(class: &str) -> ControllerName {
        if class == Self::DEFAULT_CLASS {
            return ControllerName(None);
        }
        let mut name = String::with_capacity(class.len());
        for c in class.chars() {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                name.push(c);
            } else if !name.ends_with('-') {
                name.push('-');
            }
        }
        let name = name.trim_matches('-');
        let hash = || {
            format!(
                "{:08x}",
                crate::selection::fnv1a(&[class.as_bytes()]) as u32
            )
        };
        let name = if name.is_empty() {
            format!("class-{}", hash())
        } else if name.len() > Self::MAX_LEN {
            format!(
                "{}-{}",
                name[..Self::MAX_LEN - 9].trim_end_matches('-'),
                hash()
            )
        } else {
            name.to_string()
        };
        ControllerName(Some(name))
    }

    /// `None` for the default controller.
    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    pub fn is_default(&self) -> bool {
        self.0.is_none()
    }

    /// `base` for the default controller, `base-<name>` for another: finalizers, field
    /// managers and Lease names.
    pub fn suffixed(&self, base: &str) -> String {
        match &self.0 {
            None => base.to_string(),
            Some(name) => format!("{base}-{name}"),
        }
    }

    /// Whether a record that names `recorded` as its controller (absent: the default one,
    /// as every record written before controllers had names) belongs to this controller.
    pub fn owns(&self, recorded: Option<&str>) -> bool {
        self.name() == recorded
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or(Self::DEFAULT))
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
    #[test]
    fn controllers_are_named_after_their_class() {
        assert!(ControllerName::for_class("loxilb.io/loxilb").is_default());
        assert_eq!(
            ControllerName::for_class("example.com/other").name(),
            Some("example-com-other")
        );
        assert_eq!(
            ControllerName::for_class("Example.COM//x_y").name(),
            Some("example-com-x-y")
        );
        let long = "a-very-long-domain.example.com/with-a-very-long-class-name";
        let named = ControllerName::for_class(long);
        let name = named.name().unwrap();
        assert!(name.len() <= 40, "{name}");
        assert!(ControllerName::new(name).is_ok(), "{name}");
        assert_ne!(
            named,
            ControllerName::for_class(
                "a-very-long-domain.example.com/with-a-very-long-class-other"
            ),
            "truncated names differ by the hash"
        );
        assert!(ControllerName::new(ControllerName::for_class("/").name().unwrap()).is_ok());
    }

    #[test]
    fn controller_names_are_checked() {
        assert!(ControllerName::new("default").unwrap().is_default());
        assert_eq!(
            ControllerName::new("zone-a").unwrap().name(),
            Some("zone-a")
        );
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"x".repeat(41)] {
            assert!(ControllerName::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_controller_owns_only_its_rules() {
        let cluster = ClusterId::new("ab12cd34").unwrap();
        let other = cluster.for_controller(&ControllerName::new("other").unwrap());
        assert_eq!(cluster.for_controller(&ControllerName::default()), cluster);
        let theirs = RuleName::new(&other, "default", "web", 80, Protocol::Tcp).to_string();
        assert_eq!(theirs, "ccm-ab12cd34.other_default_web_80_tcp:llb-inst0");
        assert!(RuleName::is_owned_by(&theirs, &other));
        assert!(!RuleName::is_owned_by(&theirs, &cluster));
        let ours = RuleName::new(&cluster, "default", "web", 80, Protocol::Tcp).to_string();
        assert!(!RuleName::is_owned_by(&ours, &other));
        assert_eq!(ControllerName::default().suffixed("loxi-ccm"), "loxi-ccm");
        assert_eq!(
            ControllerName::new("other").unwrap().suffixed("loxi-ccm"),
            "loxi-ccm-other"
        );
        assert!(ControllerName::default().owns(None));
        assert!(!ControllerName::default().owns(Some("other")));
        assert!(ControllerName::new("other").unwrap().owns(Some("other")));
        assert!(!ControllerName::new("other").unwrap().owns(None));
    }
}
