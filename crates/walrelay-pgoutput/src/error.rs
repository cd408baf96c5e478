//! Decoding errors.
//!
//! The decoder consumes bytes that come from the network. A bug in a proxy, a
//! protocol version mismatch or a corrupted buffer must surface as a typed,
//! descriptive error that the relay can log and stop on — never as a panic
//! and never as a giant allocation driven by an attacker-chosen length
//! field. Every variant names the field (`what`) or message it was decoding
//! so a failure can be diagnosed from the log line alone.

/// Why a pgoutput message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer ended before a field was complete.
    #[error(
        "unexpected end of message reading {what}: needed {needed} bytes, {remaining} remaining"
    )]
    UnexpectedEof {
        /// The field being read.
        what: &'static str,
        /// Bytes the field needs (saturated at `usize::MAX` for absurd sizes).
        needed: usize,
        /// Bytes left in the buffer.
        remaining: usize,
    },
    /// The first byte is not a known pgoutput message tag.
    #[error("unknown pgoutput message tag 0x{0:02X} ({p})", p = printable(*.0))]
    UnknownMessage(u8),
    /// A TupleData column kind other than `n`, `u`, `t`, `b`.
    #[error("unknown tuple column kind 0x{0:02X} ({p})", p = printable(*.0))]
    UnknownTupleKind(u8),
    /// A NUL-terminated string had no NUL before the end of the buffer.
    #[error("missing NUL terminator in {what}")]
    MissingNul {
        /// The string field being read.
        what: &'static str,
    },
    /// A string field that must be text is not valid UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The string field being read.
        what: &'static str,
    },
    /// A message decoded completely but bytes were left over, which means our
    /// idea of the format and the sender's disagree.
    #[error("{remaining} trailing bytes after {message} message")]
    TrailingBytes {
        /// The message kind that was decoded.
        message: &'static str,
        /// Bytes left over.
        remaining: usize,
    },
    /// A field holds a value outside its allowed range (a negative length,
    /// an unknown marker byte, a boolean that is neither 0 nor 1, ...).
    #[error("invalid value {value} for {what}")]
    InvalidValue {
        /// The field being read.
        what: &'static str,
        /// The value found.
        value: i64,
    },
    /// A Stream Start arrived inside a streamed block, or a Stream Stop
    /// outside one (only reported by the stateful [`crate::Decoder`]).
    #[error("unexpected {message} message while {where_}", where_ = if *.in_stream { "inside a streamed block" } else { "outside a streamed block" })]
    UnexpectedStreamState {
        /// The message kind.
        message: &'static str,
        /// Whether the decoder was inside a streamed block.
        in_stream: bool,
    },
}

fn printable(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        "non-printable".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_descriptive() {
        assert_eq!(
            DecodeError::UnknownMessage(b'z').to_string(),
            "unknown pgoutput message tag 0x7A ('z')"
        );
        assert_eq!(
            DecodeError::UnknownTupleKind(0).to_string(),
            "unknown tuple column kind 0x00 (non-printable)"
        );
        assert_eq!(
            DecodeError::UnexpectedEof {
                what: "xid",
                needed: 4,
                remaining: 1
            }
            .to_string(),
            "unexpected end of message reading xid: needed 4 bytes, 1 remaining"
        );
        assert_eq!(
            DecodeError::UnexpectedStreamState {
                message: "Stream Stop",
                in_stream: false
            }
            .to_string(),
            "unexpected Stream Stop message while outside a streamed block"
        );
    }
}
