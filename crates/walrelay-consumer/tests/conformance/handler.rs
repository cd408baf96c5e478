//! The scenarios' handler: one `effects` row per record, and the
//! failures and misbehaviours that the records' payloads ask for
//! (conformance/README.md, `produce`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio_postgres::Transaction;
use walrelay_consumer::Delivery;

/// The handler's error: a boxed error keeps a database error's SQLSTATE
/// findable by the loop (contention is retried smaller).
pub(crate) type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// How often each record failed or misbehaved (`flaky <n>` and the
/// behaviours with a count), per (topic, key).
static CALLS: Mutex<BTreeMap<(String, String, &'static str), u32>> = Mutex::new(BTreeMap::new());

/// Statement that fails as a serialization failure does.
const CONTEND: &str = "DO $$BEGIN RAISE EXCEPTION 'contention' USING ERRCODE = '40001'; END$$";

/// A payload's instruction: `<kind> <times> <key>` or `<kind> <key>`.
struct Instruction<'a> {
    kind: &'a str,
    times: u32,
}

fn instruction<'a>(d: &'a Delivery<'_>) -> Instruction<'a> {
    let text = d
        .payload()
        .and_then(|p| std::str::from_utf8(p).ok())
        .unwrap_or("");
    let mut words = text.split(' ');
    let kind = words.next().unwrap_or("");
    let times = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    Instruction { kind, times }
}

/// Whether the record misbehaves on this call: its first `times` calls.
fn misbehaves(d: &Delivery<'_>, kind: &'static str, times: u32) -> bool {
    let mut calls = CALLS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let seen = calls
        .entry((d.position.topic.clone(), d.meta.key.to_hex(), kind))
        .or_insert(0);
    if *seen < times {
        *seen += 1;
        true
    } else {
        false
    }
}

/// The handlers' side effect: one `effects` row per record (none for a
/// `noop` record), written by `consumer`. While `misbehave`, the records'
/// payloads are obeyed: a poison record fails the batch, a flaky one
/// fails it its first times, a commit-poison one fails it at COMMIT, and
/// the behaviours of conformance/README.md happen.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    batch: &[Delivery<'_>],
    consumer: &str,
    delay: Duration,
    misbehave: bool,
) -> Result<(), HandlerError> {
    let mut after = Vec::new();
    if misbehave {
        for d in batch {
            let i = instruction(d);
            match i.kind {
                "poison" => return Err(format!("poison: cannot apply {}", d.meta.key).into()),
                "flaky" if misbehaves(d, "flaky", i.times) => {
                    return Err(format!("flaky: failure of {}", d.meta.key).into())
                }
                "raise" if misbehaves(d, "raise", i.times) => {
                    panic!("raise: the handler panics on {}", d.meta.key)
                }
                "contend" if misbehaves(d, "contend", i.times) => {
                    return Err(tx.batch_execute(CONTEND).await.err().map_or_else(
                        || HandlerError::from("the contention statement succeeded"),
                        HandlerError::from,
                    ));
                }
                "slow" if misbehaves(d, "slow", i.times) => {
                    tx.execute("SELECT pg_sleep(30)", &[]).await?;
                }
                "savepoint" => {
                    tx.batch_execute("SAVEPOINT s").await?;
                    if tx.execute("SELECT 1 / 0", &[]).await.is_ok() {
                        return Err("1 / 0 succeeded".into());
                    }
                    tx.batch_execute("ROLLBACK TO SAVEPOINT s").await?;
                }
                "commit-poison" => {
                    // Fine until the commit checks the deferred constraint.
                    tx.execute("INSERT INTO commit_check (id) VALUES (1), (1)", &[])
                        .await?;
                }
                "swallow" if misbehaves(d, "swallow", i.times) => after.push("swallow"),
                "self-commit" => after.push("COMMIT"),
                "self-rollback" => after.push("ROLLBACK"),
                _ => {}
            }
        }
    }
    if !delay.is_zero() {
        tx.execute("SELECT pg_sleep($1)", &[&delay.as_secs_f64()])
            .await?;
    }
    let applied: Vec<&Delivery<'_>> = batch
        .iter()
        .filter(|d| !misbehave || instruction(d).kind != "noop")
        .collect();
    let keys: Vec<String> = applied.iter().map(|d| d.meta.key.to_hex()).collect();
    let partitions: Vec<i32> = applied.iter().map(|d| d.position.partition).collect();
    tx.execute(
        "INSERT INTO effects (event_key, partition, consumer) \
         SELECT k, p, $3 FROM unnest($1::text[], $2::int4[]) AS u(k, p)",
        &[&keys, &partitions, &consumer],
    )
    .await?;
    for action in after {
        match action {
            // A failed statement whose error the handler ignores.
            "swallow" => {
                let _ = tx.execute("SELECT 1 / 0", &[]).await;
            }
            // The handler ends the transaction itself.
            end => tx.batch_execute(end).await?,
        }
    }
    Ok(())
}
