//! A real node for the opt-in tier `cargo xtask realnode` (docs/testing.md): containerd
//! (Debian's, with the CNI plugins bridge, host-local, portmap and loopback), kubelet and
//! kube-proxy (nftables mode) built from `k8s.io/kubernetes` like the control plane, plus
//! kube-scheduler and a kube-controller-manager running every default controller, against a
//! [`ControlPlane::start_for_node`].
//!
//! Everything lives in one temporary folder (containerd's root and socket, kubelet's root, the
//! CNI configuration and address store) except what the kernel keeps globally: the bridge
//! `cni-loxi0`, kube-proxy's nftables tables and kubelet's cgroups. [`RealNode::stop`] (also on
//! drop) stops kubelet first, removes the Pods' containers, stops containerd, kube-proxy (then
//! `kube-proxy --cleanup`) and deletes the bridge.
//!
//! Needs root, the Debian packages containerd, containernetworking-plugins, buildah and
//! musl-tools (installed by `cargo xtask realnode`), and the binaries kubelet, kube-proxy and
//! kube-scheduler in the control plane's bin folder (`scripts/control-plane.sh kubelet
//! kube-proxy kube-scheduler`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{ControlPlane, free_port, spawn_tied};

/// The name the sandbox ("pause") image is imported under and containerd is told to use.
const PAUSE_IMAGE: &str = "localhost/loxi-ccm-test/pause:1";
/// The Pods' subnet on the bridge (host-local), and kube-proxy's cluster CIDR.
pub const POD_CIDR: &str = "10.244.0.0/24";
const BRIDGE: &str = "cni-loxi0";

/// The waiting loop's pause: sleep until a ready-made answer or `timeout`.
fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// This machine's first global IPv4 address: the node's InternalIP (kubelet's `--node-ip`
/// must not be a loopback address), or `$LOXI_NODE_IP`.
pub fn node_ip() -> Result<String> {
    if let Ok(ip) = std::env::var("LOXI_NODE_IP") {
        return Ok(ip);
    }
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .context("running ip (iproute2)")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|cidr| cidr.split('/').next())
        .find(|ip| !ip.starts_with("10.244."))
        .map(String::from)
        .context("no global IPv4 address on this machine (set LOXI_NODE_IP)")
}

pub struct RealNode {
    name: String,
    ip: String,
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    /// containerd first, then kube-proxy, kube-scheduler, kubelet.
    children: Mutex<Vec<(&'static str, Child)>>,
}

impl RealNode {
    /// Starts containerd, imports the sandbox image and `images` (OCI archives), then
    /// kube-controller-manager (every default controller), kube-scheduler, kube-proxy and
    /// kubelet (`--cloud-provider=external`: the Node registers with the `uninitialized`
    /// taint) against `cp`, and waits until the Node exists.
    pub async fn start(cp: &ControlPlane, name: &str, images: &[PathBuf]) -> Result<RealNode> {
        let ip = node_ip()?;
        let bin_dir = cp.k8s_bin_dir().to_path_buf();
        for b in ["kubelet", "kube-proxy", "kube-scheduler"] {
            if !bin_dir.join(b).is_file() {
                bail!(
                    "{} is missing: run the tier with `cargo xtask realnode`, which builds it",
                    bin_dir.join(b).display()
                );
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("loxi-ccm-node-")
            .tempdir()?;
        let node = RealNode {
            name: name.to_string(),
            ip,
            dir,
            bin_dir,
            children: Mutex::new(Vec::new()),
        };
        let started = tokio::task::block_in_place(|| node.start_processes(cp, images));
        if let Err(e) = started {
            let logs = node.log_tails();
            node.stop();
            return Err(e.context(logs));
        }
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's InternalIP (kubelet's `--node-ip`).
    pub fn ip(&self) -> &str {
        &self.ip
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn spawn(&self, name: &'static str, mut cmd: Command) -> Result<()> {
        let log = std::fs::File::create(self.path(&format!("{name}.log")))?;
        cmd.stdout(log.try_clone()?).stderr(log);
        let child = spawn_tied(cmd).with_context(|| format!("starting {name}"))?;
        self.children
            .lock()
            .map_err(|_| anyhow::anyhow!("node poisoned"))?
            .push((name, child));
        Ok(())
    }

    fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }

    /// `ctr` against this node's containerd, namespace `k8s.io` (the CRI's).
    pub fn ctr(&self) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(self.containerd_socket())
            .args(["--namespace", "k8s.io"]);
        c
    }

    fn start_processes(&self, cp: &ControlPlane, images: &[PathBuf]) -> Result<()> {
        let d = self.dir.path();
        for sub in ["containerd", "cni/net.d", "cni/ipam", "kubelet", "pause"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
        // containerd: its own root, state and socket; CRI with Debian's CNI plugins, runc
        // with cgroupfs, oom_score_adj not raised (root here cannot raise limits).
        std::fs::write(
            d.join("containerd/config.toml"),
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                root = d.join("containerd/root").display(),
                state = d.join("containerd/state").display(),
                sock = self.containerd_socket().display(),
                cni = d.join("cni/net.d").display(),
            ),
        )?;
        std::fs::write(
            d.join("cni/net.d/10-loxi.conflist"),
            serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "loxi-test",
                "plugins": [
                    {
                        "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": d.join("cni/ipam"),
                        }
                    },
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            })
            .to_string(),
        )?;
        let mut containerd = Command::new("containerd");
        containerd
            .arg("--config")
            .arg(d.join("containerd/config.toml"));
        self.spawn("containerd", containerd)?;
        wait_until("containerd's socket", Duration::from_secs(60), || {
            self.ctr()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })?;

