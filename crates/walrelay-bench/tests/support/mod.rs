//! What the bench's CI smoke tests share.

use std::path::PathBuf;

/// The debug `walrelay` binary, which `scripts/test.sh` builds before the
/// tests (`cargo build --workspace --bins`); a clear failure when missing.
pub fn walrelay_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug/walrelay");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}
