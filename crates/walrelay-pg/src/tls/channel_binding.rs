//! `tls-server-end-point` channel binding (RFC 5929): the hash of the
//! server's certificate that SCRAM-SHA-256-PLUS binds the authentication to,
//! chosen from the certificate's signature algorithm.

use sha2::Digest;

/// Hash used for `tls-server-end-point` channel binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndPointHash {
    /// SHA-224 (certificate signed with a SHA-224 based algorithm).
    Sha224,
    /// SHA-256 (also used for MD5 and SHA-1 based signatures, per RFC 5929).
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

/// Reads one DER TLV: (tag, contents, rest). Only low-tag-number form and
/// definite lengths up to 4 bytes are accepted; every length is bounds-checked.
fn der_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len_bytes, after) = rest.split_at(n);
        rest = after;
        len_bytes
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if len > rest.len() {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
}

/// The `signatureAlgorithm` OID (contents octets) of a DER certificate.
fn signature_algorithm_oid(cert_der: &[u8]) -> Option<&[u8]> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    let (tag, cert, _) = der_tlv(cert_der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, _tbs, rest) = der_tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, alg_id, _) = der_tlv(rest)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, oid, _) = der_tlv(alg_id)?;
    if tag != OID {
        return None;
    }
    Some(oid)
}

/// The channel-binding hash for a certificate, chosen from its
/// signatureAlgorithm as RFC 5929 section 4.1 says (and as the PostgreSQL
/// server does): MD5/SHA-1 become SHA-256, SHA-2 variants are kept, anything
/// else (Ed25519, RSA-PSS, unknown) gives `None`.
pub fn end_point_hash_for(cert_der: &[u8]) -> Option<EndPointHash> {
    // 1.2.840.113549.1.1.x (PKCS#1)
    const PKCS1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    // 1.2.840.10045.4 (ECDSA signatures)
    const ECDSA_SIG: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04];
    // 1.2.840.10040.4.3 dsa-with-sha1
    const DSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x03];
    // 2.16.840.1.101.3.4.3.x (NIST: dsa-with-sha2)
    const NIST_SIG: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x03];
    // 1.3.14.3.2.29 sha1WithRSASignature (OIW)
    const OIW_SHA1_RSA: &[u8] = &[0x2b, 0x0e, 0x03, 0x02, 0x1d];

    use EndPointHash::*;
    let oid = signature_algorithm_oid(cert_der)?;
    if oid == DSA_SHA1 || oid == OIW_SHA1_RSA {
        return Some(Sha256);
    }
    if let Some(rest) = oid.strip_prefix(PKCS1) {
        return match rest {
            [0x04] | [0x05] => Some(Sha256), // md5WithRSA, sha1WithRSA
            [0x0b] => Some(Sha256),
            [0x0c] => Some(Sha384),
            [0x0d] => Some(Sha512),
            [0x0e] => Some(Sha224),
            _ => None, // incl. 0x0a RSASSA-PSS: hash lives in parameters
        };
    }
    if let Some(rest) = oid.strip_prefix(ECDSA_SIG) {
        return match rest {
            [0x01] => Some(Sha256), // ecdsa-with-SHA1
            [0x03, 0x01] => Some(Sha224),
            [0x03, 0x02] => Some(Sha256),
            [0x03, 0x03] => Some(Sha384),
            [0x03, 0x04] => Some(Sha512),
            _ => None,
        };
    }
    if let Some(rest) = oid.strip_prefix(NIST_SIG) {
        return match rest {
            [0x01] => Some(Sha224),
            [0x02] => Some(Sha256),
            [0x03] => Some(Sha384),
            [0x04] => Some(Sha512),
            _ => None,
        };
    }
    None
}

/// `tls-server-end-point` channel-binding data for a DER certificate.
pub fn server_end_point_hash(cert_der: &[u8]) -> Option<Vec<u8>> {
    Some(match end_point_hash_for(cert_der)? {
        EndPointHash::Sha224 => sha2::Sha224::digest(cert_der).to_vec(),
        EndPointHash::Sha256 => sha2::Sha256::digest(cert_der).to_vec(),
        EndPointHash::Sha384 => sha2::Sha384::digest(cert_der).to_vec(),
        EndPointHash::Sha512 => sha2::Sha512::digest(cert_der).to_vec(),
    })
}
