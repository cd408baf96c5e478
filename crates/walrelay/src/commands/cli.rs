//! Command line: `walrelay setup`, `walrelay run`, `walrelay config`.
//!
//! Precedence: flags, then environment variables (each flag names its
//! variable in `--help`), then the TOML file (`--config`), then defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError, HeaderSet, KeylessPlacement, MessageRoute};
use crate::kafka::properties::KafkaConfig;

/// Relay a PostgreSQL logical replication slot to Kafka, with ordered
/// 128-bit idempotency keys so consumers can process every event exactly
/// once.
#[derive(Debug, Parser)]
#[command(name = "walrelay", version, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub options: Options,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create what `run` needs, if missing: the SQL helpers
    /// (walrelay.emit), the publication (for the outbox tables, or none
    /// for messages only) and the replication slot. Idempotent; reports
    /// what it created and what already existed. Refuses to create a slot
    /// it created before and that is gone (a restore, a failover, an
    /// upgrade) unless --accept-slot-loss says so.
    Setup(SetupArgs),
    /// Relay until SIGTERM or SIGINT: then stop reading, wait for Kafka to
    /// acknowledge what is in flight, report the final position to
    /// PostgreSQL, and exit 0.
    Run,
    /// Print the effective configuration (file, environment and flags
    /// merged) as TOML, without secrets, and exit.
    Config,
    /// Read topics back from Kafka and check their idempotency keys.
    ///
    /// Per partition and source: replayed duplicates (fine), keys out of
    /// order (a high-water-mark consumer would drop them), gaps (via
    /// the previous key). Needs only Kafka settings (docs/verify.md).
    /// Exit codes: 0 clean, 1 a key out of order, 2 usage error, 3 gaps or
    /// malformed headers, 4 could not verify (Kafka, topic missing).
    Verify(crate::commands::verify::VerifyArgs),
    /// Show the slot and publication as PostgreSQL sees them: plugin,
    /// active walsender, confirmed_flush_lsn, lag in bytes, wal_status,
    /// safe_wal_size, published tables. Exit codes: 0 ok, 1 could not
    /// check, 2 slot or publication missing or wal_level not logical,
    /// 3 slot invalidated (lost), 4 slot at risk or lag over
    /// --max-lag-bytes, 5 no relay connected (with --require-active),
    /// 64 invalid command line.
    Status(StatusArgs),
}

/// Options of `walrelay setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Create the replication slot even though the one `setup` created
    /// before is gone, accepting that what was committed since it was lost
    /// is not relayed (docs/operations.md, "A lost replication slot").
    /// Deliberately a flag only, never a setting: it is a decision about
    /// one incident. Where the WAL position went back, it also needs a new
    /// relay.source_id.
    #[arg(long)]
    pub accept_slot_loss: bool,
}

/// Options of `walrelay status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit 4 when the slot lags the current WAL by more than this.
    #[arg(long, value_name = "BYTES")]
    pub max_lag_bytes: Option<i64>,
    /// Exit 5 when no relay streams from the slot (it is not active),
    /// e.g. for a check that walrelay is running.
    #[arg(long)]
    pub require_active: bool,
    /// Also report the Kafka topics' durability settings and whether the
    /// tail fence can trust them (informational: the exit code stays
    /// PostgreSQL's).
    #[arg(long)]
    pub kafka: bool,
    /// A topic to report with --kafka (repeatable; implies --kafka)
    /// [default: the topics the configuration names, and the existing
    /// topics an outbox topic template matches].
    #[arg(long = "topic", value_name = "TOPIC")]
    pub topics: Vec<String>,
}

impl StatusArgs {
    /// The checks these flags ask for.
    pub fn limits(&self) -> crate::commands::status::Limits {
        crate::commands::status::Limits {
            max_lag_bytes: self.max_lag_bytes,
            require_active: self.require_active,
        }
    }
}