        let pause = self.build_pause_image()?;
        for archive in std::iter::once(&pause).chain(images) {
            self.import(archive)?;
        }

        let kubeconfig = cp.kubeconfig_path();
        // Every default controller (EndpointSlices, the root CA ConfigMap each Pod mounts,
        // Deployments, ReplicaSets, disruption budgets, node lifecycle, ...).
        let mut kcm = Command::new(self.bin_dir.join("kube-controller-manager"));
        kcm.args([
            format!("--kubeconfig={}", kubeconfig.display()),
            "--controllers=*".into(),
            format!("--root-ca-file={}", cp.dir().join("ca.crt").display()),
            format!(
                "--service-account-private-key-file={}",
                cp.dir().join("sa.key").display()
            ),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            format!("--cert-dir={}", d.join("kcm-certs").display()),
            "--node-monitor-grace-period=20s".into(),
            "--v=1".into(),
        ]);
        self.spawn("kube-controller-manager", kcm)?;
        let mut scheduler = Command::new(self.bin_dir.join("kube-scheduler"));
        scheduler.args([
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--v=1".into(),
        ]);
        self.spawn("kube-scheduler", scheduler)?;

        std::fs::write(
            d.join("kube-proxy.yaml"),
            format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {name}
clusterCIDR: {POD_CIDR}
metricsBindAddress: 127.0.0.1:{metrics}
healthzBindAddress: 127.0.0.1:{healthz}
nodePortAddresses: ["{ip}/32"]
conntrack:
  maxPerCore: 0
  min: 0
"#,
                kubeconfig = kubeconfig.display(),
                name = self.name,
                ip = self.ip,
                metrics = free_port()?,
                healthz = free_port()?,
            ),
        )?;
        let mut proxy = Command::new(self.bin_dir.join("kube-proxy"));
        proxy
            .arg(format!("--config={}", d.join("kube-proxy.yaml").display()))
            .arg("--v=1");
        self.spawn("kube-proxy", proxy)?;

