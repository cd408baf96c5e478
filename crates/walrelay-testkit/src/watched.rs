//! A child process (a broker's or a Kafka Connect worker's JVM) that does
//! not outlive this one.
//!
//! Beside the child runs a watchdog, `sh -c SCRIPT NAME PID ARGS...`,
//! whose stdin is a pipe only this process writes to. The script starts
//! with `read`: when this process ends without killing the child (a test
//! binary that exits with a broker still shared in a `static`, or is
//! killed itself), the kernel closes the pipe, `read` returns, and the
//! script kills the child and cleans up after it.

use std::ffi::OsStr;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::broker::util::kill_child;

/// A running child and its watchdog.
#[derive(Debug)]
pub(crate) struct WatchedChild {
    child: Child,
    watchdog: Child,
    /// Held open: the watchdog acts when it closes.
    _pipe: ChildStdin,
}

impl WatchedChild {
    /// Spawns `cmd` (`what` names it in errors), then its watchdog running
    /// `script` as `name` with the child's pid as `$1` and `args` after it.
    pub(crate) fn spawn<I, S>(
        cmd: &mut Command,
        what: &str,
        script: &str,
        name: &str,
        args: I,
    ) -> anyhow::Result<WatchedChild>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {what} (is Java 17 installed?)"))?;
        let watchdog = Command::new("sh")
            .args(["-c", script, name])
            .arg(child.id().to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut watchdog = match watchdog {
            Ok(w) => w,
            Err(e) => {
                let _ = kill_child(&mut child);
                return Err(e).with_context(|| format!("starting the watchdog (sh) of {what}"));
            }
        };
        let pipe = watchdog.stdin.take().context("the watchdog's stdin")?;
        Ok(WatchedChild {
            child,
            watchdog,
            _pipe: pipe,
        })
    }

    /// The child's process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// The child's exit status, if it exited.
    pub(crate) fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// SIGKILL, and waits for the child to be gone.
    pub(crate) fn kill(mut self) -> anyhow::Result<()> {
        // The watchdog first: then the child's pid cannot be reused under
        // it.
        let _ = kill_child(&mut self.watchdog);
        kill_child(&mut self.child)
    }

    /// SIGTERM (the JVM shuts down as for an operator), waits up to
    /// `timeout`, then SIGKILL. Returns whether it exited by itself.
    pub(crate) fn terminate(mut self, timeout: Duration) -> anyhow::Result<bool> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        let mut exited = false;
        if status.success() {
            let deadline = Instant::now() + timeout;
            loop {
                if self.child.try_wait()?.is_some() {
                    exited = true;
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
                // The exit cannot be awaited without a second thread or a
                // pidfd; 20 ms steps keep the stop prompt.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill()?;
        Ok(exited)
    }
}