/// The exit code for a command line clap refused: 64 (EX_USAGE) for
/// `walrelay status`, whose 2 means "slot missing"; clap's own code (2)
/// for the other commands, as documented for `walrelay verify`.
pub fn usage_exit_code(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    use clap::CommandFactory;
    let matches = Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(args);
    match matches.ok().as_ref().and_then(|m| m.subcommand_name()) {
        Some("status") => crate::commands::status::USAGE,
        _ => 2,
    }
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Options shared by every command.
#[derive(Debug, Args)]
pub struct Options {
    /// TOML configuration file (see walrelay.example.toml).
    #[arg(long, short = 'c', env = "WALRELAY_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// PostgreSQL connection: a libpq URL or keyword string. PG* variables
    /// (PGHOST, PGUSER, PGPASSWORD, PGSSLMODE, ...) fill in the rest.
    #[arg(
        long,
        env = "WALRELAY_POSTGRES_URL",
        global = true,
        hide_env_values = true
    )]
    pub postgres_url: Option<String>,

    /// Replication slot name [default: walrelay].
    #[arg(long, env = "WALRELAY_SLOT", global = true)]
    pub slot: Option<String>,

    /// Publication name [default: walrelay].
    #[arg(long, env = "WALRELAY_PUBLICATION", global = true)]
    pub publication: Option<String>,

    /// How often the confirmed position is reported to PostgreSQL, e.g.
    /// "1s" [default: 1s].
    #[arg(long, env = "WALRELAY_STATUS_INTERVAL", global = true, value_parser = humantime::parse_duration)]
    pub status_interval: Option<Duration>,

    /// How often `run` checks that the publication still covers every
    /// configured outbox table, on a plain SQL connection, and samples the
    /// server's WAL position for walrelay_slot_lag_bytes, e.g. "2s"
    /// [default: 2s].
    #[arg(long, env = "WALRELAY_PUBLICATION_CHECK_INTERVAL", global = true, value_parser = humantime::parse_duration)]
    pub publication_check_interval: Option<Duration>,

    /// `setup` makes the slot a failover slot (PostgreSQL 17 and later),
    /// kept by standbys with sync_replication_slots = on: `--slot-failover`
    /// or `--slot-failover=true|false` [default: false].
    #[arg(long, env = "WALRELAY_POSTGRES_SLOT_FAILOVER", global = true, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub slot_failover: Option<bool>,

    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long, env = "WALRELAY_KAFKA_BOOTSTRAP_SERVERS", global = true)]
    pub bootstrap_servers: Option<String>,

    /// A librdkafka producer property, NAME=VALUE (repeatable), e.g.
    /// --kafka-property linger.ms=5. A secret (sasl.password, ...) can be
    /// read from a variable or file: sasl.password=env:NAME or
    /// sasl.password=file:/path (docs/security.md).
    #[arg(long = "kafka-property", value_name = "NAME=VALUE", global = true, value_parser = parse_pair)]
    pub kafka_properties: Vec<(String, String)>,

    /// Route raw logical messages with PREFIX to TOPIC (repeatable).
    #[arg(long = "route", value_name = "PREFIX=TOPIC", global = true, value_parser = parse_pair)]
    pub routes: Vec<(String, String)>,

    /// An outbox table, schema.table (repeatable), with the default
    /// Debezium-compatible column names and topic template.
    #[arg(long = "outbox-table", value_name = "TABLE", global = true)]
    pub outbox_tables: Vec<String>,

    /// Logical-message prefix written by another tool, skipped on purpose
    /// (repeatable).
    #[arg(long = "ignore-prefix", value_name = "PREFIX", global = true)]
    pub ignore_prefixes: Vec<String>,

    /// Source id in the walrelay-source header [default:
    /// SYSTEM-IDENTIFIER/DATABASE/SLOT].
    #[arg(long, env = "WALRELAY_SOURCE_ID", global = true)]
    pub source_id: Option<String>,

    /// The compacted topic holding each source's record, which every
    /// session start and setup check the database against [default:
    /// walrelay.sources].
    #[arg(long, env = "WALRELAY_SOURCE_RECORD_TOPIC", global = true)]
    pub source_record_topic: Option<String>,

    /// Which of walrelay's headers every record carries: lean (idempotency
    /// key, source, layout, previous key) or full (also the commit LSN,
    /// the event's LSN, the transaction id and the commit time)
    /// [default: lean].
    #[arg(long, env = "WALRELAY_HEADERS", global = true, value_enum)]
    pub headers: Option<HeaderSet>,

    /// How records without a key get their partition: wal-range (runs of
    /// consecutive transactions share one) or commit (each transaction
    /// on its own, as before) [default: wal-range].
    #[arg(long, env = "WALRELAY_KEYLESS_PLACEMENT", global = true, value_enum)]
    pub keyless_placement: Option<KeylessPlacement>,

    /// Topic for events that cannot be routed (malformed envelope, unknown
    /// prefix, NULL outbox key, outbox UPDATE, ...): they become
    /// dead-letter records there and the relay keeps going, instead of
    /// stopping at them [default: none: stop].
    #[arg(
        long,
        env = "WALRELAY_DEAD_LETTER_TOPIC",
        global = true,
        value_name = "TOPIC"
    )]
    pub dead_letter_topic: Option<String>,

    /// Most events sent to Kafka but not yet acknowledged [default: 20000].
    #[arg(long, env = "WALRELAY_MAX_IN_FLIGHT_EVENTS", global = true)]
    pub max_in_flight_events: Option<usize>,

    /// Most bytes of such events [default: 8388608].
    #[arg(long, env = "WALRELAY_MAX_IN_FLIGHT_BYTES", global = true)]
    pub max_in_flight_bytes: Option<usize>,

    /// Serve Prometheus metrics (/metrics) and health checks (/healthz,
    /// /readyz) over HTTP on this address while `run` runs, e.g.
    /// "127.0.0.1:9187" (docs/metrics.md) [default: disabled].
    #[arg(
        long,
        env = "WALRELAY_METRICS_ADDR",
        global = true,
        value_name = "HOST:PORT"
    )]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Append the relay's audit trace (sessions, every produced record,
    /// every acknowledgement, every position confirmed to PostgreSQL) to
    /// this file as JSON lines, for fault-injection tests
    /// (crates/walrelay-chaos). Not for production use.
    #[arg(long, global = true, hide = true, value_name = "PATH")]
    pub trace_file: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "WALRELAY_LOG_FORMAT", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter (tracing EnvFilter syntax), e.g. "info" or
    /// "walrelay=debug".
    #[arg(long, env = "WALRELAY_LOG", global = true, default_value = "info")]
    pub log: String,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

