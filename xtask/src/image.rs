//! `cargo xtask image`: the container image, built from `deploy/Dockerfile` (the one recipe)
//! without a Docker daemon.
//!
//! 1. a static release binary (`<arch>-unknown-linux-musl`, musl-gcc for ring's C parts),
//!    with the build machine's paths remapped so that it does not depend on where the
//!    checkout or the cargo registry live;
//! 2. the build context the Dockerfile expects (`target/image/context`, [`context_files`]);
//! 3. `buildah build` of the Dockerfile with fixed timestamps (`--timestamp 0`) in a fresh
//!    storage folder, pushed as an OCI layout, packed into a tar archive with fixed names,
//!    owners and times: the same commit gives the same image digest and the same archive.
//!
//! Flags: `--context-only` (steps 1 and 2, for `docker build`), `--arch amd64|arm64`
//! (default: this machine's), `--name REF` (the image name in the archive, default the
//! chart's default image), `--reproducible` (build twice, fail if the digests differ).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use base64::Engine;

use crate::{cargo, run, workspace_root};

/// The user the image runs as, and the chart's `runAsUser` (distroless' "nonroot").
pub const UID: u32 = 65532;
/// The admin port (`--admin-addr`), exposed by the image.
pub const ADMIN_PORT: u16 = 9500;

/// The image's name in the archive by default: the chart's default image (values.yaml), so
/// that an archive loaded into a node's runtime is the image the chart asks for.
pub fn default_name() -> String {
    format!("ghcr.io/loxi-ccm/loxi-ccm:{}", env!("CARGO_PKG_VERSION"))
}

/// `amd64`/`arm64` (the Dockerfile's TARGETARCH) to the Rust target built for it.
fn rust_target(arch: &str) -> Result<&'static str> {
    match arch {
        "amd64" => Ok("x86_64-unknown-linux-musl"),
        "arm64" => Ok("aarch64-unknown-linux-musl"),
        _ => bail!("--arch {arch}: amd64 or arm64"),
    }
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    }
}

/// The files of the build context besides the binary (`<arch>/loxi-ccm`), relative to it,
/// with their contents. deploy/Dockerfile copies `etc/` whole.
pub fn context_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "etc/passwd",
            format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:/home/nonroot:/sbin/nologin\n")
                .into_bytes(),
        ),
        (
            "etc/group",
            format!("root:x:0:\nnonroot:x:{UID}:\n").into_bytes(),
        ),
        ("etc/ssl/certs/ca-certificates.crt", ca_bundle()),
    ]
}

/// Mozilla's root certificates as a PEM bundle, from the `webpki-root-certs` crate: the
/// version Cargo.lock pins, so the bundle (and the image digest) depends on the commit, not
/// on the build machine's own certificates.
fn ca_bundle() -> Vec<u8> {
    let mut pem = String::new();
    for cert in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    pem.into_bytes()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// What `image` was asked for.
struct Options {
    arch: String,
    name: String,
    context_only: bool,
    reproducible: bool,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        arch: host_arch().to_string(),
        name: default_name(),
        context_only: false,
        reproducible: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--context-only" => options.context_only = true,
            "--reproducible" => options.reproducible = true,
            "--arch" => options.arch = args.next().context("--arch needs a value")?.clone(),
            "--name" => options.name = args.next().context("--name needs a value")?.clone(),
            other => bail!(
                "image: unknown argument {other} (--context-only, --reproducible, --arch amd64|arm64, --name REF)"
            ),
        }
    }
    rust_target(&options.arch)?;
    Ok(options)
}

pub fn image(args: &[String]) -> Result<()> {
    build(args).map(|_| ())
}

