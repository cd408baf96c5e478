//! The vectors are AWS's own, from the Signature Version 4 documentation:
//! the S3 presigned-URL example ("Authenticating Requests: Using Query
//! Parameters": `GET /test.txt` on `examplebucket`, 2013-05-24, 86400 s)
//! and the derived signing key example (IAM, 2012-02-15). Both were also
//! recomputed from the algorithm's steps with Python's hmac/hashlib while
//! writing these tests, and agree.

use std::time::{Duration, SystemTime};

use super::*;
use crate::token::Secret;

fn s3_example_credentials() -> Credentials {
    Credentials {
        access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        session_token: None,
        expires: None,
    }
}

#[test]
fn the_documented_signing_key_is_derived() {
    let key = signing_key(
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        "20120215",
        "us-east-1",
        "iam",
    );
    assert_eq!(
        hex(&key),
        "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
    );
}

#[test]
fn the_documented_s3_presigned_url_is_reproduced_step_by_step() {
    let request = Presign {
        host: "examplebucket.s3.amazonaws.com",
        path: "/test.txt",
        params: &[],
        service: "s3",
        region: "us-east-1",
        time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600),
        expires: 86400,
        payload_hash: "UNSIGNED-PAYLOAD",
    };
    let signed = presign(&request, &s3_example_credentials());
    assert_eq!(
        signed.canonical_request,
        "GET\n/test.txt\n\
         X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2F\
         us-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&\
         X-Amz-SignedHeaders=host\n\
         host:examplebucket.s3.amazonaws.com\n\nhost\nUNSIGNED-PAYLOAD"
    );
    assert_eq!(
        signed.string_to_sign,
        "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n\
         3bfa292879f6447bbcda7001decf97f4a54dc650c8942174ae0a9121cf58ad04"
    );
    assert_eq!(
        signed.signature,
        "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    );
    assert!(signed
        .url("examplebucket.s3.amazonaws.com", "/test.txt")
        .ends_with("&X-Amz-SignedHeaders=host&X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"));
}

#[test]
fn uri_encoding_keeps_only_unreserved_characters() {
    assert_eq!(
        uri_encode("kafka-cluster:Connect"),
        "kafka-cluster%3AConnect"
    );
    assert_eq!(uri_encode("a/b+c=d e~f_g.h"), "a%2Fb%2Bc%3Dd%20e~f_g.h");
    assert_eq!(uri_encode("\u{e9}"), "%C3%A9");
}

#[test]
fn dates_are_utc_in_both_forms() {
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600 + 3_723);
    assert_eq!(
        dates(t),
        ("20130524".to_owned(), "20130524T010203Z".to_owned())
    );
}

#[test]
fn the_empty_payload_hash_is_sha256_of_nothing() {
    assert_eq!(EMPTY_PAYLOAD_SHA256, sha256_hex(""));
}
