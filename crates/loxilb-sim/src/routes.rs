//! The loxilb API surface (`/netlox/v1/...`).
//!
//! Routing is done by hand rather than with axum's router so that the
//! go-openapi behaviour is reproduced exactly: per-method route tables
//! (a literal segment beats a parameter), 404/405 in the framework shape with
//! an `Allow` header, and then, in this order, fault injection, auth, the 415
//! content-type check, decoding/validation and finally the handler.

use std::collections::HashMap;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::bgp::BgpOp;
use crate::decode::{GoObj, body_object, parse_body};
use crate::errors::{ApiError, CODE_INVALID_TYPE, DropConnection, ok_json, result_200, success};
use crate::profile::{AwaitsWorker, next_tick};
use crate::state::{PostOutcome, RULE_EXISTS, RuleKey};
use crate::validate::{core_check, decode_lb, parse_ip};
use crate::{API_BASE, AppState, Profile, Shared, admin};

/// Request bodies above this size are rejected (loxilb has no limit, but
/// the simulator must not buffer unbounded input).
const MAX_BODY: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Version,
    LbCreate,
    LbList,
    LbDeleteAll,
    LbDeleteName,
    LbDeleteTuple,
    CiList,
    CiSet,
    EpList,
    EpCreate,
    EpDelete,
    FwCreate,
    FwList,
    FwDelete,
    /// `POST /config/k8smeta` (kube-loxilb's, not in the published spec).
    K8sMeta,
    /// `/config/bgp/...` (403 while BGP is off, loxilb's default).
    Bgp(BgpOp),
}

struct RouteDef {
    method: &'static str,
    pattern: &'static str,
    op: Op,
}

const fn r(method: &'static str, pattern: &'static str, op: Op) -> RouteDef {
    RouteDef {
        method,
        pattern,
        op,
    }
}

/// Every route served under [`API_BASE`] (spellings from swagger.yml).
const ROUTES: &[RouteDef] = &[
    r("GET", "/version", Op::Version),
    r("POST", "/config/loadbalancer", Op::LbCreate),
    r("GET", "/config/loadbalancer/all", Op::LbList),
    r("DELETE", "/config/loadbalancer/all", Op::LbDeleteAll),
    r(
        "DELETE",
        "/config/loadbalancer/name/{lb_name}",
        Op::LbDeleteName,
    ),
    r(
        "DELETE",
        "/config/loadbalancer/externalipaddress/{ip_address}/port/{port}/protocol/{proto}",
        Op::LbDeleteTuple,
    ),
    r(
        "DELETE",
        "/config/loadbalancer/externalipaddress/{ip_address}/port/{port}/portmax/{portmax}/protocol/{proto}",
        Op::LbDeleteTuple,
    ),
    r(
        "DELETE",
        "/config/loadbalancer/hosturl/{hosturl}/externalipaddress/{ip_address}/port/{port}/protocol/{proto}",
        Op::LbDeleteTuple,
    ),
    r(
        "DELETE",
        "/config/loadbalancer/hosturl/{hosturl}/externalipaddress/{ip_address}/port/{port}/portmax/{portmax}/protocol/{proto}",
        Op::LbDeleteTuple,
    ),
    r("GET", "/config/endpoint/all", Op::EpList),
    r("POST", "/config/endpoint", Op::EpCreate),
    r(
        "DELETE",
        "/config/endpoint/epipaddress/{ip_address}",
        Op::EpDelete,
    ),
    r("GET", "/config/firewall/all", Op::FwList),
    r("POST", "/config/firewall", Op::FwCreate),
    r("DELETE", "/config/firewall", Op::FwDelete),
    r("GET", "/config/cistate/all", Op::CiList),
    r("POST", "/config/cistate", Op::CiSet),
    r("GET", "/config/bgp/neigh/all", Op::Bgp(BgpOp::NeighList)),
    r("POST", "/config/bgp/neigh", Op::Bgp(BgpOp::NeighAdd)),
    r(
        "DELETE",
        "/config/bgp/neigh/{ip_address}",
        Op::Bgp(BgpOp::NeighDelete),
    ),
    r(
        "GET",
        "/config/bgp/policy/definedsets/{defineset_type}/{type_name}",
        Op::Bgp(BgpOp::SetGet),
    ),
    r(
        "DELETE",
        "/config/bgp/policy/definedsets/{defineset_type}/{type_name}",
        Op::Bgp(BgpOp::SetDelete),
    ),
    r(
        "POST",
        "/config/bgp/policy/definedsets/{defineset_type}",
        Op::Bgp(BgpOp::SetAdd),
    ),
    r(
        "GET",
        "/config/bgp/policy/definitions/all",
        Op::Bgp(BgpOp::PolicyList),
    ),
    r(
        "POST",
        "/config/bgp/policy/definitions",
        Op::Bgp(BgpOp::PolicyAdd),
    ),
    r(
        "DELETE",
        "/config/bgp/policy/definitions/{policy_name}",
        Op::Bgp(BgpOp::PolicyDelete),
    ),
    r("POST", "/config/bgp/policy/apply", Op::Bgp(BgpOp::ApplyAdd)),
    r(
        "DELETE",
        "/config/bgp/policy/apply",
        Op::Bgp(BgpOp::ApplyDelete),
    ),
    r("POST", "/config/bgp/global", Op::Bgp(BgpOp::Global)),
];

