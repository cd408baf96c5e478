//! A [`TlsPlan`] as a rustls client configuration: the broker's
//! certificate checked by walrelay-pg's rules (the same ones PostgreSQL
//! connections use), and the client certificate for mutual TLS.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::settings::{Pem, TlsPlan};

/// The rustls configuration of `plan`; reads the CA and client files.
pub fn client_config(plan: &TlsPlan) -> Result<Arc<rustls::ClientConfig>, String> {
    let verifier = walrelay_pg::tls::server_verifier(&plan.verification)
        .map_err(|e| format!("the TLS trust settings: {e}"))?;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .dangerous()
    .with_custom_certificate_verifier(verifier);
    let config = match &plan.client_cert {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(chain(&cert.chain)?, key(&cert.key)?)
            .map_err(|e| format!("the client certificate and key: {e}"))?,
    };
    Ok(Arc::new(config))
}

fn chain(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = match pem {
        Pem::File(path) => CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>(),
        Pem::Inline(text) => CertificateDer::pem_slice_iter(text.as_bytes()).collect(),
    }
    .map_err(|e| format!("the client certificate: {e}"))?;
    if certs.is_empty() {
        return Err("the client certificate PEM holds no certificate".to_owned());
    }
    Ok(certs)
}

fn key(pem: &Pem) -> Result<PrivateKeyDer<'static>, String> {
    match pem {
        Pem::File(path) => PrivateKeyDer::from_pem_file(path)
            .map_err(|e| format!("the client key {}: {e}", path.display())),
        Pem::Inline(text) => PrivateKeyDer::from_pem_slice(text.as_bytes())
            .map_err(|e| format!("the client key: {e}")),
    }
}
