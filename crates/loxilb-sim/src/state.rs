//! In-memory loxilb state: LB rules (identity, index allocation, update
//! semantics) and cluster-instance (HA) states. Everything here is wiped by a
//! simulated restart (docs/loxilb-api.md#restarts). All methods are synchronous and run
//! under the single state mutex, mirroring loxilb's global config lock.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::bgp::BgpState;
use crate::endpoints::{EpObject, ImplicitEp, Reachability, implicit_key};
use crate::firewall::{FwRequest, FwState, ImplicitSnat};
use crate::validate::{Checked, LbRequest, MAX_ENDPOINTS};

/// Allowed sources can only be installed on rules with internal index <= 28.
const MAX_ALLOWED_SRC_INDEX: u32 = 28;
const DEFAULT_CI_INSTANCE: &str = "llb-inst0";
const CI_STATES: &[&str] = &["MASTER", "BACKUP", "FAULT", "STOP", "NOT_DEFINED"];
/// loxilb's answer to a re-POST that changes nothing (409).
pub(crate) const RULE_EXISTS: &str = "lbrule-exists error";

/// A visible endpoint of a stored rule, as GET shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimEndpoint {
    pub ip: String,
    pub target_port: u16,
    pub weight: u8,
}

/// Snapshot of one stored rule (what loxilb holds, incl. fields GET hides).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimRule {
    pub external_ip: String,
    pub port: u16,
    /// 0 for single-port rules.
    pub port_max: u16,
    pub protocol: String,
    pub block: u32,
    pub host: String,
    pub name: String,
    pub mode: u8,
    pub sel: u8,
    pub security: u8,
    pub bgp: bool,
    /// Effective value (forced on by an active probetype).
    pub monitor: bool,
    pub managed: bool,
    pub egress: bool,
    pub proxyprotocolv2: bool,
    /// Effective value (0 was replaced by the protocol default).
    pub inactive_timeout: u32,
    pub probetype: String,
    pub probeport: u16,
    /// Visible endpoints in stored order.
    pub endpoints: Vec<SimEndpoint>,
    /// Sorted ascending.
    pub secondary_ips: Vec<String>,
    /// Canonical CIDRs.
    pub allowed_sources: Vec<String>,
    /// Internal rule index (1..=max_rules).
    pub index: u32,
    /// `privateIP` as stored at creation. loxilb never returns it over the API; the
    /// simulator shows it here so tests can see what a controller sent.
    pub private_ip: Option<String>,
}

/// Rule identity (docs/loxilb-api.md#rule-identity).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RuleKey {
    pub host: String,
    pub ip: IpAddr,
    pub protocol: String,
    pub port: u16,
    /// Effective range end: 0 is normalized to `port`.
    pub port_max: u16,
    pub block: u32,
}