/// Builds what `args` ask for; the archive's path (none with `--context-only`).
pub fn build(args: &[String]) -> Result<Option<PathBuf>> {
    let options = parse(args)?;
    let mut packages = vec!["musl-tools"];
    if !options.context_only {
        packages.push("buildah");
    }
    crate::packages::ensure(&packages)?;
    let started = Instant::now();
    let context = build_context(&options.arch)?;
    eprintln!(
        "xtask: context {} ready in {:.1} s",
        context.display(),
        started.elapsed().as_secs_f64()
    );
    if options.context_only {
        return Ok(None);
    }
    let out = target_dir().join(format!(
        "image/loxi-ccm-{}-{}.oci.tar",
        env!("CARGO_PKG_VERSION"),
        options.arch
    ));
    let digest = build_archive(&context, &options, &out)?;
    if options.reproducible {
        let again = target_dir().join("image/reproducible-check.oci.tar");
        let second = build_archive(&context, &options, &again)?;
        let same_bytes = std::fs::read(&out)? == std::fs::read(&again)?;
        std::fs::remove_file(&again)?;
        if second != digest || !same_bytes {
            bail!(
                "not reproducible: digests {digest} and {second}, archives identical: {same_bytes}"
            );
        }
        eprintln!("xtask: built twice from scratch storage: same digest, same archive bytes");
    }
    let size = std::fs::metadata(&out)?.len();
    println!(
        "{} {digest} {} ({:.1} MiB) in {:.1} s",
        options.name,
        out.display(),
        size as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    Ok(Some(out))
}

/// The static binary and the context folder the Dockerfile builds from.
fn build_context(arch: &str) -> Result<PathBuf> {
    let target = rust_target(arch)?;
    let mut rustup = Command::new("rustup");
    rustup.args(["target", "add", target]);
    run(rustup, &format!("rustup target add {target}"))?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    // Paths of the build machine end up in the binary (panic locations): mapped to fixed
    // ones so that another checkout or user builds the same bytes. \x1f separates the flags
    // of CARGO_ENCODED_RUSTFLAGS (paths may hold spaces).
    let rustflags = [
        format!("--remap-path-prefix={}=/cargo", cargo_home.display()),
        format!("--remap-path-prefix={}=/src", workspace_root().display()),
    ]
    .join("\x1f");
    let mut build = cargo();
    build
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "loxi-ccm",
            "--target",
            target,
        ])
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // ring's C and assembly parts: musl-gcc of Debian's musl-tools (native builds).
        .env(format!("CC_{}", target.replace('-', "_")), "musl-gcc");
    run(
        build,
        &format!("cargo build --release -p loxi-ccm --target {target}"),
    )?;
    let binary = target_dir().join(target).join("release/loxi-ccm");

    let context = target_dir().join("image/context");
    std::fs::create_dir_all(context.join(arch))?;
    std::fs::copy(&binary, context.join(arch).join("loxi-ccm"))
        .with_context(|| format!("copying {}", binary.display()))?;
    for (path, contents) in context_files() {
        let file = context.join(path);
        std::fs::create_dir_all(file.parent().expect("context files sit in folders"))?;
        std::fs::write(&file, contents)?;
    }
    Ok(context)
}

/// `buildah build` of deploy/Dockerfile in a fresh storage folder, then the OCI layout packed
/// into `out`. Returns the image's manifest digest.
fn build_archive(context: &Path, options: &Options, out: &Path) -> Result<String> {
    let work = target_dir().join("image/buildah");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let buildah = |args: &[&str]| {
        let mut c = Command::new("buildah");
        c.arg("--root")
            .arg(work.join("root"))
            .arg("--runroot")
            .arg(work.join("runroot"))
            // vfs: plain copies, works in any container or sandbox (no overlay mounts).
            .args(["--storage-driver", "vfs"])
            .args(args);
        c
    };
    let revision = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dockerfile = workspace_root().join("deploy/Dockerfile");
    let build_args = [
        format!("TARGETARCH={}", options.arch),
        format!("VERSION={}", env!("CARGO_PKG_VERSION")),
        format!("REVISION={revision}"),
    ];
    let mut build = buildah(&["build", "--quiet", "--format", "oci", "--timestamp", "0"]);
    build.args(["--platform", &format!("linux/{}", options.arch)]);
    for arg in &build_args {
        build.args(["--build-arg", arg]);
    }
    build
        .arg("-f")
        .arg(&dockerfile)
        .args(["-t", &options.name])
        .arg(context)
        .stdout(std::process::Stdio::null());
    run(build, "buildah build -f deploy/Dockerfile")?;
    let layout = work.join("layout");
    let digest_file = work.join("digest");
    let mut push = buildah(&["push", "--quiet", "--digestfile"]);
    push.arg(&digest_file).arg(&options.name).arg(format!(
        "oci:{}:{}",
        layout.display(),
        options.name
    ));
    run(push, "buildah push (OCI layout)")?;
    // The archive of the layout with fixed order, owners and times: byte for byte the same
    // for the same image.
    std::fs::create_dir_all(out.parent().expect("the archive sits in target/image"))?;
    let mut tar = Command::new("tar");
    tar.args([
        "--sort=name",
        "--mtime=@0",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "--format=posix",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        "-C",
    ])
    .arg(&layout)
    .arg("-cf")
    .arg(out)
    .arg(".");
    run(
        tar,
        &format!("tar of the OCI layout into {}", out.display()),
    )?;
    let digest = std::fs::read_to_string(&digest_file)?.trim().to_string();
    check_config(&layout, &digest)?;
    std::fs::remove_dir_all(&work)?;
    Ok(digest)
}

