//! CI smoke test of the end-to-end bench: `walrelay-bench --quick` with the
//! debug `walrelay` binary (built by `scripts/test.sh` before the tests)
//! writes a report in which every tool relayed something, Debezium's tuned
//! variant included, on one workload of each kind (installed by
//! `scripts/install-debezium.sh`, which `scripts/test.sh` runs first).

use std::process::Command;

mod support;

#[test]
fn quick_mode_writes_a_report_with_every_tool() {
    let walrelay = support::walrelay_binary();
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_walrelay-bench"))
        .arg("--quick")
        .arg("--out")
        .arg(out.path())
        .arg("--walrelay-bin")
        .arg(&walrelay)
        // The same binary as its own baseline: the old-vs-new rows and
        // section are written (a real comparison passes another build).
        .arg("--baseline-bin")
        .arg(&walrelay)
        // Two rates keep the smoke test short; the full bench runs four.
        .args(["--rates", "1000,max"])
        .args(["--consumer-rates", "1000"])
        .status()
        .unwrap();
    assert!(status.success(), "walrelay-bench --quick failed: {status}");

    let latest = std::fs::read_to_string(out.path().join("latest.md")).unwrap();
    assert!(latest.contains("## Targets"), "{latest}");
    assert!(
        latest.contains("## Against a plain Python relay"),
        "{latest}"
    );
    let run = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .expect("a run folder")
        .path();
    for f in ["results.md", "results.svg", "results.json"] {
        assert!(run.join(f).is_file(), "{f} missing in {}", run.display());
    }
    let svg = std::fs::read_to_string(run.join("results.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    let drain = json["drain"].as_array().unwrap();
    for tool in [
        "walrelay",
        "walrelay_no_fence",
        "walrelay_baseline",
        "pg_recvlogical",
        "producer",
        "producer_one_header",
        "python_relay",
        "polling",
    ] {
        let runs: Vec<_> = drain.iter().filter(|r| r["tool"] == tool).collect();
        assert!(!runs.is_empty(), "no {tool} runs");
        for r in runs {
            assert!(
                r["events_per_s"].as_f64().unwrap() > 0.0,
                "{tool} had no throughput: {r}"
            );
        }
    }
    assert_eq!(drain.iter().filter(|r| r["tool"] == "walrelay").count(), 7);
    // Debezium's tuned variant drained every backlog: every event's record
    // is in Kafka (more is a finding, reported; fewer fails the run), and
    // its start was timed.
    let dbz: Vec<_> = drain
        .iter()
        .filter(|r| r["tool"] == "debezium_tuned")
        .collect();
    // Quick mode: one workload of each kind (each is a JVM start).
    let mut dbz_workloads: Vec<_> = dbz
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    dbz_workloads.sort_unstable();
    assert_eq!(
        dbz_workloads,
        ["msg-100tx-200b", "outbox-1tx-200b"],
        "Debezium (tuned) drained one workload of each kind"
    );
    for r in &dbz {
        assert!(r["events_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["records_in_broker"].as_u64().unwrap() >= r["events"].as_u64().unwrap(),
            "{r}"
        );
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["db_cpu_seconds"].as_f64().is_some(), "{r}");
        assert!(
            r["startup"]["streaming_s"].as_f64().unwrap() > 0.0
                && r["startup"]["first_record_s"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
    // Quick mode: only the tuned variant, restarted once (first workload).
    assert!(!drain.iter().any(|r| r["tool"] == "debezium"));
    // ... and walrelay's start and restart beside it.
    let restarts = json["restarts"].as_array().unwrap();
    for tool in ["debezium_tuned", "walrelay"] {
        let runs: Vec<_> = restarts.iter().filter(|r| r["tool"] == tool).collect();
        assert_eq!(runs.len(), 1, "{tool}: {restarts:?}");
        assert!(runs[0]["first_new_record_s"].as_f64().unwrap() > 0.0);
    }
    assert!(restarts
        .iter()
        .any(|r| r["start_first_record_s"].as_f64().is_some_and(|s| s > 0.0)));
    assert!(latest.contains("## Debezium beside walrelay"), "{latest}");
    assert!(latest.contains("### Start and restart"), "{latest}");
    assert!(
        latest.contains("Debezium: walrelay >= 3x tuned Debezium's events/s"),
        "{latest}"
    );
    // The tail fence's read at the start of every fenced drain, from the
    // relay's log, and the fence section with its target.
    for r in drain.iter().filter(|r| r["tool"] == "walrelay") {
        assert!(r["fence"]["elapsed_ms"].is_u64(), "no fence cost: {r}");
    }
    assert!(latest.contains("## Tail fence"), "{latest}");
    assert!(
        latest.contains("## This build against the baseline binary"),
        "{latest}"
    );
    assert!(
        latest.contains("this build: drain >= 0.98x the baseline binary's"),
        "{latest}"
    );
    assert!(
        latest.contains("tail fence: walrelay's drain with the fence"),
        "{latest}"
    );
    let latency = json["latency"].as_array().unwrap();
    // The two references (plain producer, dual write) run the fixed rate
    // only: "as fast as it can" means nothing to a producer that waits for
    // nothing. The four relay modes run both.
    // Debezium's (tuned, outbox) is the fifth relay mode; with a baseline
    // binary, the two binaries as their own processes are the sixth and
    // seventh (the latency A/B).
    assert_eq!(latency.len(), 2 + 7 * 2, "nine modes");
    for binary in ["walrelay binary, messages", "baseline binary, messages"] {
        assert!(
            latency.iter().any(|l| l["mode"] == binary),
            "no {binary} row"
        );
    }
    assert!(
        latest.contains("latency A/B: this build's commit-to-consumer p99"),
        "{latest}"
    );
    assert!(
        latency
            .iter()
            .any(|l| l["mode"] == "debezium tuned, outbox"),
        "no Debezium latency row"
    );
    for reference in ["plain producer, messages", "dual write, messages"] {
        assert!(
            latency.iter().any(|l| l["mode"] == reference),
            "no {reference} row"
        );
    }
    assert!(
        latest.contains("## Where the cores go during a drain"),
        "{latest}"
    );
    assert!(latest.contains("walrelay / both limits"), "{latest}");
    for l in latency {
        assert!(l["events"].as_u64().unwrap() > 0, "{l}");
        assert!(l["commit_to_ack"]["p50"].as_f64().unwrap() >= 0.0);
    }
    let consumers = json["consumer"].as_array().unwrap();
    for c in [
        "walrelay, batch handler",
        "walrelay, per-record handler",
        "inbox table, 500 records/tx",
        "inbox table, 1 record/tx",
    ] {
        let runs: Vec<_> = consumers.iter().filter(|r| r["consumer"] == c).collect();
        assert!(!runs.is_empty(), "no {c} runs");
        for r in runs {
            assert!(r["records_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["state_rows"].as_i64().unwrap() > 0, "{r}");
        }
    }
    // End to end at one rate: keyless and keyed, each with the plain
    // reference and the Rust library (and the Python and Java ones where
    // they can run).
    let consumer_latency = json["consumer_latency"].as_array().unwrap();
    for keyed in [false, true] {
        for c in [
            "apply limit (multi-row effects, no dedupe)",
            "walrelay, batch handler",
        ] {
            let runs: Vec<_> = consumer_latency
                .iter()
                .filter(|r| r["consumer"] == c && r["keyed"] == keyed)
                .collect();
            assert_eq!(runs.len(), 1, "{c}, keyed {keyed}: {consumer_latency:?}");
            assert!(runs[0]["events"].as_u64().unwrap() > 0, "{}", runs[0]);
            assert!(runs[0]["commit_to_effect"]["p50"].as_f64().unwrap() > 0.0);
        }
    }
    assert!(latest.contains("## End to end"), "{latest}");
    assert!(latest.contains("## Consumers"), "{latest}");
}