impl RuleKey {
    pub(crate) fn new(
        host: &str,
        ip: IpAddr,
        protocol: &str,
        port: u16,
        port_max: u16,
        block: u32,
    ) -> Self {
        RuleKey {
            host: host.to_string(),
            ip,
            protocol: protocol.to_string(),
            port,
            port_max: if port_max == 0 { port } else { port_max },
            block,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredEp {
    ip: IpAddr,
    target_port: u16,
    weight: u8,
    /// Removed by an update: kept internally, invisible, no traffic.
    hidden: bool,
}

impl StoredEp {
    fn same(&self, ip: IpAddr, port: u16) -> bool {
        self.ip == ip && self.target_port == port
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct StoredRule {
    index: u32,
    vip: IpAddr,
    port: u16,
    port_max: u16,
    protocol: String,
    block: u32,
    host: String,
    name: String,
    mode: u8,
    sel: u8,
    security: u8,
    bgp: bool,
    monitor: bool,
    managed: bool,
    egress: bool,
    /// loxilb's own SNAT rule behind a `doSnat` firewall rule (docs/loxilb-api.md#firewall).
    snat: bool,
    proxyprotocolv2: bool,
    inactive_timeout: u32,
    probetype: String,
    probeport: u16,
    probereq: String,
    proberesp: String,
    probe_timeout: u32,
    probe_retries: i32,
    /// Kept like loxilb does, never returned by GET (only in [`SimRule`]).
    private_ip: Option<IpAddr>,
    endpoints: Vec<StoredEp>,
    secondary_ips: Vec<IpAddr>,
    allowed_sources: Vec<String>,
}

impl StoredRule {
    fn visible(&self) -> impl Iterator<Item = &StoredEp> {
        self.endpoints.iter().filter(|e| !e.hidden)
    }

    /// `inactive` once loxilb's probes gave up on the endpoint (only with `monitor` on).
    fn endpoint_state(&self, e: &StoredEp, reach: &Reachability, now: Instant) -> &'static str {
        let retries = u64::try_from(self.probe_retries).unwrap_or(0);
        if self.monitor && reach.failed(&e.ip, self.probe_timeout.into(), retries, now) {
            "inactive"
        } else {
            "active"
        }
    }

    /// The probe objects this rule's endpoints stand for (docs/loxilb-api.md#endpoint-health).
    fn implicit_eps(&self) -> impl Iterator<Item = ImplicitEp> + '_ {
        self.visible().map(|e| ImplicitEp {
            key: implicit_key(&e.ip, &self.protocol, e.target_port),
            host: e.ip,
            probe: self.monitor.then(|| {
                let kind = match (self.probetype.as_str(), self.protocol.as_str()) {
                    ("", "icmp") => "ping".to_string(),
                    ("", proto) => proto.to_string(),
                    (kind, _) => kind.to_string(),
                };
                let port = if self.probeport != 0 {
                    self.probeport
                } else {
                    e.target_port
                };
                let retries = u32::try_from(self.probe_retries).unwrap_or(0);
                (kind, port, self.probe_timeout, retries)
            }),
        })
    }

    fn snapshot(&self) -> SimRule {
        SimRule {
            external_ip: self.vip.to_string(),
            port: self.port,
            port_max: self.port_max,
            protocol: self.protocol.clone(),
            block: self.block,
            host: self.host.clone(),
            name: self.name.clone(),
            mode: self.mode,
            sel: self.sel,
            security: self.security,
            bgp: self.bgp,
            monitor: self.monitor,
            managed: self.managed,
            egress: self.egress,
            proxyprotocolv2: self.proxyprotocolv2,
            inactive_timeout: self.inactive_timeout,
            probetype: self.probetype.clone(),
            probeport: self.probeport,
            endpoints: self
                .visible()
                .map(|e| SimEndpoint {
                    ip: e.ip.to_string(),
                    target_port: e.target_port,
                    weight: e.weight,
                })
                .collect(),
            secondary_ips: self.secondary_ips.iter().map(ToString::to_string).collect(),
            allowed_sources: self.allowed_sources.clone(),
            private_ip: self.private_ip.map(|ip| ip.to_string()),
            index: self.index,
        }
    }

    /// `LoadbalanceEntry` as GET returns it: zero values omitted, `null` for
    /// empty arrays, hidden fields never emitted
    /// (docs/loxilb-api.md#listing-rules).
    fn to_api(&self, reach: &Reachability, now: Instant) -> Value {
        let mut sa = Map::new();
        sa.insert("externalIP".into(), json!(self.vip.to_string()));
        sa.insert("port".into(), json!(self.port));
        let mut put = |k: &str, v: Value, present: bool| {
            if present {
                sa.insert(k.into(), v);
            }
        };
        put("portMax", json!(self.port_max), self.port_max != 0);
        put("protocol", json!(self.protocol), !self.protocol.is_empty());
        put("sel", json!(self.sel), self.sel != 0);
        put("mode", json!(self.mode), self.mode != 0);
        put("security", json!(self.security), self.security != 0);
        put("block", json!(self.block), self.block != 0);
        put("bgp", json!(true), self.bgp);
        put("monitor", json!(true), self.monitor);
        put("managed", json!(true), self.managed);
        put(
            "inactiveTimeOut",
            json!(self.inactive_timeout),
            self.inactive_timeout != 0,
        );
        put(
            "probetype",
            json!(self.probetype),
            !self.probetype.is_empty(),
        );
        put("probeport", json!(self.probeport), self.probeport != 0);
        put("name", json!(self.name), !self.name.is_empty());
        put("host", json!(self.host), !self.host.is_empty());
        put("proxyprotocolv2", json!(true), self.proxyprotocolv2);
        put("egress", json!(true), self.egress);
        put("snat", json!(true), self.snat);
        let eps: Vec<Value> = self
            .visible()
            .map(|e| {
                let mut m = Map::new();
                // Required in the schema, hence never omitted (pointer fields).
                m.insert("endpointIP".into(), json!(e.ip.to_string()));
                m.insert("targetPort".into(), json!(e.target_port));
                m.insert("weight".into(), json!(e.weight));
                m.insert("state".into(), json!(self.endpoint_state(e, reach, now)));
                m.insert("counter".into(), json!("0:0"));
                Value::Object(m)
            })
            .collect();
        let null_if_empty = |v: Vec<Value>| {
            if v.is_empty() {
                Value::Null
            } else {
                Value::Array(v)
            }
        };
        json!({
            "serviceArguments": sa,
            "endpoints": null_if_empty(eps),
            "secondaryIPs": null_if_empty(
                self.secondary_ips.iter().map(|ip| json!({"secondaryIP": ip.to_string()})).collect()
            ),
            "allowedSources": null_if_empty(
                self.allowed_sources.iter().map(|p| json!({"prefix": p})).collect()
            ),
        })
    }
}

/// Sorts endpoints the way loxilb stores a new rule's endpoints: by address bytes compared
/// from the last one (for IPv4 the last octet is the most significant; seen on a live
/// loxilb: `[10.0.0.2, 10.0.1.1, 9.255.255.3]` is stored as `[10.0.1.1, 10.0.0.2,
/// 9.255.255.3]`), IPv4 before IPv6. Not numeric order, so that no client can rely on it.
fn sort_by_ip(eps: &mut [StoredEp]) {
    eps.sort_by_key(|e| match e.ip {
        IpAddr::V4(v4) => (0, v4.octets().iter().rev().copied().collect::<Vec<u8>>()),
        IpAddr::V6(v6) => (1, v6.octets().iter().rev().copied().collect::<Vec<u8>>()),
    });
}

fn new_eps(list: &[(IpAddr, u16, u8)]) -> Vec<StoredEp> {
    let mut eps: Vec<StoredEp> = list
        .iter()
        .map(|&(ip, target_port, weight)| StoredEp {
            ip,
            target_port,
            weight,
            hidden: false,
        })
        .collect();
    sort_by_ip(&mut eps);
    eps
}

#[derive(Debug, Clone)]
struct CiEntry {
    state: String,
    /// `None` is Go's nil IP, shown as `"<nil>"`.
    vip: Option<String>,
}

/// Outcome of a successful `POST /config/loadbalancer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostOutcome {
    Created,
    /// `changed: false`: an update that left the rule as it was (docs/loxilb-api.md#updates),
    /// e.g. the re-POST of a rule holding hidden endpoints.
    Updated {
        changed: bool,
    },
    /// Detach removed the last endpoint: the rule is gone.
    Deleted,
}

/// All loxilb state the simulator models.
#[derive(Debug)]
pub(crate) struct SimState {
    max_rules: usize,
    rules: HashMap<RuleKey, StoredRule>,
    /// Next never-used index (ascending allocation from 1).
    next_index: u32,
    /// Freed indexes, reused LIFO.
    free: Vec<u32>,
    ci: HashMap<String, CiEntry>,
    /// Probe objects posted with `POST /config/endpoint`, by key.
    posted_eps: BTreeMap<String, EpObject>,
    /// goBGP's state and loxilb's advertisement counts (docs/loxilb-api.md#bgp).
    pub(crate) bgp: BgpState,
    /// The firewall table (docs/loxilb-api.md#firewall).
    pub(crate) firewall: FwState,
    /// The Kubernetes metadata bodies received (`POST /config/k8smeta`).
    pub(crate) k8s_metadata: crate::k8smeta::K8sMetaLog,
}

impl SimState {
    /// The size of the rule table (loxilb's `max_rules`).
    pub(crate) fn max_rules(&self) -> usize {
        self.max_rules
    }

    pub(crate) fn new(max_rules: usize) -> Self {
        let mut ci = HashMap::new();
        ci.insert(
            DEFAULT_CI_INSTANCE.to_string(),
            CiEntry {
                state: "NOT_DEFINED".into(),
                vip: Some(Ipv4Addr::UNSPECIFIED.to_string()),
            },
        );
        SimState {
            max_rules,
            rules: HashMap::new(),
            next_index: 1,
            free: Vec::new(),
            ci,
            posted_eps: BTreeMap::new(),
            bgp: BgpState::default(),
            firewall: FwState::default(),
            k8s_metadata: crate::k8smeta::K8sMetaLog::default(),
        }
    }

    pub(crate) fn rule_count(&self) -> usize {
        self.rules.len()
    }

    fn alloc_index(&mut self) -> Option<u32> {
        if let Some(i) = self.free.pop() {
            return Some(i);
        }
        let limit = u32::try_from(self.max_rules).unwrap_or(u32::MAX);
        if self.next_index > limit {
            return None;
        }
        let i = self.next_index;
        self.next_index += 1;
        Some(i)
    }

    fn release_index(&mut self, i: u32) {
        self.free.push(i);
    }

    /// Create / update / attach / detach (docs/loxilb-api.md: Creating a rule, Updates).
    pub(crate) fn post_rule(&mut self, r: &LbRequest, c: Checked) -> Result<PostOutcome, String> {
        let key = RuleKey::new(&r.host, c.vip, &r.protocol, r.port, c.port_max, r.block);
        if self.rules.contains_key(&key) {
            return self.update_rule(&key, r, c);
        }
        if r.oper == 2 {
            return Err("lbrule not-exists error".into());
        }
        let Some(index) = self.alloc_index() else {
            return Err("rule-hwm error".into());
        };
        if !c.allowed_sources.is_empty() && index > MAX_ALLOWED_SRC_INDEX {
            self.release_index(index);
            return Err("rule-allowed-src error".into());
        }
        let rule = StoredRule {
            index,
            vip: c.vip,
            port: r.port,
            port_max: c.port_max,
            protocol: r.protocol.clone(),
            block: r.block,
            host: r.host.clone(),
            name: r.name.clone(),
            mode: r.mode,
            sel: r.sel,
            security: r.security,
            bgp: r.bgp,
            monitor: c.monitor,
            managed: r.managed,
            egress: r.egress,
            snat: false,
            proxyprotocolv2: r.proxyprotocolv2,
            inactive_timeout: c.inactive_timeout,
            probetype: r.probetype.clone(),
            probeport: r.probeport,
            probereq: r.probereq.clone(),
            proberesp: r.proberesp.clone(),
            probe_timeout: r.probe_timeout,
            probe_retries: r.probe_retries,
            private_ip: c.private_ip,
            endpoints: new_eps(&c.endpoints),
            secondary_ips: c.secondary_ips,
            allowed_sources: c.allowed_sources,
        };
        self.rules.insert(key, rule);
        Ok(PostOutcome::Created)
    }

    fn update_rule(
        &mut self,
        key: &RuleKey,
        r: &LbRequest,
        c: Checked,
    ) -> Result<PostOutcome, String> {
        let Some(rule) = self.rules.get_mut(key) else {
            return Err("lbrule not-exists error".into());
        };
        if rule.secondary_ips != c.secondary_ips {
            return Err("secIP modify error".into());
        }
        let (eps, eps_changed) = merge_endpoints(&rule.endpoints, &c.endpoints, r.oper);
        let sources = compare_sources(&rule.allowed_sources, &c.allowed_sources);
        let others_changed = rule.probetype != r.probetype
            || rule.probeport != r.probeport
            || rule.probereq != r.probereq
            || rule.proberesp != r.proberesp
            || rule.sel != r.sel
            || rule.mode != r.mode
            || rule.proxyprotocolv2 != r.proxyprotocolv2
            || sources.counts_as_change;
        if !eps_changed && !others_changed {
            return Err(RULE_EXISTS.into());
        }
        if rule.security != r.security {
            return Err("lbrule-exist error: cant modify rule security mode".into());
        }
        if rule.egress != r.egress {
            return Err("lbrule-exist error: cant modify rule egress mode".into());
        }
        if (rule.mode == 4) != (r.mode == 4) {
            return Err("lbrule-exist error: cant modify fullproxy rule mode".into());
        }
        if !c.allowed_sources.is_empty() && rule.index > MAX_ALLOWED_SRC_INDEX {
            return Err("rule-allowed-src error".into());
        }
        let before = rule.clone();
        rule.endpoints = eps;
        rule.probetype = r.probetype.clone();
        rule.probeport = r.probeport;
        rule.probereq = r.probereq.clone();
        rule.proberesp = r.proberesp.clone();
        rule.probe_timeout = r.probe_timeout;
        rule.probe_retries = r.probe_retries;
        rule.sel = r.sel;
        // NAT action is not re-derived by loxilb; only the field changes.
        rule.mode = r.mode;
        rule.proxyprotocolv2 = r.proxyprotocolv2;
        if sources.applied {
            rule.allowed_sources = c.allowed_sources;
        }
        rule.inactive_timeout = c.inactive_timeout;
        if r.oper == 2 && rule.visible().next().is_none() {
            let index = rule.index;
            self.rules.remove(key);
            self.release_index(index);
            return Ok(PostOutcome::Deleted);
        }
        Ok(PostOutcome::Updated {
            changed: *rule != before,
        })
    }

    fn remove_rule(&mut self, key: &RuleKey) -> Option<StoredRule> {
        let rule = self.rules.remove(key)?;
        self.release_index(rule.index);
        Some(rule)
    }

    /// A tuple DELETE: deletes one rule by identity (`no-rule error` when absent). With
    /// `withdraw` (the query's `bgp`, BGP on), that address as written and the removed rule's
    /// secondary addresses lose one advertisement reference, even when nothing matched
    /// (docs/loxilb-api.md#bgp).
    pub(crate) fn delete_tuple(
        &mut self,
        key: &RuleKey,
        withdraw: Option<&str>,
    ) -> Result<(), String> {
        let removed = self.remove_rule(key);
        if let Some(vip) = withdraw {
            let mut ips: Vec<String> = removed
                .iter()
                .flat_map(|r| r.secondary_ips.iter().map(ToString::to_string))
                .collect();
            ips.push(vip.to_string());
            self.bgp.withdraw(ips);
        }
        removed.map(|_| ()).ok_or_else(|| "no-rule error".into())
    }

    /// Removes a rule the way delete by name and delete-all do: with the rule's own `bgp`.
    fn delete_stored(&mut self, key: &RuleKey, bgp_on: bool) {
        if let Some(rule) = self.remove_rule(key)
            && bgp_on
            && rule.bgp
        {
            let ips = rule
                .secondary_ips
                .iter()
                .chain(std::iter::once(&rule.vip))
                .map(ToString::to_string);
            self.bgp.withdraw(ips);
        }
    }

    /// Deletes every rule named exactly `name`; returns how many.
    pub(crate) fn delete_by_name(&mut self, name: &str, bgp_on: bool) -> usize {
        let keys: Vec<RuleKey> = self
            .rules
            .iter()
            .filter(|(_, r)| r.name == name)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            // Errors per rule are ignored by loxilb; removal cannot fail here.
            self.delete_stored(k, bgp_on);
        }
        keys.len()
    }

    pub(crate) fn delete_all(&mut self, bgp_on: bool) {
        let keys: Vec<RuleKey> = self.rules.keys().cloned().collect();
        for k in &keys {
            self.delete_stored(k, bgp_on);
        }
    }

    /// `POST /config/firewall`: the rule, and for `doSnat` the LB rule loxilb makes with it
    /// (`0.0.0.0:0`, protocol `none`, `block` = rule number | 0x1000, named
    /// `snat:<toIP>:<toPort>`, listed with `snat`); no room for that LB rule refuses both.
    pub(crate) fn add_firewall(&mut self, req: &FwRequest, capacity: usize) -> Result<(), String> {
        let Some(snat) = self.firewall.add(req, capacity)? else {
            return Ok(());
        };
        let ImplicitSnat {
            block,
            to_ip,
            to_port,
        } = snat;
        let Some(index) = self.alloc_index() else {
            // Take the firewall rule back: loxilb refuses the whole call.
            let _ = self.firewall.delete(req);
            return Err("rule-snat error".into());
        };
        let vip = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let rule = StoredRule {
            index,
            vip,
            port: 0,
            port_max: 0,
            protocol: "none".into(),
            block,
            host: String::new(),
            name: format!("snat:{to_ip}:{to_port}"),
            mode: 0,
            sel: 0,
            security: 0,
            bgp: false,
            monitor: false,
            managed: false,
            egress: false,
            snat: true,
            proxyprotocolv2: false,
            inactive_timeout: 240,
            probetype: String::new(),
            probeport: 0,
            probereq: String::new(),
            proberesp: String::new(),
            probe_timeout: 0,
            probe_retries: 0,
            private_ip: None,
            endpoints: new_eps(&[(to_ip, to_port, 1)]),
            secondary_ips: Vec::new(),
            allowed_sources: Vec::new(),
        };
        self.rules
            .insert(RuleKey::new("", vip, "none", 0, 0, block), rule);
        Ok(())
    }

    /// `DELETE /config/firewall`: the rule, and the LB rule of a SNAT rule.
    pub(crate) fn delete_firewall(&mut self, req: &FwRequest) -> Result<(), String> {
        if let Some(block) = self.firewall.delete(req)? {
            let vip = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            self.remove_rule(&RuleKey::new("", vip, "none", 0, 0, block));
        }
        Ok(())
    }

    /// The LB rule a packet to `vip:port` (`protocol`) with this mark (`block`) meets:
    /// (name, has an active endpoint, allowed sources). Port-range rules included; host
    /// rules (L7) are not (the model has no host).
    pub(crate) fn lb_lookup(
        &self,
        vip: IpAddr,
        port: u16,
        protocol: &str,
        block: u32,
        reach: &Reachability,
    ) -> Option<(String, bool, Vec<String>)> {
        let now = Instant::now();
        self.rules
            .values()
            .find(|r| {
                r.vip == vip
                    && r.protocol == protocol
                    && r.block == block
                    && r.host.is_empty()
                    && (r.port..=r.port_max.max(r.port)).contains(&port)
            })
            .map(|r| {
                let active = r
                    .visible()
                    .any(|e| r.endpoint_state(e, reach, now) == "active");
                (r.name.clone(), active, r.allowed_sources.clone())
            })
    }

    /// Whether any rule carries `allowedSources` (what triggers loxilb issue #1036).
    pub(crate) fn any_allowed_sources(&self) -> bool {
        self.rules.values().any(|r| !r.allowed_sources.is_empty())
    }

    /// `{"lbAttr":[...]}` in HashMap (i.e. unspecified) order, on purpose.
    pub(crate) fn list_api(&self, reach: &Reachability) -> Value {
        let now = Instant::now();
        let attrs: Vec<Value> = self.rules.values().map(|r| r.to_api(reach, now)).collect();
        json!({ "lbAttr": attrs })
    }

    /// `GET /config/endpoint/all` (docs/loxilb-api.md#endpoint-health).
    pub(crate) fn list_endpoints(&self, reach: &Reachability) -> Value {
        let mut implicit: Vec<ImplicitEp> = self
            .rules
            .values()
            .flat_map(StoredRule::implicit_eps)
            .collect();
        // One object per key: probed when any rule using it monitors it.
        implicit.sort_by_key(|e| e.probe.is_none());
        crate::endpoints::list(&implicit, &self.posted_eps, reach, Instant::now())
    }

    /// `POST /config/endpoint`: an existing key gets the new options.
    pub(crate) fn post_endpoint(&mut self, key: String, object: EpObject) {
        self.posted_eps.insert(key, object);
    }

    /// `DELETE /config/endpoint/epipaddress/{ip}`: a posted object goes; one a rule uses
    /// cannot.
    pub(crate) fn delete_endpoint(&mut self, key: &str) -> Result<(), String> {
        let used = self
            .rules
            .values()
            .flat_map(StoredRule::implicit_eps)
            .any(|e| e.key == key);
        if used {
            return Err("lb rule-referred error".into());
        }
        match self.posted_eps.remove(key) {
            Some(_) => Ok(()),
            None => Err("host-notfound error".into()),
        }
    }

    /// Rules with a visible endpoint at `ip`, counted in place (no copy of the table).
    pub(crate) fn count_with_endpoint(&self, ip: &IpAddr) -> usize {
        self.rules
            .values()
            .filter(|r| r.visible().any(|e| e.ip == *ip))
            .count()
    }

    pub(crate) fn snapshot(&self) -> Vec<SimRule> {
        let mut v: Vec<SimRule> = self.rules.values().map(StoredRule::snapshot).collect();
        v.sort_by_key(|r| r.index);
        v
    }

    /// `POST /config/cistate` (docs/loxilb-api.md#ha-roles).
    pub(crate) fn set_ci(&mut self, instance: &str, state: &str, vip: &str) -> Result<(), String> {
        let instance = if instance.is_empty() {
            // Assumption: an absent instance means the default one.
            DEFAULT_CI_INSTANCE
        } else {
            instance
        };
        // Unknown instances are created first, even if the state is rejected.
        let entry = self
            .ci
            .entry(instance.to_string())
            .or_insert_with(|| CiEntry {
                state: "NOT_DEFINED".into(),
                vip: Some(Ipv4Addr::UNSPECIFIED.to_string()),
            });
        if entry.state == state {
            // Same state: no-op, and the vip is *not* updated.
            return Ok(());
        }
        if !CI_STATES.contains(&state) {
            return Err("invalid cluster-state".into());
        }
        entry.state = state.to_string();
        entry.vip = crate::validate::parse_ip(vip).map(|ip| ip.to_string());
        Ok(())
    }

    pub(crate) fn ci_states(&self) -> Vec<(String, String, String)> {
        let mut v: Vec<(String, String, String)> = self
            .ci
            .iter()
            .map(|(name, e)| {
                let vip = e.vip.clone().unwrap_or_else(|| "<nil>".into());
                (name.clone(), e.state.clone(), vip)
            })
            .collect();
        v.sort();
        v
    }

    pub(crate) fn list_ci(&self) -> Value {
        let attrs: Vec<Value> = self
            .ci
            .iter()
            .map(|(name, e)| {
                json!({
                    "instance": name,
                    "state": e.state,
                    "vip": e.vip.as_deref().unwrap_or("<nil>"),
                    "sync": null,
                })
            })
            .collect();
        json!({ "Attr": attrs })
    }
}

/// How loxilb's re-POST treats the `allowedSources` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SourcesCompared {
    /// Makes the re-POST an update (200) rather than 409 "exists".
    counts_as_change: bool,
    /// The new list replaces the stored one when the update is applied.
    applied: bool,
}

