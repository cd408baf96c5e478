//! Meaning of the backend messages a replication connection can receive.
//!
//! Pure functions from a [`RawFrame`] to a [`BackendMessage`]; no I/O. Only
//! the messages of the simple-query and replication (CopyBoth) flows are
//! understood; anything else is reported as [`BackendMessage::Other`] so the
//! caller decides whether it is a protocol violation in its current state.

use bytes::{Buf, Bytes};

use crate::error::{DbError, Error};
use crate::framing::RawFrame;

/// A decoded backend message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendMessage {
    Authentication(Authentication),
    ParameterStatus {
        name: String,
        value: String,
    },
    BackendKeyData {
        process_id: i32,
        secret_key: Bytes,
    },
    ReadyForQuery {
        status: u8,
    },
    RowDescription {
        columns: Vec<String>,
    },
    DataRow {
        values: Vec<Option<Bytes>>,
    },
    CommandComplete {
        tag: String,
    },
    EmptyQueryResponse,
    ErrorResponse(DbError),
    NoticeResponse(DbError),
    /// `'W'`: the server entered CopyBoth mode (after START_REPLICATION).
    CopyBothResponse,
    /// `'H'` / `'G'`: copy modes a replication client never asks for.
    CopyOutResponse,
    CopyInResponse,
    CopyData(Bytes),
    CopyDone,
    NegotiateProtocolVersion {
        newest_minor: i32,
        unrecognized: Vec<String>,
    },
    /// Any other tag; kept so the caller can name it in an error.
    Other {
        tag: u8,
    },
}

/// The `'R'` message family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication {
    Ok,
    CleartextPassword,
    Md5Password {
        salt: [u8; 4],
    },
    Sasl {
        mechanisms: Vec<String>,
    },
    SaslContinue {
        data: Bytes,
    },
    SaslFinal {
        data: Bytes,
    },
    /// Kerberos, GSSAPI, SSPI and anything newer: not supported.
    Unsupported {
        code: i32,
    },
}

/// Small bounds-checked reader over a message body.
struct Body {
    buf: Bytes,
    tag: u8,
}

impl Body {
    fn truncated(&self, what: &str) -> Error {
        Error::Protocol(format!(
            "backend message '{}' is truncated while reading {what}",
            char::from(self.tag).escape_default()
        ))
    }

    fn i16(&mut self, what: &str) -> Result<i16, Error> {
        if self.buf.remaining() < 2 {
            return Err(self.truncated(what));
        }
        Ok(self.buf.get_i16())
    }

    fn i32(&mut self, what: &str) -> Result<i32, Error> {
        if self.buf.remaining() < 4 {
            return Err(self.truncated(what));
        }
        Ok(self.buf.get_i32())
    }

