use super::*;
use rdkafka::error::RDKafkaErrorCode;
use std::time::Duration;

fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_server_position_only_rises_and_lag_needs_a_confirmed_position() {
    let m = Metrics::new();
    m.set_server_wal_end(Lsn(1_000));
    let text = m.encode();
    assert_eq!(sample(&text, "walrelay_slot_lag_bytes"), Some(0.0));
    m.set_confirmed(Lsn(400));
    // A keepalive's wal_end behind the sampled pg_current_wal_lsn().
    m.set_server_wal_end(Lsn(900));
    let text = m.encode();
    assert_eq!(sample(&text, "walrelay_server_wal_end_lsn"), Some(1000.0));
    assert_eq!(sample(&text, "walrelay_slot_lag_bytes"), Some(600.0));
}

#[test]
fn lag_takes_the_servers_own_figure_when_it_is_larger() {
    let m = Metrics::new();
    m.set_confirmed(Lsn(900));
    m.set_server_wal_end(Lsn(1_000));
    // The walsender never processed the confirmation of 900: the slot
    // is at 400 by PostgreSQL's own account.
    m.set_server_slot_lag(600);
    assert_eq!(sample(&m.encode(), "walrelay_slot_lag_bytes"), Some(600.0));
    // Once the server caught up, the process's figure counts again.
    m.set_server_slot_lag(50);
    m.set_server_wal_end(Lsn(1_200));
    assert_eq!(sample(&m.encode(), "walrelay_slot_lag_bytes"), Some(300.0));
}

#[test]
fn names_follow_prometheus_conventions() {
    let m = Metrics::new();
    m.topic("orders").acked(10);
    m.topic("orders").acked(5);
    m.set_confirmed(Lsn(100));
    m.set_server_wal_end(Lsn(250));
    m.kafka_error(&SinkError::Delivery {
        topic: "orders".into(),
        partition: 0,
        code: RDKafkaErrorCode::MessageTimedOut,
        message: "timed out".into(),
    });
    m.observe_commit_to_ack(PgTimestamp::from_system_time(SystemTime::now()).unwrap());
    let text = m.encode();
    assert_eq!(
        sample(&text, "walrelay_events_total{topic=\"orders\"}"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "walrelay_event_bytes_total{topic=\"orders\"}"),
        Some(15.0)
    );
    assert_eq!(sample(&text, "walrelay_confirmed_flush_lsn"), Some(100.0));
    assert_eq!(sample(&text, "walrelay_server_wal_end_lsn"), Some(250.0));
    assert_eq!(sample(&text, "walrelay_slot_lag_bytes"), Some(150.0));
    assert_eq!(sample(&text, "walrelay_in_flight_events"), Some(0.0));
    assert_eq!(sample(&text, "walrelay_in_flight_bytes"), Some(0.0));
    assert_eq!(
        sample(&text, "walrelay_commit_to_ack_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "walrelay_kafka_errors_total{kind=\"delivery\",code=\"MessageTimedOut\"}"
        ),
        Some(1.0)
    );
    for zero in [
        "walrelay_reconnects_total",
        "walrelay_sessions_total",
        "walrelay_dead_letter_records_total{kind=\"unknown-prefix\"}",
        "walrelay_dead_letter_records_total{kind=\"outbox-update\"}",
        "walrelay_ready",
    ] {
        assert_eq!(sample(&text, zero), Some(0.0), "{zero}: {text}");
    }
    assert_eq!(sample(&text, "walrelay_up"), Some(1.0));
    let version = format!(
        "walrelay_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&text, &version), Some(1.0), "{text}");
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn readiness_needs_a_session_and_kafka() {
    let m = Metrics::new();
    assert!(m.readiness().unwrap_err().contains("not streaming"));
    m.session_started(Lsn(1));
    assert!(m.readiness().unwrap_err().contains("Kafka not reached"));
    m.kafka_ok();
    assert_eq!(m.readiness(), Ok(()));
    m.kafka_unreachable("probe failed");
    assert!(m.readiness().unwrap_err().contains("probe failed"));
    // A later success clears it (timestamps are in ms: make sure the
    // clock moved).
    std::thread::sleep(Duration::from_millis(2));
    m.kafka_ok();
    assert_eq!(m.readiness(), Ok(()));
    m.session_ended(Some("lost the connection".into()));
    assert!(m.readiness().unwrap_err().contains("lost the connection"));
    m.session_started(Lsn(1));
    assert_eq!(m.readiness(), Ok(()));
    m.draining();
    m.session_ended(None);
    assert!(m.readiness().unwrap_err().contains("draining"));
    m.stopped();
    assert_eq!(m.readiness().unwrap_err(), "stopped");
}

#[test]
fn a_stall_is_nothing_acknowledged_for_longer_than_the_bound_while_events_wait() {
    let bound = Duration::from_secs(10);
    // Nothing in flight: never a stall, however old the last ack.
    assert_eq!(ack_stall(0, 1, 1, 60_000, bound), None);
    // Events waiting since 1 s, last ack at 0.5 s.
    assert_eq!(ack_stall(5, 1_000, 500, 11_000, bound), None);
    assert_eq!(
        ack_stall(5, 1_000, 500, 11_001, bound),
        Some(Duration::from_millis(10_001))
    );
    // Acks keep coming: the wait counts from the last one.
    assert_eq!(ack_stall(5, 1_000, 9_000, 15_000, bound), None);
    // The first event after an idle hour waits from when it was sent.
    assert_eq!(ack_stall(1, 3_600_000, 1_000, 3_600_500, bound), None);
    // 23 s without an ack (the reported stall) is not ready.
    assert!(ack_stall(100, 1_000, 1_000, 24_000, bound).is_some());
}

#[test]
fn readiness_falls_while_acknowledgements_stall() {
    // A clock that started a minute ago: timestamps near 0 are old.
    let Some(origin) = Instant::now().checked_sub(Duration::from_secs(60)) else {
        return; // a machine up for less than a minute
    };
    let m = Metrics::with_origin(origin);
    m.session_started(Lsn(1));
    m.acknowledged();
    m.set_in_flight(3, 300);
    assert_eq!(m.readiness(), Ok(()));
    // Events waiting and the last ack both a minute old, while the
    // probe keeps reaching Kafka.
    let h = &m.inner.health;
    h.waiting_since.store(1, Ordering::Relaxed);
    h.last_ack.store(1, Ordering::Relaxed);
    m.kafka_ok();
    let reason = m.readiness().unwrap_err();
    assert!(
        reason.contains("Kafka acknowledged nothing for")
            && reason.contains("while 3 events are in flight"),
        "{reason}"
    );
    assert_eq!(sample(&m.encode(), "walrelay_ready"), Some(0.0));
    // An acknowledgement clears it.
    m.acknowledged();
    assert_eq!(m.readiness(), Ok(()));
    // So does nothing waiting.
    h.last_ack.store(1, Ordering::Relaxed);
    m.set_in_flight(0, 0);
    assert_eq!(m.readiness(), Ok(()));
    // Events that start waiting now are not stalled yet.
    m.set_in_flight(1, 10);
    assert_eq!(m.readiness(), Ok(()));
}

#[test]
fn clock_skew_counts_as_zero() {
    let m = Metrics::new();
    let future = SystemTime::now() + Duration::from_secs(3600);
    m.observe_commit_to_ack(PgTimestamp::from_system_time(future).unwrap());
    let text = m.encode();
    assert_eq!(
        sample(&text, "walrelay_commit_to_ack_seconds_sum"),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "walrelay_commit_to_ack_seconds_count"),
        Some(1.0)
    );
}
