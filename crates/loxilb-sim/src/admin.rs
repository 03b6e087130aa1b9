//! Admin API under `/admin` (JSON), kept apart from the loxilb paths so it
//! can never be confused with real loxilb behaviour. Admin calls are not
//! counted, delayed, faulted or authenticated.
//!
//! | route | body | effect |
//! |---|---|---|
//! | `POST /admin/restart` | – | simulated loxilb restart (state wiped) |
//! | `POST /admin/down` | optional `{"seconds":N}` | close the listener; with `seconds`, come back up after N s |
//! | `POST /admin/up` | – | no-op while up; unreachable while down (use `Simulator::come_up` or the timed down) |
//! | `GET`/`PUT /admin/latency` | `{"ms":N}` | delay before every API call |
//! | `GET`/`PUT`/`DELETE /admin/fault` | `{"status":500,"rate":1.0,"onlyWrites":true}` | error injection |
//! | `POST /admin/endpoint-health` | `{"ip":"10.0.0.1","reachable":false}` | the address answers loxilb's health probes or not (`Simulator::set_endpoint_reachable`) |
//! | `GET /admin/bgp` | – | BGP on/off, goBGP's configuration and the advertisement counts, same as `Simulator::bgp()` |
//! | `PUT /admin/bgp` | `{"enabled":true}` | loxilb's BGP mode on or off (`Simulator::set_bgp_enabled`) |
//! | `PUT /admin/bgp/peer-state` | `{"ip":"10.0.0.1","state":"ESTABLISHED","updowntime":"00:05:00"}` | a peer's session state; `updowntime` optional (counts from now); 404 for an unknown peer (`Simulator::set_bgp_peer_state`) |
//! | `PUT /admin/token` | `{"token":"..."}` or `{"token":null}` | the token API calls need from now on (`Simulator::set_auth_token`) |
//! | `GET /admin/rules` | – | stored rules, same as `Simulator::rules()` |
//! | `GET /admin/stats` | – | counters and knobs |
//! | `GET /admin/writes` | – | the API writes since start or the last restart, in order, with their status, caller, times, worker tick and whether they were answered (`Simulator::write_log`) |
//! | `GET`/`PUT /admin/profile` | `{"profile":"loxilb-0.9.8","tickMs":100}` (`tickMs` optional, 1000) or `{"profile":"instant"}` | the cost profile (`Simulator::set_profile`); also sets goBGP's start-up delay to the profile's |
//! | `GET /admin/costs` | – | writes completed, unanswered, identical re-POSTs, no-op updates, listings during rule writes (`Simulator::costs`) |

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{AppState, Fault, Profile, Simulator};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/restart", post(restart))
        .route("/admin/down", post(down))
        .route("/admin/up", post(up))
        .route("/admin/latency", put(set_latency).get(get_latency))
        .route(
            "/admin/fault",
            put(set_fault).delete(clear_fault).get(get_fault),
        )
        .route("/admin/endpoint-health", post(set_endpoint_health))
        .route("/admin/bgp", get(get_bgp).put(set_bgp))
        .route("/admin/bgp/peer-state", put(set_peer_state))
        .route("/admin/token", put(set_token))
        .route("/admin/rules", get(rules))
        .route("/admin/stats", get(stats))
        .route("/admin/writes", get(writes))
        .route("/admin/profile", get(get_profile).put(set_profile))
        .route("/admin/costs", get(costs))
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": msg.to_string()})),
    )
        .into_response()
}

fn ok(v: Value) -> Response {
    (StatusCode::OK, axum::Json(v)).into_response()
}

/// Parses an admin body; an empty body yields `None`.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<Option<T>, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|e| e.to_string())
}

async fn restart(State(app): State<AppState>) -> Response {
    app.shared.restart(app.shared.cfg.max_rules);
    tracing::info!("admin: simulated restart");
    ok(json!({"result": "Success"}))
}

#[derive(Deserialize)]
struct DownReq {
    seconds: Option<f64>,
}

async fn down(State(app): State<AppState>, body: Bytes) -> Response {
    let req = match parse::<DownReq>(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let seconds = req.and_then(|r| r.seconds);
    let back_after = match seconds {
        Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s.min(86_400.0))),
        Some(_) => return bad_request("seconds must be a non-negative number"),
        None => None,
    };
    let Some(inner) = app.sim.upgrade() else {
        return bad_request("simulator is shutting down");
    };
    let sim = Simulator { inner };
    // Going down waits for this very connection to finish, so it must run
    // outside the handler; the response still gets written (graceful close).
    tokio::spawn(async move {
        sim.go_down().await;
        if let Some(d) = back_after {
            tokio::time::sleep(d).await;
            if let Err(e) = sim.come_up().await {
                tracing::error!(error = %e, "admin: timed come-up failed");
            }
        }
    });
    let mut resp = ok(json!({"result": "Success", "upAfterSeconds": seconds}));
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

async fn up() -> Response {
    ok(json!({
        "result": "Success",
        "note": "already up (while down this route is unreachable: use Simulator::come_up or POST /admin/down {\"seconds\":N})"
    }))
}

#[derive(Deserialize)]
struct LatencyReq {
    ms: u64,
}

#[derive(Deserialize)]
struct EndpointHealthReq {
    ip: std::net::IpAddr,
    reachable: bool,
}