/// Routes loxilb serves that its published swagger.yml does not list (their bodies follow
/// kube-loxilb's models, docs/loxilb-api.md#kubernetes-metadata).
const UNPUBLISHED_ROUTES: &[RouteDef] = &[r("POST", "/config/k8smeta", Op::K8sMeta)];

/// One served API route: HTTP method and path template relative to
/// [`API_BASE`] (swagger spelling, e.g. `/config/loadbalancer/name/{lb_name}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRoute {
    pub method: &'static str,
    pub path: &'static str,
}

/// The API routes the simulator serves.
pub fn api_routes() -> Vec<ApiRoute> {
    ROUTES
        .iter()
        .map(|d| ApiRoute {
            method: d.method,
            path: d.pattern,
        })
        .collect()
}

/// The API routes the simulator serves that loxilb's published spec lacks.
pub fn unpublished_api_routes() -> Vec<ApiRoute> {
    UNPUBLISHED_ROUTES
        .iter()
        .map(|d| ApiRoute {
            method: d.method,
            path: d.pattern,
        })
        .collect()
}

/// The complete HTTP app: admin routes plus the hand-routed API.
pub(crate) fn router(app: AppState) -> Router {
    admin::routes().fallback(api_entry).with_state(app)
}

fn hex(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Percent-decoding of one path segment or query component. Malformed
/// escapes are kept literally.
fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

type Params = HashMap<&'static str, String>;

/// Matches `segs` against a template; returns (number of literal segments, params).
fn match_template(pattern: &'static str, segs: &[String]) -> Option<(usize, Params)> {
    let tpl: Vec<&'static str> = pattern.split('/').skip(1).collect();
    if tpl.len() != segs.len() {
        return None;
    }
    let mut literals = 0;
    let mut params = Params::new();
    for (t, s) in tpl.iter().zip(segs) {
        if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            if s.is_empty() {
                return None;
            }
            params.insert(name, s.clone());
        } else if t == s {
            literals += 1;
        } else {
            return None;
        }
    }
    Some((literals, params))
}

/// Per-method lookup like go-openapi: the best match for the request method,
/// else 405 listing the methods whose tables match the path, else 404.
fn route(method: &Method, rel: &str, full_path: &str) -> Result<(Op, Params), ApiError> {
    let segs: Vec<String> = if rel.starts_with('/') {
        rel.split('/')
            .skip(1)
            .map(|s| percent_decode(s, false))
            .collect()
    } else {
        // "/netlox/v1" itself (kube-loxilb's liveness probe) and "/netlox/v1x".
        return Err(ApiError::not_found_path(full_path));
    };
    let mut best: Option<(usize, Op, Params)> = None;
    let mut allow: Vec<&'static str> = Vec::new();
    for def in ROUTES.iter().chain(UNPUBLISHED_ROUTES) {
        let Some((score, params)) = match_template(def.pattern, &segs) else {
            continue;
        };
        if def.method == method.as_str() {
            if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, def.op, params));
            }
        } else if !allow.contains(&def.method) {
            allow.push(def.method);
        }
    }
    if let Some((_, op, params)) = best {
        return Ok((op, params));
    }
    if allow.is_empty() {
        return Err(ApiError::not_found_path(full_path));
    }
    allow.sort_unstable();
    Err(ApiError::Framework {
        status: 405,
        code: 405,
        message: format!(
            "method {method} is not allowed, but [{}] are",
            allow.join(",")
        ),
        allow: Some(allow.join(", ")),
    })
}

