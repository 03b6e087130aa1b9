//! Certificates for TLS tests (a loxilb simulator serving HTTPS): a CA and server
//! certificates it signs, made with `rcgen`, valid or already expired.

use anyhow::Result;

/// A certificate authority for tests.
pub struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

/// A server certificate and its private key, in PEM.
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestCa {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Result<TestCa> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key)?;
        Ok(TestCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// The CA certificate in PEM (what a client is told to trust).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server certificate for `hosts` (names or IP addresses), valid from 1975 to 4096.
    pub fn server_cert(&self, hosts: &[&str]) -> Result<ServerCert> {
        self.issue(hosts, false)
    }

    /// A server certificate for `hosts` that expired on 2001-01-01.
    pub fn expired_server_cert(&self, hosts: &[&str]) -> Result<ServerCert> {
        self.issue(hosts, true)
    }

    fn issue(&self, hosts: &[&str], expired: bool) -> Result<ServerCert> {
        let key = rcgen::KeyPair::generate()?;
        let mut params =
            rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            hosts.first().copied().unwrap_or("server"),
        );
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}
