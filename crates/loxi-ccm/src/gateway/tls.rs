//! Whether a Secret an HTTPS listener names can serve TLS (pure): its `tls.crt` must hold
//! PEM certificates, its `tls.key` a PEM private key of the first certificate. A Secret that
//! does not is the listener's `ResolvedRefs=False`, `InvalidCertificateRef`, as the Gateway
//! API asks for a malformed certificate reference (docs/gateway-api.md#http).
//!
//! Parsing and the key/certificate match are rustls' (already the TLS stack of this
//! binary, with its ring provider): no hand-written PEM or X.509 code. The certificate's
//! validity period is not judged (loxilb-ingress serves what it is given).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// The keys of a `kubernetes.io/tls` Secret's data.
pub const CERT_KEY: &str = "tls.crt";
pub const PRIVATE_KEY: &str = "tls.key";

/// Why the Secret's data cannot serve TLS (`None`: it can).
pub fn problem(data: Option<&BTreeMap<String, ByteString>>) -> Option<String> {
    let field = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.as_slice());
    let Some(cert) = field(CERT_KEY) else {
        return Some(format!("it has no {CERT_KEY}"));
    };
    let Some(key) = field(PRIVATE_KEY) else {
        return Some(format!("it has no {PRIVATE_KEY}"));
    };
    let chain: Vec<CertificateDer<'static>> =
        match CertificateDer::pem_slice_iter(cert).collect::<Result<_, _>>() {
            Ok(chain) => chain,
            Err(e) => return Some(format!("its {CERT_KEY} is not PEM certificates: {e}")),
        };
    if chain.is_empty() {
        return Some(format!("its {CERT_KEY} holds no PEM certificate"));
    }
    let key = match PrivateKeyDer::from_pem_slice(key) {
        Ok(key) => key,
        Err(e) => return Some(format!("its {PRIVATE_KEY} is not a PEM private key: {e}")),
    };
    // Loads the key and, where the key tells its public half, parses the first certificate
    // and checks that it carries that key.
    match CertifiedKey::from_der(chain, key, &default_provider()) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "its {CERT_KEY} and {PRIVATE_KEY} are not a usable certificate and key: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(cert: &str, key: &str) -> BTreeMap<String, ByteString> {
        BTreeMap::from([
            (CERT_KEY.to_string(), ByteString(cert.as_bytes().to_vec())),
            (PRIVATE_KEY.to_string(), ByteString(key.as_bytes().to_vec())),
        ])
    }

    #[test]
    fn a_certificate_with_its_key_is_usable() {
        let ca = testenv::certs::TestCa::new("gateway-test-ca").unwrap();
        let c = ca.server_cert(&["example.com"]).unwrap();
        assert_eq!(problem(Some(&data(&c.cert_pem, &c.key_pem))), None);
        // The chain may carry its CA after the server certificate.
        let chain = format!("{}{}", c.cert_pem, ca.pem());
        assert_eq!(problem(Some(&data(&chain, &c.key_pem))), None);
    }

    #[test]
    fn malformed_or_mismatched_data_is_not() {
        let ca = testenv::certs::TestCa::new("gateway-test-ca").unwrap();
        let a = ca.server_cert(&["a.example.com"]).unwrap();
        let b = ca.server_cert(&["b.example.com"]).unwrap();
        // The upstream conformance suite's malformed Secret: "Hello world" in both.
        let hello = "Hello world\n";
        for (cert, key, says) in [
            (hello, hello, "holds no PEM certificate"),
            (a.cert_pem.as_str(), hello, "is not a PEM private key"),
            (hello, a.key_pem.as_str(), "holds no PEM certificate"),
            (
                a.cert_pem.as_str(),
                b.key_pem.as_str(),
                "not a usable certificate",
            ),
            (
                a.key_pem.as_str(),
                a.key_pem.as_str(),
                "holds no PEM certificate",
            ),
        ] {
            let p = problem(Some(&data(cert, key))).expect(says);
            assert!(p.contains(says), "{p}");
        }
        let broken = a.cert_pem.replace('M', "A");
        assert!(problem(Some(&data(&broken, &a.key_pem))).is_some());
        assert!(problem(None).unwrap().contains("no tls.crt"));
        let mut only_cert = data(&a.cert_pem, &a.key_pem);
        only_cert.remove(PRIVATE_KEY);
        assert!(problem(Some(&only_cert)).unwrap().contains("no tls.key"));
    }
}
