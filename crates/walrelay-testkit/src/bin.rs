//! Finding the PostgreSQL server binaries (`initdb`, `pg_ctl`, `postgres`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context};

/// Environment variable naming a PostgreSQL `bin` directory; wins over
/// every other place.
pub const PG_BIN_ENV: &str = "WALRELAY_PG_BIN";

/// The Debian PostgreSQL 15 binaries, preferred when present.
pub const DEBIAN_PG15_BIN: &str = "/usr/lib/postgresql/15/bin";

const DEBIAN_PG_ROOT: &str = "/usr/lib/postgresql";

/// A directory holding the PostgreSQL server binaries, with the server's
/// version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgBin {
    dir: PathBuf,
    version: String,
    major: u32,
}

impl PgBin {
    /// Finds the binaries: `$WALRELAY_PG_BIN` if set, else
    /// `/usr/lib/postgresql/15/bin` if present, else the newest
    /// `/usr/lib/postgresql/*/bin`. The result is computed once per process.
    pub fn discover() -> anyhow::Result<PgBin> {
        static FOUND: OnceLock<Result<PgBin, String>> = OnceLock::new();
        FOUND
            .get_or_init(|| Self::discover_uncached().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(anyhow::Error::msg)
    }

    fn discover_uncached() -> anyhow::Result<PgBin> {
        if let Some(dir) = std::env::var_os(PG_BIN_ENV).filter(|d| !d.is_empty()) {
            return PgBin::from_dir(&dir)
                .with_context(|| format!("using {PG_BIN_ENV}={}", Path::new(&dir).display()));
        }
        if Path::new(DEBIAN_PG15_BIN).join("initdb").is_file() {
            return PgBin::from_dir(DEBIAN_PG15_BIN);
        }
        let mut newest: Option<(u32, PathBuf)> = None;
        if let Ok(entries) = std::fs::read_dir(DEBIAN_PG_ROOT) {
            for entry in entries.flatten() {
                let Some(major) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let bin = entry.path().join("bin");
                if bin.join("initdb").is_file() && newest.as_ref().is_none_or(|(m, _)| major > *m) {
                    newest = Some((major, bin));
                }
            }
        }
        match newest {
            Some((_, bin)) => PgBin::from_dir(bin),
            None => bail!(
                "no PostgreSQL server binaries found: set {PG_BIN_ENV} to a PostgreSQL bin \
                 directory, or run scripts/install-postgres.sh to install PostgreSQL 15 \
                 (looked in {DEBIAN_PG15_BIN} and {DEBIAN_PG_ROOT}/*/bin)"
            ),
        }
    }

    /// Uses the binaries in `dir`, checking that `initdb`, `pg_ctl` and
    /// `postgres` are there and asking `postgres --version`.
    pub fn from_dir(dir: impl AsRef<Path>) -> anyhow::Result<PgBin> {
        let dir = dir.as_ref().to_path_buf();
        for tool in ["initdb", "pg_ctl", "postgres"] {
            if !dir.join(tool).is_file() {
                bail!(
                    "{} not found in {} (run scripts/install-postgres.sh, or point {PG_BIN_ENV} \
                     at a PostgreSQL bin directory)",
                    tool,
                    dir.display()
                );
            }
        }
        let out = Command::new(dir.join("postgres"))
            .arg("--version")
            .output()
            .with_context(|| format!("running {}/postgres --version", dir.display()))?;
        if !out.status.success() {
            bail!(
                "{}/postgres --version failed ({}): {}",
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let major = parse_major(&version)
            .with_context(|| format!("cannot parse the server version from {version:?}"))?;
        Ok(PgBin {
            dir,
            version,
            major,
        })
    }

    /// The bin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the tool `name` in the bin directory (e.g. `"psql"`).
    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The output of `postgres --version`, e.g.
    /// `postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The server's major version, e.g. 15.
    pub fn major(&self) -> u32 {
        self.major
    }
}

/// Parses the major version out of `postgres --version` output.
fn parse_major(version: &str) -> Option<u32> {
    let rest = version.split(')').nth(1).unwrap_or(version);
    let number = rest.split_whitespace().next()?;
    let digits: String = number.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_major;

    #[test]
    fn parses_versions() {
        assert_eq!(
            parse_major("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
            Some(15)
        );
        assert_eq!(parse_major("postgres (PostgreSQL) 17.2"), Some(17));
        assert_eq!(parse_major("postgres (PostgreSQL) 18beta1"), Some(18));
        assert_eq!(parse_major("garbage"), None);
    }
}
