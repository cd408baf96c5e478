//! The Java consumers' runnable classpath, for tests that start one with
//! `java -cp ...` (java/examples/plain-consumer's example service,
//! java/chaos-consumer's chaos consumer; built by scripts/test.sh's `java`
//! stage).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::bail;

/// The classpath of the Maven module `java/<module>`: its
/// `target/classes` and the jars `mvn package` listed in
/// `target/classpath.txt`. `None` (the caller skips its Java part, and this
/// says so) when either is missing or there is no `java` on PATH, except
/// under `CI=true`, where the Java part must run: an error.
pub fn java_classpath(module: &str) -> anyhow::Result<Option<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../java")
        .join(module)
        .join("target");
    let listed = dir.join("classpath.txt");
    let classes = dir.join("classes");
    let java = Command::new("java")
        .arg("-version")
        .output()
        .is_ok_and(|o| o.status.success());
    let missing: Option<PathBuf> = [&listed, &classes]
        .into_iter()
        .find(|p| !p.exists())
        .cloned();
    if java && missing.is_none() {
        let jars = std::fs::read_to_string(&listed)?;
        return Ok(Some(format!("{}:{}", classes.display(), jars.trim())));
    }
    let why = match missing {
        Some(p) => format!(
            "{} is missing (scripts/test.sh's java stage builds it: \
             cd java && mvn -B -T 1 -Dmaven.repo.local=../target/tools/m2 verify)",
            p.display()
        ),
        None => "no `java` on PATH (scripts/test.sh installs openjdk-17-jdk-headless)".to_owned(),
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!("the Java consumer must run in CI, but {why}");
    }
    eprintln!("SKIPPING the Java consumer: {why}");
    Ok(None)
}
