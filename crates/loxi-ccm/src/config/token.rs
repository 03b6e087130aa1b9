//! Where the loxilb token comes from, and how a new one reaches the clients without a
//! restart (docs/configuration.md#loxilb-authentication-and-tls).
//!
//! The token lives in one [`Token`] cell shared by every loxilb client. A token from a file
//! (`--loxilb-token-file`, e.g. a mounted Secret, which the kubelet rewrites when the Secret
//! changes) is re-read every [`FILE_REREAD`]; a token from a Secret
//! (`--loxilb-token-secret`) is watched. The value is never logged, printed or exported:
//! only that it changed, and from where.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use loxilb_client::Token;
use tracing::{info, warn};

/// How often a token file is read again. Reading a few bytes costs nothing; the kubelet
/// itself takes up to a minute to update a mounted Secret.
pub const FILE_REREAD: Duration = Duration::from_secs(2);

/// The key of the Secret holding the token when `--loxilb-token-secret` names none (the key
/// of deploy/31-secret.yaml).
pub const DEFAULT_SECRET_KEY: &str = "token";

/// A Secret holding the token: `namespace/name` or `namespace/name:key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl SecretRef {
    /// Parses `namespace/name[:key]`; the error says what is expected.
    pub fn parse(text: &str) -> Result<SecretRef, String> {
        let expected = "expected namespace/name or namespace/name:key, e.g. \
                        kube-system/loxi-ccm-loxilb-auth:token";
        let (path, key) = match text.trim().split_once(':') {
            Some((path, key)) => (path, key),
            None => (text.trim(), DEFAULT_SECRET_KEY),
        };
        let (namespace, name) = path.split_once('/').ok_or(expected)?;
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        let key_ok = !key.is_empty()
            && key.len() <= 253
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !label(namespace) || !loxi_domain::address_name::is_object_name(name) || !key_ok {
            return Err(expected.to_string());
        }
        Ok(SecretRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
            key: key.to_string(),
        })
    }
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.key)
    }
}

/// Reads a token file: its trimmed content, or why it cannot be used.
pub fn read_token_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(token.to_string())
}

/// Re-reads `path` every [`FILE_REREAD`] into `token` until `stop` resolves. A file that
/// cannot be read or is empty (a Secret being rewritten) keeps the token in use.
pub async fn reread_file(path: PathBuf, token: Token, stop: impl std::future::Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut failing = false;
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(FILE_REREAD) => {}
        }
        reread_once(&path, &token, &mut failing);
    }
}

/// One read of the token file; `failing` remembers that the last read failed, so that a
/// lasting problem is logged once. Answers whether the token changed.
pub fn reread_once(path: &Path, token: &Token, failing: &mut bool) -> bool {
    match read_token_file(path) {
        Ok(value) => {
            *failing = false;
            let changed = token.set(Some(&value));
            if changed {
                info!(file = %path.display(), "loxilb token changed: using the new one");
            }
            changed
        }
        Err(reason) => {
            if !*failing {
                *failing = true;
                warn!(%reason, "loxilb token file unusable; keeping the token in use");
            }
            false
        }
    }
}

/// The token in a Secret's data, trimmed; `None` when the key is missing or empty.
pub fn token_of(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })?;
    let text = String::from_utf8(bytes).ok()?;
    let trimmed = text.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

/// Watches the Secret and keeps `token` equal to its key until `stop` resolves. Deleted, or
/// without the key: no token (as loxilb without authentication expects). Watch errors are
/// retried with backoff by the watcher and keep the token in use.
pub async fn watch_secret(
    client: kube::Client,
    secret: SecretRef,
    token: Token,
    stop: impl std::future::Future<Output = ()>,
) {
    let api: Api<Secret> = Api::namespaced(client, &secret.namespace);
    // Only this Secret, so the permission can be limited to its name
    // (docs/configuration.md#loxilb-authentication-and-tls).
    let config = watcher::Config::default().fields(&format!("metadata.name={}", secret.name));
    let events = watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut stop = std::pin::pin!(stop);
    let mut reported_error = false;
    loop {
        let event = tokio::select! {
            () = &mut stop => return,
            event = events.next() => event,
        };
        let Some(event) = event else { return };
        let value = match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                reported_error = false;
                token_of(&s, &secret.key)
            }
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(e) => {
                if !reported_error {
                    reported_error = true;
                    warn!(secret = %secret, error = %e, "cannot watch the loxilb token Secret; keeping the token in use");
                }
                continue;
            }
        };
        let present = value.is_some();
        if token.set(value.as_deref()) {
            if present {
                info!(secret = %secret, "loxilb token changed: using the new one");
            } else {
                warn!(secret = %secret, "loxilb token Secret or key gone: sending no token");
            }
        }
    }
}