async fn set_endpoint_health(State(app): State<AppState>, body: Bytes) -> Response {
    match parse::<EndpointHealthReq>(&body) {
        Ok(Some(r)) => {
            app.shared.reachability().set(r.ip, r.reachable);
            ok(json!({"result": "Success"}))
        }
        Ok(None) => bad_request("body {\"ip\":\"...\",\"reachable\":bool} required"),
        Err(e) => bad_request(e),
    }
}

async fn set_latency(State(app): State<AppState>, body: Bytes) -> Response {
    match parse::<LatencyReq>(&body) {
        Ok(Some(r)) => {
            app.shared.set_latency(Duration::from_millis(r.ms));
            ok(json!({"result": "Success", "ms": r.ms}))
        }
        Ok(None) => bad_request("body {\"ms\":N} required"),
        Err(e) => bad_request(e),
    }
}

async fn get_latency(State(app): State<AppState>) -> Response {
    let ms = u64::try_from(app.shared.latency().as_millis()).unwrap_or(u64::MAX);
    ok(json!({"ms": ms}))
}

async fn set_fault(State(app): State<AppState>, body: Bytes) -> Response {
    match parse::<Fault>(&body) {
        Ok(Some(f)) => {
            if StatusCode::from_u16(f.status).is_err() || f.status < 100 {
                return bad_request("status must be a valid HTTP status code");
            }
            if !(0.0..=1.0).contains(&f.rate) {
                return bad_request("rate must be within 0..=1");
            }
            app.shared.set_fault(Some(f));
            ok(json!({"result": "Success", "fault": f}))
        }
        Ok(None) => bad_request("body {\"status\":N,\"rate\":R,\"onlyWrites\":B} required"),
        Err(e) => bad_request(e),
    }
}

async fn clear_fault(State(app): State<AppState>) -> Response {
    app.shared.set_fault(None);
    ok(json!({"result": "Success"}))
}

async fn get_fault(State(app): State<AppState>) -> Response {
    ok(json!({"fault": app.shared.current_fault()}))
}

#[derive(Deserialize)]
struct BgpReq {
    enabled: bool,
}

async fn get_bgp(State(app): State<AppState>) -> Response {
    ok(json!(app.shared.bgp_snapshot()))
}

async fn set_bgp(State(app): State<AppState>, body: Bytes) -> Response {
    match parse::<BgpReq>(&body) {
        Ok(Some(r)) => {
            app.shared.set_bgp_enabled(r.enabled);
            ok(json!({"result": "Success", "enabled": r.enabled}))
        }
        Ok(None) => bad_request("body {\"enabled\":bool} required"),
        Err(e) => bad_request(e),
    }
}

#[derive(Deserialize)]
struct TokenReq {
    token: Option<String>,
}

async fn set_token(State(app): State<AppState>, body: Bytes) -> Response {
    match parse::<TokenReq>(&body) {
        Ok(Some(r)) => {
            *crate::lock(&app.shared.auth_token) = r.token;
            ok(json!({"result": "Success"}))
        }
        Ok(None) => bad_request("body {\"token\":\"...\"|null} required"),
        Err(e) => bad_request(e),
    }
}

#[derive(Deserialize)]
struct PeerStateReq {
    ip: String,
    state: String,
    updowntime: Option<String>,
}

async fn set_peer_state(State(app): State<AppState>, body: Bytes) -> Response {
    let r = match parse::<PeerStateReq>(&body) {
        Ok(Some(r)) => r,
        Ok(None) => {
            return bad_request(
                "body {\"ip\":\"...\",\"state\":\"ESTABLISHED\",\"updowntime\":\"...\"} required",
            );
        }
        Err(e) => return bad_request(e),
    };
    let found = app
        .shared
        .state()
        .bgp
        .set_peer_state(&r.ip, &r.state, r.updowntime.as_deref())
        .is_some();
    if found {
        ok(json!({"result": "Success"}))
    } else {
        (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": format!("no BGP peer {}", r.ip)})),
        )
            .into_response()
    }
}

async fn rules(State(app): State<AppState>) -> Response {
    ok(json!(app.shared.state().snapshot()))
}

async fn writes(State(app): State<AppState>) -> Response {
    ok(json!(app.shared.write_log()))
}

async fn stats(State(app): State<AppState>) -> Response {
    ok(app.shared.stats())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProfileReq {
    profile: String,
    tick_ms: Option<u64>,
}

async fn get_profile(State(app): State<AppState>) -> Response {
    ok(app.shared.profile_json())
}

async fn set_profile(State(app): State<AppState>, body: Bytes) -> Response {
    let r = match parse::<ProfileReq>(&body) {
        Ok(Some(r)) => r,
        Ok(None) => return bad_request("body {\"profile\":\"...\",\"tickMs\":N} required"),
        Err(e) => return bad_request(e),
    };
    let tick = r
        .tick_ms
        .map_or(Profile::LOXILB_098_TICK, Duration::from_millis);
    let Some(profile) = Profile::named(&r.profile, tick) else {
        return bad_request(format!(
            "profile must be one of {:?}, tickMs at least 1",
            Profile::NAMES
        ));
    };
    app.shared.set_profile(profile);
    tracing::info!(profile = profile.name(), ?tick, "admin: cost profile");
    ok(app.shared.profile_json())
}

async fn costs(State(app): State<AppState>) -> Response {
    ok(json!(app.shared.costs.snapshot()))
}