fn check_auth(shared: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = shared.auth_token() else {
        return Ok(());
    };
    match headers.get(header::AUTHORIZATION) {
        None => Err(ApiError::framework(
            401,
            401,
            "unauthenticated for invalid credentials",
        )),
        // Raw token compared verbatim: no "Bearer " prefix
        // (docs/loxilb-api.md#authentication).
        Some(v) if v.as_bytes() == token.as_bytes() => Ok(()),
        Some(_) => Err(ApiError::framework(500, 500, "invalid token")),
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    // go-openapi defaults a missing Content-Type to application/octet-stream.
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream");
    let media = ct.split(';').next().unwrap_or("").trim();
    if media.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::framework(
            415,
            415,
            format!("unsupported media type {ct:?}, only [application/json] are allowed"),
        ))
    }
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in q.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // First value wins, like url.Values.Get.
        out.entry(percent_decode(k, true))
            .or_insert_with(|| percent_decode(v, true));
    }
    out
}

fn invalid_type(name: &str, in_: &str, ty: &str, value: &str) -> ApiError {
    ApiError::framework(
        422,
        CODE_INVALID_TYPE,
        format!("{name} in {in_} must be of type {ty}: {value:?}"),
    )
}

/// go-openapi `type: number` parameter (float64, Go ParseFloat).
fn number_param(name: &str, in_: &str, raw: &str) -> Result<f64, ApiError> {
    raw.parse::<f64>()
        .map_err(|_| invalid_type(name, in_, "number", raw))
}

/// Go `strconv.ParseBool`.
fn bool_param(name: &str, raw: &str) -> Result<bool, ApiError> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(invalid_type(name, "query", "boolean", raw)),
    }
}

/// Go's float64 -> int conversion (amd64 behaviour for sane values).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn go_u16(f: f64) -> u16 {
    (f as i64) as u16
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn go_u32(f: f64) -> u32 {
    (f as i64) as u32
}

