//! Lease leader election against a real kube-apiserver: one leader at a time, fast handover
//! on graceful shutdown, takeover after expiry when a leader dies, and a five-way race.
//!
//! Timing-sensitive, so the tests run one at a time (on a 2-core machine, parallel tests would
//! starve each other's renewals) against one control plane per test binary.

mod common;

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use loxi_ccm::leader::{LeaderElector, LeaseConfig};
use testenv::ControlPlane;
use tokio::sync::{MutexGuard, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const LEASE_NAME: &str = "loxi-ccm";
/// Poll interval for waits.
const POLL: Duration = Duration::from_millis(50);
/// Interval for checking the one-leader invariant: finer than POLL to catch short overlaps.
const SAMPLE: Duration = Duration::from_millis(10);
const WAIT: Duration = Duration::from_secs(20);

/// The short timing of tests 1, 3 and 4: expiry after 2 s.
fn short(ns: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new(ns, LEASE_NAME, identity)
    }
}

struct Env {
    _serial: MutexGuard<'static, ()>,
    cp: &'static ControlPlane,
    ns: String,
    leases: Api<Lease>,
}

impl Env {
    async fn new(name: &str) -> Env {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "loxi_ccm::leader=info".into()),
            )
            .with_test_writer()
            .try_init();
        let serial = common::serial().await;
        let cp = common::control_plane();
        let client = cp.admin_client().await.unwrap();
        let ns = format!("leader-{name}-{}", std::process::id() % 100_000);
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(ns.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        Env {
            _serial: serial,
            cp,
            leases: Api::namespaced(client, &ns),
            ns,
        }
    }

    /// Starts an elector on its own client (separate connections, as separate replicas).
    async fn start(&self, cfg: LeaseConfig) -> Contender {
        let client = self.cp.admin_client().await.unwrap();
        let identity = cfg.identity.clone();
        let elector = LeaderElector::new(client, cfg);
        let leading = elector.subscribe();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(elector.run(async move {
            let _ = stopped.await;
        }));
        Contender {
            identity,
            leading,
            stop: Some(stop),
            task,
        }
    }

    async fn holder(&self) -> Option<String> {
        self.leases
            .get(LEASE_NAME)
            .await
            .unwrap()
            .spec
            .and_then(|s| s.holder_identity)
    }
}

struct Contender {
    identity: String,
    leading: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Contender {
    fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Resolves the shutdown future and waits for `run` to return (lease released).
    async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(WAIT, &mut self.task)
            .await
            .expect("run returns after shutdown")
            .expect("elector task");
    }
}

/// Indices of the contenders that currently report leadership; panics if more than one does.
fn leaders(cs: &[&Contender]) -> Vec<usize> {
    let now: Vec<usize> = (0..cs.len()).filter(|&i| cs[i].is_leader()).collect();
    assert!(
        now.len() <= 1,
        "two leaders at once: {:?}",
        now.iter().map(|&i| &cs[i].identity).collect::<Vec<_>>()
    );
    now
}

/// Polls `check` every POLL until it yields, checking the one-leader invariant every SAMPLE
/// meanwhile ([`common::poll_for`] at SAMPLE); panics after WAIT naming `what`.
async fn wait_for<T, F, Fut>(what: &str, cs: &[&Contender], mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let mut next_poll = Instant::now();
    common::poll_for(what, WAIT, SAMPLE, String::new, || {
        leaders(cs);
        let due = Instant::now() >= next_poll;
        if due {
            next_poll = Instant::now() + POLL;
        }
        let polled = due.then(&mut check);
        async move {
            match polled {
                Some(check) => check.await,
                None => None,
            }
        }
    })
    .await
}

/// Waits until exactly one of `cs` leads and returns its index.
async fn one_leader(cs: &[&Contender]) -> usize {
    wait_for("exactly one leader", cs, || async {
        let l = leaders(cs);
        (l.len() == 1).then(|| l[0])
    })
    .await
}

