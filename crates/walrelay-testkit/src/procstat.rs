//! CPU time and peak memory of processes, from `/proc` (Linux only).
//!
//! * [`cpu_seconds`]: user + system time of one live process.
//! * [`reaped_children_cpu_seconds`]: user + system time of this process's
//!   children that have exited and been waited for (`cutime + cstime`), so
//!   the cost of a child that exits by itself (`pg_recvlogical --endpos`)
//!   is exact: take it before spawning and after waiting.
//! * [`TreeCpuMeter`]: a server and its children (PostgreSQL: the
//!   postmaster, its backends, walsenders and background processes) over
//!   a window, sampled per process.
//! * [`peak_rss_bytes`]: `VmHWM`, the resident-set high-water mark.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

/// Clock ticks per second (`getconf CLK_TCK`, 100 if that fails).
pub fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// The fields of `/proc/PID/stat` we use, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    pub utime: u64,
    pub stime: u64,
    pub cutime: u64,
    pub cstime: u64,
}

/// Parses `/proc/PID/stat`. The command name (field 2) may hold spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat> {
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .context("no ')' in /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): field n is f[n - 3].
    if f.len() < 15 {
        bail!("short /proc stat line: {text:?}");
    }
    let n = |i: usize| -> Result<u64> {
        f[i].parse::<u64>()
            .with_context(|| format!("field {} of /proc stat: {:?}", i + 3, f[i]))
    };
    Ok(Stat {
        ppid: u32::try_from(n(1)?)?,
        utime: n(11)?,
        stime: n(12)?,
        cutime: n(13)?,
        cstime: n(14)?,
    })
}

fn stat_of(pid: &str) -> Result<Stat> {
    let text = std::fs::read_to_string(Path::new("/proc").join(pid).join("stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    parse_stat(&text)
}

/// User + system CPU seconds of a live process.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let s = stat_of(&pid.to_string())?;
    Ok((s.utime + s.stime) as f64 / clock_ticks())
}

/// User + system CPU seconds of this process itself (all threads).
pub fn self_cpu_seconds() -> Result<f64> {
    let s = stat_of("self")?;
    Ok((s.utime + s.stime) as f64 / clock_ticks())
}

/// CPU seconds of this process's exited and waited-for children.
pub fn reaped_children_cpu_seconds() -> Result<f64> {
    let s = stat_of("self")?;
    Ok((s.cutime + s.cstime) as f64 / clock_ticks())
}

/// CPU of a server and its children over a window, per process: every
/// sample records each child's CPU, so a child that exits during the
/// window keeps what it had used at its last sample (whether the parent's
/// `cutime` gets it is not relied on). Sample often (every few tens of
/// milliseconds) while the window is open.
#[derive(Debug, Default)]
pub struct TreeCpuMeter {
    root: u32,
    start: std::collections::HashMap<u32, u64>,
    last: std::collections::HashMap<u32, u64>,
}

impl TreeCpuMeter {
    /// Starts a window at the current CPU of `root` and its children.
    pub fn start(root: u32) -> Result<TreeCpuMeter> {
        let mut m = TreeCpuMeter {
            root,
            ..Default::default()
        };
        m.sample()?;
        m.start = m.last.clone();
        Ok(m)
    }

    /// Records the CPU of `root` (its own time only) and its live children.
    pub fn sample(&mut self) -> Result<()> {
        let r = stat_of(&self.root.to_string())?;
        self.last.insert(self.root, r.utime + r.stime);
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(pid) = name.parse::<u32>() else {
                continue;
            };
            if let Ok(s) = stat_of(name) {
                if s.ppid == self.root {
                    self.last.insert(pid, s.utime + s.stime);
                }
            }
        }
        Ok(())
    }

    /// CPU seconds used in the window up to the last sample.
    pub fn seconds(&self) -> f64 {
        let ticks: u64 = self
            .last
            .iter()
            .map(|(pid, t)| t.saturating_sub(self.start.get(pid).copied().unwrap_or(0)))
            .sum();
        ticks as f64 / clock_ticks()
    }
}

/// `VmHWM` of a live process, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    parse_vm_hwm(&text).with_context(|| format!("no VmHWM in /proc/{pid}/status"))
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_names() {
        let line = "1234 (post gres: (x)) S 99 1 1 0 -1 4194304 100 0 0 0 250 75 12 3 20 0 1 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            s,
            Stat {
                ppid: 99,
                utime: 250,
                stime: 75,
                cutime: 12,
                cstime: 3
            }
        );
        assert!(parse_stat("1 (x) S 2").is_err());
    }

    #[test]
    fn reads_this_process() {
        assert!(self_cpu_seconds().unwrap() >= 0.0);
        assert!(peak_rss_bytes(std::process::id()).unwrap() > 0);
        assert_eq!(parse_vm_hwm("VmHWM:\t  2048 kB\n"), Some(2 * 1024 * 1024));
    }
}
