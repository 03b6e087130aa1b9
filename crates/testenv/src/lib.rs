//! A real Kubernetes control plane for tests, the demo and benchmarks: etcd (from the
//! `etcd-bin-vendored` crate) and kube-apiserver (built from the Go module `k8s.io/kubernetes`
//! by `scripts/control-plane.sh`), on free loopback ports, with RBAC on.
//!
//! Authentication: a static token file with an admin token (group `system:masters`), and a
//! service-account signing key so ServiceAccount tokens can be requested for RBAC tests. The
//! serving certificate is made here with `rcgen` for 127.0.0.1, so clients verify TLS for real.
//!
//! Child processes are started from a dedicated thread with `PR_SET_PDEATHSIG`: when the test
//! process ends, in any way (panic, abort, kill), the kernel kills etcd and kube-apiserver
//! too. [`ControlPlane`]'s `Drop` stops them earlier when it runs. Their working directory
//! is removed by a later control plane once no process uses it ([`workdirs`]).
//!
//! Also the other real tools the tests use: kube-controller-manager on the same API server
//! ([`ControlPlane::start_controller_manager`]), `helm` and `promtool` ([`tools`]), and the
//! rendering of `deploy/` from the Helm chart ([`chart`]).

pub mod chart;
pub mod node;
pub mod tools;
pub mod workdirs;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub mod certs;

/// The Kubernetes version the project builds and tests against; matches the `k8s-openapi`
/// feature (v1_37).
pub const K8S_VERSION: &str = "v1.37.2";

pub const ADMIN_TOKEN: &str = "loxi-ccm-test-admin-token";

/// A running etcd + kube-apiserver.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    children: Mutex<Vec<Child>>,
    server: String,
    ca_pem: String,
    bin_dir: PathBuf,
    etcd_url: String,
    /// kube-apiserver's arguments, to start it again on the same port (`restart_apiserver`).
    api_args: Vec<String>,
    /// etcd's arguments, to start it again on the same ports and data (`restart_etcd`).
    etcd_args: Vec<String>,
}

/// Where each process is in `ControlPlane::children` (kube-controller-manager, when a test
/// starts it, comes after).
const ETCD: usize = 0;
const APISERVER: usize = 1;

/// Directory holding kube-apiserver, kube-controller-manager and kubectl for [`K8S_VERSION`]:
/// `$LOXI_K8S_BIN_DIR` if set, else the cache filled by `scripts/control-plane.sh` (which is
/// run here when the binaries are missing).
pub fn bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("LOXI_K8S_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/control-plane.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("K8S_VERSION", K8S_VERSION)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed", script.display());
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// Path of the etcd binary shipped by the `etcd-bin-vendored` crate.
pub fn etcd_path() -> Result<PathBuf> {
    Ok(etcd_bin_vendored::etcd_bin_path()
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .to_path_buf())
}

/// A free TCP port on 127.0.0.1 (bound then released: a tiny race we accept in tests).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Spawns `cmd` from a thread that lives as long as the process, with `PR_SET_PDEATHSIG`, so
/// the child dies with this process. (The death signal follows the *thread* that forked, so
/// forking from a short-lived test thread would kill the child too early.)
pub fn spawn_tied(mut cmd: Command) -> Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::OnceLock;
    use std::sync::mpsc;

    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    unsafe {
                        cmd.pre_exec(|| {
                            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                                return Err(std::io::Error::last_os_error());
                            }
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::channel();
    cmd.stdin(Stdio::null());
    sender
        .lock()
        .map_err(|_| anyhow::anyhow!("spawner poisoned"))?
        .send((cmd, tx))
        .map_err(|_| anyhow::anyhow!("spawner thread gone"))?;
    Ok(rx.recv()??)
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File> {
    Ok(std::fs::File::create(dir.join(format!("{name}.log")))?)
}

fn spawn_etcd(dir: &Path, args: &[String]) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("etcd.log"))?;
    let mut etcd = Command::new(etcd_path()?);
    etcd.args(args).stdout(log.try_clone()?).stderr(log);
    spawn_tied(etcd)
}

