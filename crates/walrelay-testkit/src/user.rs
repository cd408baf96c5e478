//! Who runs the PostgreSQL server processes.
//!
//! `initdb` and `postgres` refuse to run as root. When this process runs as
//! root, the server tools run as the `postgres` user from `/etc/passwd`
//! (through `CommandExt::uid`/`gid`) and the cluster directory is chowned to
//! it; otherwise they run as the current user.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The account the server tools run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerUser {
    /// Run as the current (non-root) user.
    Current,
    /// Run as this uid/gid (we are root).
    Switch { uid: u32, gid: u32 },
}

/// The user the server runs as when this process is root.
pub(crate) const SERVER_ACCOUNT: &str = "postgres";

impl ServerUser {
    pub(crate) fn detect() -> anyhow::Result<ServerUser> {
        if effective_uid()? != 0 {
            return Ok(ServerUser::Current);
        }
        let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
        match lookup_passwd(&passwd, SERVER_ACCOUNT) {
            Some((uid, gid)) if uid != 0 => Ok(ServerUser::Switch { uid, gid }),
            Some(_) => bail!("the {SERVER_ACCOUNT} user has uid 0; cannot run the server as it"),
            None => bail!(
                "running as root but there is no {SERVER_ACCOUNT} user in /etc/passwd to run \
                 PostgreSQL as (initdb refuses root): run scripts/install-postgres.sh"
            ),
        }
    }

    /// Makes `cmd` run as the server user.
    pub(crate) fn apply(&self, cmd: &mut Command) {
        if let ServerUser::Switch { uid, gid } = *self {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
            // Tools may look at HOME; root's is usually unreadable for them.
            cmd.env("HOME", "/");
        }
    }

    /// Gives `path` to the server user (no-op when not switching users).
    pub(crate) fn chown(&self, path: &Path) -> anyhow::Result<()> {
        if let ServerUser::Switch { uid, gid } = *self {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .with_context(|| format!("chown {} to {uid}:{gid}", path.display()))?;
        }
        Ok(())
    }
}

/// The effective uid of this process, from `/proc/self/status`.
pub(crate) fn effective_uid() -> anyhow::Result<u32> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    parse_status_euid(&status).context("no parsable Uid: line in /proc/self/status")
}

fn parse_status_euid(status: &str) -> Option<u32> {
    // "Uid:\t<real>\t<effective>\t<saved>\t<fs>"
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn lookup_passwd(passwd: &str, name: &str) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some((uid, gid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let status = "Name:\tcat\nUmask:\t0022\nUid:\t1000\t0\t1000\t1000\nGid:\t5\t5\t5\t5\n";
        assert_eq!(parse_status_euid(status), Some(0));
        assert_eq!(parse_status_euid("Name:\tx\n"), None);
    }

    #[test]
    fn parses_passwd() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\n\
                      postgresql:x:5:5::/:/bin/false\n\
                      postgres:x:101:104:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash\n";
        assert_eq!(lookup_passwd(passwd, "postgres"), Some((101, 104)));
        assert_eq!(lookup_passwd(passwd, "nobody"), None);
    }
}