/// The initial token of a Secret, read once (at start-up, so the first calls carry it).
/// A missing Secret or key is no token; any other failure is an error.
pub async fn read_secret(
    client: &kube::Client,
    secret: &SecretRef,
) -> Result<Option<String>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
    match api.get_opt(&secret.name).await {
        Ok(found) => Ok(found.and_then(|s| token_of(&s, &secret.key))),
        Err(e) => Err(format!("reading the loxilb token Secret {secret}: {e}")),
    }
}

/// Follows the token's source for the life of the process (until `stop` resolves): a file
/// re-read, a Secret read now and then watched; a fixed token needs nothing.
pub async fn follow(
    client: &kube::Client,
    source: &super::TokenSource,
    token: &Token,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) {
    match source {
        super::TokenSource::Fixed => {}
        super::TokenSource::File(path) => {
            tokio::spawn(reread_file(path.clone(), token.clone(), stop));
        }
        super::TokenSource::Secret(secret) => {
            match read_secret(client, secret).await {
                Ok(value) => {
                    token.set(value.as_deref());
                }
                Err(e) => warn!(error = %e, "loxilb token not read yet; watching for it"),
            }
            tokio::spawn(watch_secret(
                client.clone(),
                secret.clone(),
                token.clone(),
                stop,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_refs() {
        assert_eq!(
            SecretRef::parse("kube-system/auth").unwrap(),
            SecretRef {
                namespace: "kube-system".into(),
                name: "auth".into(),
                key: "token".into()
            }
        );
        assert_eq!(SecretRef::parse("ns/a.b:my_key").unwrap().key, "my_key");
        for bad in [
            "",
            "auth",
            "/auth",
            "ns/",
            "ns/auth:",
            "NS/auth",
            "ns/a/b",
            "ns/auth:a b",
        ] {
            assert!(SecretRef::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn token_of_reads_data_then_string_data_trimmed() {
        let mut s = Secret::default();
        assert_eq!(token_of(&s, "token"), None);
        s.string_data = Some([("token".to_string(), " a \n".to_string())].into());
        assert_eq!(token_of(&s, "token").as_deref(), Some("a"));
        s.data = Some(
            [(
                "token".to_string(),
                k8s_openapi::ByteString(b"b\n".to_vec()),
            )]
            .into(),
        );
        assert_eq!(token_of(&s, "token").as_deref(), Some("b"));
        assert_eq!(token_of(&s, "other"), None);
    }

    #[test]
    fn a_rewritten_file_replaces_the_token_and_a_broken_one_keeps_it() {
        let path = std::env::temp_dir().join(format!("loxi-ccm-token-test-{}", std::process::id()));
        std::fs::write(&path, "one\n").unwrap();
        let token = Token::new(Some(&read_token_file(&path).unwrap()));
        let mut failing = false;
        assert!(!reread_once(&path, &token, &mut failing), "unchanged");
        std::fs::write(&path, " \n").unwrap();
        assert!(!reread_once(&path, &token, &mut failing));
        assert!(failing);
        assert_eq!(
            token.get().as_deref(),
            Some("one"),
            "an empty file keeps the token"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(!reread_once(&path, &token, &mut failing));
        assert_eq!(
            token.get().as_deref(),
            Some("one"),
            "a missing file keeps the token"
        );
        std::fs::write(&path, "two\n").unwrap();
        assert!(reread_once(&path, &token, &mut failing));
        assert!(!failing);
        assert_eq!(token.get().as_deref(), Some("two"));
        std::fs::remove_file(&path).unwrap();
    }
}
