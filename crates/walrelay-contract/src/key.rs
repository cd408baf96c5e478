//! The 128-bit idempotency key every walrelay record carries.
//!
//! An [`EventKey`] is `(commit LSN << 64) | event position` for a
//! transactional event and `((L - 1) << 64) | (L - 1)` for a
//! non-transactional message reporting end LSN `L` (`docs/contract.md`):
//! numeric order is stream order, and replaying the same WAL gives the same
//! keys. The relay assigns keys (`walrelay::engine::key::KeyAssigner`); consumers
//! only parse, compare and print them, which is all this module offers.

use std::fmt;
use std::str::FromStr;

/// Lowercase hex digits, indexed by nibble value.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// A 128-bit idempotency key.
///
/// The high 64 bits are the transaction's `final_lsn` (or `L - 1` for a
/// non-transactional message), the low 64 bits the event's position within
/// it. Numeric order is stream order.
///
/// The text form ([`Display`](fmt::Display), [`EventKey::to_hex`]) is
/// exactly 32 lowercase hex digits, big-endian and zero-padded, so comparing
/// two keys as strings gives the same answer as comparing them as numbers.
/// `Debug` prints the same digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventKey(pub u128);

// The relay calls these once or more per record from another crate; without
// LTO, only `#[inline]` functions can be inlined across a crate boundary.
impl EventKey {
    /// The smallest key, all zeros.
    pub const MIN: EventKey = EventKey(0);
    /// The largest key, all ones.
    pub const MAX: EventKey = EventKey(u128::MAX);

    /// Builds a key from its high and low 64-bit halves.
    #[inline]
    #[must_use]
    pub const fn new(high: u64, low: u64) -> Self {
        EventKey(((high as u128) << 64) | low as u128)
    }

    /// The high 64 bits: the transaction's `final_lsn`, or `L - 1` for a
    /// non-transactional message reporting end LSN `L`.
    #[inline]
    #[must_use]
    pub const fn high(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The low 64 bits: the event's (possibly raised) position.
    #[inline]
    #[must_use]
    pub const fn low(self) -> u64 {
        self.0 as u64
    }

    /// The key as 16 big-endian bytes (byte order equals numeric order).
    #[inline]
    #[must_use]
    pub const fn to_be_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The key from 16 big-endian bytes.
    #[inline]
    #[must_use]
    pub const fn from_be_bytes(bytes: [u8; 16]) -> Self {
        EventKey(u128::from_be_bytes(bytes))
    }

    /// Formats the key as 32 lowercase hex digits into `buf` without
    /// allocating, and returns the digits as a `&str` borrowed from `buf`.
    ///
    /// This is the hot-path form (one call per published record); use
    /// [`EventKey::to_hex`] or `Display` where an allocation does not matter.
    #[inline]
    pub fn write_hex<'b>(&self, buf: &'b mut [u8; 32]) -> &'b str {
        let mut value = self.0;
        for slot in buf.iter_mut().rev() {
            // Truncation intended: `value & 0xf` is a single nibble.
            *slot = HEX_DIGITS[(value & 0xf) as usize];
            value >>= 4;
        }
        match std::str::from_utf8(buf) {
            Ok(text) => text,
            // Every byte written above is an ASCII hex digit.
            Err(_) => unreachable!("hex digits are ASCII"),
        }
    }

    /// The key as exactly 32 lowercase hex digits, big-endian, zero-padded.
    #[inline]
    #[must_use]
    pub fn to_hex(&self) -> String {
        let mut buf = [0u8; 32];
        self.write_hex(&mut buf).to_owned()
    }

    /// Parses exactly 32 hex digits (either case), big-endian.
    ///
    /// No prefix (`0x`), sign, separator or whitespace is accepted.
    #[inline]
    pub fn from_hex(text: &str) -> Result<Self, ParseEventKeyError> {
        let bytes = text.as_bytes();
        if bytes.len() != 32 {
            return Err(ParseEventKeyError::Length {
                length: bytes.len(),
            });
        }
        let mut value: u128 = 0;
        for (index, &byte) in bytes.iter().enumerate() {
            let nibble = match byte {
                b'0'..=b'9' => byte - b'0',
                b'a'..=b'f' => byte - b'a' + 10,
                b'A'..=b'F' => byte - b'A' + 10,
                _ => {
                    // Every byte before `index` is an ASCII digit, so
                    // `index` is a char boundary.
                    return Err(ParseEventKeyError::Digit {
                        index,
                        found: text[index..].chars().next().unwrap_or('?'),
                    });
                }
            };
            value = (value << 4) | u128::from(nibble);
        }
        Ok(EventKey(value))
    }

    /// Writes the compact form, `HIGH/LOW`: each half in lowercase hex
    /// without leading zeros (like an LSN's text, e.g.
    /// `16b374d848/16b374d800`), into `buf` without allocating. The lean
    /// header set writes the previous key (`walrelay-prev`) this way: about
    /// 21 characters instead of 32 for keys of today's WAL positions.
    #[inline]
    pub fn write_compact<'b>(&self, buf: &'b mut [u8; 33]) -> &'b str {
        let mut n = write_half(self.high(), buf);
        buf[n] = b'/';
        n += 1;
        let mut rest = [0u8; 16];
        let m = write_half(self.low(), &mut rest);
        buf[n..n + m].copy_from_slice(&rest[..m]);
        match std::str::from_utf8(&buf[..n + m]) {
            Ok(text) => text,
            Err(_) => unreachable!("hex digits and '/' are ASCII"),
        }
    }

    /// The compact form ([`EventKey::write_compact`]) as a `String`.
    #[must_use]
    pub fn to_compact(&self) -> String {
        let mut buf = [0u8; 33];
        self.write_compact(&mut buf).to_owned()
    }

    /// Parses the compact form `HIGH/LOW`: each half 1 to 16 hex digits
    /// (either case, leading zeros allowed), nothing else.
    pub fn from_compact(text: &str) -> Result<Self, ParseEventKeyError> {
        let half = |t: &str| -> Option<u64> {
            if t.is_empty() || t.len() > 16 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u64::from_str_radix(t, 16).ok()
        };
        text.split_once('/')
            .and_then(|(high, low)| Some(EventKey::new(half(high)?, half(low)?)))
            .ok_or(ParseEventKeyError::Compact)
    }
}

