//! Certificate verification policy: which roots to trust and how much to
//! check (chain only, or chain and host name) for each sslmode, with the
//! handshake signature always checked against the certificate's key.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::TlsError;
use crate::config::{Config, ConfigError, RootCert, SslMode};

/// How the server certificate will be checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verification {
    /// Encrypt, but accept any certificate (the handshake signature is still
    /// checked against the certificate's key).
    None,
    /// Verify the chain against the roots, not the host name.
    Chain(RootCert),
    /// Verify the chain and the host name.
    ChainAndName(RootCert),
}

/// Decides, from the configuration, whether TLS is attempted (`None` means
/// `sslmode=disable`) and how the certificate is checked. Looks at the file
/// system only to see whether the default root certificate file exists.
pub fn verification_for(config: &Config) -> Result<Option<Verification>, TlsError> {
    let mode = config.get_sslmode();
    if config.get_sslrootcert() == Some(&RootCert::System) && mode != SslMode::VerifyFull {
        return Err(ConfigError::WeakSslModeWithSystemRoots { sslmode: mode }.into());
    }
    let default = config.get_default_sslrootcert();
    let roots = match config.get_sslrootcert() {
        Some(r) => Some(r.clone()),
        None => default
            .filter(|p| p.is_file())
            .map(|p| RootCert::File(p.to_path_buf())),
    };
    Ok(match mode {
        SslMode::Disable => None,
        SslMode::Prefer | SslMode::Require => {
            Some(roots.map_or(Verification::None, Verification::Chain))
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = roots.ok_or_else(|| TlsError::NoRootCert {
                sslmode: mode,
                default_path: default.map(Path::to_path_buf),
            })?;
            Some(if mode == SslMode::VerifyFull {
                Verification::ChainAndName(roots)
            } else {
                Verification::Chain(roots)
            })
        }
    })
}

fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Loads trust anchors.
pub fn load_roots(root: &RootCert) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    match root {
        RootCert::File(path) => {
            let bytes = std::fs::read(path).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    TlsError::RootCertMissing { path: path.clone() }
                } else {
                    TlsError::RootCertRead {
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
            let certs = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::RootCertParse {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(TlsError::RootCertEmpty { path: path.clone() });
            }
            for cert in certs {
                store.add(cert).map_err(|e| TlsError::RootCertInvalid {
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            }
        }
        RootCert::System => {
            let result = rustls_native_certs::load_native_certs();
            for e in &result.errors {
                tracing::warn!(error = %e, "problem loading a system root certificate");
            }
            let (added, ignored) = store.add_parsable_certificates(result.certs);
            if ignored > 0 {
                tracing::warn!(ignored, "ignored unparsable system root certificates");
            }
            if added == 0 {
                let detail = match result.errors.first() {
                    Some(e) => e.to_string(),
                    None => "the trust store is empty".to_string(),
                };
                return Err(TlsError::SystemRoots { detail });
            }
        }
    }
    Ok(store)
}

/// Accepts any certificate but still checks handshake signatures.
#[derive(Debug)]
struct AcceptAnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// verify-ca: the WebPKI verifier with only the host-name mismatch forgiven.
/// `WebPkiServerVerifier::verify_server_cert` checks the chain (signatures,
/// validity, trust anchor) before the name, so a name error means the chain
/// was fine.
#[derive(Debug)]
struct VerifyChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for VerifyChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The server certificate check of a verification policy, on the ring
/// provider. Public so that walrelay's own Kafka requests check a
/// broker's certificate by the same rules.
pub fn server_verifier(
    verification: &Verification,
) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let provider = ring_provider();
    let webpki = |roots: &RootCert| -> Result<Arc<WebPkiServerVerifier>, TlsError> {
        let store = load_roots(roots)?;
        WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))
    };
    Ok(match verification {
        Verification::None => Arc::new(AcceptAnyCertificate {
            algorithms: provider.signature_verification_algorithms,
        }),
        Verification::Chain(roots) => Arc::new(VerifyChainOnly {
            inner: webpki(roots)?,
        }),
        Verification::ChainAndName(roots) => webpki(roots)?,
    })
}

/// Builds the rustls client configuration for a verification policy.
pub fn client_config(verification: &Verification) -> Result<Arc<ClientConfig>, TlsError> {
    let provider = ring_provider();
    let verifier = server_verifier(verification)?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Arc::new(config))
}

pub(super) fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::InvalidServerName {
        host: host.to_string(),
    })
}