fn spawn_apiserver(bin_dir: &Path, dir: &Path, args: &[String]) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("kube-apiserver.log"))?;
    let mut api = Command::new(bin_dir.join("kube-apiserver"));
    api.args(args).stdout(log.try_clone()?).stderr(log);
    spawn_tied(api)
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until the API answers `/readyz`.
    pub async fn start() -> Result<ControlPlane> {
        ControlPlane::start_with_api_args(&[]).await
    }

    /// [`ControlPlane::start`] with extra kube-apiserver flags after the defaults (a flag
    /// given again replaces the default), e.g. a wider `--service-node-port-range` for
    /// more LoadBalancer ports than the default range's 2,768 (bench/src/fleet.rs).
    pub async fn start_with_api_args(extra: &[&str]) -> Result<ControlPlane> {
        ControlPlane::start_inner(extra, &[]).await
    }

    /// A control plane that Pods on a real node ([`node::RealNode`]) reach: kube-apiserver
    /// listens on every address and advertises `node_ip`, so that the `kubernetes` Service
    /// (10.96.0.1:443, through kube-proxy) leads to it, and its certificate names that
    /// address and the Service's names besides 127.0.0.1.
    pub async fn start_for_node(node_ip: &str) -> Result<ControlPlane> {
        let sans: Vec<String> = [
            node_ip,
            "10.96.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let advertise = format!("--advertise-address={node_ip}");
        ControlPlane::start_inner(
            &[
                "--bind-address=0.0.0.0",
                &advertise,
                "--endpoint-reconciler-type=lease",
            ],
            &sans,
        )
        .await
    }

    async fn start_inner(extra: &[&str], extra_sans: &[String]) -> Result<ControlPlane> {
        let bin_dir = tokio::task::spawn_blocking(bin_dir).await??;
        workdirs::sweep();
        let dir = tempfile::Builder::new()
            .prefix(workdirs::PREFIX)
            .tempdir()?;
        workdirs::claim(dir.path())?;
        let d = dir.path().to_path_buf();

        // Certificates: a CA and a serving certificate for 127.0.0.1 / localhost.
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "loxi-ccm test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = rcgen::Issuer::new(ca_params, ca_key);
        let srv_key = rcgen::KeyPair::generate()?;
        let mut srv_params = rcgen::CertificateParams::new(
            ["localhost".to_string(), "127.0.0.1".to_string()]
                .into_iter()
                .chain(extra_sans.iter().cloned())
                .collect::<Vec<_>>(),
        )?;
        srv_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let srv_cert = srv_params.signed_by(&srv_key, &ca)?;
        std::fs::write(d.join("ca.crt"), ca_cert.pem())?;
        std::fs::write(d.join("apiserver.crt"), srv_cert.pem())?;
        std::fs::write(d.join("apiserver.key"), srv_key.serialize_pem())?;
        let sa_key = rcgen::KeyPair::generate()?;
        std::fs::write(d.join("sa.key"), sa_key.serialize_pem())?;
        std::fs::write(d.join("sa.pub"), sa_key.public_key_pem())?;
        std::fs::write(
            d.join("tokens.csv"),
            format!("{ADMIN_TOKEN},loxi-admin,loxi-admin-uid,\"system:masters\"\n"),
        )?;

        let mut children = Vec::new();
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let etcd_args: Vec<String> = vec![
            "--data-dir".into(),
            d.join("etcd").to_str().unwrap_or_default().into(),
            "--listen-client-urls".into(),
            etcd_url.clone(),
            "--advertise-client-urls".into(),
            etcd_url.clone(),
            "--listen-peer-urls".into(),
            format!("http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls".into(),
            format!("http://127.0.0.1:{peer_port}"),
            "--initial-cluster".into(),
            format!("default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        children.push(spawn_etcd(&d, &etcd_args)?);

        let port = free_port()?;
        let api_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--tls-cert-file={}", d.join("apiserver.crt").display()),
            format!(
                "--tls-private-key-file={}",
                d.join("apiserver.key").display()
            ),
            // Dual-stack, so RequireDualStack Services can be created.
            "--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", d.join("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            format!("--token-auth-file={}", d.join("tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            // The default reconciler refuses a loopback advertise address.
            "--endpoint-reconciler-type=none".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            "--watch-cache=true".into(),
            "--v=0".into(),
        ];
        let api_args: Vec<String> = api_args
            .into_iter()
            .chain(extra.iter().map(|a| (*a).to_string()))
            .collect();
        children.push(spawn_apiserver(&bin_dir, &d, &api_args)?);

        let cp = ControlPlane {
            server: format!("https://127.0.0.1:{port}"),
            ca_pem: ca_cert.pem(),
            dir,
            children: Mutex::new(children),
            bin_dir,
            etcd_url,
            api_args,
            etcd_args,
        };
        cp.write_kubeconfig(&cp.kubeconfig_path(), ADMIN_TOKEN)?;
        cp.wait_ready(Duration::from_secs(120)).await?;
        Ok(cp)
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let client = self.admin_client().await?;
        let deadline = Instant::now() + timeout;
        let mut last_err = String::new();
        while Instant::now() < deadline {
            if let Ok(mut children) = self.children.lock() {
                for c in children.iter_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        bail!(
                            "control-plane process exited ({status}):\n{}",
                            self.log_tails()
                        );
                    }
                }
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(req).await {
                Ok(text) if text.trim() == "ok" => {
                    // The default namespace and RBAC bootstrap roles come with readiness.
                    return Ok(());
                }
                Ok(text) => last_err = text,
                Err(e) => last_err = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!(
            "kube-apiserver not ready after {timeout:?}: {last_err}\n{}",
            self.log_tails()
        )
    }

    /// Starts kube-controller-manager against this API server (admin credentials, no leader
    /// election) running only `controllers` (e.g. `deployment`, `replicaset`), so that the
    /// objects they own appear as in a cluster. It stops with the control plane. No kubelet
    /// or scheduler runs: Pods are created and stay Pending.
    pub fn start_controller_manager(&self, controllers: &[&str]) -> Result<()> {
        let d = self.dir.path();
        let mut kcm = Command::new(self.bin_dir.join("kube-controller-manager"));
        kcm.args([
            format!("--kubeconfig={}", self.kubeconfig_path().display()),
            format!("--controllers={}", controllers.join(",")),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            format!("--cert-dir={}", d.join("kcm-certs").display()),
            "--v=1".into(),
        ])
        .stdout(log_file(d, "kube-controller-manager")?)
        .stderr(log_file(d, "kube-controller-manager")?);
        let child = spawn_tied(kcm)?;
        self.children
            .lock()
            .map_err(|_| anyhow::anyhow!("control plane poisoned"))?
            .push(child);
        Ok(())
    }

    /// The last lines of every log, for error messages (the directory is gone after drop).
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {name}.log (last lines)\n"));
            for l in &lines[lines.len().saturating_sub(40)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// Directory with kube-apiserver, kube-controller-manager and kubectl.
    pub fn k8s_bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Working directory (certificates, logs, kubeconfig).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Writes a kubeconfig for a bearer token (admin, or a ServiceAccount's).
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        use base64::Engine as _;
        let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: user\n  user:\n    token: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
            self.server,
            encode(self.ca_pem.as_bytes()),
            token
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    /// A client with cluster-admin rights.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        self.client_for_kubeconfig(&self.kubeconfig_path()).await
    }

    pub async fn client_for_kubeconfig(&self, path: &Path) -> Result<kube::Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kc = kube::config::Kubeconfig::read_from(path)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Ok(kube::Client::try_from(cfg)?)
    }

    /// Stops kube-apiserver (SIGKILL: no graceful close of watches) and starts it again on
    /// the same port with the same etcd, then waits until it is ready: clients see their
    /// connections cut and their requests refused meanwhile, and keep their credentials.
    pub async fn restart_apiserver(&self) -> Result<()> {
        self.restart_apiserver_with(&[]).await
    }

    /// As [`ControlPlane::restart_apiserver`], with `extra` arguments added (e.g.
    /// `--max-requests-inflight=1` to make it throttle); the next restart without them
    /// drops them again.
    pub async fn restart_apiserver_with(&self, extra: &[&str]) -> Result<()> {
        let mut args = self.api_args.clone();
        args.extend(extra.iter().map(|a| a.to_string()));
        self.replace_child(APISERVER, || {
            spawn_apiserver(&self.bin_dir, self.dir.path(), &args)
        })?;
        self.wait_ready(Duration::from_secs(120)).await
    }

    /// Stops etcd (SIGKILL) and starts it again on the same ports with the same data
    /// directory, then waits until kube-apiserver is ready again (its `/readyz` includes
    /// etcd): the API server keeps running and answers errors meanwhile, its watches on etcd
    /// break and resume.
    pub async fn restart_etcd(&self) -> Result<()> {
        self.replace_child(ETCD, || spawn_etcd(self.dir.path(), &self.etcd_args))?;
        self.wait_ready(Duration::from_secs(120)).await
    }

    /// Kills the process at `index` of `children` and puts what `spawn` starts in its place.
    fn replace_child(&self, index: usize, spawn: impl FnOnce() -> Result<Child>) -> Result<()> {
        let mut children = self
            .children
            .lock()
            .map_err(|_| anyhow::anyhow!("children lock poisoned"))?;
        let Some(old) = children.get_mut(index) else {
            bail!("no control-plane process at {index}");
        };
        let _ = old.kill();
        let _ = old.wait();
        children[index] = spawn()?;
        Ok(())
    }

    /// Stops every process (also done on drop).
    pub fn stop(&self) {
        if let Ok(mut children) = self.children.lock() {
            // kube-controller-manager, then kube-apiserver, then etcd.
            for c in children.iter_mut().rev() {
                let _ = c.kill();
                let _ = c.wait();
            }
            children.clear();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