        // kubelet: cgroup v1 allowed (this machine's hybrid cgroups), cgroupfs driver, no
        // eviction on this machine's nearly full disk, authentication by token only.
        std::fs::write(
            d.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{sock}
address: {ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
failSwapOn: false
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
fileCheckFrequency: 5s
"#,
                sock = self.containerd_socket().display(),
                ip = self.ip,
                port = free_port()?,
                healthz = free_port()?,
            ),
        )?;
        let mut kubelet = Command::new(self.bin_dir.join("kubelet"));
        kubelet.args([
            format!("--config={}", d.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", d.join("kubelet").display()),
            format!("--cert-dir={}", d.join("kubelet/pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--cloud-provider=external".into(),
            "--v=1".into(),
        ]);
        self.spawn("kubelet", kubelet)?;
        Ok(())
    }

    /// The sandbox image: a static `pause` (crates/testenv/src/pause.c, musl-gcc) in a
    /// FROM-scratch image.
    fn build_pause_image(&self) -> Result<PathBuf> {
        let d = self.path("pause");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pause.c");
        run_ok(
            Command::new("musl-gcc")
                .args(["-static", "-Os", "-o"])
                .arg(d.join("pause"))
                .arg(&source),
            "musl-gcc pause.c",
        )?;
        build_scratch_image(
            &d,
            PAUSE_IMAGE,
            "FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT [\"/pause\"]\n",
        )
    }

    /// Imports an OCI archive into the node's runtime (what `ctr images import` does for a
    /// user loading an image without a registry).
    pub fn import(&self, archive: &Path) -> Result<()> {
        run_ok(
            self.ctr()
                .args(["images", "import", "--all-platforms"])
                .arg(archive),
            &format!("ctr images import {}", archive.display()),
        )
    }

    /// The last lines of the node's logs, for error messages.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for name in [
            "containerd",
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "kubelet",
        ] {
            let text =
                std::fs::read_to_string(self.path(&format!("{name}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!("--- {name} ---\n{}\n", tail.join("\n")));
        }
        out
    }

    /// Keeps the logs (the folder goes away on stop) under `to`.
    pub fn copy_logs(&self, to: &Path) -> Result<()> {
        std::fs::create_dir_all(to)?;
        for entry in std::fs::read_dir(self.dir.path())? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "log") {
                std::fs::copy(&path, to.join(path.file_name().unwrap_or_default()))?;
            }
        }
        Ok(())
    }

    /// Stops kubelet, kube-scheduler, kube-proxy and kube-controller-manager, removes every
    /// container of the node, stops containerd, then removes kube-proxy's rules, the bridge
    /// and the iptables chains of the CNI plugins and kubelet. Idempotent.
    pub fn stop(&self) {
        let Ok(mut children) = self.children.lock() else {
            return;
        };
        if children.is_empty() {
            return;
        }
        let containerd_index = children.iter().position(|(n, _)| *n == "containerd");
        for (name, child) in children.iter_mut().rev() {
            if *name == "containerd" {
                continue;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // The Pods' containers outlive kubelet (their shims belong to containerd).
        if let Ok(out) = self.ctr().args(["tasks", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = self
                    .ctr()
                    .args(["tasks", "kill", "-s", "SIGKILL", id])
                    .output();
            }
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = self.ctr().args(["tasks", "delete", "-f", id]).output();
            }
        }
        if let Ok(out) = self.ctr().args(["containers", "ls", "-q"]).output() {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = self.ctr().args(["containers", "delete", id]).output();
            }
        }
        if let Some(i) = containerd_index {
            let (_, child) = &mut children[i];
            let _ = child.kill();
            let _ = child.wait();
        }
        children.clear();
        let _ = Command::new(self.bin_dir.join("kube-proxy"))
            .args(["--cleanup", "--proxy-mode=nftables"])
            .output();
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).output();
        remove_iptables_chains();
        // Sandboxes' network namespaces and mounts under the folder.
        let _ = Command::new("umount")
            .args(["-R", "--lazy"])
            .arg(self.dir.path())
            .output();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = self.dir.path().display().to_string();
        for line in mounts.lines() {
            if let Some(point) = line.split_whitespace().nth(1)
                && point.starts_with(&prefix)
            {
                let _ = Command::new("umount").args(["--lazy", point]).output();
            }
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run_ok(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Builds `dockerfile` (FROM scratch, files from `context`) with buildah in a storage folder
/// under `context`, as the OCI archive `<context>/image.oci.tar` named `name`.
pub fn build_scratch_image(context: &Path, name: &str, dockerfile: &str) -> Result<PathBuf> {
    std::fs::write(context.join("Dockerfile"), dockerfile)?;
    let storage = [
        "--root".to_string(),
        context.join(".storage").display().to_string(),
        "--runroot".into(),
        context.join(".runroot").display().to_string(),
        "--storage-driver".into(),
        "vfs".into(),
    ];
    run_ok(
        Command::new("buildah")
            .args(&storage)
            .args(["build", "--quiet", "--timestamp", "0", "-t", name])
            .arg(context),
        &format!("buildah build ({name})"),
    )?;
    let archive = context.join("image.oci.tar");
    run_ok(
        Command::new("buildah")
            .args(&storage)
            .args(["push", "--quiet", name])
            .arg(format!("oci-archive:{}:{name}", archive.display())),
        &format!("buildah push ({name})"),
    )?;
    Ok(archive)
}

/// The iptables chains the node leaves behind: the CNI plugins' `CNI-*` (masquerading,
/// port maps: their sandboxes were removed without a CNI DEL) and kubelet's `KUBE-*`
/// (kubelet's own firewall and canary chains), with every rule that jumps to them. Each
/// table is rewritten without those lines; nothing else on this machine uses them.
fn remove_iptables_chains() {
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        for table in ["nat", "filter", "mangle"] {
            let Ok(out) = Command::new(save).args(["-t", table]).output() else {
                continue;
            };
            let text = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || !(text.contains("CNI-") || text.contains("KUBE-")) {
                continue;
            }
            let kept: String = text
                .lines()
                .filter(|l| !l.contains("CNI-") && !l.contains("KUBE-"))
                .map(|l| format!("{l}\n"))
                .collect();
            let Ok(mut child) = Command::new(restore)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            else {
                continue;
            };
            if let Some(mut stdin) = child.stdin.take() {
                use std::io::Write;
                let _ = stdin.write_all(kept.as_bytes());
            }
            let _ = child.wait();
        }
    }
}
