//! Print the decoded pgoutput stream of a sample workload, with its LSNs.
//!
//! ```text
//! cargo run -p walrelay-pg --example stream_events
//! ```
//! starts a throwaway PostgreSQL cluster (Debian's PostgreSQL 15; run
//! `scripts/install-postgres.sh` first on a fresh machine), creates an
//! outbox table and a publication, runs a small workload (messages, outbox
//! inserts, a COPY, a rolled-back transaction, a non-transactional message)
//! and prints every event the slot delivers. It confirms each transaction's
//! end LSN as it goes and shows the slot's `confirmed_flush_lsn` at the end.
//!
//! `--url URL --slot NAME --publication NAME` streams from an existing
//! database instead (no workload), until Ctrl-C.

use std::time::Duration;

use anyhow::{Context, Result};
use walrelay_pg::xlog::ReplicationMessage;
use walrelay_pg::{
    Config, PgOutputOptions, ReplicationConnection, ReplicationStream, SslMode, StreamOptions,
};
use walrelay_pgoutput::{ColumnValue, Decoder, Lsn, PgOutputMessage, RelationCache};
use walrelay_testkit::{db, outbox_table, ClusterOptions, OutboxKeys, PgCluster};

/// (what, SQL, transactions the slot will deliver for it)
const WORKLOAD: &[(&str, &str, usize)] = &[
    ("two messages in one transaction", "BEGIN; SELECT pg_logical_emit_message(true, 'orders', '{\"id\": 1}'); SELECT pg_logical_emit_message(true, 'orders', '{\"id\": 2}'); COMMIT;", 1),
    ("an outbox row", "INSERT INTO outbox VALUES ('e-1', 'order', 'o-1', 'OrderCreated', '{\"total\": 42}')", 1),
    ("a message, then a row starting where the message ends", "BEGIN; SELECT pg_logical_emit_message(true, 'orders', 'm1'); INSERT INTO outbox VALUES ('e-2', 'order', 'o-2', 'OrderPaid', '{}'); COMMIT;", 1),
    ("a rolled-back transaction (nothing arrives)", "BEGIN; SELECT pg_logical_emit_message(true, 'orders', 'never'); ROLLBACK;", 0),
    ("a non-transactional message, flushed by the next commit", "SELECT pg_logical_emit_message(false, 'audit', 'login'); SELECT pg_logical_emit_message(true, 'orders', 'flush');", 1),
];

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if let Some(url) = arg("--url") {
        let config = Config::from_env_and_str(&url)?;
        let slot = arg("--slot").unwrap_or_else(|| "walrelay".into());
        let publication = arg("--publication").unwrap_or_else(|| "walrelay".into());
        let mut stream = open(&config, &slot, &publication).await?;
        println!(
            "streaming slot {slot} from {}; Ctrl-C to stop",
            config.redacted_url()
        );
        let mut printer = Printer::default();
        tokio::select! {
            r = print_events(&mut stream, &mut printer, usize::MAX) => { r?; }
            _ = tokio::signal::ctrl_c() => {}
        }
        return stream.stop().await.map_err(Into::into);
    }

    let cluster = tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default()))
        .await?
        .context("starting a throwaway PostgreSQL (run scripts/install-postgres.sh first)")?;
    println!("throwaway {} on port {}", cluster.version(), cluster.port());
    let client = cluster.client().await?;
    client
        .batch_execute(&format!(
            "{}\n    CREATE PUBLICATION walrelay FOR TABLE outbox;",
            outbox_table(OutboxKeys::Required)
        ))
        .await?;
    let config =
        Config::parse(&cluster.conninfo("postgres", "postgres"))?.sslmode(SslMode::Disable);
    let mut stream = open(&config, "walrelay", "walrelay").await?;

    let mut printer = Printer::default();
    let mut commits = 0;
    for &(what, sql, expected) in WORKLOAD {
        println!("\n-- {what}");
        client.batch_execute(sql).await?;
        if expected == 0 {
            println!("   (rolled back: the slot sends nothing)");
            continue;
        }
        commits += print_events(&mut stream, &mut printer, expected).await?;
    }
    let handle = stream.status_handle();
    handle.send_now().await?;
    let confirmed = db::confirmed_flush_lsn(&client, "walrelay").await?;
    println!(
        "\n{commits} transactions; confirmed {}; slot confirmed_flush_lsn = {}",
        handle.stats().confirmed,
        confirmed.unwrap_or_default()
    );
    stream.stop().await?;
    Ok(())
}