/// loxilb's comparison of a re-POSTed source list with the stored one is inverted (seen on a
/// live loxilb, docs/loxilb-api.md#source-ranges): a change of length counts and is applied;
/// the same single prefix counts as a change (the same list of two or more does not); a
/// different list of the same length does not count, and is not applied even when another
/// field makes the re-POST an update.
fn compare_sources(stored: &[String], requested: &[String]) -> SourcesCompared {
    if stored.len() != requested.len() {
        return SourcesCompared {
            counts_as_change: true,
            applied: true,
        };
    }
    let mut a = stored.to_vec();
    let mut b = requested.to_vec();
    a.sort();
    b.sort();
    SourcesCompared {
        counts_as_change: a == b && requested.len() == 1,
        applied: false,
    }
}

/// Endpoint merge per `oper` (docs/loxilb-api.md#updates). Returns the new internal list and
/// whether anything endpoint-related changed.
fn merge_endpoints(
    stored: &[StoredEp],
    req: &[(IpAddr, u16, u8)],
    oper: u8,
) -> (Vec<StoredEp>, bool) {
    let in_req = |e: &StoredEp| req.iter().find(|&&(ip, p, _)| e.same(ip, p));
    if oper == 2 {
        let changed = stored.iter().any(|e| !e.hidden && in_req(e).is_some());
        let kept = stored
            .iter()
            .filter(|e| in_req(e).is_none())
            .cloned()
            .collect();
        return (kept, changed);
    }
    let mut changed = false;
    let mut out: Vec<StoredEp> = Vec::with_capacity(stored.len() + req.len());
    for e in stored {
        let mut e = e.clone();
        match in_req(&e) {
            Some(&(_, _, w)) => {
                changed |= e.hidden || e.weight != w;
                e.hidden = false;
                e.weight = w;
            }
            // add/replace hides endpoints missing from the request; attach keeps them. Seen
            // on a live loxilb: a hidden endpoint counts as a change on every later re-POST
            // (200, not 409 "exists") until it is added back.
            None if oper == 0 => {
                changed = true;
                e.hidden = true;
            }
            None => {}
        }
        out.push(e);
    }
    let fresh: Vec<(IpAddr, u16, u8)> = req
        .iter()
        .filter(|&&(ip, p, _)| !stored.iter().any(|e| e.same(ip, p)))
        .copied()
        .collect();
    changed |= !fresh.is_empty();
    out.extend(new_eps(&fresh));
    if out.len() > MAX_ENDPOINTS {
        // Internal list overflow: loxilb resets it to the request's list.
        out = new_eps(req);
    }
    (out, changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn index_lifo_reuse() {
        let mut s = SimState::new(3);
        assert_eq!(s.alloc_index(), Some(1));
        assert_eq!(s.alloc_index(), Some(2));
        assert_eq!(s.alloc_index(), Some(3));
        assert_eq!(s.alloc_index(), None);
        s.release_index(1);
        s.release_index(3);
        assert_eq!(s.alloc_index(), Some(3));
        assert_eq!(s.alloc_index(), Some(1));
    }

    #[test]
    fn merge_replace_hides_and_appends() {
        let stored = new_eps(&[(ip("10.0.0.11"), 80, 1), (ip("10.0.0.12"), 80, 1)]);
        let (out, changed) = merge_endpoints(
            &stored,
            &[(ip("10.0.0.13"), 80, 1), (ip("10.0.0.12"), 80, 1)],
            0,
        );
        assert!(changed);
        let visible: Vec<_> = out.iter().filter(|e| !e.hidden).map(|e| e.ip).collect();
        assert_eq!(visible, vec![ip("10.0.0.12"), ip("10.0.0.13")]);
        // The hidden 10.0.0.11 makes every re-POST a change, until it is added back.
        let (out, changed) = merge_endpoints(
            &out,
            &[(ip("10.0.0.13"), 80, 1), (ip("10.0.0.12"), 80, 1)],
            0,
        );
        assert!(changed);
        let all = [
            (ip("10.0.0.13"), 80, 1),
            (ip("10.0.0.12"), 80, 1),
            (ip("10.0.0.11"), 80, 1),
        ];
        let (out, changed) = merge_endpoints(&out, &all, 0);
        assert!(changed, "re-activated");
        let (_, changed) = merge_endpoints(&out, &all, 0);
        assert!(!changed);
    }

    #[test]
    fn new_endpoints_are_stored_last_octet_first() {
        let eps = new_eps(&[
            (ip("10.0.0.2"), 80, 1),
            (ip("10.0.1.1"), 80, 1),
            (ip("9.255.255.3"), 80, 1),
        ]);
        let order: Vec<IpAddr> = eps.iter().map(|e| e.ip).collect();
        assert_eq!(order, [ip("10.0.1.1"), ip("10.0.0.2"), ip("9.255.255.3")]);
    }

    #[test]
    fn source_lists_compare_the_way_loxilb_does() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cmp = |a: &[&str], b: &[&str]| {
            let c = compare_sources(&l(a), &l(b));
            (c.counts_as_change, c.applied)
        };
        let a = "10.0.0.0/8";
        let b = "192.168.0.0/16";
        let c = "172.16.0.0/12";
        assert_eq!(cmp(&[a], &[a]), (true, false), "same single prefix: 200");
        assert_eq!(cmp(&[a, b], &[b, a]), (false, false), "same two: 409");
        assert_eq!(cmp(&[a], &[b]), (false, false), "1 -> 1 other: 409, kept");
        assert_eq!(
            cmp(&[a, b], &[a, c]),
            (false, false),
            "2 -> 2 other: 409, kept"
        );
        assert_eq!(cmp(&[a], &[a, b]), (true, true), "length change: applied");
        assert_eq!(cmp(&[a], &[]), (true, true));
        assert_eq!(cmp(&[], &[]), (false, false));
    }
}
