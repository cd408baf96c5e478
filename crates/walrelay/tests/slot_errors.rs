//! Bad connection settings and a broken slot, through the real
//! `walrelay run` (and `status`, `setup`): each stops the relay at once, not
//! after retrying forever, with an error that says what failed and what to
//! do (issue #5, item 2). The bad-input matrix in docs/troubleshooting.md
//! names these tests.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use support::{Env, WAIT};
use walrelay_pgoutput::Lsn;
use walrelay_testkit::{
    await_condition, read_topics, Auth, BrokerKind, ClusterOptions, TestBroker,
};

/// Never contacted: every error below happens before a producer exists.
const NO_BROKER: &str = "127.0.0.1:9";
const RESTARTING: &str = "restarting from the slot's confirmed position";

/// A `walrelay` process with its stdout and stderr in one file.
struct Walrelay {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Walrelay {
    fn spawn(url: &str, bootstrap: &str, envs: &[(&str, &str)], args: &[&str]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("walrelay.log");
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args(["--postgres-url", url, "--bootstrap-servers", bootstrap])
            .args(["--status-interval", "200ms"])
            // No PGPASSWORD, ~/.pgpass or PGSSLMODE from the machine.
            .env_remove("PGPASSWORD")
            .env("PGPASSFILE", dir.path().join("no-pgpass"))
            .env_remove("PGSSLMODE")
            .envs(envs.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        Ok(Walrelay {
            child,
            log,
            _dir: dir,
        })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until the process exits on its own; its exit code and output.
    async fn exit(&mut self, within: Duration) -> Result<(i32, String)> {
        let mut code = None;
        await_condition(within, Duration::from_millis(50), || {
            let done = self
                .child
                .try_wait()
                .map(|s| s.map(|s| s.code().unwrap_or(-1)));
            if let Ok(Some(c)) = done {
                code = Some(c);
            }
            async move { Ok(done?.is_some()) }
        })
        .await
        .with_context(|| {
            format!(
                "walrelay kept running instead of stopping with an error:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
        })?;
        Ok((code.unwrap_or(-1), self.output()))
    }
}

impl Drop for Walrelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `walrelay run` that must stop by itself: its output, after checking
/// that it exited non-zero and did not retry.
async fn run_fails(url: &str, envs: &[(&str, &str)], args: &[&str]) -> Result<String> {
    let mut args = args.to_vec();
    args.push("run");
    let mut relay = Walrelay::spawn(url, NO_BROKER, envs, &args)?;
    let (code, out) = relay.exit(Duration::from_secs(60)).await?;
    ensure!(code == 1, "exit code {code}:\n{out}");
    ensure!(out.contains("Error: "), "no error printed:\n{out}");
    ensure!(
        !out.contains(RESTARTING),
        "a non-transient error was retried:\n{out}"
    );
    Ok(out)
}

fn url(env: &Env, userinfo: &str, params: &str) -> String {
    format!(
        "postgresql://{userinfo}@127.0.0.1:{}/postgres?{params}",
        env.cluster.port()
    )
}

fn assert_has(out: &str, parts: &[&str]) {
    for p in parts {
        assert!(out.contains(p), "missing {p:?} in:\n{out}");
    }
}

async fn wal_status(env: &Env) -> Result<Option<String>> {
    Ok(env
        .client
        .query_opt(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'walrelay'",
            &[],
        )
        .await?
        .and_then(|r| r.get(0)))
}

/// Write WAL and checkpoint until the slot is invalidated
/// (`max_slot_wal_keep_size` is 1MB, less than one segment).
async fn invalidate_the_slot(env: &Env) -> Result<()> {
    await_condition(WAIT, Duration::from_millis(10), || async {
        env.client
            .batch_execute(
                "INSERT INTO busy (v) VALUES ('wal'); SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .await?;
        Ok(wal_status(env).await?.as_deref() == Some("lost"))
    })
    .await
    .context("the slot was not invalidated")
}

fn small_wal_budget() -> ClusterOptions {
    ClusterOptions::default()
        .conf("max_slot_wal_keep_size", "1MB")
        .conf("wal_keep_size", "0")
}

/// A Tansu broker (one test kills it), whichever WALRELAY_BROKER says.
async fn with_broker(mut env: Env) -> Result<Env> {
    env.broker =
        Some(tokio::task::spawn_blocking(|| TestBroker::start_kind(BrokerKind::Tansu)).await??);
    Ok(env)
}

fn lsn_after(out: &str, marker: &str) -> Result<Lsn> {
    let start = out.find(marker).context("marker not in the output")? + marker.len();
    let text: String = out[start..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || *c == '/')
        .collect();
    Ok(text.parse()?)
}

fn status(env: &Env) -> Result<(i32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--postgres-url", &url(env, "postgres", "sslmode=disable")])
        .args(["--log", "warn", "status"])
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
    ))
}

/// The slot was invalidated while walrelay was stopped: `run` refuses it
/// at once (without creating a producer), says that the events in the
/// removed WAL cannot be relayed and what to do; `status` exits 3 and
/// `setup` refuses to reuse the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_invalidated_by_max_slot_wal_keep_size_stops_run_and_status_reports_it() -> Result<()>
{
    let env = Env::postgres_only(small_wal_budget()).await?;
    walrelay::commands::setup::setup(&env.config(NO_BROKER)).await?;
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    // Published while walrelay is down: in the WAL that will be removed.
    env.client
        .batch_execute("SELECT walrelay.emit('slot-errors', 'k', '{\"lost\": true}')")
        .await?;
    invalidate_the_slot(&env).await?;

    let out = run_fails(&url(&env, "postgres", "sslmode=disable"), &[], &[]).await?;
    assert_has(
        &out,
        &[
            "replication slot \"walrelay\" is invalidated (wal_status = lost)",
            "removed WAL the slot still needed",
            "max_slot_wal_keep_size",
            &format!("events committed after its confirmed position {confirmed} cannot be relayed"),
            "SELECT pg_drop_replication_slot('walrelay')",
            "create a new one with `walrelay setup --accept-slot-loss`",
            "backfill or reconcile",
            "wal_status 'unreserved'",
            "relay stopped",
        ],
    );

    let (code, text) = status(&env)?;
    assert_eq!(code, 3, "{text}");
    assert_has(
        &text,
        &[
            "wal_status           lost",
            "LOST: the slot was invalidated",
            "walrelay setup",
        ],
    );

    // setup does not paper over it either: the slot has to be dropped.
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--postgres-url", &url(&env, "postgres", "sslmode=disable")])
        .args(["--log", "warn", "setup"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_has(
        &err,
        &[
            "is invalidated (wal_status = lost)",
            "events in the lost WAL cannot be recovered",
        ],
    );
    Ok(())
}

/// The slot is invalidated under a running relay that cannot confirm
/// (Kafka is down, an event waits for it): PostgreSQL terminates the
/// walsender, the relay reconnects once, finds the slot lost and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_invalidated_under_a_running_relay_stops_it() -> Result<()> {
    let mut env = with_broker(Env::postgres_only(small_wal_budget()).await?).await?;
    let bootstrap = env.bootstrap();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let mut relay = Walrelay::spawn(
        &url(&env, "postgres", "sslmode=disable"),
        &bootstrap,
        &[],
        &["--log", "info", "run"],
    )?;
    env.client
        .batch_execute("SELECT walrelay.emit('slot-errors', 'k', '{\"n\": 1}')")
        .await?;
    read_topics(&bootstrap, &["slot-errors"], 1, WAIT).await?;

    // Kafka goes away; the next event cannot be acknowledged, so the slot
    // cannot move past it.
    env.broker
        .as_mut()
        .and_then(TestBroker::as_tansu_mut)
        .expect("a Tansu broker")
        .kill()?;
    env.client
        .batch_execute("SELECT walrelay.emit('slot-errors', 'k', '{\"n\": 2}')")
        .await?;
    invalidate_the_slot(&env).await?;

    let (code, out) = relay.exit(WAIT).await?;
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            "replication slot \"walrelay\" is invalidated (wal_status = lost)",
            "cannot be relayed",
            "`walrelay setup --accept-slot-loss`",
            "relay stopped",
        ],
    );
    Ok(())
}

/// The slot is dropped while walrelay runs (its walsender terminated, then
/// the slot dropped before the relay reconnects). walrelay must not create
/// a new slot, which would skip what was committed in between; it stops
/// and says from which position events may be missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_dropped_while_running_stops_the_relay_without_recreating_it() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let mut relay = Walrelay::spawn(
        &url(&env, "postgres", "sslmode=disable"),
        &bootstrap,
        &[],
        &["--log", "info", "run"],
    )?;
    env.client
        .batch_execute("SELECT walrelay.emit('slot-errors', 'k', '{\"n\": 1}')")
        .await?;
    read_topics(&bootstrap, &["slot-errors"], 1, WAIT).await?;
    let after_event = env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= after_event)
    })
    .await
    .context("the relay did not confirm the event")?;
    let confirmed_before_drop = env.confirmed_flush_lsn("walrelay").await?;

    // An active slot cannot be dropped: terminate its walsender, wait for
    // it to exit, and drop the slot before the relay is back (its first
    // reconnect waits 100 ms). If the relay won the race, do it again.
    await_condition(WAIT, Duration::from_millis(10), || async {
        env.client
            .batch_execute(
                "DO $$
                 DECLARE pid int;
                 BEGIN
                   SELECT active_pid INTO pid FROM pg_replication_slots WHERE slot_name = 'walrelay';
                   IF pid IS NOT NULL THEN
                     PERFORM pg_terminate_backend(pid, 10000);
                   END IF;
                   FOR i IN 1..100 LOOP
                     BEGIN
                       PERFORM pg_drop_replication_slot('walrelay');
                       RETURN;
                     EXCEPTION WHEN object_in_use THEN
                       PERFORM pg_sleep(0.001);
                     END;
                   END LOOP;
                   RAISE EXCEPTION 'the slot is still in use';
                 END $$;",
            )
            .await?;
        Ok(true)
    })
    .await?;

    let (code, out) = relay.exit(WAIT).await?;
    assert_eq!(code, 1, "{out}");
    assert_has(
        &out,
        &[
            "replication slot \"walrelay\" disappeared while walrelay was running",
            "events committed after",
            "may be missing from Kafka",
            "does not create a new slot by itself",
            "`walrelay setup --accept-slot-loss`",
            "backfill or reconcile",
            "relay stopped",
        ],
    );
    let reported = lsn_after(&out, "it had confirmed up to ")?;
    assert!(
        reported >= confirmed_before_drop,
        "reported {reported}, but the server had {confirmed_before_drop} confirmed:\n{out}"
    );
    // It reconnected after its walsender was terminated (once, unless it
    // won the race above), then stopped instead of retrying.
    assert!(out.contains(RESTARTING), "{out}");
    let slots: i64 = env
        .client
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await?
        .get(0);
    assert_eq!(slots, 0, "walrelay recreated the slot");
    Ok(())
}