async fn open(config: &Config, slot: &str, publication: &str) -> Result<ReplicationStream> {
    let mut conn = ReplicationConnection::connect(config).await?;
    let system = conn.identify_system().await?;
    conn.check_wal_level().await?;
    conn.check_publications(&[publication.to_owned()]).await?;
    let slot_status = conn.ensure_slot(slot).await?;
    let start = slot_status.info().confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
    println!(
        "system {} timeline {} at {}; slot {slot} confirmed_flush_lsn {start}",
        system.system_id, system.timeline, system.xlogpos
    );
    let options = StreamOptions {
        status_interval: Duration::from_secs(1),
        initial_flush: start,
        ..StreamOptions::default()
    };
    Ok(conn
        .start_replication(
            slot,
            Lsn::ZERO,
            &PgOutputOptions::new([publication]),
            options,
        )
        .await?)
}

/// Decoding state. It lives as long as the stream: the server sends each
/// Relation once per session, before the table's first change.
#[derive(Default)]
struct Printer {
    decoder: Decoder,
    relations: RelationCache,
}

/// Print events until `commits` transactions have ended; confirm each
/// transaction's end LSN after printing it (printing is this example's
/// "sink").
async fn print_events(
    stream: &mut ReplicationStream,
    p: &mut Printer,
    commits: usize,
) -> Result<usize> {
    let Printer { decoder, relations } = p;
    let mut seen = 0;
    while seen < commits {
        let msg = stream.recv().await.context("stream ended")??;
        let ReplicationMessage::XLogData(x) = msg else {
            continue;
        };
        let at = x.wal_start.to_string();
        match decoder.decode(x.data)? {
            PgOutputMessage::Begin(b) => {
                println!("{at:>12}  BEGIN    xid {} final_lsn {}", b.xid, b.final_lsn)
            }
            PgOutputMessage::Commit(c) => {
                println!(
                    "{at:>12}  COMMIT   commit_lsn {} end_lsn {}",
                    c.commit_lsn, c.end_lsn
                );
                stream.confirm(c.end_lsn);
                seen += 1;
            }
            PgOutputMessage::Message(m) => {
                println!(
                    "{at:>12}  MESSAGE  {} prefix {:?} lsn {} content {:?}",
                    if m.transactional() {
                        "transactional"
                    } else {
                        "non-transactional"
                    },
                    m.prefix_str()?,
                    m.lsn,
                    String::from_utf8_lossy(&m.content)
                );
                if !m.transactional() {
                    stream.confirm(m.lsn);
                }
            }
            PgOutputMessage::Relation(r) => {
                println!(
                    "{at:>12}  RELATION {}.{} ({} columns)",
                    r.namespace,
                    r.name,
                    r.columns.len()
                );
                relations.insert(r);
            }
            PgOutputMessage::Insert(i) => {
                let row = relations.row(i.relation_id, &i.new)?;
                let cols: Vec<String> = row
                    .iter()
                    .map(|(c, v)| match v {
                        ColumnValue::Null => format!("{}=NULL", c.name),
                        ColumnValue::UnchangedToast => format!("{}=<unchanged>", c.name),
                        ColumnValue::Text(t) | ColumnValue::Binary(t) => {
                            format!("{}={}", c.name, String::from_utf8_lossy(t))
                        }
                    })
                    .collect();
                println!(
                    "{at:>12}  INSERT   {} {}",
                    row.relation().name,
                    cols.join(" ")
                );
            }
            other => println!("{at:>12}  {}", other.kind()),
        }
    }
    Ok(seen)
}