/// The built image's configuration (OCI layout: manifest, then config blob) is what the
/// chart expects: its user, the admin port, the entrypoint and the version label.
fn check_config(layout: &Path, digest: &str) -> Result<()> {
    let blob = |digest: &str| -> Result<serde_json::Value> {
        let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
        let text = std::fs::read(layout.join("blobs/sha256").join(hex))?;
        Ok(serde_json::from_slice(&text)?)
    };
    let manifest = blob(digest)?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .context("the manifest names no config")?;
    let config = &blob(config_digest)?["config"];
    let user = format!("{UID}:{UID}");
    let port = format!("{ADMIN_PORT}/tcp");
    let version = config["Labels"]["org.opencontainers.image.version"].as_str();
    if config["User"].as_str() != Some(user.as_str())
        || config["ExposedPorts"].get(&port).is_none()
        || config["Entrypoint"] != serde_json::json!(["/loxi-ccm"])
        || version != Some(env!("CARGO_PKG_VERSION"))
    {
        bail!(
            "the image's config is not the one the chart expects (user {user}, port {port}, entrypoint /loxi-ccm, version label): {config}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Dockerfile's instructions, continuation lines joined, comments left out.
    fn dockerfile_instructions() -> Vec<String> {
        let text = std::fs::read_to_string(workspace_root().join("deploy/Dockerfile")).unwrap();
        let mut instructions = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(part) => current.push_str(part),
                None => {
                    current.push_str(line);
                    instructions.push(std::mem::take(&mut current));
                }
            }
        }
        instructions
    }

    /// deploy/Dockerfile and the context `cargo xtask image` writes are one recipe: it copies
    /// exactly the files written (the binary per TARGETARCH, `etc/`), runs as the chart's
    /// user, exposes the admin port, takes the build arguments xtask passes, and starts FROM
    /// scratch (nothing to pull).
    #[test]
    fn the_dockerfile_builds_from_the_context_xtask_writes() {
        let instructions = dockerfile_instructions();
        let copies: Vec<&str> = instructions
            .iter()
            .filter_map(|i| i.strip_prefix("COPY "))
            .collect();
        assert_eq!(
            copies,
            ["etc/ /etc/", "${TARGETARCH}/loxi-ccm /loxi-ccm"],
            "COPY lines"
        );
        for (path, _) in context_files() {
            assert!(path.starts_with("etc/"), "{path} is not under etc/");
        }
        let expected = [
            "FROM scratch".to_string(),
            format!("USER {UID}:{UID}"),
            format!("EXPOSE {ADMIN_PORT}"),
            r#"ENTRYPOINT ["/loxi-ccm"]"#.to_string(),
            r#"CMD ["run"]"#.to_string(),
        ];
        for line in &expected {
            assert!(
                instructions.contains(line),
                "no `{line}` in deploy/Dockerfile"
            );
        }
        assert_eq!(
            instructions
                .iter()
                .filter(|i| i.starts_with("FROM "))
                .count(),
            1,
            "one stage"
        );
        for arg in ["TARGETARCH", "VERSION", "REVISION"] {
            assert!(
                instructions
                    .iter()
                    .any(|i| i == &format!("ARG {arg}") || i.starts_with(&format!("ARG {arg}="))),
                "the Dockerfile takes no ARG {arg}, which xtask passes"
            );
        }
        let labels = instructions
            .iter()
            .find(|i| i.starts_with("LABEL "))
            .expect("a LABEL line");
        for label in [
            "org.opencontainers.image.version=\"${VERSION}\"",
            "org.opencontainers.image.revision=\"${REVISION}\"",
            "org.opencontainers.image.source=\"${SOURCE}\"",
        ] {
            assert!(labels.contains(label), "no {label} in {labels}");
        }
    }

    /// The chart's restricted security context runs the image's user; the default name in
    /// the archive is the chart's default image.
    #[test]
    fn the_image_matches_the_chart() {
        let values =
            std::fs::read_to_string(workspace_root().join("charts/loxi-ccm/values.yaml")).unwrap();
        let repository = default_name();
        let repository = repository.rsplit_once(':').unwrap().0;
        assert!(
            values.contains(&format!("  repository: {repository}\n")),
            "values.yaml's image.repository is not {repository}"
        );
        let deployment = std::fs::read_to_string(
            workspace_root().join("charts/loxi-ccm/templates/40-deployment.yaml"),
        )
        .unwrap();
        assert!(deployment.contains(&format!("runAsUser: {UID}")));
        assert!(deployment.contains("readOnlyRootFilesystem: true"));
    }

    #[test]
    fn the_ca_bundle_holds_every_root() {
        let bundle = String::from_utf8(ca_bundle()).unwrap();
        assert_eq!(
            bundle.matches("-----BEGIN CERTIFICATE-----").count(),
            webpki_root_certs::TLS_SERVER_ROOT_CERTS.len()
        );
        assert!(webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() > 100);
    }
}
