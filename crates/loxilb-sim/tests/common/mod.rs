//! Shared helpers for the simulator's integration tests: a started simulator
//! and a small raw-JSON HTTP client (deliberately not the typed client crate).
#![allow(dead_code)]

use std::net::SocketAddr;

use loxilb_sim::{API_BASE, SimConfig, Simulator};
use serde_json::{Value, json};

pub struct Env {
    pub sim: Simulator,
    pub http: reqwest::Client,
}

pub fn client() -> reqwest::Client {
    // reqwest is built with `rustls-no-provider`; plain HTTP needs no TLS but
    // building a client still wants a crypto provider installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .build()
        .expect("reqwest client builds")
}

pub async fn start() -> Env {
    start_with(SimConfig::default()).await
}

pub async fn start_with(cfg: SimConfig) -> Env {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let sim = Simulator::start(addr, cfg).await.expect("simulator starts");
    Env {
        sim,
        http: client(),
    }
}

/// `(status, parsed JSON body or Null)`.
pub type Reply = (u16, Value);

async fn reply(resp: reqwest::Response) -> Reply {
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body readable");
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

impl Env {
    pub fn api(&self, path: &str) -> String {
        format!("{}{API_BASE}{path}", self.sim.url())
    }

    pub fn admin(&self, path: &str) -> String {
        format!("{}/admin{path}", self.sim.url())
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        let resp = self
            .http
            .post(self.api(path))
            .json(body)
            .send()
            .await
            .expect("request sent");
        reply(resp).await
    }

    pub async fn post_lb(&self, body: &Value) -> Reply {
        self.post("/config/loadbalancer", body).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        let resp = self
            .http
            .get(self.api(path))
            .send()
            .await
            .expect("request sent");
        reply(resp).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        let resp = self
            .http
            .delete(self.api(path))
            .send()
            .await
            .expect("request sent");
        reply(resp).await
    }

    /// The JSON of `GET /admin{path}` (asserting a 200).
    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, v) = self.send(self.http.get(self.admin(path))).await;
        assert_eq!(status, 200, "GET /admin{path}: {v}");
        v
    }

    pub async fn send(&self, req: reqwest::RequestBuilder) -> Reply {
        reply(req.send().await.expect("request sent")).await
    }

    /// `lbAttr` of `GET /config/loadbalancer/all`.
    pub async fn list(&self) -> Vec<Value> {
        let (status, v) = self.get("/config/loadbalancer/all").await;
        assert_eq!(status, 200, "list failed: {v}");
        v["lbAttr"].as_array().cloned().expect("lbAttr array")
    }

    /// The listed rule with this VIP and port.
    pub async fn find(&self, vip: &str, port: u16) -> Option<Value> {
        self.list().await.into_iter().find(|r| {
            r["serviceArguments"]["externalIP"] == vip && r["serviceArguments"]["port"] == port
        })
    }
}

/// A valid TCP rule body with endpoints `ip:8080` weight 1.
pub fn tcp_rule(vip: &str, port: u16, eps: &[&str]) -> Value {
    rule(vip, port, "tcp", eps)
}

pub fn rule(vip: &str, port: u16, proto: &str, eps: &[&str]) -> Value {
    json!({
        "serviceArguments": {
            "externalIP": vip,
            "port": port,
            "protocol": proto,
            "sel": 0,
            "mode": 0,
            "name": format!("ns_svc{port}:llb-inst0"),
        },
        "endpoints": endpoints(eps, 8080),
    })
}

pub fn endpoints(ips: &[&str], target_port: u16) -> Value {
    Value::Array(
        ips.iter()
            .map(|ip| json!({"endpointIP": ip, "targetPort": target_port, "weight": 1}))
            .collect(),
    )
}

/// Endpoint IPs of a listed rule, in listed order.
pub fn ep_ips(rule: &Value) -> Vec<String> {
    rule["endpoints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["endpointIP"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn assert_success(r: &Reply) {
    assert_eq!(r.0, 200, "expected success, got {r:?}");
    assert_eq!(r.1, json!({"result": "Success"}), "expected success body");
}

/// Handler-shaped error: status, code == status, `fields: null`, raw result.
pub fn assert_handler_error(r: &Reply, status: u16, result: &str) {
    assert_eq!(r.0, status, "unexpected reply {r:?}");
    assert_eq!(r.1["code"], status, "{r:?}");
    assert_eq!(r.1["result"], result, "{r:?}");
    assert!(r.1.get("fields").is_some_and(Value::is_null), "{r:?}");
    assert!(r.1["message"].is_string(), "{r:?}");
}

/// Framework-shaped error: `{"code","message"}`, no `result`.
pub fn assert_framework_error(r: &Reply, status: u16, code: i64) {
    assert_eq!(r.0, status, "unexpected reply {r:?}");
    assert_eq!(r.1["code"], code, "{r:?}");
    assert!(r.1["message"].is_string(), "{r:?}");
    assert!(r.1.get("result").is_none(), "{r:?}");
}
