//! Where Debezium is installed: a Kafka Connect worker's jars and the
//! PostgreSQL connector's plugin directory, as `scripts/install-debezium.sh`
//! lays them out.

use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::broker::kafka::KAFKA_VERSION;
use crate::broker::util::workspace_root;

/// Environment variable naming a Debezium install directory; it wins over
/// the one `scripts/install-debezium.sh` puts under `target/tools`.
pub const DEBEZIUM_HOME_ENV: &str = "WALRELAY_DEBEZIUM_HOME";

/// The Debezium version `scripts/install-debezium.sh` pins (keep the two
/// equal).
pub const DEBEZIUM_VERSION: &str = "3.6.1.Final";

/// The plugin directory's name under `plugins/`.
const PLUGIN: &str = "debezium-connector-postgres";

/// A Debezium install: `libs/` (the Connect worker, at the broker's
/// version), `plugins/debezium-connector-postgres/` (the connector),
/// `config/log4j2.properties` (the worker's logging).
#[derive(Clone, Debug)]
pub struct DebeziumHome {
    dir: PathBuf,
}

impl DebeziumHome {
    /// `$WALRELAY_DEBEZIUM_HOME` if set, else
    /// `<workspace root>/target/tools/debezium-<DEBEZIUM_VERSION>-connect-<KAFKA_VERSION>`.
    /// The error names the script that installs it.
    pub fn find() -> anyhow::Result<DebeziumHome> {
        if let Some(value) = std::env::var_os(DEBEZIUM_HOME_ENV).filter(|v| !v.is_empty()) {
            let dir = PathBuf::from(value);
            let dir = if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            };
            if let Some(missing) = Self::missing(&dir) {
                bail!(
                    "{DEBEZIUM_HOME_ENV} is set to {}, which has no {missing} (run \
                     scripts/install-debezium.sh, which prints such a directory)",
                    dir.display()
                );
            }
            return Ok(DebeziumHome { dir });
        }
        let dir = Self::installed_path();
        match Self::missing(&dir) {
            None => Ok(DebeziumHome { dir }),
            Some(missing) => bail!(
                "Debezium {DEBEZIUM_VERSION} on Kafka Connect {KAFKA_VERSION} is not installed at \
                 {} (no {missing}): run scripts/install-debezium.sh (or set {DEBEZIUM_HOME_ENV} \
                 to a directory it printed)",
                dir.display()
            ),
        }
    }

    /// Where `scripts/install-debezium.sh` installs the pinned versions.
    pub fn installed_path() -> PathBuf {
        workspace_root().join(format!(
            "target/tools/debezium-{DEBEZIUM_VERSION}-connect-{KAFKA_VERSION}"
        ))
    }

    /// What an install at `dir` lacks, if anything.
    fn missing(dir: &Path) -> Option<&'static str> {
        let has_jar = |sub: &Path, prefix: &str| {
            std::fs::read_dir(dir.join(sub))
                .map(|entries| {
                    entries.flatten().any(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.starts_with(prefix) && name.ends_with(".jar")
                    })
                })
                .unwrap_or(false)
        };
        if !has_jar(Path::new("libs"), "connect-runtime-") {
            Some("libs/connect-runtime-*.jar")
        } else if !has_jar(&Path::new("plugins").join(PLUGIN), PLUGIN) {
            Some("plugins/debezium-connector-postgres/debezium-connector-postgres-*.jar")
        } else if !dir.join("config/log4j2.properties").is_file() {
            Some("config/log4j2.properties")
        } else {
            None
        }
    }

    /// The install directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The worker's class path (`libs/*`, as `java -cp` takes it).
    pub fn classpath(&self) -> PathBuf {
        self.dir.join("libs/*")
    }

    /// The worker's `plugin.path`.
    pub fn plugin_path(&self) -> PathBuf {
        self.dir.join("plugins")
    }

    /// The worker's log4j2 configuration.
    pub fn log_config(&self) -> PathBuf {
        self.dir.join("config/log4j2.properties")
    }
}
