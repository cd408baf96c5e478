//! Cluster ids for `kafka.tools.StorageTool format -t`.

/// A random cluster id: 16 random bytes in URL-safe base64 without
/// padding (22 characters), the form `kafka-storage random-uuid` prints.
/// Its top bit is cleared, so it never starts with `-` (or `_`): the
/// storage tool's argument parser takes an id starting with `-` for an
/// option ("argument --cluster-id/-t: expected one argument"), which is why
/// Kafka's own `Uuid.randomUuid` never hands one out.
pub(crate) fn random_cluster_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 16];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        h.write_u32(std::process::id());
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    let bits: u128 = u128::from_be_bytes(bytes) & !(1u128 << 127);
    let mut out = Vec::with_capacity(22);
    // 22 sextets cover 132 bits: the 128 bits, then 4 zero bits.
    for i in 0..22 {
        let shift = 128i32 - 6 * (i + 1);
        let sextet = if shift >= 0 {
            (bits >> shift) & 0x3f
        } else {
            (bits << (-shift)) & 0x3f
        };
        out.push(ALPHABET[sextet as usize]);
    }
    String::from_utf8(out).expect("base64 alphabet is ASCII")
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_ids_are_22_url_safe_characters_and_differ() {
        let a = super::random_cluster_id();
        let b = super::random_cluster_id();
        assert_eq!(a.len(), 22);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        assert_ne!(a, b);
        for _ in 0..1000 {
            let id = super::random_cluster_id();
            assert!(id.as_bytes()[0].is_ascii_alphabetic(), "{id}");
        }
    }
}
