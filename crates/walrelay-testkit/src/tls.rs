//! Test certificate authorities and server/client certificates built with
//! `rcgen`.
//!
//! Every [`TestCa`] is a fresh, self-signed CA with its own key, so two CAs
//! made with the same name are still unrelated: a certificate issued by one
//! does not verify against the other (handy for "wrong CA" tests).

use std::path::Path;

use anyhow::Context;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, both PEM encoded.
///
/// Used as [`crate::ClusterOptions::tls`]: the server certificate and key
/// are written into the data directory as `server.crt` / `server.key`.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The leaf certificate (PEM).
    pub cert_pem: String,
    /// The private key of the leaf certificate (PKCS#8 PEM).
    pub key_pem: String,
}

impl TlsMaterial {
    /// Writes the certificate to `cert_path` and the key to `key_path`
    /// (mode 0600).
    pub fn write(&self, cert_path: &Path, key_path: &Path) -> anyhow::Result<()> {
        write_file(cert_path, self.cert_pem.as_bytes(), 0o644)?;
        write_file(key_path, self.key_pem.as_bytes(), 0o600)
    }
}

/// A throwaway certificate authority.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// Creates a new self-signed CA whose subject common name is
    /// `common_name`.
    pub fn new(common_name: &str) -> anyhow::Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("generating CA key")?;
        let cert = params.self_signed(&key).context("self-signing CA")?;
        Ok(TestCa { cert, key })
    }

    /// The CA certificate (PEM), for clients' trust stores or
    /// `ssl_ca_file`.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate (PEM) to `path`.
    pub fn write_cert(&self, path: &Path) -> anyhow::Result<()> {
        write_file(path, self.cert.pem().as_bytes(), 0o644)
    }

    /// Issues a server certificate for `names`. Each name that parses as an
    /// IP address becomes an IP subject alternative name, every other one a
    /// DNS name. The first name is also the subject common name.
    pub fn server_cert(&self, names: &[&str]) -> anyhow::Result<TlsMaterial> {
        self.issue(
            names,
            names.first().copied().unwrap_or("server"),
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// Issues a client certificate whose common name is `common_name` (for
    /// PostgreSQL `cert` authentication the CN is the user name).
    pub fn client_cert(&self, common_name: &str) -> anyhow::Result<TlsMaterial> {
        self.issue(&[], common_name, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        names: &[&str],
        common_name: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> anyhow::Result<TlsMaterial> {
        let sans: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).context("certificate names")?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("generating leaf key")?;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .context("signing leaf certificate")?;
        Ok(TlsMaterial {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(contents)
        .with_context(|| format!("writing {}", path.display()))?;
    // `mode` above only applies to newly created files.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))?;
    Ok(())
}

pub(crate) fn write_private_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    write_file(path, contents, 0o600)
}
