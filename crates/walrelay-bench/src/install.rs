//! What a bench run needs installed, and installing what is missing at
//! start.
//!
//! Why: the testkit finds PostgreSQL, the broker and Debezium where the
//! project's install scripts put them, and stops with "run
//! scripts/install-...sh" when one is missing. On a new machine a full run
//! therefore failed until the scripts were run by hand, Debezium's only
//! after PostgreSQL and the broker had started, the Python consumers' only
//! hours later, in the consumer section. Like `scripts/demo.sh`, the bench
//! now runs the script of each missing tool its run needs before anything
//! starts (the scripts are pinned and idempotent: what the tests use).
//!
//! An install can fail (no network, no root for apt, a script's error).
//! Without PostgreSQL or the broker nothing can run: the bench stops with
//! the reason. Without Debezium or the Python consumers' virtualenv it
//! skips the sections that need them, says so at start and names them in
//! the report's notes. A tool the user pointed to (`$WALRELAY_KAFKA_HOME`
//! and the like) is the user's choice: never installed over; and what the
//! run does not ask for (`--no-debezium`, `--no-consumer`, a Tansu run's
//! Debezium) is not installed at all.
//!
//! The decisions ([`Wants::of`], [`needs`], [`plan`], [`after_failure`],
//! [`first_root`]) are pure and unit-tested; [`prepare`] looks and runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Result};
use walrelay_testkit::debezium::DEBEZIUM_HOME_ENV;
use walrelay_testkit::{
    BrokerKind, DebeziumHome, KafkaHome, TansuBroker, KAFKA_HOME_ENV, PG_BIN_ENV, TANSU_BIN_ENV,
};

use crate::cli::Cli;

/// The checkout the bench was built from (its install scripts are found
/// here when the binary and the working directory are elsewhere).
const BUILT_FROM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Something a run needs that an install script of the project installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prerequisite {
    Postgres,
    Kafka,
    Tansu,
    Debezium,
    /// The pinned virtualenv the Python consumer rows run in.
    PythonVenv,
}

impl Prerequisite {
    fn what(self) -> &'static str {
        match self {
            Prerequisite::Postgres => "PostgreSQL",
            Prerequisite::Kafka => "Apache Kafka",
            Prerequisite::Tansu => "Tansu",
            Prerequisite::Debezium => "Debezium",
            Prerequisite::PythonVenv => "the Python consumers' virtualenv",
        }
    }

    fn script(self) -> &'static str {
        match self {
            Prerequisite::Postgres => "scripts/install-postgres.sh",
            Prerequisite::Kafka => "scripts/install-kafka.sh",
            Prerequisite::Tansu => "scripts/install-tansu.sh",
            Prerequisite::Debezium => "scripts/install-debezium.sh",
            Prerequisite::PythonVenv => "scripts/install-python-venv.sh",
        }
    }

    /// The variable naming an install of the user's: set, the bench
    /// installs nothing (the testkit checks it). Kafka's, Tansu's and
    /// Debezium's are also set to the path their script prints, as
    /// `scripts/demo.sh` does, so that the testkit finds an install made
    /// in another checkout than the one it was built in.
    fn env(self) -> Option<&'static str> {
        match self {
            Prerequisite::Postgres => Some(PG_BIN_ENV),
            Prerequisite::Kafka => Some(KAFKA_HOME_ENV),
            Prerequisite::Tansu => Some(TANSU_BIN_ENV),
            Prerequisite::Debezium => Some(DEBEZIUM_HOME_ENV),
            Prerequisite::PythonVenv => None,
        }
    }

    /// Whether its script prints the install's path for [`Self::env`]
    /// (PostgreSQL's installs system packages and prints progress).
    fn prints_path(self) -> bool {
        matches!(
            self,
            Prerequisite::Kafka | Prerequisite::Tansu | Prerequisite::Debezium
        )
    }

    /// The sections that cannot run without it; `None`: none can.
    fn sections(self) -> Option<&'static str> {
        match self {
            Prerequisite::Debezium => {
                Some("Debezium (its drains, restarts and latency mode dbz; crash: its tools)")
            }
            Prerequisite::PythonVenv => {
                Some("the Python consumer rows (py_*) and the Python relay's drains")
            }
            Prerequisite::Postgres | Prerequisite::Kafka | Prerequisite::Tansu => None,
        }
    }
}

/// What a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    pub broker: BrokerKind,
    /// Debezium unless `--no-debezium` (it runs on Kafka only).
    pub debezium: bool,
    /// The project's Python virtualenv: for a Python consumer among
    /// `--consumers`, or for the Python relay among the drains'
    /// references.
    pub python: bool,
}

impl Wants {
    /// What the benchmark's command line asks for.
    pub fn of(cli: &Cli) -> Wants {
        Wants {
            broker: cli.broker,
            debezium: !cli.no_debezium,
            python: (!cli.no_consumer
                && (cli.consumers.is_empty()
                    || cli.consumers.iter().any(|c| c.starts_with("py_"))))
                || (!cli.no_drain && !cli.no_references),
        }
    }
}

