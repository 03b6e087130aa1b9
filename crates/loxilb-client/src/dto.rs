//! Wire types of the loxilb API (docs/loxilb-api.md: Rule fields, Listing rules, HA roles,
//! Liveness).
//!
//! Requests use loxilb's exact key spellings. Responses omit zero values and send `null` for
//! empty arrays, so every field defaults and `null` reads as empty; unknown fields are ignored.

use serde::{Deserialize, Deserializer, Serialize};

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One load-balancer rule, as POSTed and as listed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadbalanceEntry {
    #[serde(rename = "serviceArguments")]
    pub service_arguments: ServiceArguments,
    /// Always sent (loxilb rejects a missing or `null` list).
    #[serde(default, deserialize_with = "null_as_default")]
    pub endpoints: Vec<EndpointEntry>,
    #[serde(
        rename = "secondaryIPs",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub secondary_ips: Vec<SecondaryIp>,
    #[serde(
        rename = "allowedSources",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allowed_sources: Vec<AllowedSource>,
}

/// `serviceArguments`: every field of docs/loxilb-api.md#rule-fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceArguments {
    #[serde(rename = "externalIP")]
    pub external_ip: String,
    pub port: u16,
    #[serde(rename = "portMax")]
    pub port_max: u16,
    /// `tcp`, `udp`, `sctp` or `icmp` (lower-case).
    pub protocol: String,
    /// Endpoint selection 0..=6.
    pub sel: u8,
    /// NAT mode 0..=5.
    pub mode: u8,
    /// 0 plain, 1 HTTPS termination, 2 end-to-end HTTPS.
    pub security: u8,
    pub bgp: bool,
    pub monitor: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub probetype: String,
    pub probeport: u16,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub probereq: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub proberesp: String,
    #[serde(rename = "probeTimeout")]
    pub probe_timeout: u32,
    #[serde(rename = "probeRetries")]
    pub probe_retries: i32,
    #[serde(rename = "inactiveTimeOut")]
    pub inactive_timeout: u32,
    pub block: u32,
    pub managed: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// Must parse as an IP when present, so it is never sent empty.
    #[serde(rename = "privateIP", skip_serializing_if = "String::is_empty")]
    pub private_ip: String,
    /// 0 add/replace, 1 attach endpoints, 2 detach endpoints.
    pub oper: u8,
    pub proxyprotocolv2: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub egress: bool,
    /// Ignored by loxilb on input; only ever read.
    #[serde(skip_serializing)]
    pub snat: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EndpointEntry {
    #[serde(rename = "endpointIP")]
    pub endpoint_ip: String,
    #[serde(rename = "targetPort")]
    pub target_port: u16,
    pub weight: u8,
    /// Output only: `active` or `inactive`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// Output only: `<packets>:<bytes>`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub counter: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondaryIp {
    #[serde(rename = "secondaryIP", default)]
    pub secondary_ip: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AllowedSource {
    #[serde(default)]
    pub prefix: String,
}

/// One cluster instance's HA state (`POST /config/cistate`, `GET /config/cistate/all`,
/// docs/loxilb-api.md#ha-roles).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CiState {
    pub instance: String,
    /// `MASTER`, `BACKUP`, `FAULT`, `STOP` or `NOT_DEFINED`.
    pub state: String,
    /// Always sent (`0.0.0.0` when none): a missing VIP is stored as nil.
    pub vip: String,
}

/// `GET /config/cistate/all`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct CiStateList {
    #[serde(rename = "Attr", default, deserialize_with = "null_as_default")]
    pub states: Vec<CiState>,
}

/// `GET /version`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct VersionInfo {
    pub version: String,
    #[serde(rename = "buildInfo")]
    pub build_info: String,
}

/// Body of every answer that is not a GET payload: `{"result": ...}` on success, plus
/// `code`/`message` on errors (docs/loxilb-api.md#answers-and-errors).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ResultBody {
    pub code: Option<i64>,
    pub message: Option<String>,
    pub result: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_with_nulls_and_omitted_fields_parses() {
        let body = r#"{"lbAttr":[{"serviceArguments":{"externalIP":"192.0.2.1","port":80,
            "protocol":"tcp","inactiveTimeOut":240,"unknownField":1},
            "endpoints":null,"secondaryIPs":null,"allowedSources":null}]}"#;
        let list = crate::listing::parse(body.as_bytes(), Some).unwrap();
        let r = &list.items[0];
        assert_eq!(r.service_arguments.external_ip, "192.0.2.1");
        assert_eq!(r.service_arguments.inactive_timeout, 240);
        assert!(!r.service_arguments.monitor);
        assert!(r.endpoints.is_empty() && r.secondary_ips.is_empty());
        let empty = crate::listing::parse(&br#"{"lbAttr":null}"#[..], Some).unwrap();
        assert!(empty.items.is_empty());
    }

    #[test]
    fn request_uses_exact_spellings_and_omits_empty_strings() {
        let e = LoadbalanceEntry {
            service_arguments: ServiceArguments {
                external_ip: "192.0.2.1".into(),
                port: 80,
                protocol: "tcp".into(),
                ..Default::default()
            },
            endpoints: vec![EndpointEntry {
                endpoint_ip: "10.0.0.1".into(),
                target_port: 30080,
                weight: 1,
                ..Default::default()
            }],
            ..Default::default()
        };
        let v = serde_json::to_value(&e).unwrap();
        let sa = &v["serviceArguments"];
        assert_eq!(sa["externalIP"], "192.0.2.1");
        assert_eq!(sa["inactiveTimeOut"], 0);
        assert!(sa.get("privateIP").is_none());
        assert!(sa.get("snat").is_none());
        assert!(v.get("secondaryIPs").is_none());
        assert_eq!(v["endpoints"][0]["endpointIP"], "10.0.0.1");
        assert!(v["endpoints"][0].get("state").is_none());
    }
}