/// `value` in lowercase hex without leading zeros (`0` for zero) at the
/// start of `buf`; returns the number of digits.
#[inline]
fn write_half(value: u64, buf: &mut [u8]) -> usize {
    let digits = (16 - value.leading_zeros() as usize / 4).max(1);
    for (i, slot) in buf[..digits].iter_mut().enumerate() {
        let shift = 4 * (digits - 1 - i);
        // Truncation intended: a single nibble.
        *slot = HEX_DIGITS[((value >> shift) & 0xf) as usize];
    }
    digits
}

impl fmt::Display for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        f.pad(self.write_hex(&mut buf))
    }
}

/// `Debug` shows the hex digits too: a decimal `u128` is useless when
/// comparing against a record header.
impl fmt::Debug for EventKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        write!(f, "EventKey({})", self.write_hex(&mut buf))
    }
}

impl FromStr for EventKey {
    type Err = ParseEventKeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventKey::from_hex(s)
    }
}

impl From<u128> for EventKey {
    fn from(value: u128) -> Self {
        EventKey(value)
    }
}

impl From<EventKey> for u128 {
    fn from(value: EventKey) -> Self {
        value.0
    }
}

/// Serialized as its 32-digit hex string (a JSON number cannot hold 128 bits
/// portably).
impl serde::Serialize for EventKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 32];
        serializer.serialize_str(self.write_hex(&mut buf))
    }
}

impl<'de> serde::Deserialize<'de> for EventKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HexVisitor;

        impl serde::de::Visitor<'_> for HexVisitor {
            type Value = EventKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an event key as 32 hex digits")
            }

            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<EventKey, E> {
                EventKey::from_hex(value).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(HexVisitor)
    }
}