/// Everything the run needs, in install order.
pub fn needs(wants: Wants) -> Vec<Prerequisite> {
    let mut out = vec![Prerequisite::Postgres];
    match wants.broker {
        BrokerKind::Kafka => out.push(Prerequisite::Kafka),
        BrokerKind::Tansu => out.push(Prerequisite::Tansu),
    }
    if wants.debezium && wants.broker == BrokerKind::Kafka {
        out.push(Prerequisite::Debezium);
    }
    if wants.python {
        out.push(Prerequisite::PythonVenv);
    }
    out
}

/// What to install: the needs neither found nor named by their variable.
pub fn plan(
    needs: &[Prerequisite],
    env_set: impl Fn(&str) -> bool,
    found: impl Fn(Prerequisite) -> bool,
) -> Vec<Prerequisite> {
    needs
        .iter()
        .copied()
        .filter(|p| !p.env().is_some_and(&env_set) && !found(*p))
        .collect()
}

/// Sections skipped for want of a prerequisite, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub prerequisite: Prerequisite,
    /// For the log at start and the report's notes.
    pub note: String,
}

/// What an install that failed with `why` means: the sections skipped,
/// or (PostgreSQL, the broker) the end of the run.
pub fn after_failure(p: Prerequisite, why: &str) -> Result<Skip> {
    let failed = format!(
        "{} is not installed and {} failed ({why})",
        p.what(),
        p.script()
    );
    match p.sections() {
        Some(sections) => Ok(Skip {
            prerequisite: p,
            note: format!("skipped {sections}: {failed}"),
        }),
        None => bail!("{failed}: the bench cannot run without it"),
    }
}

/// What [`prepare`] left out.
#[derive(Debug, Default)]
pub struct Prepared {
    pub skipped: Vec<Skip>,
}

impl Prepared {
    pub fn skips(&self, p: Prerequisite) -> bool {
        self.skipped.iter().any(|s| s.prerequisite == p)
    }

    /// For the report's notes.
    pub fn notes(&self) -> Vec<String> {
        self.skipped.iter().map(|s| s.note.clone()).collect()
    }
}

/// The first of `candidates` or their ancestors that `is_root`.
pub fn first_root(
    candidates: impl IntoIterator<Item = PathBuf>,
    is_root: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    candidates
        .into_iter()
        .find_map(|c| c.ancestors().find(|a| is_root(a)).map(Path::to_path_buf))
}

/// The checkout whose scripts install: found from the bench binary
/// (`<root>/target/<profile>/walrelay-bench` under cargo), else from the
/// working directory, else the one it was built from.
fn repo_root() -> Option<PathBuf> {
    let candidates = [
        std::env::current_exe().ok(),
        std::env::current_dir().ok(),
        Some(PathBuf::from(BUILT_FROM)),
    ];
    let is_root =
        |d: &Path| d.join("Cargo.toml").is_file() && d.join("scripts/install-kafka.sh").is_file();
    first_root(candidates.into_iter().flatten(), is_root).map(|r| r.canonicalize().unwrap_or(r))
}

/// Whether `p` is where the testkit (or the consumer bench) looks.
fn found(p: Prerequisite, root: Option<&Path>) -> bool {
    match p {
        Prerequisite::Postgres => std::fs::read_dir("/usr/lib/postgresql")
            .map(|d| d.flatten().any(|e| e.path().join("bin/initdb").is_file()))
            .unwrap_or(false),
        Prerequisite::Kafka => KafkaHome::find().is_ok(),
        Prerequisite::Tansu => TansuBroker::find_binary().is_ok(),
        Prerequisite::Debezium => DebeziumHome::find().is_ok(),
        Prerequisite::PythonVenv => root
            .unwrap_or(Path::new(BUILT_FROM))
            .join("target/tools/python-venv/bin/python")
            .is_file(),
    }
}

