//! The Gateway API kinds this controller reads, as minimal typed views of the upstream CRDs
//! (`gateway.networking.k8s.io`, v1 of Gateway API v1.6): only the fields loxi-ccm acts on.
//! Fields not listed are kept by the API server and never written back: the controller
//! writes only `status`, by merge patches that name its own fields.
//!
//! Why not the `gateway-api` crate: docs/gateway-api.md#types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "gateway.networking.k8s.io";

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "GatewayClass",
    status = "ClassStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    pub controller_name: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClassStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    namespaced,
    status = "GatewayStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    #[serde(default)]
    pub hostname: Option<String>,
    pub port: i32,
    pub protocol: String,
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
    /// HTTPS listeners: the certificates (`http`).
    #[serde(default)]
    pub tls: Option<ListenerTls>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default)]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default)]
    pub selector: Option<LabelSelector>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    #[serde(default)]
    pub group: Option<String>,
    pub kind: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    pub value: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub listeners: Vec<ListenerStatus>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    pub name: String,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// What every route kind has: parents and backends (HTTPRoute adds hostnames).
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct L4RouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default)]
    pub rules: Vec<L4RouteRule>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct L4RouteRule {
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
    /// HTTPRoute only: the path matches (`http`); other match fields are not read.
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// A route's backendRef: the object (a Service by default), its port and weight.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    #[serde(flatten)]
    pub object: ObjectReference,
    #[serde(default)]
    pub port: Option<i32>,
    #[serde(default)]
    pub weight: Option<i32>,
}

/// A route's status as read: every parent entry kept as it is, since other controllers'
/// entries must survive our writes (`status.parents` is one list for all controllers).
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    #[serde(default)]
    pub parents: Vec<serde_json::Value>,
}

/// A route kind of the Gateway API's v1 group: the kind's resource type over the spec
/// `$spec` with the fields given, and the shared status [`RouteStatus`].
macro_rules! route_kind {
    ($(#[$meta:meta])* $spec:ident, $kind:tt, { $($fields:tt)* }) => {
        $(#[$meta])*
        #[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default)]
        #[kube(
            group = "gateway.networking.k8s.io",
            version = "v1",
            kind = $kind,
            namespaced,
            status = "RouteStatus",
            schema = "disabled"
        )]
        #[serde(rename_all = "camelCase")]
        pub struct $spec {
            $($fields)*
        }
    };
}

route_kind!(
    /// HTTPRoute: the common parents and backends plus `hostnames` (matches and filters are
    /// not read: loxi-ccm does not program HTTP traffic yet).
    HTTPRouteSpec, "HTTPRoute", {
        #[serde(flatten)]
        pub common: L4RouteSpec,
        #[serde(default)]
        pub hostnames: Vec<String>,
    }
);
route_kind!(TCPRouteSpec, "TCPRoute", {
    #[serde(flatten)]
    pub l4: L4RouteSpec,
});
route_kind!(UDPRouteSpec, "UDPRoute", {
    #[serde(flatten)]
    pub l4: L4RouteSpec,
});

/// Read as v1beta1, the version every v1.x release's standard channel serves (v1.6 serves
/// v1 beside it, stored as v1beta1): older CRDs keep working.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1beta1",
    kind = "ReferenceGrant",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// The status every route kind has, read the same way.
pub trait HasRouteStatus {
    fn route_status(&self) -> Option<&RouteStatus>;
}

macro_rules! route_status {
    ($($kind:ty),*) => {$(
        impl HasRouteStatus for $kind {
            fn route_status(&self) -> Option<&RouteStatus> {
                self.status.as_ref()
            }
        }
    )*};
}
route_status!(TCPRoute, UDPRoute, HTTPRoute);

/// A listener's `tls` (HTTPS): its certificate references.
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub certificate_refs: Vec<ObjectReference>,
}

/// An object named by group, kind, name and namespace: the fields of the spec's
/// `SecretObjectReference` (a listener's certificate, group "" and kind `Secret` by
/// default) and of a `BackendObjectReference` (group "" and kind `Service` by default).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

/// One `matches` entry of an HTTPRoute rule: only its path is read.
#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    #[serde(default)]
    pub path: Option<HttpPathMatch>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// `PathPrefix` (the default), `Exact` or `RegularExpression`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
}
