use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::Timestamp;
use walrelay_contract::header;
use walrelay_contract::EventKey;

use super::*;
use crate::settings::RetryPolicy;

fn record(offset: i64, key: Option<u64>) -> Queued {
    let mut headers = OwnedHeaders::new();
    if let Some(k) = key {
        let hex = EventKey::new(k, 0).to_hex();
        headers = headers
            .insert(Header {
                key: header::IDEMPOTENCY_KEY,
                value: Some(&hex),
            })
            .insert(Header {
                key: header::SOURCE,
                value: Some("s"),
            });
    }
    Queued::new(OwnedMessage::new(
        Some(vec![0; 100]),
        None,
        "t".into(),
        Timestamp::NotAvailable,
        0,
        offset,
        Some(headers),
    ))
}

fn partition(keys: &[Option<u64>]) -> Partition {
    let mut p = Partition::new(Position::new("g", "t", 0), 1);
    let now = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        p.push(record(i as i64, *k), now);
    }
    p
}

fn settings(on_poison: OnPoison) -> Settings {
    Settings {
        max_batch_records: 3,
        retry: RetryPolicy {
            attempts: 2,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(10),
        },
        on_poison,
        ..Settings::default()
    }
}

#[test]
fn a_batch_is_the_front_up_to_the_bounds() {
    let s = settings(OnPoison::Stop);
    let p = partition(&[Some(1), Some(2), Some(3), Some(4)]);
    let now = Instant::now();
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 3,
            park: None
        }
    );
    let s = Settings {
        max_batch_bytes: 350,
        ..s
    };
    // Each record is about 160 bytes (payload and headers): two fit.
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 2,
            park: None
        }
    );
    let s = Settings {
        max_batch_bytes: 1,
        ..s
    };
    // A record larger than the bound still makes a batch of its own.
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 1,
            park: None
        }
    );
}

#[test]
fn a_lone_record_is_applied_at_once_and_linger_waits() {
    let now = Instant::now();
    let p = partition(&[Some(1)]);
    assert_eq!(
        p.next_step(&settings(OnPoison::Stop), now),
        Step::Apply {
            take: 1,
            park: None
        }
    );
    let s = Settings {
        batch_linger: Duration::from_millis(5),
        ..settings(OnPoison::Stop)
    };
    assert!(matches!(p.next_step(&s, now), Step::WaitUntil(_)));
    assert_eq!(
        p.next_step(&s, now + Duration::from_millis(6)),
        Step::Apply {
            take: 1,
            park: None
        }
    );
}

#[test]
fn busy_stopped_and_empty_partitions_wait() {
    let s = settings(OnPoison::Stop);
    let now = Instant::now();
    assert_eq!(partition(&[]).next_step(&s, now), Step::Idle);
    let mut p = partition(&[Some(1)]);
    p.busy = true;
    assert_eq!(p.next_step(&s, now), Step::Idle);
    p.busy = false;
    p.stopped = Some("x".into());
    assert_eq!(p.next_step(&s, now), Step::Idle);
}

#[test]
fn cached_duplicates_skip_the_transaction() {
    let s = settings(OnPoison::Stop);
    let mut p = partition(&[Some(1), Some(2), Some(3)]);
    p.learn(
        &[("s".to_owned(), EventKey::new(3, 0))]
            .into_iter()
            .collect(),
    );
    assert_eq!(p.next_step(&s, Instant::now()), Step::Skip { take: 3 });
    assert!(p.knows_sources(3));
}