/// Runs `p`'s script (its progress on stderr), then checks the result;
/// the error is why not, for [`after_failure`].
fn install(p: Prerequisite, root: Option<&Path>) -> Result<(), String> {
    let root = root.ok_or(
        "no checkout with scripts/install-kafka.sh above the bench binary or the working directory",
    )?;
    let stdout = match p {
        // Its progress, on the bench's stderr as every other script's.
        Prerequisite::Postgres => Stdio::from(std::io::stderr()),
        _ => Stdio::piped(),
    };
    let out = Command::new(root.join(p.script()))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running it: {e}"))?;
    if !out.status.success() {
        return Err(out.status.to_string());
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    let printed = printed.lines().last().unwrap_or_default().trim();
    if let Some(var) = p.env().filter(|_| p.prints_path()) {
        if !printed.is_empty() {
            // Before anything of the run starts: nothing reads the
            // environment concurrently.
            std::env::set_var(var, printed);
        }
    }
    if !found(p, Some(root)) {
        return Err(format!("it ran, but {} is still not found", p.what()));
    }
    Ok(())
}

/// Installs what `wants` needs and is missing, printing what; returns
/// the sections skipped for an install that failed, or the error when
/// nothing could run.
pub fn prepare(wants: Wants) -> Result<Prepared> {
    let root = repo_root();
    let env_set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty());
    let mut prepared = Prepared::default();
    let needs = needs(wants);
    let missing = plan(&needs, env_set, |p| found(p, root.as_deref()));
    if missing.is_empty() {
        let all: Vec<_> = needs.iter().map(|p| p.what()).collect();
        tracing::info!("found what the run needs: {}", all.join(", "));
    }
    for p in missing {
        eprintln!(
            "walrelay-bench: {} is missing: installing it with {}",
            p.what(),
            p.script()
        );
        match install(p, root.as_deref()) {
            Ok(()) => eprintln!("walrelay-bench: installed {}", p.what()),
            Err(why) => {
                let skip = after_failure(p, &why)?;
                eprintln!("walrelay-bench: {}", skip.note);
                prepared.skipped.push(skip);
            }
        }
    }
    Ok(prepared)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn wants(args: &[&str]) -> Vec<Prerequisite> {
        let cli =
            Cli::try_parse_from(std::iter::once("walrelay-bench").chain(args.iter().copied()))
                .unwrap();
        needs(Wants::of(&cli))
    }

    #[test]
    fn a_run_needs_what_its_sections_use() {
        use Prerequisite::*;
        assert_eq!(wants(&[]), [Postgres, Kafka, Debezium, PythonVenv]);
        assert_eq!(wants(&["--quick"]), [Postgres, Kafka, Debezium, PythonVenv]);
        // The user's choices: no Debezium, no consumers, only Rust ones.
        assert_eq!(wants(&["--no-debezium"]), [Postgres, Kafka, PythonVenv]);
        // The drains' Python relay needs the virtualenv too.
        assert_eq!(
            wants(&["--no-consumer"]),
            [Postgres, Kafka, Debezium, PythonVenv]
        );
        let rust_only = ["--no-references", "--consumers", "wr_batch,inbox_1"];
        assert_eq!(wants(&rust_only), [Postgres, Kafka, Debezium]);
        assert_eq!(
            wants(&["--no-drain", "--consumers", "wr_batch,inbox_1"]),
            [Postgres, Kafka, Debezium]
        );
        assert_eq!(
            wants(&["--no-references", "--consumers", "wr_batch,py_record"]),
            [Postgres, Kafka, Debezium, PythonVenv]
        );
        // Debezium runs on Kafka only.
        assert_eq!(
            wants(&["--broker", "tansu", "--no-consumer", "--no-references"]),
            [Postgres, Tansu]
        );
    }

    #[test]
    fn installs_only_what_is_missing_and_not_the_users_choice() {
        use Prerequisite::*;
        let needs = [Postgres, Kafka, Debezium, PythonVenv];
        let none = |_: &str| false;
        assert!(plan(&needs, none, |_| true).is_empty());
        assert_eq!(
            plan(&needs, none, |p| p == Postgres),
            [Kafka, Debezium, PythonVenv]
        );
        // $WALRELAY_DEBEZIUM_HOME set: the testkit says what is wrong with it.
        let dbz_set = |v: &str| v == DEBEZIUM_HOME_ENV;
        assert_eq!(
            plan(&needs, dbz_set, |p| p == Postgres),
            [Kafka, PythonVenv]
        );
    }

    #[test]
    fn a_failed_install_skips_its_sections_or_stops_the_run() {
        let skip = after_failure(Prerequisite::Debezium, "exit status: 1").unwrap();
        assert_eq!(
            skip.note,
            "skipped Debezium (its drains, restarts and latency mode dbz; crash: its tools): \
             Debezium is not installed and scripts/install-debezium.sh failed (exit status: 1)"
        );
        assert!(after_failure(Prerequisite::PythonVenv, "x").is_ok());
        for p in [
            Prerequisite::Postgres,
            Prerequisite::Kafka,
            Prerequisite::Tansu,
        ] {
            let err = after_failure(p, "no network").unwrap_err().to_string();
            assert!(err.ends_with("the bench cannot run without it"), "{err}");
        }
        let prepared = Prepared {
            skipped: vec![skip],
        };
        assert!(prepared.skips(Prerequisite::Debezium));
        assert!(!prepared.skips(Prerequisite::PythonVenv));
        assert_eq!(prepared.notes().len(), 1);
    }

    #[test]
    fn the_root_is_the_first_ancestor_with_the_scripts() {
        let is_root = |d: &Path| d == Path::new("/w/walrelay");
        let exe = PathBuf::from("/w/walrelay/target/release/walrelay-bench");
        assert_eq!(
            first_root([PathBuf::from("/tmp/x"), exe], is_root),
            Some(PathBuf::from("/w/walrelay"))
        );
        assert_eq!(first_root([PathBuf::from("/tmp/x")], is_root), None);
    }
}
