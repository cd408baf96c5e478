//! Client side of PostgreSQL authentication: trust, cleartext, MD5 and
//! SCRAM-SHA-256 (with `tls-server-end-point` channel binding over TLS).
//!
//! A pure state machine: [`Authenticator::step`] takes the server's
//! `Authentication*` message and returns the bytes to send back, so the
//! connection code only shuttles frames and every branch is unit-testable.
//!
//! ```text
//!            AuthenticationOk
//!   Start ─────────────────────────────────────────────▶ Done
//!     │ Cleartext / MD5 ─▶ PasswordMessage ─▶ (Ok) ─────▶ Done
//!     │ SASL ─▶ SASLInitialResponse ─▶ Scram
//!   Scram ── SASLContinue ─▶ SASLResponse ─▶ Scram
//!   Scram ── SASLFinal (server signature verified) ─▶ Final ── Ok ─▶ Done
//! ```

use bytes::BytesMut;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;

use crate::backend::Authentication;
use crate::config::ChannelBinding as BindingPolicy;
use crate::error::Error;

enum State {
    Start,
    /// A password was sent; only AuthenticationOk may follow.
    PasswordSent,
    Scram(Box<ScramSha256>),
    /// SASLFinal verified; only AuthenticationOk may follow.
    ScramFinal,
    Done,
}

/// Drives one authentication exchange.
pub struct Authenticator<'a> {
    user: &'a str,
    password: Option<&'a [u8]>,
    /// `tls-server-end-point` data when the connection is TLS.
    channel_binding: Option<Vec<u8>>,
    /// libpq's `channel_binding` setting.
    policy: BindingPolicy,
    /// Whether SCRAM-SHA-256-PLUS was used.
    bound: bool,
    state: State,
}

/// What to do after a step.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send these bytes (a complete frontend message) and wait for the next
    /// Authentication message.
    Send(BytesMut),
    /// Authentication succeeded.
    Done,
}

impl<'a> Authenticator<'a> {
    pub fn new(
        user: &'a str,
        password: Option<&'a [u8]>,
        channel_binding: Option<Vec<u8>>,
        policy: BindingPolicy,
    ) -> Self {
        Authenticator {
            user,
            password,
            channel_binding: if policy == BindingPolicy::Disable {
                None
            } else {
                channel_binding
            },
            policy,
            bound: false,
            state: State::Start,
        }
    }

    /// With `channel_binding=require`, success without binding is an error:
    /// the server might be an impostor that skipped authentication.
    fn done(&mut self) -> Result<Step, Error> {
        if self.policy == BindingPolicy::Require && !self.bound {
            return Err(Error::Auth(
                "channel_binding=require, but the server authenticated this client without \
                 SCRAM channel binding; use TLS and scram-sha-256 in pg_hba.conf, or relax \
                 channel_binding"
                    .into(),
            ));
        }
        self.state = State::Done;
        Ok(Step::Done)
    }

