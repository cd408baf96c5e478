//! CI smoke test of the crash comparison: `walrelay-bench crash` with two
//! `kill -9` of each relay (walrelay, the debug binary built by
//! `scripts/test.sh` before the tests; Debezium's tuned worker, installed
//! by `scripts/install-debezium.sh`, standalone and distributed with Kafka
//! Connect's exactly-once source support) on Apache Kafka
//! (`WALRELAY_KAFKA_HOME`). walrelay must lose nothing and put no
//! duplicate and nothing out of order on the wire; Debezium must lose
//! nothing (its duplicates are reported, not judged).

use std::process::Command;
use std::time::Instant;

mod support;

#[test]
fn crash_comparison_with_two_kills_of_each_relay_and_worker_mode() {
    let walrelay = support::walrelay_binary();
    let out = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let status = Command::new(env!("CARGO_BIN_EXE_walrelay-bench"))
        .arg("crash")
        .args(["--kills", "2", "--seed", "24", "--rate", "50"])
        .args(["--min-gap", "1s", "--max-gap", "3s", "--settle", "60s"])
        .args(["--tools", "walrelay,debezium,debezium_eos"])
        .arg("--walrelay-bin")
        .arg(&walrelay)
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    eprintln!(
        "walrelay-bench crash took {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    // The command itself fails when walrelay lost or duplicated an event
    // or any tool lost one; the report says what.
    let report = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("crash-<stamp>.json");
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(
        status.success(),
        "walrelay-bench crash failed: {status}\n{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["failures"].as_array().unwrap().len(), 0, "{text}");
    let runs = json["runs"].as_array().unwrap();
    let run = |tool: &str| {
        runs.iter()
            .find(|r| r["tool"] == tool)
            .unwrap_or_else(|| panic!("no {tool} run: {text}"))
    };
    for tool in ["walrelay", "debezium", "debezium_eos"] {
        let r = run(tool);
        let c = &r["counts"];
        assert_eq!(r["kills"].as_array().unwrap().len(), 2, "{tool}: {r}");
        assert!(c["committed"].as_u64().unwrap() > 0, "{tool}: {r}");
        assert_eq!(c["lost"], 0, "{tool} lost events: {r}");
        assert_eq!(c["other"], 0, "{tool}: records of no event of the run: {r}");
        assert!(
            c["records"].as_u64() >= c["committed"].as_u64(),
            "{tool}: {r}"
        );
    }
    let w = &run("walrelay")["counts"];
    assert_eq!(w["duplicates"], 0, "walrelay duplicated on the wire: {w}");
    assert_eq!(w["out_of_order"], 0, "walrelay out of order: {w}");
    assert_eq!(w["records"], w["committed"], "{w}");
    let md = std::fs::read_to_string(report.with_extension("md")).unwrap();
    assert!(
        ["walrelay", "debezium", "debezium_eos"]
            .iter()
            .all(|t| md.contains(&format!("| {t} | 2 |"))),
        "{md}"
    );
}