impl Options {
    /// `walrelay verify`'s Kafka settings, bootstrap servers and properties: the file's `[kafka]` section (if
    /// `--config` is given; the rest of the file is neither needed nor
    /// validated), overridden by flags and environment.
    pub fn kafka_config(&self) -> anyhow::Result<KafkaConfig> {
        let mut kafka = match &self.config {
            Some(path) => Config::load(path)?.kafka,
            None => KafkaConfig::default(),
        };
        if let Some(v) = &self.bootstrap_servers {
            kafka.bootstrap_servers = v.clone();
        }
        for (k, v) in &self.kafka_properties {
            kafka.properties.insert(k.clone(), v.clone());
        }
        if kafka.bootstrap_servers.trim().is_empty() {
            anyhow::bail!("--bootstrap-servers must name at least one broker (host:port)");
        }
        Ok(kafka)
    }

    /// The file (if any) with flags and environment applied, validated.
    pub fn effective_config(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(v) = &self.postgres_url {
            c.postgres.url = v.clone();
        }
        if let Some(v) = &self.slot {
            c.postgres.slot = v.clone();
        }
        if let Some(v) = &self.publication {
            c.postgres.publication = v.clone();
        }
        if let Some(v) = self.status_interval {
            c.postgres.status_interval = v;
        }
        if let Some(v) = self.publication_check_interval {
            c.postgres.publication_check_interval = v;
        }
        if let Some(v) = self.slot_failover {
            c.postgres.slot_failover = v;
        }
        if let Some(v) = &self.bootstrap_servers {
            c.kafka.bootstrap_servers = v.clone();
        }
        for (k, v) in &self.kafka_properties {
            c.kafka.properties.insert(k.clone(), v.clone());
        }
        for (prefix, topic) in &self.routes {
            c.messages.retain(|m| &m.prefix != prefix);
            c.messages.push(MessageRoute {
                prefix: prefix.clone(),
                topic: topic.clone(),
            });
        }
        for table in &self.outbox_tables {
            if !c.outbox.iter().any(|o| &o.table == table) {
                c.outbox.push(
                    Config::from_toml(
                        &format!("[[outbox]]\ntable = {table:?}\n"),
                        "--outbox-table",
                    )?
                    .outbox
                    .remove(0),
                );
            }
        }
        c.relay
            .ignore_prefixes
            .extend(self.ignore_prefixes.iter().cloned());
        if let Some(v) = &self.source_id {
            c.relay.source_id = Some(v.clone());
        }
        if let Some(v) = self.headers {
            c.relay.headers = v;
        }
        if let Some(v) = self.keyless_placement {
            c.relay.keyless_placement = v;
        }
        if let Some(v) = &self.source_record_topic {
            c.relay.source_record_topic = v.clone();
        }
        if let Some(v) = self.max_in_flight_events {
            c.relay.max_in_flight_events = v;
        }
        if let Some(v) = &self.dead_letter_topic {
            c.dead_letter.topic = Some(v.clone());
        }
        if let Some(v) = self.max_in_flight_bytes {
            c.relay.max_in_flight_bytes = v;
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::render;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_the_file_and_render_round_trips() {
        let cli = Cli::try_parse_from([
            "walrelay",
            "--postgres-url",
            "postgresql://u:hunter2@h/db",
            "--slot",
            "s1",
            "--kafka-property",
            "linger.ms=1",
            "--kafka-property",
            "sasl.password=topsecret",
            "--kafka-property",
            "security.protocol=SASL_SSL",
            "--kafka-property",
            "sasl.mechanism=SCRAM-SHA-512",
            "--kafka-property",
            "sasl.username=relay",
            "--kafka-property",
            "ssl.key.password=env:WALRELAY_TEST_KEY_PASSWORD",
            "--route",
            "orders=orders-topic",
            "--outbox-table",
            "app.outbox",
            "--dead-letter-topic",
            "dlq",
            "config",
        ])
        .unwrap();
        let c = cli.options.effective_config().unwrap();
        assert_eq!(c.postgres.slot, "s1");
        assert_eq!(c.kafka.properties["linger.ms"], "1");
        assert_eq!(c.messages[0].topic, "orders-topic");
        assert_eq!(
            c.outbox[0].qualified_name(),
            ("app".into(), "outbox".into())
        );
        let text = render(&c);
        assert!(
            !text.contains("hunter2") && !text.contains("topsecret"),
            "{text}"
        );
        // A secret reference is not a secret: shown as written.
        assert!(
            text.contains("\"ssl.key.password\" = \"env:WALRELAY_TEST_KEY_PASSWORD\""),
            "{text}"
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("topsecret"),
            "{debug}"
        );
        // What `walrelay config` prints is itself a valid configuration.
        let again = Config::from_toml(&text, "rendered").unwrap();
        assert_eq!(again.outbox, c.outbox);
        assert_eq!(again.messages, c.messages);
        assert_eq!(again.dead_letter.topic.as_deref(), Some("dlq"));
    }

    #[test]
    fn status_usage_errors_have_a_code_of_their_own() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            usage_exit_code(args(&["walrelay", "status", "--max-lag-bytes", "x"])),
            crate::commands::status::USAGE
        );
        assert_eq!(
            usage_exit_code(args(&["walrelay", "--slot", "s", "status", "--bogus"])),
            crate::commands::status::USAGE
        );
        assert_eq!(usage_exit_code(args(&["walrelay", "verify", "--bogus"])), 2);
        assert_eq!(usage_exit_code(args(&["walrelay", "--bogus"])), 2);
    }

