//! The issuer's RSA signing keys: committed, **test-only** fixtures.
//!
//! `ring` signs RS256 from a PKCS#8 key but cannot generate RSA keys, and
//! `rcgen` on its ring backend cannot either; a keygen crate or a call to
//! `openssl` per test run would add a dependency or a tool for what four
//! constant keys do as well. These four 2048-bit keys were made once with
//! `openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048`. They
//! sign tokens for throwaway brokers on loopback and nothing else: never
//! trust them anywhere. Four allow an issuer three rotations.

use anyhow::{anyhow, Context};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::rsa::PublicKeyComponents;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

/// TEST-ONLY private keys (PKCS#8 PEM), see the module documentation.
const FIXTURES: [&str; 4] = [
    include_str!("keys/test-rsa-1.pk8.pem"),
    include_str!("keys/test-rsa-2.pk8.pem"),
    include_str!("keys/test-rsa-3.pk8.pem"),
    include_str!("keys/test-rsa-4.pk8.pem"),
];

/// How many keys an issuer has (the first is published at start).
pub(crate) const KEY_COUNT: usize = FIXTURES.len();

/// One RSA key and its key id.
pub(crate) struct SigningKey {
    kid: String,
    pair: RsaKeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Fixture `index`, with key id `<prefix>-<index + 1>`.
    pub(crate) fn fixture(index: usize, kid_prefix: &str) -> anyhow::Result<SigningKey> {
        let pem = FIXTURES
            .get(index)
            .ok_or_else(|| anyhow!("only {KEY_COUNT} test keys exist (asked for #{index})"))?;
        let pair = RsaKeyPair::from_pkcs8(&pem_body(pem)?)
            .map_err(|e| anyhow!("test key #{index} is not an RSA PKCS#8 key: {e}"))?;
        Ok(SigningKey {
            kid: format!("{kid_prefix}-{}", index + 1),
            pair,
        })
    }

    pub(crate) fn kid(&self) -> &str {
        &self.kid
    }

    /// The RS256 (RSASSA-PKCS1-v1_5 with SHA-256) signature of `message`.
    pub(crate) fn sign(&self, message: &[u8]) -> anyhow::Result<Vec<u8>> {
        let mut signature = vec![0; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                message,
                &mut signature,
            )
            .map_err(|_| anyhow!("signing with test key {}", self.kid))?;
        Ok(signature)
    }

    /// The public key as a JSON Web Key (RFC 7517/7518: modulus and
    /// exponent big-endian without leading zeros, base64url).
    pub(crate) fn jwk(&self) -> serde_json::Value {
        let public = PublicKeyComponents::<Vec<u8>>::from(self.pair.public());
        serde_json::json!({
            "kty": "RSA",
            "kid": self.kid,
            "use": "sig",
            "alg": "RS256",
            "n": URL_SAFE_NO_PAD.encode(&public.n),
            "e": URL_SAFE_NO_PAD.encode(&public.e),
        })
    }

    /// The DER of the public key (`RSAPublicKey`), for verifying in tests.
    #[cfg(test)]
    pub(crate) fn public_der(&self) -> Vec<u8> {
        use ring::signature::KeyPair as _;
        self.pair.public_key().as_ref().to_vec()
    }
}

/// The DER inside a PEM block.
fn pem_body(pem: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .collect();
    STANDARD.decode(body).context("the PEM's base64")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    #[test]
    fn every_fixture_signs_what_its_public_key_verifies() {
        for i in 0..KEY_COUNT {
            let key = SigningKey::fixture(i, "k").unwrap();
            assert_eq!(key.kid(), format!("k-{}", i + 1));
            let sig = key.sign(b"payload").unwrap();
            let public = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_der());
            public.verify(b"payload", &sig).unwrap();
            assert!(public.verify(b"other", &sig).is_err());
            let jwk = key.jwk();
            assert_eq!(jwk["kty"], "RSA");
            assert_eq!(jwk["e"], "AQAB", "65537");
            // 2048 bits: 256 bytes, 342 base64url characters.
            assert_eq!(jwk["n"].as_str().unwrap().len(), 342);
        }
        assert!(SigningKey::fixture(KEY_COUNT, "k").is_err());
    }
}
