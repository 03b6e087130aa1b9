//! Fuzzing of the client's decoding of loxilb's answers: a TCP server that answers every
//! request with an arbitrary status and body (random bytes, arbitrary JSON with the keys
//! the client reads, truncated real answers), and every call of the client against it. No
//! call may panic (the rule listing is parsed on a blocking thread, so a panic there would
//! surface as an error of its own), and the error categories follow the status.
//!
//! CI runs a few hundred cases per property; a long run:
//! `PROPTEST_CASES=20000 cargo test -p loxilb-client --test fuzz_responses --release`
//! (docs/testing.md).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use loxilb_client::{
    CiState, ClientConfig, ClientError, DefinedSetKind, LoadbalanceEntry, LoxilbClient, RetryPolicy,
};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cases(ci: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci;
    }
    config
}

/// The answer the server gives to every request: status line code and body.
type Answer = Arc<Mutex<(u16, Vec<u8>)>>;

struct Server {
    runtime: tokio::runtime::Runtime,
    addr: SocketAddr,
    answer: Answer,
}

/// One server for the whole test binary, on its own runtime.
fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let answer: Answer = Arc::new(Mutex::new((200, Vec::new())));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = answer.clone();
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let answer = shared.clone();
                tokio::spawn(answer_once(stream, answer));
            }
        });
        Server {
            runtime,
            addr,
            answer,
        }
    })
}

/// Reads one request (headers and a Content-Length body) and writes the current answer,
/// then closes the connection.
async fn answer_once(mut stream: tokio::net::TcpStream, answer: Answer) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let (status, body) = answer.lock().unwrap().clone();
    let head = format!(
        "HTTP/1.1 {status} Answer\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
}

/// One client for every case (building one loads the system's trusted roots).
fn client() -> &'static LoxilbClient {
    static CLIENT: OnceLock<LoxilbClient> = OnceLock::new();
    CLIENT.get_or_init(new_client)
}

fn new_client() -> LoxilbClient {
    let mut cfg = ClientConfig::new(&format!("http://{}", server().addr));
    cfg.timeout = Duration::from_secs(10);
    cfg.retry = RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    };
    LoxilbClient::new(cfg).unwrap()
}

const KEYS: &[&str] = &[
    "result",
    "message",
    "code",
    "lbAttr",
    "serviceArguments",
    "endpoints",
    "secondaryIPs",
    "allowedSources",
    "externalIP",
    "port",
    "portMax",
    "protocol",
    "sel",
    "mode",
    "bgp",
    "monitor",
    "probetype",
    "probeport",
    "probeTimeout",
    "probeRetries",
    "inactiveTimeOut",
    "block",
    "managed",
    "name",
    "host",
    "endpointIP",
    "targetPort",
    "weight",
    "state",
    "counter",
    "secondaryIP",
    "prefix",
    "Attr",
    "instance",
    "vip",
    "version",
    "buildInfo",
    "bgpNeiAttr",
    "ipAddress",
    "remoteAs",
    "definedSets",
    "statement",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::sample::select(vec![
            "Success",
            "exist",
            "lbrule-exists error",
            "cant modify",
            "no-rule error",
            "not found",
            "invalid token",
            "rule-hwm error",
            "loxilb BGP mode is disabled",
            "192.0.2.1",
            "tcp",
            "sctp",
            "",
        ])
        .prop_map(str::to_string),
    ]
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        text().prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        5 => prop::sample::select(KEYS).prop_map(str::to_string),
                        1 => any::<String>(),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|e| serde_json::Value::Object(e.into_iter().collect())),
        ]
    })
}

/// One rule as loxilb lists it.
fn real_entry() -> serde_json::Value {
    serde_json::json!({
        "serviceArguments": {"externalIP": "192.0.2.1", "port": 80, "protocol": "tcp",
            "sel": 0, "mode": 0, "name": "x", "inactiveTimeOut": 240},
        "endpoints": [{"endpointIP": "10.0.0.1", "targetPort": 30080, "weight": 1,
            "state": "active", "counter": "0:0"}],
    })
}

/// A real rule listing, as loxilb would give it.
fn real_listing() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"lbAttr": [real_entry(), real_entry()]})).unwrap()
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => json().prop_map(|v| serde_json::json!({"lbAttr": [v]})).prop_map(|v| serde_json::to_vec(&v).unwrap()),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => (0usize..400).prop_map(|cut| {
            let full = real_listing();
            full[..cut.min(full.len())].to_vec()
        }),
    ]
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => Just(200u16),
        1 => prop::sample::select(vec![201u16, 204, 301, 400, 401, 403, 404, 405, 409, 415, 422, 500, 502, 503]),
        1 => 100u16..600,
    ]
}

/// What the status alone says about the error category.
fn check_category(status: u16, err: &ClientError) -> Result<(), TestCaseError> {
    let category = err.category();
    match status {
        401 => prop_assert_eq!(category, "LoxilbUnauthorized"),
        501..=599 => prop_assert!(
            ["LoxilbServerError", "LoxilbRejected", "LoxilbUnreachable"].contains(&category),
            "{status}: {err}"
        ),
        _ => prop_assert!(!category.is_empty()),
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn every_answer_decodes_or_is_a_typed_error(status in status(), body in body()) {
        let server = server();
        *server.answer.lock().unwrap() = (status, body);
        let client = client();
        let results: Vec<Result<(), ClientError>> = server.runtime.block_on(async {
            let entry: LoadbalanceEntry = serde_json::from_value(real_entry()).unwrap();
            vec![
                client.version().await.map(drop),
                client.list_rules().await.map(drop),
                client.cluster_states().await.map(drop),
                client.set_cluster_state(&CiState::default()).await,
                client.apply_rule(&entry).await.map(drop),
                client.delete_rule("192.0.2.1", 80, "tcp", false).await.map(drop),
                client.delete_rules_named("x").await,
                client.list_bgp_neighbors().await.map(drop),
                client.list_bgp_defined_sets(DefinedSetKind::Prefix).await.map(drop),
                client.list_bgp_policies().await.map(drop),
            ]
        });
        for result in results {
            if let Err(e) = result {
                check_category(status, &e)?;
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}
