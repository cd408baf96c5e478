//! Fuzz target: any message content must parse to an envelope or a typed
//! error — never a panic or a huge allocation. What parses must survive a
//! round trip through `encode` unchanged, and its payload must be the
//! content's tail byte for byte (the relay forwards it without a copy).

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_contract::envelope::{encode, is_valid_topic, parse};

fuzz_target!(|data: &[u8]| {
    let content = Bytes::copy_from_slice(data);
    let envelope = match parse(&content) {
        Ok(envelope) => envelope,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    assert!(is_valid_topic(&envelope.topic));
    if let Some(payload) = &envelope.payload {
        assert!(content.ends_with(payload));
    }
    let headers: Vec<(&str, &str)> = envelope
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let again = encode(
        &envelope.topic,
        envelope.key.as_deref(),
        &headers,
        envelope.payload.as_deref(),
    );
    let reparsed = parse(&Bytes::from(again)).expect("an encoded envelope parses");
    assert_eq!(reparsed, envelope);
});