async fn api_entry(State(app): State<AppState>, req: Request) -> Response {
    let accepted = Instant::now();
    let shared = &app.shared;
    shared.count_request();
    let mut latency = shared.latency();
    let caller = crate::caller(req.headers());
    if req.method() != Method::GET {
        latency += shared.write_latency();
        shared.count_write(caller.as_deref());
    }
    if req.method() == Method::POST && req.uri().path().ends_with("/config/loadbalancer") {
        shared.count_rule_post();
    }
    let profile = shared.profile();
    if profile.tick().is_none() {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        return serve(shared, profile, req, caller, accepted).await;
    }
    // loxilb's handler goes on when the client gives up waiting (a timeout): the write is
    // still queued and applied, so it must not be cancelled with the connection (nor while
    // its latency is served).
    let shared = app.shared.clone();
    let task = tokio::spawn(async move {
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        serve(&shared, profile, req, caller, accepted).await
    });
    match task.await {
        Ok(resp) => resp,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Handles an API call once its latency is served: waits for the rule lock and the profile's
/// worker where due, logs writes.
async fn serve(
    shared: &Shared,
    profile: Profile,
    req: Request,
    caller: Option<String>,
    accepted: Instant,
) -> Response {
    let rule_write =
        req.method() != Method::GET && req.uri().path().contains("/config/loadbalancer");
    // Rule writes one at a time: each taking the rule write latency when one is set, and
    // every rule POST under a profile with a worker, as loxilb 0.9.8 takes its API lock for
    // them (deletes do not wait, docs/loxilb-api.md#costs-and-versions).
    let rule_latency = shared.rule_write_latency();
    let takes_lock = rule_write
        && (!rule_latency.is_zero() || (profile.tick().is_some() && req.method() == Method::POST));
    let rule_turn = if takes_lock {
        Some(shared.rule_writes.clone().lock_owned().await)
    } else {
        None
    };
    if rule_turn.is_some() && !rule_latency.is_zero() {
        tokio::time::sleep(rule_latency).await;
    }
    let in_flight = rule_write.then(|| shared.costs.rule_write());
    let (parts, body) = req.into_parts();
    let mut resp = match handle(shared, &parts, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    };
    // A create or update holds the lock until the datapath worker's next tick acknowledges it.
    let tick = match profile.tick() {
        Some(period) if resp.extensions().get::<AwaitsWorker>().is_some() => {
            let (n, at) = next_tick(shared.born, period, Instant::now());
            tokio::time::sleep_until(at.into()).await;
            Some(n)
        }
        _ => None,
    };
    drop(in_flight);
    drop(rule_turn);
    // Past loxilb's write timeout the answer can no longer be written: applied, unanswered.
    let done = Instant::now();
    let answered = profile
        .write_timeout()
        .is_none_or(|limit| done - accepted <= limit);
    if !answered {
        resp.extensions_mut().insert(DropConnection);
    }
    if parts.method != Method::GET {
        shared.costs.write_completed(answered);
        let path = parts.uri.path();
        shared.log_write(crate::SimWrite {
            method: parts.method.to_string(),
            path: match parts.uri.query() {
                Some(q) => format!("{}?{q}", path.strip_prefix(API_BASE).unwrap_or(path)),
                None => path.strip_prefix(API_BASE).unwrap_or(path).to_string(),
            },
            status: resp.status().as_u16(),
            rule: resp.extensions().get::<WroteRule>().map(|w| w.0.clone()),
            caller,
            accepted: accepted.saturating_duration_since(shared.born),
            completed: done - shared.born,
            tick,
            answered,
        });
    }
    tracing::debug!(method = %parts.method, path = %parts.uri.path(), status = resp.status().as_u16(), answered, "api call");
    resp
}

async fn handle(shared: &Shared, parts: &Parts, body: Body) -> Result<Response, ApiError> {
    let path = parts.uri.path();
    let rel = path
        .strip_prefix(API_BASE)
        .ok_or_else(|| ApiError::not_found_path(path))?;
    let (op, params) = route(&parts.method, rel, path)?;
    if let Some(status) = shared.injected_fault(parts.method != Method::GET) {
        return Err(ApiError::Injected(status));
    }
    if op != Op::Version {
        check_auth(shared, &parts.headers)?;
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(ApiError::parse)?;
    if !bytes.is_empty() {
        check_content_type(&parts.headers)?;
    }
    let query = parse_query(parts.uri.query());
    if shared.cfg.bgp_only && !matches!(op, Op::Version | Op::Bgp(_)) {
        // A BGP-peer-only loxilb refuses everything but BGP (docs/loxilb-api.md#bgp-peer-only-mode).
        return Err(ApiError::handler("running in bgp only mode"));
    }
    match op {
        Op::Version => Ok(ok_json(json!({
            "version": shared.cfg.version,
            "buildInfo": "loxilb-sim",
        }))),
        Op::LbCreate => {
            // The rule it writes, for the write log, also when the write is refused (an
            // identical re-POST costs loxilb a turn of its lock too).
            let rule = crate::validate::decode_lb(&bytes)
                .ok()
                .map(|r| format!("{}:{}/{}", r.external_ip, r.port, r.protocol));
            let mut resp = lb_create(shared, &bytes).unwrap_or_else(IntoResponse::into_response);
            if let Some(rule) = rule {
                resp.extensions_mut().insert(WroteRule(rule));
            }
            Ok(resp)
        }
        Op::LbList => {
            shared.costs.listing();
            let reach = shared.reachability();
            Ok(ok_json(shared.state().list_api(&reach)))
        }
        Op::EpList => {
            let reach = shared.reachability();
            Ok(ok_json(shared.state().list_endpoints(&reach)))
        }
        Op::EpCreate => {
            let (key, object) = crate::endpoints::decode_post(&bytes)?;
            shared.state().post_endpoint(key, object);
            Ok(success())
        }
        Op::EpDelete => ep_delete(shared, &params, &query),
        Op::LbDeleteAll => {
            shared.state().delete_all(shared.bgp_enabled());
            Ok(success())
        }
        Op::LbDeleteName => {
            let name = params.get("lb_name").map_or("", String::as_str);
            shared.state().delete_by_name(name, shared.bgp_enabled());
            Ok(success())
        }
        Op::LbDeleteTuple => lb_delete_tuple(shared, &params, &query),
        Op::FwList => Ok(ok_json(shared.state().firewall.list_api())),
        Op::FwCreate => {
            let req = crate::firewall::decode_post(&bytes)?;
            shared
                .state()
                .add_firewall(&req, shared.firewall_capacity())
                .map_err(ApiError::Handler)?;
            Ok(success())
        }
        Op::FwDelete => fw_delete(shared, &query),
        Op::K8sMeta => {
            let body = crate::k8smeta::decode_post(&bytes)?;
            shared.state().k8s_metadata.record(body);
            Ok(success())
        }
        Op::CiList => Ok(ok_json(shared.state().list_ci())),
        Op::CiSet => ci_set(shared, &bytes),
        Op::Bgp(op) => crate::bgp::handle(shared, op, &params, &query, &bytes),
    }
}

/// Marks the answer to a rule POST with the rule it wrote (`ip:port/protocol`), for
/// [`crate::SimWrite::rule`].
#[derive(Debug, Clone)]
struct WroteRule(String);

fn lb_create(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let req = decode_lb(bytes)?;
    if let Some(text) = req.dsr_quirk() {
        return Ok(result_200(text));
    }
    let checked = core_check(&req).map_err(ApiError::Handler)?;
    let mut state = shared.state();
    let outcome = state.post_rule(&req, checked).map_err(|e| {
        if e == RULE_EXISTS {
            shared.costs.identical_repost();
        }
        ApiError::Handler(e)
    })?;
    if outcome == (PostOutcome::Updated { changed: false }) {
        shared.costs.noop_update();
    }
    // Every 200 of a rule with `bgp` (creation or update) adds a reference to its addresses,
    // as written in the request (docs/loxilb-api.md#bgp); nothing is counted with BGP off.
    if req.bgp && shared.bgp_enabled() {
        let ips = std::iter::once(req.external_ip.clone()).chain(req.secondary_ips.clone());
        state.bgp.advertise(ips);
    }
    drop(state);
    tracing::debug!(?outcome, vip = %req.external_ip, port = req.port, proto = %req.protocol, "lb rule");
    let mut resp = success();
    resp.extensions_mut().insert(AwaitsWorker);
    Ok(resp)
}

fn lb_delete_tuple(
    shared: &Shared,
    params: &Params,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let get = |k: &str| params.get(k).map(String::as_str);
    // Parameter binding (go-openapi) first: 422 601 on non-numeric values.
    let port = go_u16(number_param("port", "path", get("port").unwrap_or(""))?);
    let port_max = match get("portmax") {
        Some(raw) => go_u16(number_param("portmax", "path", raw)?),
        None => 0,
    };
    let block = match query.get("block").filter(|v| !v.is_empty()) {
        Some(raw) => go_u32(number_param("block", "query", raw)?),
        None => 0,
    };
    let bgp = match query.get("bgp").filter(|v| !v.is_empty()) {
        Some(raw) => bool_param("bgp", raw)?,
        None => false,
    };
    // Handler.
    let proto = get("proto").unwrap_or("");
    if !matches!(proto, "tcp" | "udp" | "sctp" | "icmp" | "none") {
        return Err(ApiError::handler("malformed-proto error"));
    }
    let Some(ip) = parse_ip(get("ip_address").unwrap_or("")) else {
        return Err(ApiError::handler("malformed-service error"));
    };
    let port_max = if port_max == port { 0 } else { port_max };
    if port_max != 0 && port_max < port {
        return Err(ApiError::handler("serv-port-args range error"));
    }
    let host = match get("hosturl") {
        Some("any") | None => "",
        Some(h) => h,
    };
    let key = RuleKey::new(host, ip, proto, port, port_max, block);
    // `?bgp=true` withdraws the address as written in the path, whether or not a rule
    // matched (docs/loxilb-api.md#bgp).
    let raw_ip = get("ip_address").unwrap_or("");
    let withdraw = (bgp && shared.bgp_enabled()).then_some(raw_ip);
    shared
        .state()
        .delete_tuple(&key, withdraw)
        .map_err(ApiError::Handler)?;
    Ok(success())
}

/// `DELETE /config/firewall?sourceIP=..&destinationIP=..&...`: integers bound first
/// (go-openapi: 422 601 when not a number), then loxilb's checks and lookup.
fn fw_delete(shared: &Shared, query: &HashMap<String, String>) -> Result<Response, ApiError> {
    let mut ints = HashMap::new();
    for name in [
        "minSourcePort",
        "maxSourcePort",
        "minDestinationPort",
        "maxDestinationPort",
        "protocol",
        "preference",
    ] {
        if let Some(raw) = query.get(name).filter(|v| !v.is_empty()) {
            let n = raw
                .parse::<i64>()
                .map_err(|_| invalid_type(name, "query", "integer", raw))?;
            ints.insert(name, n);
        }
    }
    let req = crate::firewall::delete_request(
        |k| query.get(k).filter(|v| !v.is_empty()).cloned(),
        |k| ints.get(k).copied(),
    );
    shared
        .state()
        .delete_firewall(&req)
        .map_err(ApiError::Handler)?;
    Ok(success())
}

/// `DELETE /config/endpoint/epipaddress/{ip}`: key `name`, else `<ip>_<probe_type>_<probe_port>`.
fn ep_delete(
    shared: &Shared,
    params: &Params,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let ip = params.get("ip_address").map_or("", String::as_str);
    let port = match query.get("probe_port").filter(|v| !v.is_empty()) {
        Some(raw) => go_u16(number_param("probe_port", "query", raw)?),
        None => 0,
    };
    let key = match query.get("name").filter(|v| !v.is_empty()) {
        Some(name) => name.clone(),
        None => {
            let kind = query.get("probe_type").map_or("", String::as_str);
            format!("{ip}_{kind}_{port}")
        }
    };
    shared
        .state()
        .delete_endpoint(&key)
        .map_err(ApiError::Handler)?;
    Ok(success())
}

fn ci_set(shared: &Shared, bytes: &[u8]) -> Result<Response, ApiError> {
    let Some(v) = parse_body(bytes)? else {
        return Err(ApiError::required("attr", "body"));
    };
    let map = body_object(&v, "CIStatusEntry")?;
    let o = GoObj::new(&map, "CIStatusEntry");
    let instance = o.string("instance")?.unwrap_or_default();
    let state = o.string("state")?.unwrap_or_default();
    let vip = o.string("vip")?.unwrap_or_default();
    shared
        .state()
        .set_ci(&instance, &state, &vip)
        .map_err(ApiError::Handler)?;
    Ok(success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent() {
        assert_eq!(percent_decode("a%2Fb", false), "a/b");
        assert_eq!(percent_decode("a+b", true), "a b");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(percent_decode("100%", false), "100%");
        assert_eq!(percent_decode("%zz", false), "%zz");
        assert_eq!(percent_decode("%4", false), "%4");
    }

    #[test]
    fn literal_beats_param_and_405() {
        let (op, _) = route(&Method::GET, "/config/bgp/neigh/all", "").unwrap();
        assert_eq!(op, Op::Bgp(BgpOp::NeighList));
        let (op, p) = route(&Method::DELETE, "/config/bgp/neigh/10.0.0.1", "").unwrap();
        assert_eq!(op, Op::Bgp(BgpOp::NeighDelete));
        assert_eq!(p["ip_address"], "10.0.0.1");
        let (op, p) = route(&Method::DELETE, "/config/loadbalancer/name/all", "").unwrap();
        assert_eq!(op, Op::LbDeleteName);
        assert_eq!(p["lb_name"], "all");
        let (op, _) = route(&Method::DELETE, "/config/loadbalancer/all", "").unwrap();
        assert_eq!(op, Op::LbDeleteAll);
        match route(&Method::PUT, "/config/loadbalancer/all", "") {
            Err(ApiError::Framework { status, allow, .. }) => {
                assert_eq!(status, 405);
                assert_eq!(allow.as_deref(), Some("DELETE, GET"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(route(&Method::GET, "", "/netlox/v1").is_err());
    }
}