    fn password(&self, method: &str) -> Result<&'a [u8], Error> {
        self.password.ok_or_else(|| {
            Error::Auth(format!(
                "the server asks for {method} password authentication for user \"{}\" but no \
                 password is configured; set it in the connection URL, PGPASSWORD or ~/.pgpass",
                self.user
            ))
        })
    }

    pub fn step(&mut self, msg: Authentication) -> Result<Step, Error> {
        let mut out = BytesMut::new();
        let state = std::mem::replace(&mut self.state, State::Done);
        match (state, msg) {
            (State::Start | State::PasswordSent | State::ScramFinal, Authentication::Ok) => {
                self.done()
            }
            (State::Start, Authentication::CleartextPassword) => {
                let pw = self.password("cleartext")?;
                frontend::password_message(pw, &mut out)
                    .map_err(Error::io("encoding a password message"))?;
                self.state = State::PasswordSent;
                Ok(Step::Send(out))
            }
            (State::Start, Authentication::Md5Password { salt }) => {
                let pw = self.password("MD5")?;
                let hash = md5_hash(self.user.as_bytes(), pw, salt);
                frontend::password_message(hash.as_bytes(), &mut out)
                    .map_err(Error::io("encoding a password message"))?;
                self.state = State::PasswordSent;
                Ok(Step::Send(out))
            }
            (State::Start, Authentication::Sasl { mechanisms }) => {
                let pw = self.password("SCRAM-SHA-256")?;
                let has = |m: &str| mechanisms.iter().any(|x| x == m);
                let (mechanism, binding) = match self.channel_binding.take() {
                    Some(data) if has(sasl::SCRAM_SHA_256_PLUS) => {
                        self.bound = true;
                        (
                            sasl::SCRAM_SHA_256_PLUS,
                            ChannelBinding::tls_server_end_point(data),
                        )
                    }
                    _ if self.policy == BindingPolicy::Require => {
                        return Err(Error::Auth(format!(
                            "channel_binding=require, but {}; connect with TLS (sslmode=require \
                             or stricter) to a server that offers SCRAM-SHA-256-PLUS",
                            if has(sasl::SCRAM_SHA_256_PLUS) {
                                "the server certificate's signature algorithm gives no channel binding hash"
                            } else {
                                "the server does not offer SCRAM-SHA-256-PLUS (is the connection TLS?)"
                            }
                        )))
                    }
                    // TLS, but the server does not offer binding (or we
                    // could not hash its certificate): say so in the GS2
                    // header ("y"), which lets the server detect a
                    // downgrade by a man in the middle.
                    Some(_) if has(sasl::SCRAM_SHA_256) => {
                        (sasl::SCRAM_SHA_256, ChannelBinding::unrequested())
                    }
                    None if has(sasl::SCRAM_SHA_256) => {
                        (sasl::SCRAM_SHA_256, ChannelBinding::unsupported())
                    }
                    _ => {
                        return Err(Error::Auth(format!(
                            "the server offers only the SASL mechanisms {mechanisms:?}; walrelay \
                             supports SCRAM-SHA-256 and SCRAM-SHA-256-PLUS"
                        )))
                    }
                };
                let scram = ScramSha256::new(pw, binding);
                frontend::sasl_initial_response(mechanism, scram.message(), &mut out)
                    .map_err(Error::io("encoding a SASL message"))?;
                self.state = State::Scram(Box::new(scram));
                Ok(Step::Send(out))
            }
            (State::Scram(mut scram), Authentication::SaslContinue { data }) => {
                scram
                    .update(&data)
                    .map_err(|e| Error::Auth(format!("invalid SCRAM server-first message: {e}")))?;
                frontend::sasl_response(scram.message(), &mut out)
                    .map_err(Error::io("encoding a SASL message"))?;
                self.state = State::Scram(scram);
                Ok(Step::Send(out))
            }
            (State::Scram(mut scram), Authentication::SaslFinal { data }) => {
                // Verifies the server signature: a server that does not know
                // the password cannot complete the exchange.
                scram.finish(&data).map_err(|e| {
                    Error::Auth(format!(
                        "the server's SCRAM signature did not verify ({e}); refusing to continue"
                    ))
                })?;
                self.state = State::ScramFinal;
                // The server follows with AuthenticationOk; nothing to send.
                Ok(Step::Send(BytesMut::new()))
            }
            (State::Scram(_), Authentication::Ok) => Err(Error::Auth(
                "the server ended SCRAM authentication without proving it knows the password"
                    .into(),
            )),
            (_, Authentication::Unsupported { code }) => Err(Error::Auth(format!(
                "the server asks for an authentication method walrelay does not support (code \
                 {code}: Kerberos, GSSAPI or SSPI); use scram-sha-256, md5, password or trust in \
                 pg_hba.conf for this client"
            ))),
            (_, other) => Err(Error::Protocol(format!(
                "unexpected authentication message {other:?} at this point of the exchange"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_is_done_at_once() {
        let mut a = Authenticator::new("u", None, None, BindingPolicy::Prefer);
        assert_eq!(a.step(Authentication::Ok).unwrap(), Step::Done);
    }

    #[test]
    fn cleartext_sends_the_password() {
        let mut a = Authenticator::new("u", Some(b"secret"), None, BindingPolicy::Prefer);
        let Step::Send(out) = a.step(Authentication::CleartextPassword).unwrap() else {
            panic!()
        };
        assert_eq!(&out[..], b"p\0\0\0\x0bsecret\0");
        assert_eq!(a.step(Authentication::Ok).unwrap(), Step::Done);
    }

    #[test]
    fn md5_sends_the_salted_hash() {
        let mut a = Authenticator::new("u", Some(b"secret"), None, BindingPolicy::Prefer);
        let Step::Send(out) = a
            .step(Authentication::Md5Password { salt: [1, 2, 3, 4] })
            .unwrap()
        else {
            panic!()
        };
        let expected = md5_hash(b"u", b"secret", [1, 2, 3, 4]);
        assert!(expected.starts_with("md5") && expected.len() == 35);
        assert_eq!(&out[5..out.len() - 1], expected.as_bytes());
    }

    #[test]
    fn missing_password_is_actionable() {
        let mut a = Authenticator::new("bob", None, None, BindingPolicy::Prefer);
        let err = a
            .step(Authentication::Md5Password { salt: [0; 4] })
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no password is configured") && err.contains("PGPASSWORD"),
            "{err}"
        );
    }

    #[test]
    fn scram_picks_plus_only_with_tls_binding() {
        let mechs = || Authentication::Sasl {
            mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()],
        };
        let mut plain = Authenticator::new("u", Some(b"pw"), None, BindingPolicy::Prefer);
        let Step::Send(out) = plain.step(mechs()).unwrap() else {
            panic!()
        };
        assert!(out.windows(14).any(|w| w == b"SCRAM-SHA-256\0"));
        assert!(out.windows(3).any(|w| w == b"n,,"), "no-binding GS2 header");

        let mut tls =
            Authenticator::new("u", Some(b"pw"), Some(vec![7; 32]), BindingPolicy::Prefer);
        let Step::Send(out) = tls.step(mechs()).unwrap() else {
            panic!()
        };
        assert!(out.windows(19).any(|w| w == b"SCRAM-SHA-256-PLUS\0"));
        assert!(out.windows(22).any(|w| w == b"p=tls-server-end-point"));

        let mut tls_no_plus =
            Authenticator::new("u", Some(b"pw"), Some(vec![7; 32]), BindingPolicy::Prefer);
        let Step::Send(out) = tls_no_plus
            .step(Authentication::Sasl {
                mechanisms: vec!["SCRAM-SHA-256".into()],
            })
            .unwrap()
        else {
            panic!()
        };
        assert!(
            out.windows(3).any(|w| w == b"y,,"),
            "binding-capable GS2 header"
        );
    }

    #[test]
    fn channel_binding_policy() {
        let sasl = || Authentication::Sasl {
            mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()],
        };
        // require: trust or a password without binding is refused...
        let mut a = Authenticator::new("u", Some(b"pw"), None, BindingPolicy::Require);
        assert!(a.step(Authentication::Ok).is_err());
        let mut a = Authenticator::new("u", Some(b"pw"), None, BindingPolicy::Require);
        assert!(a
            .step(sasl())
            .unwrap_err()
            .to_string()
            .contains("channel_binding=require"));
        // ...and with TLS data it binds.
        let mut a = Authenticator::new("u", Some(b"pw"), Some(vec![1; 32]), BindingPolicy::Require);
        let Step::Send(out) = a.step(sasl()).unwrap() else {
            panic!()
        };
        assert!(out.windows(19).any(|w| w == b"SCRAM-SHA-256-PLUS\0"));
        // disable: never binds, even over TLS.
        let mut a = Authenticator::new("u", Some(b"pw"), Some(vec![1; 32]), BindingPolicy::Disable);
        let Step::Send(out) = a.step(sasl()).unwrap() else {
            panic!()
        };
        assert!(out.windows(3).any(|w| w == b"n,,"));
    }

    #[test]
    fn ok_before_scram_final_is_rejected() {
        let mut a = Authenticator::new("u", Some(b"pw"), None, BindingPolicy::Prefer);
        a.step(Authentication::Sasl {
            mechanisms: vec!["SCRAM-SHA-256".into()],
        })
        .unwrap();
        assert!(a.step(Authentication::Ok).is_err());
    }

    #[test]
    fn unsupported_methods_are_explained() {
        let mut a = Authenticator::new("u", Some(b"pw"), None, BindingPolicy::Prefer);
        let err = a
            .step(Authentication::Unsupported { code: 7 })
            .unwrap_err()
            .to_string();
        assert!(err.contains("GSSAPI"), "{err}");
    }
}
