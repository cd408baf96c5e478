//! Where Apache Kafka is installed: a directory laid out like Kafka's
//! distribution (`libs/*.jar`, `config/log4j2.properties`), as
//! `scripts/install-kafka.sh` makes it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::broker::util::workspace_root;

/// Environment variable naming a Kafka install directory; it wins over the
/// one `scripts/install-kafka.sh` puts under `target/tools`.
pub const KAFKA_HOME_ENV: &str = "WALRELAY_KAFKA_HOME";

/// The Kafka version `scripts/install-kafka.sh` pins (keep the two equal).
pub const KAFKA_VERSION: &str = "4.1.1";

/// A Kafka install directory.
#[derive(Clone, Debug)]
pub struct KafkaHome {
    dir: PathBuf,
}

impl KafkaHome {
    /// `$WALRELAY_KAFKA_HOME` if set (relative paths against the current
    /// directory, then the workspace root), else
    /// `<workspace root>/target/tools/kafka-<KAFKA_VERSION>`.
    pub fn find() -> anyhow::Result<KafkaHome> {
        if let Some(value) = std::env::var_os(KAFKA_HOME_ENV).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(&value);
            let candidates = if path.is_absolute() {
                vec![path.clone()]
            } else {
                [std::env::current_dir().ok(), Some(workspace_root())]
                    .into_iter()
                    .flatten()
                    .map(|dir| dir.join(&path))
                    .collect()
            };
            return match candidates.into_iter().find(|p| Self::looks_installed(p)) {
                Some(dir) => Ok(KafkaHome { dir }),
                None => bail!(
                    "{KAFKA_HOME_ENV} is set to {}, which has no libs/kafka_2.13-*.jar and \
                     config/log4j2.properties (run scripts/install-kafka.sh, which prints \
                     such a directory)",
                    path.display()
                ),
            };
        }
        let dir = Self::installed_path();
        if Self::looks_installed(&dir) {
            return Ok(KafkaHome { dir });
        }
        bail!(
            "Apache Kafka {KAFKA_VERSION} is not installed at {}: run scripts/install-kafka.sh \
             (or set {KAFKA_HOME_ENV} to a directory it printed)",
            dir.display()
        )
    }

    /// The install of another `version` that `scripts/install-kafka.sh
    /// <version>` made under `target/tools` (e.g. the 3.6 line, whose high
    /// watermark still passes records under min ISR).
    pub fn version(version: &str) -> anyhow::Result<KafkaHome> {
        let dir = workspace_root().join(format!("target/tools/kafka-{version}"));
        if Self::looks_installed(&dir) {
            return Ok(KafkaHome { dir });
        }
        bail!(
            "Apache Kafka {version} is not installed at {}: run scripts/install-kafka.sh {version}",
            dir.display()
        )
    }

    /// Where `scripts/install-kafka.sh` installs the pinned version.
    pub fn installed_path() -> PathBuf {
        workspace_root().join(format!("target/tools/kafka-{KAFKA_VERSION}"))
    }

    fn looks_installed(dir: &Path) -> bool {
        dir.join("config/log4j2.properties").is_file()
            && std::fs::read_dir(dir.join("libs"))
                .map(|entries| {
                    entries.flatten().any(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.starts_with("kafka_2.13-") && name.ends_with(".jar")
                    })
                })
                .unwrap_or(false)
    }

    /// The install directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A `java` command with Kafka's jars on the class path, the log4j2
    /// configuration, and `heap` as the maximum heap (`-Xmx`), with the
    /// serial collector (a small footprint, for tools and test nodes).
    pub(crate) fn java(&self, heap: &str) -> anyhow::Result<std::process::Command> {
        self.java_with(&[&format!("-Xmx{heap}"), "-Xms64m", "-XX:+UseSerialGC"])
    }

    /// A `java` command with Kafka's jars on the class path, the log4j2
    /// configuration and the JVM options `jvm`.
    pub(crate) fn java_with(&self, jvm: &[&str]) -> anyhow::Result<std::process::Command> {
        let java = match std::env::var_os("JAVA_HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home).join("bin/java"),
            None => PathBuf::from("java"),
        };
        let classpath = self.dir.join("libs/*");
        let log_config = self.dir.join("config/log4j2.properties");
        let mut cmd = std::process::Command::new(java);
        cmd.args(jvm)
            .arg("-Djava.awt.headless=true")
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                log_config.to_str().context("non-UTF-8 Kafka home")?
            ))
            .arg("-cp")
            .arg(classpath);
        Ok(cmd)
    }
}
