//! The password file (`~/.pgpass`, `passfile`, `PGPASSFILE`): read only
//! when private to its owner, matched line by line like libpq does.

use std::path::Path;

use super::{Config, Password};

impl Config {
    /// The password for the first host: the explicit one, else a matching
    /// line of the password file.
    pub fn resolve_password(&self) -> Option<Password> {
        let (host, port) = self.host_ports()[0];
        self.resolve_password_for(host, port)
    }

    /// The password for `host`/`port`: the explicit one, else the first
    /// matching line of the password file. The file is ignored (with a
    /// warning) when it is readable by group or others, like libpq does.
    pub fn resolve_password_for(&self, host: &str, port: u16) -> Option<Password> {
        if let Some(p) = &self.password {
            return Some(p.clone());
        }
        let path = self.passfile.as_deref()?;
        let contents = read_passfile(path)?;
        lookup_passfile(&contents, host, port, self.get_dbname(), &self.user)
    }
}

fn read_passfile(path: &Path) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) => return None,
    };
    if !meta.is_file() {
        tracing::warn!(
            path = %path.display(),
            "password file is not a plain file; ignoring it"
        );
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "password file has group or world access; permissions should be u=rw (0600) or \
                 less; ignoring it"
            );
            return None;
        }
    }
    match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read password file; ignoring it");
            None
        }
    }
}

/// Splits a `.pgpass` line into fields, undoing `\:` and `\\`. Returns each
/// field with a flag telling whether it was exactly an unescaped `*`.
fn split_pgpass_line(line: &str) -> Vec<(String, bool)> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut escaped_any = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                escaped_any = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ':' if fields.len() < 4 => {
                let wild = cur == "*" && !escaped_any;
                fields.push((std::mem::take(&mut cur), wild));
                escaped_any = false;
            }
            c => cur.push(c),
        }
    }
    let wild = cur == "*" && !escaped_any;
    fields.push((cur, wild));
    fields
}

pub(super) fn lookup_passfile(
    contents: &str,
    host: &str,
    port: u16,
    db: &str,
    user: &str,
) -> Option<Password> {
    let port = port.to_string();
    for line in contents.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_pgpass_line(line);
        if fields.len() != 5 {
            continue;
        }
        let matches = |(f, wild): &(String, bool), want: &str| *wild || f == want;
        let host_ok =
            matches(&fields[0], host) || (host.starts_with('/') && fields[0].0 == "localhost");
        if host_ok
            && matches(&fields[1], &port)
            && matches(&fields[2], db)
            && matches(&fields[3], user)
        {
            return Some(Password::new(fields[4].0.clone()));
        }
    }
    None
}