#[test]
fn a_record_without_headers_is_parked_or_stops_alone() {
    let now = Instant::now();
    let p = partition(&[None, Some(2)]);
    match p.next_step(&settings(OnPoison::Park), now) {
        Step::ParkUnkeyed { error } => {
            assert!(error.contains("t/0 at offset 0"), "{error}");
            assert!(error.contains("idempotency-key"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        p.next_step(&settings(OnPoison::Stop), now),
        Step::Stop { .. }
    ));
    // A batch stops before a bad record.
    let p = partition(&[Some(1), None]);
    assert_eq!(
        p.next_step(&settings(OnPoison::Stop), now),
        Step::Apply {
            take: 1,
            park: None
        }
    );
}

#[test]
fn a_known_failing_record_is_retried_then_parked() {
    let s = settings(OnPoison::Park);
    let mut p = partition(&[Some(1), Some(2), Some(3)]);
    let now = Instant::now();
    // Record 1 (index) fails: backoff, then the same batch again.
    assert_eq!(p.handler_failed("boom".into(), Some(1), 3, &s, now), 1);
    assert!(matches!(p.next_step(&s, now), Step::WaitUntil(_)));
    let later = now + Duration::from_millis(20);
    assert_eq!(
        p.next_step(&s, later),
        Step::Apply {
            take: 3,
            park: None
        }
    );
    // Attempts exhausted: records 0 and 1, the last parked.
    p.handler_failed("boom".into(), Some(1), 3, &s, later);
    let much_later = later + Duration::from_millis(20);
    assert_eq!(
        p.next_step(&s, much_later),
        Step::Apply {
            take: 2,
            park: Some(Park {
                error: "boom".into(),
                attempts: 2
            })
        }
    );
    // With stop, the records before it are applied, then the partition
    // stops naming the record.
    let stop = settings(OnPoison::Stop);
    let mut q = partition(&[Some(1), Some(2), Some(3)]);
    q.handler_failed("boom".into(), Some(1), 3, &stop, now);
    q.handler_failed("boom".into(), Some(1), 3, &stop, later);
    assert_eq!(
        q.next_step(&stop, much_later),
        Step::Apply {
            take: 1,
            park: None
        }
    );
    q.take(1);
    q.committed(1, much_later);
    match q.next_step(&stop, much_later) {
        Step::Stop { error } => {
            assert!(error.contains("offset 1 failed 2 times: boom"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    // The park commits: back to normal batches.
    p.take(2);
    p.committed(2, much_later);
    assert_eq!(
        p.next_step(&s, much_later),
        Step::Apply {
            take: 1,
            park: None
        }
    );
}

#[test]
fn an_unknown_failing_record_is_isolated_one_per_transaction() {
    let s = settings(OnPoison::Park);
    let mut p = partition(&[Some(1), Some(2), Some(3)]);
    let now = Instant::now();
    p.handler_failed("boom".into(), None, 3, &s, now);
    let now = now + Duration::from_millis(20);
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 3,
            park: None
        }
    );
    p.handler_failed("boom".into(), None, 3, &s, now);
    // Now one per transaction, at once.
    assert_eq!(p.isolate, 3);
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 1,
            park: None
        }
    );
    p.take(1);
    p.committed(1, now);
    assert_eq!(
        p.next_step(&s, now),
        Step::Apply {
            take: 1,
            park: None
        }
    );
    // The second record fails on its own: index 0 of a batch of one.
    p.handler_failed("boom".into(), Some(0), 1, &s, now);
    p.handler_failed("boom".into(), Some(0), 1, &s, now);
    let later = now + Duration::from_millis(50);
    assert!(matches!(
        p.next_step(&s, later),
        Step::Apply {
            take: 1,
            park: Some(_)
        }
    ));
}

#[test]
fn database_failures_back_off_without_counting_attempts() {
    let s = settings(OnPoison::Stop);
    let mut p = partition(&[Some(1)]);
    let now = Instant::now();
    for n in 1..=10 {
        assert_eq!(p.db_failed(&s, now), n);
    }
    assert!(p.failing.is_none());
    assert!(matches!(p.next_step(&s, now), Step::WaitUntil(_)));
    assert_eq!(
        p.next_step(&s, now + Duration::from_millis(11)),
        Step::Apply {
            take: 1,
            park: None
        }
    );
}

#[test]
fn fetching_pauses_above_two_batches_and_resumes_below_one() {
    let s = settings(OnPoison::Stop);
    let mut p = partition(&[Some(1), Some(2), Some(3), Some(4), Some(5)]);
    assert!(!p.should_pause(&s));
    p.push(record(5, Some(6)), Instant::now());
    assert!(p.should_pause(&s));
    p.paused = true;
    assert!(!p.should_resume(&s));
    let taken = p.take(3);
    assert!(p.should_resume(&s));
    p.put_back(taken);
    assert_eq!(p.queue.len(), 6);
    assert_eq!(p.queue.front().unwrap().message.offset(), 0);
    assert_eq!(
        p.queued_bytes,
        p.queue.iter().map(|r| r.bytes).sum::<usize>()
    );
}

#[test]
fn a_partition_queue_is_read_only_while_fewer_than_two_batches_wait() {
    let s = settings(OnPoison::Stop); // two batches of 3 fill a queue
    let mut p = partition(&[Some(1), Some(2), Some(3), Some(4), Some(5)]);
    assert!(p.wants_records(&s), "room for one more");
    p.push(record(5, Some(6)), Instant::now());
    assert!(
        !p.wants_records(&s),
        "two batches wait: librdkafka keeps the rest"
    );
    let taken = p.take(3);
    p.busy = true;
    assert!(p.wants_records(&s), "a batch in flight: read the next one");
    p.put_back(taken);
    p.busy = false;
    assert!(
        !p.wants_records(&s),
        "a failed batch back in the queue: full again"
    );

    // Waiting for a retry with room: reading on is bounded, no pause.
    let mut retrying = partition(&[Some(1)]);
    retrying.retry_at = Some(Instant::now() + Duration::from_secs(1));
    assert!(retrying.wants_records(&s));

    let mut stopped = partition(&[]);
    stopped.stopped = Some("poison".into());
    assert!(
        !stopped.wants_records(&s),
        "a stopped partition reads nothing"
    );

    // Bytes count too: one large record fills the queue's byte bound.
    let small = Settings {
        max_batch_bytes: 50,
        ..settings(OnPoison::Stop)
    };
    let one = partition(&[Some(1)]); // 100 payload bytes and headers
    assert!(!one.wants_records(&small));
}

#[test]
fn a_record_delivered_twice_is_not_queued_twice() {
    let mut p = partition(&[]);
    assert!(p.is_new(0), "anything is new to a fresh assignment");
    p.push(record(7, Some(1)), Instant::now());
    assert!(!p.is_new(7));
    assert!(!p.is_new(3));
    assert!(p.is_new(8));
    assert!(p.is_new(12), "offsets may skip (transaction markers)");
    // Taking and putting back do not make a queued record new again.
    let taken = p.take(1);
    p.put_back(taken);
    assert!(!p.is_new(7));
}

#[test]
fn the_phase_says_what_a_partition_waits_for() {
    let s = settings(OnPoison::Stop);
    let now = Instant::now();
    assert_eq!(partition(&[]).phase(&s, now), Phase::Polling);
    let mut paused = partition(&[]);
    paused.paused = true;
    assert_eq!(paused.phase(&s, now), Phase::Paused);
    assert_eq!(partition(&[Some(1)]).phase(&s, now), Phase::Pool);
    let mut busy = partition(&[Some(1)]);
    busy.busy = true;
    assert_eq!(busy.phase(&s, now), Phase::InFlight);
    let mut retrying = partition(&[Some(1)]);
    retrying.retry_at = Some(now + Duration::from_secs(1));
    assert_eq!(retrying.phase(&s, now), Phase::Backoff);
    assert_eq!(
        retrying.phase(&s, now + Duration::from_secs(2)),
        Phase::Pool,
        "the retry is due"
    );
    let mut stopped = partition(&[Some(1)]);
    stopped.stopped = Some("poison".into());
    assert_eq!(stopped.phase(&s, now), Phase::Stopped);
}

#[test]
fn attempts_are_counted_per_record_not_per_batch() {
    // Record 2 fails four times and then goes through, while record 7
    // fails once: record 7 has had one attempt, not five (issue 25, item 6).
    let s = Settings {
        max_batch_records: 10,
        retry: RetryPolicy {
            attempts: 5,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(10),
        },
        on_poison: OnPoison::Park,
        ..Settings::default()
    };
    let keys: Vec<Option<u64>> = (1..=10).map(Some).collect();
    let mut p = partition(&keys);
    let now = Instant::now();
    let later = now + Duration::from_secs(1);
    for _ in 0..4 {
        assert!(p.handler_failed("record 2 failed".into(), Some(2), 10, &s, now) <= 4);
    }
    assert_eq!(
        p.handler_failed("record 7 failed".into(), Some(7), 10, &s, now),
        1
    );
    assert_eq!(
        p.next_step(&s, later),
        Step::Apply {
            take: 10,
            park: None
        }
    );
    // Its own attempts still add up to the policy's.
    for attempt in 2..=5 {
        assert_eq!(
            p.handler_failed("record 7 failed".into(), Some(7), 10, &s, now),
            attempt
        );
    }
    assert_eq!(
        p.next_step(&s, later),
        Step::Apply {
            take: 8,
            park: Some(Park {
                error: "record 7 failed".into(),
                attempts: 5
            })
        }
    );
    // Once the records before it are committed, their counts go with them.
    p.take(7);
    p.committed(7, later);
    assert_eq!(p.record_failures, BTreeMap::from([(7, 5)]));
}

#[test]
fn a_short_batch_waits_while_more_is_fetched() {
    let s = settings(OnPoison::Stop);
    let now = Instant::now();
    let mut p = partition(&[Some(1), Some(2)]);
    p.more_fetched = true;
    // It waits for the loop's next read only, not for a timer: a burst
    // that ended exactly on the read limit starts at the next turn.
    assert_eq!(p.next_step(&s, now), Step::WaitUntil(now));
    // Nothing more waiting in librdkafka: the short batch starts.
    p.more_fetched = false;
    assert!(matches!(p.next_step(&s, now), Step::Apply { take: 2, .. }));
    // A full batch starts whatever waits behind it.
    let mut p = partition(&[Some(1), Some(2), Some(3), Some(4)]);
    p.more_fetched = true;
    assert!(matches!(p.next_step(&s, now), Step::Apply { take: 3, .. }));
    // A batch cut short by a record without headers starts too.
    let mut p = partition(&[Some(1), None]);
    p.more_fetched = true;
    assert!(matches!(p.next_step(&s, now), Step::Apply { take: 1, .. }));
}

#[test]
fn a_lone_record_of_twice_the_byte_bound_never_waits_to_fill() {
    // 100-byte payloads (plus headers): a partition holding one of them
    // is full, so it is not read, and it must not wait for more.
    let s = Settings {
        max_batch_bytes: 50,
        ..settings(OnPoison::Stop)
    };
    let now = Instant::now();
    let mut p = partition(&[Some(1)]);
    p.more_fetched = true;
    assert!(p.is_full(&s));
    assert!(!p.wants_records(&s));
    assert!(matches!(p.next_step(&s, now), Step::Apply { take: 1, .. }));
}

#[test]
fn contention_halves_the_batch_without_counting_until_one_record() {
    let s = Settings {
        max_batch_records: 8,
        ..settings(OnPoison::Park)
    };
    let now = Instant::now();
    let keys: Vec<Option<u64>> = (1..=10).map(Some).collect();
    let mut p = partition(&keys);
    assert!(matches!(p.next_step(&s, now), Step::Apply { take: 8, .. }));
    // A deadlock on the batch of 8: half of it next, nothing counted.
    assert_eq!(p.contended("deadlock".into(), 8, &s, now), None);
    assert!(p.record_failures.is_empty() && p.failing.is_none());
    let later = now + Duration::from_secs(1);
    assert!(matches!(
        p.next_step(&s, later),
        Step::Apply { take: 4, .. }
    ));
    assert_eq!(p.contended("deadlock".into(), 4, &s, later), None);
    assert!(matches!(
        p.next_step(&s, later + Duration::from_secs(1)),
        Step::Apply { take: 2, .. }
    ));
    assert_eq!(p.contended("deadlock".into(), 2, &s, later), None);
    let t = later + Duration::from_secs(2);
    assert!(matches!(p.next_step(&s, t), Step::Apply { take: 1, .. }));
    // At one record it counts, as a failure of that record.
    assert_eq!(p.contended("deadlock".into(), 1, &s, t), Some(1));
    assert_eq!(p.record_failures, BTreeMap::from([(0, 1)]));
    // After the attempts it is parked, like any failing record.
    assert_eq!(p.contended("deadlock".into(), 1, &s, t), Some(2));
    let t = t + Duration::from_secs(1);
    assert!(matches!(
        p.next_step(&s, t),
        Step::Apply {
            take: 1,
            park: Some(_)
        }
    ));
    // The cap holds for the failed batch's records, then full batches
    // come back.
    p.take(1);
    p.committed(1, t);
    assert!(matches!(p.next_step(&s, t), Step::Apply { take: 1, .. }));
    p.take(1);
    p.committed(1, t);
    for _ in 0..6 {
        assert!(p.shrink.is_some());
        p.take(1);
        p.committed(1, t);
    }
    assert_eq!(p.shrink, None);
    assert!(matches!(p.next_step(&s, t), Step::Apply { take: 2, .. }));
}
