//! The client side of SCRAM (RFC 5802) as Kafka runs it: SHA-256 or
//! SHA-512, no channel binding (`n,,`), the user name in the first
//! message. A pure state machine: the connection passes the server's
//! messages in and sends what comes out, so every step is tested on the
//! RFC's own exchange below.
//!
//! Like Kafka's Java client, the password is used as its UTF-8 bytes
//! (no SASLprep); Kafka's broker stores the credentials the same way.

use std::num::NonZeroU32;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};

/// The hash of a SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    fn hmac(self) -> hmac::Algorithm {
        match self {
            Hash::Sha256 => hmac::HMAC_SHA256,
            Hash::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Hash::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Hash::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Hash::Sha256 => &digest::SHA256,
            Hash::Sha512 => &digest::SHA512,
        }
    }

    fn len(self) -> usize {
        self.digest().output_len()
    }
}

/// Kafka's lower bound on the iteration count (`ScramMechanism`): a
/// server asking for fewer is not a Kafka broker to trust.
const MIN_ITERATIONS: u32 = 4096;

/// One SCRAM exchange, from the client's first message to the server's
/// verified signature.
pub struct Scram {
    hash: Hash,
    password: Vec<u8>,
    client_nonce: String,
    client_first_bare: String,
    /// The server signature expected in the final message, once the
    /// client's proof is sent.
    expected_signature: Option<Vec<u8>>,
}

impl Scram {
    /// `client_nonce`: printable characters without `,` (a random one from
    /// [`random_nonce`] outside tests).
    #[must_use]
    pub fn new(hash: Hash, username: &str, password: &str, client_nonce: String) -> Scram {
        let client_first_bare = format!("n={},r={client_nonce}", sasl_name(username));
        Scram {
            hash,
            password: password.as_bytes().to_vec(),
            client_nonce,
            client_first_bare,
            expected_signature: None,
        }
    }

    /// The client-first message.
    #[must_use]
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// The server-first message in, the client-final message (with the
    /// proof) out.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| "the server's first SCRAM message is not UTF-8".to_owned())?;
        let field = |name: char| {
            server_first
                .split(',')
                .find_map(|f| f.strip_prefix(name).and_then(|f| f.strip_prefix('=')))
                .ok_or_else(|| format!("the server's first SCRAM message has no {name}="))
        };
        let nonce = field('r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err("the server's SCRAM nonce does not extend ours".to_owned());
        }
        let salt = BASE64
            .decode(field('s')?)
            .map_err(|e| format!("the server's SCRAM salt: {e}"))?;
        let iterations: u32 = field('i')?
            .parse()
            .map_err(|e| format!("the server's SCRAM iteration count: {e}"))?;
        if iterations < MIN_ITERATIONS {
            return Err(format!(
                "the server asks for {iterations} SCRAM iterations, fewer than Kafka's minimum {MIN_ITERATIONS}"
            ));
        }
        let mut salted = vec![0u8; self.hash.len()];
        pbkdf2::derive(
            self.hash.pbkdf2(),
            NonZeroU32::new(iterations).expect("at least MIN_ITERATIONS"),
            &salt,
            &self.password,
            &mut salted,
        );
        let salted = hmac::Key::new(self.hash.hmac(), &salted);
        let client_key = hmac::sign(&salted, b"Client Key");
        let stored_key = digest::digest(self.hash.digest(), client_key.as_ref());
        // `biws` is base64 of the GS2 header `n,,`.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac::sign(
            &hmac::Key::new(self.hash.hmac(), stored_key.as_ref()),
            auth_message.as_bytes(),
        );
        let proof: Vec<u8> = client_key
            .as_ref()
            .iter()
            .zip(signature.as_ref())
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hmac::sign(&salted, b"Server Key");
        let server_signature = hmac::sign(
            &hmac::Key::new(self.hash.hmac(), server_key.as_ref()),
            auth_message.as_bytes(),
        );
        self.expected_signature = Some(server_signature.as_ref().to_vec());
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message: the server proved it knows the
    /// credentials, or it reported an error.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(server_final)
            .map_err(|_| "the server's final SCRAM message is not UTF-8".to_owned())?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(format!("the server refused the SCRAM proof: {error}"));
        }
        let expected = self
            .expected_signature
            .as_ref()
            .ok_or_else(|| "the server's final SCRAM message came too early".to_owned())?;
        let got = text
            .split(',')
            .find_map(|f| f.strip_prefix("v="))
            .ok_or_else(|| "the server's final SCRAM message has no v=".to_owned())
            .and_then(|v| {
                BASE64
                    .decode(v)
                    .map_err(|e| format!("the server's SCRAM signature: {e}"))
            })?;
        // Compared in full whatever differs first: the time taken says
        // nothing of where.
        let same = got.len() == expected.len()
            && got
                .iter()
                .zip(expected)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(
                "the server's SCRAM signature is wrong: it does not hold these credentials"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// A user name as RFC 5802 writes it: `=` and `,` escaped.
fn sasl_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// 24 random printable characters (base64 of 18 random bytes, no `,`).
pub fn random_nonce() -> Result<String, String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 18];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness for the SCRAM nonce".to_owned())?;
    Ok(BASE64.encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677, section 3: the SCRAM-SHA-256 exchange of user `user`,
    /// password `pencil`.
    #[test]
    fn the_rfc_7677_exchange_gives_its_proof_and_accepts_its_signature() {
        let mut scram = Scram::new(
            Hash::Sha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".to_owned(),
        );
        assert_eq!(scram.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = scram.client_final(server_first).unwrap();
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        scram
            .verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        let wrong = scram
            .verify_server_final(b"v=7rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap_err();
        assert!(wrong.contains("signature is wrong"), "{wrong}");
    }

    #[test]
    fn a_server_that_does_not_extend_the_nonce_or_skimps_on_iterations_is_refused() {
        let mut scram = Scram::new(Hash::Sha512, "u", "p", "abc".to_owned());
        let e = scram.client_final(b"r=xyz1,s=QUJD,i=4096").unwrap_err();
        assert!(e.contains("nonce"), "{e}");
        let e = scram.client_final(b"r=abc,s=QUJD,i=4096").unwrap_err();
        assert!(e.contains("nonce"), "{e}");
        let e = scram.client_final(b"r=abcd,s=QUJD,i=1").unwrap_err();
        assert!(e.contains("fewer than"), "{e}");
        let e = scram.client_final(b"r=abcd,i=4096").unwrap_err();
        assert!(e.contains("no s="), "{e}");
        assert!(scram
            .verify_server_final(b"v=AAAA")
            .unwrap_err()
            .contains("too early"));
        assert!(scram
            .verify_server_final(b"e=invalid-proof")
            .unwrap_err()
            .contains("invalid-proof"));
    }

    #[test]
    fn user_names_are_escaped_and_nonces_are_printable() {
        let scram = Scram::new(Hash::Sha512, "a=b,c", "p", "n".to_owned());
        assert_eq!(scram.client_first(), b"n,,n=a=3Db=2Cc,r=n");
        let nonce = random_nonce().unwrap();
        assert_eq!(nonce.len(), 24);
        assert!(!nonce.contains(','));
        assert_ne!(nonce, random_nonce().unwrap());
    }
}