    fn u8(&mut self, what: &str) -> Result<u8, Error> {
        if self.buf.remaining() < 1 {
            return Err(self.truncated(what));
        }
        Ok(self.buf.get_u8())
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<Bytes, Error> {
        if self.buf.remaining() < n {
            return Err(self.truncated(what));
        }
        Ok(self.buf.split_to(n))
    }

    /// A NUL-terminated string. Server strings are UTF-8 on a connection
    /// with `client_encoding=UTF8`, which the startup message requests;
    /// anything else is replaced lossily rather than failing a diagnostic.
    fn cstr(&mut self, what: &str) -> Result<String, Error> {
        let Some(end) = self.buf.iter().position(|&b| b == 0) else {
            return Err(self.truncated(what));
        };
        let s = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.advance(end + 1);
        Ok(s)
    }

    fn rest(&mut self) -> Bytes {
        self.buf.split_off(0)
    }
}

impl BackendMessage {
    /// The error for this message arriving where it has no place
    /// (`context`: "authentication", "streaming", ...), naming the message
    /// without its contents.
    pub(crate) fn unexpected(&self, context: &str) -> Error {
        let name = match self {
            BackendMessage::CopyData(_) => "CopyData".to_owned(),
            BackendMessage::Other { tag } => format!("'{}'", char::from(*tag).escape_default()),
            other => format!("{other:?}").chars().take(60).collect(),
        };
        Error::Protocol(format!("unexpected message {name} during {context}"))
    }
}

/// Decode one frame.
pub fn parse(frame: RawFrame) -> Result<BackendMessage, Error> {
    let tag = frame.tag;
    let mut b = Body {
        buf: frame.body,
        tag,
    };
    let msg = match tag {
        b'd' => BackendMessage::CopyData(b.rest()),
        b'R' => BackendMessage::Authentication(parse_auth(&mut b)?),
        b'S' => BackendMessage::ParameterStatus {
            name: b.cstr("parameter name")?,
            value: b.cstr("parameter value")?,
        },
        b'K' => BackendMessage::BackendKeyData {
            process_id: b.i32("process id")?,
            // Protocol 3.2 allows longer keys; keep whatever is there.
            secret_key: b.rest(),
        },
        b'Z' => BackendMessage::ReadyForQuery {
            status: b.u8("transaction status")?,
        },
        b'T' => {
            let n = b.i16("field count")?;
            let n = usize::try_from(n).map_err(|_| b.truncated("field count"))?;
            let mut columns = Vec::with_capacity(n.min(b.buf.remaining() / 19 + 1));
            for _ in 0..n {
                columns.push(b.cstr("field name")?);
                // table oid, column attnum, type oid, type size, type modifier, format
                b.bytes(4 + 2 + 4 + 2 + 4 + 2, "field description")?;
            }
            BackendMessage::RowDescription { columns }
        }
        b'D' => {
            let n = b.i16("column count")?;
            let n = usize::try_from(n).map_err(|_| b.truncated("column count"))?;
            let mut values = Vec::with_capacity(n.min(b.buf.remaining() / 4 + 1));
            for _ in 0..n {
                let len = b.i32("value length")?;
                if len < 0 {
                    values.push(None);
                } else {
                    values.push(Some(b.bytes(len as usize, "value")?));
                }
            }
            BackendMessage::DataRow { values }
        }
        b'C' => BackendMessage::CommandComplete {
            tag: b.cstr("command tag")?,
        },
        b'I' => BackendMessage::EmptyQueryResponse,
        b'E' => BackendMessage::ErrorResponse(parse_fields(&mut b)?),
        b'N' => BackendMessage::NoticeResponse(parse_fields(&mut b)?),
        b'W' => BackendMessage::CopyBothResponse,
        b'H' => BackendMessage::CopyOutResponse,
        b'G' => BackendMessage::CopyInResponse,
        b'c' => BackendMessage::CopyDone,
        b'v' => {
            let newest_minor = b.i32("newest minor version")?;
            let n = b.i32("option count")?;
            let mut unrecognized = Vec::new();
            for _ in 0..n.max(0) {
                unrecognized.push(b.cstr("option name")?);
            }
            BackendMessage::NegotiateProtocolVersion {
                newest_minor,
                unrecognized,
            }
        }
        other => BackendMessage::Other { tag: other },
    };
    Ok(msg)
}

fn parse_auth(b: &mut Body) -> Result<Authentication, Error> {
    let code = b.i32("authentication code")?;
    Ok(match code {
        0 => Authentication::Ok,
        3 => Authentication::CleartextPassword,
        5 => {
            let salt = b.bytes(4, "MD5 salt")?;
            Authentication::Md5Password {
                salt: [salt[0], salt[1], salt[2], salt[3]],
            }
        }
        10 => {
            let mut mechanisms = Vec::new();
            loop {
                let m = b.cstr("SASL mechanism")?;
                if m.is_empty() {
                    break;
                }
                mechanisms.push(m);
            }
            Authentication::Sasl { mechanisms }
        }
        11 => Authentication::SaslContinue { data: b.rest() },
        12 => Authentication::SaslFinal { data: b.rest() },
        code => Authentication::Unsupported { code },
    })
}

/// ErrorResponse / NoticeResponse fields: `(type byte, cstring)*, 0`.
fn parse_fields(b: &mut Body) -> Result<DbError, Error> {
    let mut e = DbError::default();
    loop {
        let field = b.u8("error field type")?;
        if field == 0 {
            break;
        }
        let value = b.cstr("error field value")?;
        match field {
            b'S' => e.severity = value,
            // The non-localized severity wins over the localized one.
            b'V' => e.severity = value,
            b'C' => e.code = value,
            b'M' => e.message = value,
            b'D' => e.detail = Some(value),
            b'H' => e.hint = Some(value),
            b'W' => e.context = Some(value),
            _ => {}
        }
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(tag: u8, body: &[u8]) -> RawFrame {
        RawFrame {
            tag,
            body: Bytes::copy_from_slice(body),
        }
    }

    #[test]
    fn error_response_keeps_sqlstate_and_message() {
        let body = b"SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user \"bob\"\0Fauth.c\0L335\0\0";
        let BackendMessage::ErrorResponse(e) = parse(raw(b'E', body)).unwrap() else {
            panic!("not an error")
        };
        assert_eq!(e.severity, "FATAL");
        assert_eq!(e.code, "28P01");
        assert_eq!(e.message, "password authentication failed for user \"bob\"");
        assert_eq!(e.detail, None);
    }

    #[test]
    fn notice_with_detail_and_hint() {
        let body = b"SWARNING\0C01000\0Mm\0Dd\0Hh\0\0";
        let BackendMessage::NoticeResponse(e) = parse(raw(b'N', body)).unwrap() else {
            panic!()
        };
        assert_eq!(
            (e.detail.as_deref(), e.hint.as_deref()),
            (Some("d"), Some("h"))
        );
    }

    #[test]
    fn authentication_variants() {
        assert_eq!(
            parse(raw(b'R', &[0, 0, 0, 0])).unwrap(),
            BackendMessage::Authentication(Authentication::Ok)
        );
        assert_eq!(
            parse(raw(b'R', &[0, 0, 0, 3])).unwrap(),
            BackendMessage::Authentication(Authentication::CleartextPassword)
        );
        assert_eq!(
            parse(raw(b'R', &[0, 0, 0, 5, 1, 2, 3, 4])).unwrap(),
            BackendMessage::Authentication(Authentication::Md5Password { salt: [1, 2, 3, 4] })
        );
        assert_eq!(
            parse(raw(
                b'R',
                b"\0\0\0\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"
            ))
            .unwrap(),
            BackendMessage::Authentication(Authentication::Sasl {
                mechanisms: vec!["SCRAM-SHA-256-PLUS".into(), "SCRAM-SHA-256".into()]
            })
        );
        assert_eq!(
            parse(raw(b'R', b"\0\0\0\x0br=abc")).unwrap(),
            BackendMessage::Authentication(Authentication::SaslContinue {
                data: Bytes::from_static(b"r=abc")
            })
        );
        assert_eq!(
            parse(raw(b'R', &[0, 0, 0, 7])).unwrap(),
            BackendMessage::Authentication(Authentication::Unsupported { code: 7 })
        );
        assert!(parse(raw(b'R', &[0, 0, 0, 5, 1])).is_err());
    }

    #[test]
    fn row_description_and_data_row() {
        let mut t = vec![0, 2];
        for name in [&b"systemid"[..], b"timeline"] {
            t.extend_from_slice(name);
            t.push(0);
            t.extend_from_slice(&[0; 18]);
        }
        assert_eq!(
            parse(raw(b'T', &t)).unwrap(),
            BackendMessage::RowDescription {
                columns: vec!["systemid".into(), "timeline".into()]
            }
        );
        let d = [0, 2, 0, 0, 0, 2, b'4', b'2', 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            parse(raw(b'D', &d)).unwrap(),
            BackendMessage::DataRow {
                values: vec![Some(Bytes::from_static(b"42")), None]
            }
        );
        // A value length beyond the body is an error, not a panic.
        assert!(parse(raw(b'D', &[0, 1, 0x7f, 0, 0, 0, b'x'])).is_err());
    }

    #[test]
    fn copy_messages_and_ready() {
        assert_eq!(
            parse(raw(b'W', &[0, 0, 0])).unwrap(),
            BackendMessage::CopyBothResponse
        );
        assert_eq!(parse(raw(b'c', &[])).unwrap(), BackendMessage::CopyDone);
        assert_eq!(
            parse(raw(b'd', b"w123")).unwrap(),
            BackendMessage::CopyData(Bytes::from_static(b"w123"))
        );
        assert_eq!(
            parse(raw(b'Z', b"I")).unwrap(),
            BackendMessage::ReadyForQuery { status: b'I' }
        );
        assert_eq!(
            parse(raw(b'C', b"IDENTIFY_SYSTEM\0")).unwrap(),
            BackendMessage::CommandComplete {
                tag: "IDENTIFY_SYSTEM".into()
            }
        );
        assert_eq!(
            parse(raw(b'?', b"")).unwrap(),
            BackendMessage::Other { tag: b'?' }
        );
    }

    #[test]
    fn truncated_bodies_never_panic() {
        let samples: [(u8, &[u8]); 6] = [
            (b'E', b"SERROR\0C4200"),
            (b'S', b"name"),
            (b'T', &[0, 1, b'a', 0, 0]),
            (b'K', &[0, 0]),
            (b'v', &[0, 0, 0, 0, 0, 0, 0, 9]),
            (b'Z', b""),
        ];
        for (tag, body) in samples {
            assert!(parse(raw(tag, body)).is_err(), "tag {}", tag as char);
        }
    }
}