    /// The effective configuration of `walrelay <a> config`.
    fn config(a: &[&str]) -> Result<Config, clap::Error> {
        let mut args = vec!["walrelay"];
        args.extend_from_slice(a);
        args.push("config");
        Cli::try_parse_from(args).map(|c| c.options.effective_config().unwrap())
    }

    #[test]
    fn the_header_set_is_lean_by_default_full_on_request_and_nothing_else() {
        assert_eq!(config(&[]).unwrap().relay.headers, HeaderSet::Lean);
        let full = config(&["--headers", "full"]).unwrap();
        assert_eq!(full.relay.headers, HeaderSet::Full);
        assert!(render(&full).contains("headers = \"full\""));
        assert!(config(&["--headers", "all"]).is_err());
        let file: Config = Config::from_toml("[relay]\nheaders = \"full\"\n", "t").unwrap();
        assert_eq!(file.relay.headers, HeaderSet::Full);
        let err = Config::from_toml("[relay]\nheaders = \"lite\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("lean"), "{err}");
    }

    #[test]
    fn keyless_records_are_placed_by_wal_range_by_default_by_commit_on_request() {
        let placement = |c: Config| c.relay.keyless_placement;
        assert_eq!(placement(config(&[]).unwrap()), KeylessPlacement::WalRange);
        let commit = config(&["--keyless-placement", "commit"]).unwrap();
        assert!(render(&commit).contains("keyless_placement = \"commit\""));
        assert_eq!(placement(commit), KeylessPlacement::Commit);
        assert!(config(&["--keyless-placement", "sticky"]).is_err());
        let file = Config::from_toml("[relay]\nkeyless_placement = \"commit\"\n", "t").unwrap();
        assert_eq!(placement(file), KeylessPlacement::Commit);
        let err = Config::from_toml("[relay]\nkeyless_placement = \"random\"\n", "t").unwrap_err();
        assert!(err.to_string().contains("wal-range"), "{err}");
    }

    #[test]
    fn an_empty_source_id_is_refused() {
        let cli = Cli::try_parse_from(["walrelay", "--source-id", "", "config"]).unwrap();
        let err = cli.options.effective_config().unwrap_err().to_string();
        assert!(
            err.contains("relay.source_id") && err.contains("must not be empty"),
            "{err}"
        );
    }

    #[test]
    fn help_explains_every_option() {
        let help = Cli::command().render_long_help().to_string();
        for opt in [
            "--postgres-url",
            "--slot",
            "--bootstrap-servers",
            "--kafka-property",
            "--route",
            "--outbox-table",
            "--source-id",
            "--max-in-flight-events",
            "--status-interval",
            "--log-format",
        ] {
            assert!(help.contains(opt), "{opt} missing from --help");
        }
    }

    #[test]
    fn verify_needs_no_postgres_settings() {
        use crate::commands::verify::exit;
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "walrelay",
            "verify",
            "--bootstrap-servers",
            "k:9092",
            "--topic",
            "a",
            "--topic",
            "b",
            "--from",
            "c:0:5",
            "--idle-timeout",
            "500ms",
            "--json",
        ])
        .unwrap();
        let Command::Verify(args) = &cli.command else {
            panic!("{cli:?}")
        };
        assert_eq!(args.topics, ["a", "b"]);
        assert_eq!(args.idle_timeout, Duration::from_millis(500));
        assert!(args.json && args.timeout.is_none());
        let kafka = cli.options.kafka_config().unwrap();
        assert_eq!(kafka.bootstrap_servers, "k:9092");
        // --topic or --from is required.
        let err = Cli::try_parse_from(["walrelay", "verify"]).unwrap_err();
        assert_eq!(err.exit_code(), exit::USAGE);
        assert!(Cli::try_parse_from(["walrelay", "verify", "--from", "t:0:0"]).is_ok());
    }
}
