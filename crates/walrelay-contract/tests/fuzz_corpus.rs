//! Replays the cargo-fuzz corpus (`fuzz/corpus/parse`) on every test run,
//! with the fuzz target's properties, so the inputs the fuzzer found
//! interesting stay regression tests without a nightly toolchain.

use std::path::Path;

use bytes::Bytes;
use walrelay_contract::envelope::{encode, is_valid_topic, parse};

#[test]
fn every_corpus_input_parses_or_errors_and_round_trips() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/parse");
    let mut inputs = 0;
    let mut parsed = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz corpus directory") {
        let path = entry.expect("corpus entry").path();
        let content = Bytes::from(std::fs::read(&path).expect("corpus file"));
        inputs += 1;
        let Ok(envelope) = parse(&content) else {
            continue;
        };
        parsed += 1;
        assert!(is_valid_topic(&envelope.topic), "{}", path.display());
        if let Some(payload) = &envelope.payload {
            assert!(content.ends_with(payload), "{}", path.display());
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
        assert_eq!(
            parse(&Bytes::from(again)).as_ref(),
            Ok(&envelope),
            "{}",
            path.display()
        );
    }
    assert!(
        inputs >= 100,
        "only {inputs} corpus inputs in {}",
        dir.display()
    );
    assert!(
        parsed >= 10,
        "only {parsed} of {inputs} corpus inputs parse"
    );
}
