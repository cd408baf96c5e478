//! The Python interpreter that tests run the Python consumer package with.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// The interpreter with `walrelay_consumer` installed: `$WALRELAY_PYTHON`,
/// or the virtualenv `scripts/install-python-venv.sh` makes. `None` (the
/// caller skips its Python part, and this says so) when there is none,
/// except under `CI=true`, where the Python part must run: an error.
pub fn python_interpreter() -> anyhow::Result<Option<PathBuf>> {
    let candidate = std::env::var_os("WALRELAY_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/python-venv/bin/python")
        });
    if candidate.exists() {
        return Ok(Some(candidate));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!(
            "no Python interpreter at {} (set WALRELAY_PYTHON to the one \
             scripts/install-python-venv.sh prints): the Python consumer must run in CI",
            candidate.display()
        );
    }
    eprintln!(
        "SKIPPING the Python consumer: no interpreter at {} (run scripts/install-python-venv.sh \
         or set WALRELAY_PYTHON)",
        candidate.display()
    );
    Ok(None)
}
