//! Log sequence numbers.
//!
//! An LSN is a 64-bit byte position in the PostgreSQL write-ahead log. It is
//! carried on the wire as a plain big-endian `Int64`, but everything humans
//! see (`pg_current_wal_lsn()`, `pg_replication_slots.confirmed_flush_lsn`,
//! log lines, our own checkpoints) uses the text form `HIGH/LOW`: the upper
//! and lower 32 bits in upper-case hex without zero padding. We print and
//! parse exactly that form — also in `Debug` — so that an LSN in a walrelay
//! log can be pasted straight into a SQL query and vice versa.

use std::fmt;
use std::str::FromStr;

/// A PostgreSQL log sequence number (`pg_lsn` / `XLogRecPtr`).
///
/// Ordering is the numeric ordering of WAL positions, so `a < b` means `a` was
/// written before `b`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid / "no position" LSN, `0/0` (`InvalidXLogRecPtr`).
    pub const ZERO: Lsn = Lsn(0);

    /// The raw 64-bit position.
    #[must_use]
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `true` for [`Lsn::ZERO`], which PostgreSQL uses to mean "no LSN".
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Writes the text form (as [`Display`](fmt::Display) does) into `out`
    /// and returns its length: for per-event headers, without the
    /// formatting machinery or an allocation.
    pub fn write_text(self, out: &mut [u8; Lsn::MAX_TEXT_LEN]) -> usize {
        fn half(v: u32, out: &mut [u8]) -> usize {
            const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
            let n = (32 - v.leading_zeros()).div_ceil(4).max(1) as usize;
            for (i, b) in out[..n].iter_mut().enumerate() {
                *b = DIGITS[((v >> (4 * (n - 1 - i))) & 0xF) as usize];
            }
            n
        }
        let hi = half((self.0 >> 32) as u32, out);
        out[hi] = b'/';
        hi + 1 + half(self.0 as u32, &mut out[hi + 1..])
    }

    /// The longest text form, `FFFFFFFF/FFFFFFFF`.
    pub const MAX_TEXT_LEN: usize = 17;
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Self {
        Lsn(value)
    }
}

impl From<Lsn> for u64 {
    fn from(value: Lsn) -> Self {
        value.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// `Debug` deliberately prints the same text form as `Display`: a derived
/// `Lsn(391119771720)` would be useless when comparing against Postgres.
impl fmt::Debug for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Which half of an `HIGH/LOW` LSN text a [`ParseLsnError`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LsnHalf {
    /// The part before the `/` (upper 32 bits).
    High,
    /// The part after the `/` (lower 32 bits).
    Low,
}

impl fmt::Display for LsnHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LsnHalf::High => "high (before '/')",
            LsnHalf::Low => "low (after '/')",
        })
    }
}

/// Why a string is not a valid `HIGH/LOW` LSN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseLsnError {
    /// There is no `/` separating the two halves.
    #[error("invalid LSN: missing '/' separator (expected e.g. 16/B374D848)")]
    MissingSeparator,
    /// One half is empty, e.g. `/1` or `1/`.
    #[error("invalid LSN: {half} half is empty")]
    EmptyHalf {
        /// The empty half.
        half: LsnHalf,
    },
    /// One half has more than 8 hex digits and cannot fit 32 bits.
    #[error("invalid LSN: {half} half has {len} characters, at most 8 hex digits allowed")]
    TooLong {
        /// The offending half.
        half: LsnHalf,
        /// Its length in bytes.
        len: usize,
    },
    /// One half contains a character that is not a hex digit.
    #[error("invalid LSN: {half} half contains non-hex character {found:?}")]
    InvalidDigit {
        /// The offending half.
        half: LsnHalf,
        /// The first non-hex character found.
        found: char,
    },
}

