use super::*;

fn record() -> SourceRecord {
    SourceRecord {
        source_id: "7312/app/walrelay".into(),
        system_identifier: "7312".into(),
        timeline: 1,
        slot: "walrelay".into(),
        event: Some(RecordedEvent {
            key: EventKey::new(0x5000, 0x5010),
            topic: "orders".into(),
            partition: 2,
            identity: EventIdentity::CommitTime(1_764_400_000_123),
        }),
        confirmed: Lsn(0x5100),
        written_at: "2026-11-29T04:00:00Z".into(),
    }
}

fn identity(system: &str) -> Identity {
    Identity {
        source_id: "7312/app/walrelay".into(),
        system_identifier: system.into(),
        timeline: 1,
        slot: "walrelay".into(),
    }
}

fn now(identity: &Identity, start: u64, server_wal: u64) -> Now<'_> {
    Now {
        identity,
        start: Lsn(start),
        server_wal: Lsn(server_wal),
    }
}

#[test]
fn the_record_round_trips_through_its_json() {
    let ours = identity("7312");
    let r = record();
    let value = r.encode();
    let text = String::from_utf8(value.clone()).unwrap();
    assert!(text.contains("\"lsn\":\"0/5000\""), "{text}");
    assert!(
        text.contains("\"identity\":\"commit-time-ms:1764400000123\""),
        "{text}"
    );
    assert_eq!(SourceRecord::decode(&r.source_id, &value), Ok(r.clone()));
    let mut digest = r.clone();
    digest.event.as_mut().unwrap().identity = EventIdentity::of(None, Some(b"{\"id\": 1}"));
    let none_yet = SourceRecord {
        event: None,
        ..r.clone()
    };
    assert_eq!(
        SourceRecord::decode(&r.source_id, &none_yet.encode()),
        Ok(none_yet.clone())
    );
    assert_eq!(
        assess(&none_yet, &now(&ours, 0x10, 0x20)),
        Ok(Verdict::Clear)
    );
    assert_eq!(
        SourceRecord::decode(&r.source_id, &digest.encode()),
        Ok(digest)
    );
}

#[test]
fn a_record_this_walrelay_cannot_read_says_why() {
    let r = record();
    let other_source = SourceRecord::decode("another", &r.encode()).unwrap_err();
    assert!(
        other_source
            .why
            .contains("names source \"7312/app/walrelay\""),
        "{other_source}"
    );
    let newer = String::from_utf8(r.encode())
        .unwrap()
        .replace("\"format\":1", "\"format\":2");
    let e = SourceRecord::decode(&r.source_id, newer.as_bytes()).unwrap_err();
    assert!(e.why.contains("format 2"), "{e}");
    for bad in [&b"not json"[..], b"{}", b""] {
        assert!(SourceRecord::decode(&r.source_id, bad).is_err());
    }
    let bad_event = String::from_utf8(r.encode())
        .unwrap()
        .replace("commit-time-ms:", "wall-clock:");
    assert!(SourceRecord::decode(&r.source_id, bad_event.as_bytes()).is_err());
}

#[test]
fn identities_tell_events_at_the_same_key_apart() {
    assert_eq!(
        EventIdentity::of(Some(7), Some(b"a")),
        EventIdentity::of(Some(7), Some(b"b")),
        "a transactional event is known by its commit time, whatever the configuration made of it"
    );
    assert_ne!(
        EventIdentity::of(Some(7), None),
        EventIdentity::of(Some(8), None)
    );
    assert_ne!(
        EventIdentity::of(None, Some(b"a")),
        EventIdentity::of(None, Some(b"b"))
    );
    assert_eq!(
        EventIdentity::of(None, Some(b"a")),
        EventIdentity::of(None, Some(b"a"))
    );
}

#[test]
fn a_server_at_or_behind_the_recorded_key_is_refused_with_both_positions() {
    let ours = identity("7312");
    for wal in [0x4000, 0x5000] {
        let e = assess(&record(), &now(&ours, 0x4000, wal)).unwrap_err();
        let text = e.to_string();
        for part in [
            "key 0000000000005000",
            "WAL position 0/5000",
            "topic \"orders\" partition 2",
            "confirmed at 0/5100",
            &format!("WAL is only at {}", Lsn(wal)),
            "slot \"walrelay\" replays from 0/4000",
            "relay.source_id to a new value",
            "\"7312/app/walrelay@restored-1\"",
            "Restoring the database or failing over",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        assert!(!text.contains(", system "), "{text}");
    }
    let other = identity("9999");
    let text = assess(&record(), &now(&other, 0x10, 0x20))
        .unwrap_err()
        .to_string();
    assert!(text.contains(", system 9999)"), "{text}");
}

#[test]
fn a_replay_through_the_recorded_key_must_reproduce_it_and_one_after_it_is_clear() {
    let ours = identity("7312");
    assert_eq!(
        assess(&record(), &now(&ours, 0x4000, 0x9000)),
        Ok(Verdict::Reproduce(record().event.unwrap()))
    );
    assert_eq!(
        assess(&record(), &now(&ours, 0x5000, 0x9000)),
        Ok(Verdict::Reproduce(record().event.unwrap())),
        "a slot at the commit's start replays that transaction"
    );
    assert_eq!(
        assess(&record(), &now(&ours, 0x5001, 0x9000)),
        Ok(Verdict::Clear)
    );
    assert_eq!(
        assess(&record(), &now(&ours, 0x5100, 0x5100)),
        Ok(Verdict::Clear)
    );
}