/// Why a string is not an [`EventKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseEventKeyError {
    /// The text is not exactly 32 bytes long.
    #[error("an event key is exactly 32 hex digits, got {length} bytes")]
    Length {
        /// Length of the input in bytes.
        length: usize,
    },
    /// A byte that is not a hex digit.
    #[error("an event key is exactly 32 hex digits, found {found:?} at byte {index}")]
    Digit {
        /// Byte offset of the offending character.
        index: usize,
        /// The offending character.
        found: char,
    },
    /// Not the compact form ([`EventKey::from_compact`]).
    #[error("a compact event key is HIGH/LOW, each half 1 to 16 hex digits")]
    Compact,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(high: u64, low: u64) -> EventKey {
        EventKey::new(high, low)
    }

    #[test]
    fn the_compact_form_round_trips_and_refuses_anything_else() {
        for (k, text) in [
            (key(0x16_B374_D848, 0x16_B374_D800), "16b374d848/16b374d800"),
            (key(0, 0), "0/0"),
            (key(1, 0x10), "1/10"),
            (EventKey::MAX, "ffffffffffffffff/ffffffffffffffff"),
        ] {
            assert_eq!(k.to_compact(), text);
            assert_eq!(EventKey::from_compact(text), Ok(k));
        }
        assert_eq!(EventKey::from_compact("0016B/0A"), Ok(key(0x16b, 0xa)));
        for bad in [
            "",
            "/",
            "1/",
            "/1",
            "1",
            "1/2/3",
            "g/1",
            "1/-1",
            "+1/1",
            " 1/1",
            "1/1 ",
            "10000000000000000/0",
            "00000016b374d8480000000000000100",
        ] {
            assert_eq!(
                EventKey::from_compact(bad),
                Err(ParseEventKeyError::Compact),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parts_round_trip() {
        let k = key(0x16_B374_D848, 0x16_B374_D800);
        assert_eq!(k.high(), 0x16_B374_D848);
        assert_eq!(k.low(), 0x16_B374_D800);
        assert_eq!(EventKey::from_be_bytes(k.to_be_bytes()), k);
        assert_eq!(k.to_be_bytes()[..8], 0x16_B374_D848u64.to_be_bytes());
    }

    #[test]
    fn hex_is_32_lowercase_zero_padded_digits() {
        assert_eq!(EventKey(0).to_hex(), "0".repeat(32));
        assert_eq!(EventKey(u128::MAX).to_hex(), "f".repeat(32));
        let k = key(0x16_B374_D848, 0xAB);
        assert_eq!(k.to_hex(), "00000016b374d84800000000000000ab");
        assert_eq!(k.to_string(), k.to_hex());
        assert_eq!(
            format!("{k:?}"),
            "EventKey(00000016b374d84800000000000000ab)"
        );
        let mut buf = [0u8; 32];
        assert_eq!(k.write_hex(&mut buf), "00000016b374d84800000000000000ab");
    }

    #[test]
    fn hex_parses_either_case() {
        let k = key(0x16_B374_D848, 0xAB);
        assert_eq!(
            EventKey::from_hex("00000016b374d84800000000000000ab"),
            Ok(k)
        );
        assert_eq!("00000016B374D84800000000000000AB".parse(), Ok(k));
    }

    #[test]
    fn hex_rejects_wrong_length_and_digits() {
        assert_eq!(
            EventKey::from_hex("abc"),
            Err(ParseEventKeyError::Length { length: 3 })
        );
        assert_eq!(
            EventKey::from_hex(""),
            Err(ParseEventKeyError::Length { length: 0 })
        );
        assert_eq!(
            EventKey::from_hex(&"0".repeat(33)),
            Err(ParseEventKeyError::Length { length: 33 })
        );
        let bad = format!("{}g{}", "0".repeat(5), "0".repeat(26));
        assert_eq!(
            EventKey::from_hex(&bad),
            Err(ParseEventKeyError::Digit {
                index: 5,
                found: 'g'
            })
        );
        let prefixed = format!("0x{}", "0".repeat(30));
        assert!(EventKey::from_hex(&prefixed).is_err());
        let spaced = format!(" {}", "0".repeat(31));
        assert!(EventKey::from_hex(&spaced).is_err());
        // 30 ASCII digits plus one two-byte char: 32 bytes, invalid.
        let unicode = format!("{}é", "0".repeat(30));
        assert_eq!(
            EventKey::from_hex(&unicode),
            Err(ParseEventKeyError::Digit {
                index: 30,
                found: 'é'
            })
        );
        assert!(ParseEventKeyError::Length { length: 3 }
            .to_string()
            .contains("32 hex digits"));
    }

    #[test]
    fn serde_uses_hex_string() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Wrapper {
            key: EventKey,
        }
        // serde_json is a regular dependency of the crate.
        let w = Wrapper { key: key(1, 2) };
        let json = serde_json::to_string(&w).unwrap();
        assert_eq!(json, r#"{"key":"00000000000000010000000000000002"}"#);
        assert_eq!(serde_json::from_str::<Wrapper>(&json).unwrap(), w);
        assert!(serde_json::from_str::<Wrapper>(r#"{"key":"12"}"#).is_err());
    }
}