/// Checks the invariant for `span`; returns how many samples had exactly one leader and the
/// total number of samples.
async fn watch_invariant(cs: &[&Contender], span: Duration) -> (usize, usize) {
    let end = Instant::now() + span;
    let (mut one, mut total) = (0, 0);
    while Instant::now() < end {
        if leaders(cs).len() == 1 {
            one += 1;
        }
        total += 1;
        tokio::time::sleep(SAMPLE).await;
    }
    (one, total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_contenders_exactly_one_leads() {
    let env = Env::new("two").await;
    let (a, b) = tokio::join!(
        env.start(short(&env.ns, "a")),
        env.start(short(&env.ns, "b"))
    );
    let (mut a, mut b) = (a, b);
    let winner = one_leader(&[&a, &b]).await;
    let (one, total) = watch_invariant(&[&a, &b], Duration::from_secs(3)).await;
    println!("two contenders: {one}/{total} samples with exactly one leader, never two");
    // Nothing disturbs the leader, so it keeps renewing and stays the only one.
    let l = leaders(&[&a, &b]);
    assert_eq!(l, vec![winner], "the leader stays leader while renewing");
    let name = [&a.identity, &b.identity][winner].clone();
    assert_eq!(env.holder().await.as_deref(), Some(name.as_str()));
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_releases_and_standby_takes_over_at_once() {
    let env = Env::new("release").await;
    // A long lease, so a takeover by expiry (>= 10 s) is clearly told from one by release.
    let cfg = |id: &str| LeaseConfig {
        lease_duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(5),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new(&env.ns, LEASE_NAME, id)
    };
    let (a, b) = tokio::join!(env.start(cfg("a")), env.start(cfg("b")));
    let mut cs = [a, b];
    let refs: Vec<&Contender> = cs.iter().collect();
    let leader = one_leader(&refs).await;
    let standby = 1 - leader;
    let transitions_before = env
        .leases
        .get(LEASE_NAME)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;

    let t0 = Instant::now();
    let [x, y] = &mut cs;
    let (l, s) = if leader == 0 { (x, y) } else { (y, x) };
    l.stop().await;
    assert!(!l.is_leader(), "a stopped elector reports no leadership");
    let refs: Vec<&Contender> = vec![&*l, &*s];
    wait_for("the standby to lead", &refs, || async {
        s.is_leader().then_some(())
    })
    .await;
    let took = t0.elapsed();
    println!("graceful handover took {took:?} (lease duration 10s)");
    assert!(
        took < Duration::from_secs(5),
        "handover took {took:?}: the lease was not released"
    );
    assert_eq!(
        env.holder().await.as_deref(),
        Some(cs[standby].identity.as_str())
    );
    let transitions_after = env
        .leases
        .get(LEASE_NAME)
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(
        transitions_after,
        transitions_before.map(|t| t + 1),
        "a new holder counts one transition"
    );
    cs[standby].stop().await;
    assert_eq!(env.holder().await, None, "released on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_leader_is_replaced_after_the_lease_expires() {
    let env = Env::new("abort").await;
    let (a, b) = tokio::join!(
        env.start(short(&env.ns, "a")),
        env.start(short(&env.ns, "b"))
    );
    let mut cs = [a, b];
    let refs: Vec<&Contender> = cs.iter().collect();
    let leader = one_leader(&refs).await;
    let standby = 1 - leader;

    // Killed: no release. Its receiver keeps the last value (true), so only the standby is
    // watched from here on.
    cs[leader].task.abort();
    let t0 = Instant::now();
    let _ = (&mut cs[leader].task).await;
    let s = &cs[standby];
    wait_for("the standby to lead after expiry", &[s], || async {
        s.is_leader().then_some(())
    })
    .await;
    let took = t0.elapsed();
    println!("failover after abort took {took:?} (lease duration 2s)");
    // The standby last saw a renewal at most ~one retry period before the abort, and must
    // then wait the full lease duration on its own clock.
    assert!(
        took >= Duration::from_millis(1500),
        "took over after {took:?}: before the lease could have expired"
    );
    assert_eq!(env.holder().await.as_deref(), Some(s.identity.as_str()));
    cs[standby].stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_contenders_race_for_a_fresh_lease() {
    let env = Env::new("race").await;
    let names = ["c0", "c1", "c2", "c3", "c4"];
    // Clients first, then all electors spawned back to back so they race on the CREATE.
    let mut clients = Vec::new();
    for _ in names {
        clients.push(env.cp.admin_client().await.unwrap());
    }
    let mut cs: Vec<Contender> = names
        .iter()
        .zip(clients)
        .map(|(id, client)| {
            let elector = LeaderElector::new(client, short(&env.ns, id));
            let leading = elector.subscribe();
            let (stop, stopped) = oneshot::channel::<()>();
            let task = tokio::spawn(elector.run(async move {
                let _ = stopped.await;
            }));
            Contender {
                identity: id.to_string(),
                leading,
                stop: Some(stop),
                task,
            }
        })
        .collect();
    let refs: Vec<&Contender> = cs.iter().collect();
    let winner = one_leader(&refs).await;
    let (one, total) = watch_invariant(&refs, Duration::from_secs(3)).await;
    println!("five contenders: {one}/{total} samples with exactly one leader, never two");
    assert_eq!(leaders(&refs), vec![winner]);
    assert_eq!(env.holder().await.as_deref(), Some(names[winner]));
    for c in &mut cs {
        c.stop().await;
    }
}