fn parse_half(text: &str, half: LsnHalf) -> Result<u64, ParseLsnError> {
    if text.is_empty() {
        return Err(ParseLsnError::EmptyHalf { half });
    }
    // Check digits before the length so that e.g. "+1" or "ä" is reported as
    // a bad character rather than accepted (`from_str_radix` allows a sign).
    if let Some(found) = text.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(ParseLsnError::InvalidDigit { half, found });
    }
    if text.len() > 8 {
        return Err(ParseLsnError::TooLong {
            half,
            len: text.len(),
        });
    }
    let mut value = 0u64;
    for b in text.bytes() {
        // Only ASCII hex digits remain, checked above.
        let digit = (b as char).to_digit(16).unwrap_or(0);
        value = (value << 4) | u64::from(digit);
    }
    Ok(value)
}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    /// Parses `HIGH/LOW` with 1–8 hex digits (either case) per half, the
    /// format PostgreSQL's `pg_lsn` input accepts.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (high, low) = s.split_once('/').ok_or(ParseLsnError::MissingSeparator)?;
        let high = parse_half(high, LsnHalf::High)?;
        let low = parse_half(low, LsnHalf::Low)?;
        Ok(Lsn((high << 32) | low))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_and_debug() {
        let cases: &[(u64, &str)] = &[
            (0, "0/0"),
            (0x016B_3748, "0/16B3748"),
            (0x16_B374_D848, "16/B374D848"),
            (u64::MAX, "FFFFFFFF/FFFFFFFF"),
            (1 << 32, "1/0"),
            (0xFFFF_FFFF, "0/FFFFFFFF"),
        ];
        for &(raw, text) in cases {
            assert_eq!(Lsn(raw).to_string(), text);
            assert_eq!(format!("{:?}", Lsn(raw)), text);
            assert_eq!(text.parse::<Lsn>(), Ok(Lsn(raw)), "{text}");
        }
    }

    #[test]
    fn parse_accepts_lowercase_and_padding() {
        assert_eq!("16/b374d848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
        assert_eq!("00000016/0B374D84".parse::<Lsn>(), Ok(Lsn(0x16_0B37_4D84)));
        assert_eq!("ffffffff/ffffffff".parse::<Lsn>(), Ok(Lsn(u64::MAX)));
    }

    #[test]
    fn parse_errors() {
        use LsnHalf::*;
        use ParseLsnError::*;
        let cases: &[(&str, ParseLsnError)] = &[
            ("", MissingSeparator),
            ("16B374D848", MissingSeparator),
            ("/1", EmptyHalf { half: High }),
            ("1/", EmptyHalf { half: Low }),
            ("/", EmptyHalf { half: High }),
            ("100000000/0", TooLong { half: High, len: 9 }),
            ("0/100000000", TooLong { half: Low, len: 9 }),
            (
                "g/0",
                InvalidDigit {
                    half: High,
                    found: 'g',
                },
            ),
            (
                "+1/0",
                InvalidDigit {
                    half: High,
                    found: '+',
                },
            ),
            (
                "1/2/3",
                InvalidDigit {
                    half: Low,
                    found: '/',
                },
            ),
            (
                " 1/0",
                InvalidDigit {
                    half: High,
                    found: ' ',
                },
            ),
            (
                "1/ä",
                InvalidDigit {
                    half: Low,
                    found: 'ä',
                },
            ),
        ];
        for (text, err) in cases {
            assert_eq!(text.parse::<Lsn>().as_ref(), Err(err), "{text:?}");
            // Every error explains itself.
            assert!(err.to_string().starts_with("invalid LSN"));
        }
    }

    #[test]
    fn conversions_and_order() {
        let lsn: Lsn = 42u64.into();
        assert_eq!(u64::from(lsn), 42);
        assert_eq!(Lsn::default(), Lsn::ZERO);
        assert!(Lsn::ZERO.is_zero());
        assert!(Lsn(1) < Lsn(1 << 32));
    }

    #[test]
    fn write_text_edges() {
        for (raw, text) in [
            (0, "0/0"),
            (0x16_B374_D848, "16/B374D848"),
            (u64::MAX, "FFFFFFFF/FFFFFFFF"),
            (1 << 32, "1/0"),
        ] {
            let mut buf = [0u8; Lsn::MAX_TEXT_LEN];
            let n = Lsn(raw).write_text(&mut buf);
            assert_eq!(&buf[..n], text.as_bytes());
        }
    }

    proptest! {
        #[test]
        fn text_round_trip(raw in any::<u64>()) {
            let text = Lsn(raw).to_string();
            prop_assert_eq!(text.parse::<Lsn>(), Ok(Lsn(raw)));
            prop_assert_eq!(text.to_lowercase().parse::<Lsn>(), Ok(Lsn(raw)));
        }

        #[test]
        fn write_text_matches_display(raw in any::<u64>()) {
            let mut buf = [0u8; Lsn::MAX_TEXT_LEN];
            let n = Lsn(raw).write_text(&mut buf);
            prop_assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), Lsn(raw).to_string());
        }

        #[test]
        fn parse_never_panics(s in ".{0,24}") {
            let _ = s.parse::<Lsn>();
        }
    }
}