/// A wrong password, TLS required but not offered, and a role without
/// REPLICATION: each stops `walrelay run` at once with the server's (or
/// walrelay's) reason and the setting to fix; the password never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_on_a_wrong_password_missing_tls_and_a_role_without_replication() -> Result<()> {
    const RIGHT: &str = "right-Pw-5e1";
    const WRONG: &str = "wrong-Pw-7c3a9";
    let env = Env::postgres_only(ClusterOptions::default().auth(Auth::scram(RIGHT))).await?;
    env.client
        .batch_execute(&format!("CREATE ROLE plain LOGIN PASSWORD '{RIGHT}'"))
        .await?;

    // A wrong password in the URL, with debug logging, and from PGPASSWORD.
    let fix = "check the password for this user: it comes from the connection URL, the password option, PGPASSWORD or the password file (~/.pgpass)";
    for (url, envs) in [
        (
            url(&env, &format!("postgres:{WRONG}"), "sslmode=disable"),
            vec![],
        ),
        (
            url(&env, "postgres", "sslmode=disable"),
            vec![("PGPASSWORD", WRONG)],
        ),
    ] {
        let out = run_fails(&url, &envs, &["--log", "debug"]).await?;
        assert_has(
            &out,
            &[
                "as user \"postgres\" failed: FATAL 28P01: password authentication failed for user \"postgres\"",
                fix,
            ],
        );
        assert!(!out.contains(WRONG), "the password was printed:\n{out}");
    }

    // No password anywhere: said before the server has to refuse it.
    let out = run_fails(&url(&env, "postgres", "sslmode=disable"), &[], &[]).await?;
    assert_has(
        &out,
        &["no password is configured; set it in the connection URL, PGPASSWORD or ~/.pgpass"],
    );

    // TLS required, but the server has ssl = off.
    let out = run_fails(
        &url(&env, &format!("postgres:{RIGHT}"), "sslmode=require"),
        &[],
        &[],
    )
    .await?;
    assert_has(
        &out,
        &[
            "does not support TLS but sslmode=require",
            "enable ssl on the server or use sslmode=prefer",
        ],
    );

    // A login role without the REPLICATION attribute.
    let out = run_fails(
        &url(&env, &format!("plain:{RIGHT}"), "sslmode=disable"),
        &[],
        &[],
    )
    .await?;
    assert_has(
        &out,
        &[
            "as user \"plain\" failed: FATAL 42501",
            "the role needs the REPLICATION attribute: ALTER ROLE <name> WITH REPLICATION",
        ],
    );
    assert!(!out.contains(RIGHT), "the password was printed:\n{out}");
    Ok(())
}

/// `wal_level = replica`: `run` and `setup` name the setting and the
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_setup_stop_on_wal_level_replica() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default().wal_level("replica")).await?;
    let fix = "set wal_level=logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL";
    let out = run_fails(&url(&env, "postgres", "sslmode=disable"), &[], &[]).await?;
    assert_has(&out, &["wal_level is 'replica'", fix]);

    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--postgres-url", &url(&env, "postgres", "sslmode=disable")])
        .args(["--log", "warn", "setup"])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        bail!("setup succeeded with wal_level=replica: {err}");
    }
    assert_has(&err, &["wal_level", "set wal_level=logical"]);
    Ok(())
}
