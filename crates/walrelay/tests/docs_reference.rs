//! The operator documentation, checked against the code so it cannot rot.
//!
//! - `docs/configuration.md` has a reference row for every option the
//!   configuration file accepts. The options are not listed by hand: every
//!   section of `Config` denies unknown fields, so feeding each table an
//!   unknown key makes serde list the fields it accepts, and the test walks
//!   the whole tree that way. A new option fails this test until it is
//!   documented. The defaults in the rows are compared with what
//!   `walrelay config` prints for a default configuration.
//! - Every command-line flag of every command, and every environment
//!   variable, is in `docs/configuration.md`; a flag's row names its
//!   variable.
//! - `docker/walrelay.toml` parses and validates, and the container files
//!   agree with it.
//! - Every text that `docs/troubleshooting.md` quotes as walrelay's own
//!   ("Checked text:") is still in the source, and in the example message
//!   shown for that entry.
//! - The exit codes of `walrelay status` in `docs/operations.md` match the
//!   code.
//! - Every relative Markdown link of `docs/*.md`, `README.md`,
//!   `conformance/README.md`, `python/README.md` (and `java/README.md`
//!   when there is one) names a file that exists and, with an anchor, a
//!   heading of that file (GitHub's anchor rule).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use walrelay::commands::status::Health;
use walrelay::config::Config;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

// ---------------------------------------------------------------------
// Configuration options, discovered from the code.

const PROBE: &str = "zz_docs_probe";

/// One step of a path in the configuration: a table (`[a.b]`) or an array
/// of tables (`[[a.b]]`).
#[derive(Debug, Clone)]
struct Step {
    name: String,
    array: bool,
}

/// How the reference names an option: dotted, with `[]` after arrays of
/// tables, e.g. `outbox[].columns.aggregateid`.
fn display(path: &[Step]) -> String {
    path.iter()
        .map(|s| {
            if s.array {
                format!("{}[]", s.name)
            } else {
                s.name.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// How TOML names the table, e.g. `outbox.columns`.
fn toml_name(path: &[Step]) -> String {
    path.iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(".")
}

/// The fields serde accepts in the table at `path`, read from the error
/// for an unknown field. `None` when that path is not a struct that denies
/// unknown fields (a string, a number, a list, a free-form map).
fn fields_at(path: &[Step]) -> Option<Vec<String>> {
    let mut text = String::new();
    for i in 0..path.len() {
        let name = toml_name(&path[..=i]);
        if path[i].array {
            text.push_str(&format!("[[{name}]]\n"));
        } else {
            text.push_str(&format!("[{name}]\n"));
        }
    }
    text.push_str(&format!("{PROBE} = 1\n"));
    let err = match Config::from_toml(&text, "probe") {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let marker = format!("unknown field `{PROBE}`, ");
    let rest = &err[err.find(&marker)? + marker.len()..];
    let line = rest.lines().next().unwrap_or_default();
    if line.starts_with("there are no fields") {
        return Some(Vec::new());
    }
    // "expected `a`" or "expected one of `a`, `b`, `c`"
    Some(
        line.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect(),
    )
}

/// Every option of the configuration file (leaves), and every table
/// (sections), as the reference names them.
fn discover(path: &mut Vec<Step>, options: &mut BTreeSet<String>, sections: &mut Vec<String>) {
    let fields = fields_at(path).unwrap_or_else(|| {
        panic!(
            "{:?} should deny unknown fields so the documentation test can list its options",
            display(path)
        )
    });
    for field in fields {
        let mut found = false;
        for array in [false, true] {
            path.push(Step {
                name: field.clone(),
                array,
            });
            if fields_at(path).is_some() {
                let name = toml_name(path);
                sections.push(if array {
                    format!("[[{name}]]")
                } else {
                    format!("[{name}]")
                });
                discover(path, options, sections);
                found = true;
            }
            path.pop();
            if found {
                break;
            }
        }
        if !found {
            path.push(Step {
                name: field,
                array: false,
            });
            let name = display(path);
            options.insert(name);
            path.pop();
        }
    }
}

fn all_options() -> (BTreeSet<String>, Vec<String>) {
    let mut options = BTreeSet::new();
    let mut sections = Vec::new();
    discover(&mut Vec::new(), &mut options, &mut sections);
    (options, sections)
}

/// The reference row of an option: a table row whose first cell is the
/// option's name in backticks.
fn row<'a>(doc: &'a str, option: &str) -> Option<&'a str> {
    let start = format!("| `{option}` |");
    doc.lines().find(|l| l.trim_start().starts_with(&start))
}

#[test]
fn the_option_walk_finds_the_known_options() {
    // Guards the discovery itself: if serde's wording changed, the walk
    // would find nothing and the real test would pass vacuously.
    let (options, sections) = all_options();
    for known in [
        "postgres.url",
        "postgres.slot",
        "kafka.bootstrap_servers",
        "kafka.properties",
        "relay.max_backoff",
        "messages[].prefix",
        "outbox[].topic",
        "outbox[].columns.aggregateid",
    ] {
        assert!(
            options.contains(known),
            "{known} not found; found {options:?}"
        );
    }
    for known in [
        "[postgres]",
        "[[messages]]",
        "[[outbox]]",
        "[outbox.columns]",
    ] {
        assert!(
            sections.iter().any(|s| s == known),
            "{known} not found; found {sections:?}"
        );
    }
}

#[test]
fn every_option_of_the_configuration_file_is_documented() {
    let doc = read("docs/configuration.md");
    let (options, sections) = all_options();
    let undocumented: Vec<_> = options.iter().filter(|o| row(&doc, o).is_none()).collect();
    assert!(
        undocumented.is_empty(),
        "docs/configuration.md has no reference row (a table row starting with \"| `OPTION` |\") \
         for: {undocumented:?}"
    );
    for section in &sections {
        assert!(
            doc.contains(&format!("`{section}`")),
            "docs/configuration.md does not mention the section `{section}`"
        );
    }
}

/// Flatten a TOML table to `name → value text`, naming options like the
/// reference does.
fn flatten(prefix: &str, table: &toml::Table, out: &mut BTreeMap<String, String>) {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) if k != "properties" => flatten(&name, t, out),
            toml::Value::Array(items)
                if items.iter().all(toml::Value::is_table) && !items.is_empty() =>
            {
                for item in items {
                    if let toml::Value::Table(t) = item {
                        flatten(&format!("{name}[]"), t, out);
                    }
                }
            }
            other => {
                out.insert(name, other.to_string());
            }
        }
    }
}

#[test]
fn documented_defaults_match_the_code() {
    let doc = read("docs/configuration.md");
    // The default configuration plus an outbox table with nothing but its
    // name: what `walrelay config` prints for them are the defaults.
    let config = Config::from_toml("[[outbox]]\ntable = \"docs_probe\"\n", "defaults").unwrap();
    let rendered = walrelay::config::render(&config);
    let table: toml::Table = toml::from_str(&rendered).unwrap();
    let mut values = BTreeMap::new();
    flatten("", &table, &mut values);
    // No default: the URL is empty (PG* variables fill it in), the
    // properties are empty, the table is the one set above.
    for skip in ["postgres.url", "kafka.properties", "outbox[].table"] {
        values.remove(skip);
    }
    assert!(values.len() >= 10, "too few defaults found: {values:?}");
    for (option, value) in values {
        let line = row(&doc, &option)
            .unwrap_or_else(|| panic!("docs/configuration.md has no row for {option}"));
        assert!(
            line.contains(&format!("`{value}`")),
            "the row of {option} in docs/configuration.md does not give its default `{value}`: {line}"
        );
    }
}

#[test]
fn every_option_of_the_example_file_is_documented() {
    let doc = read("docs/configuration.md");
    let table: toml::Table = toml::from_str(&read("walrelay.example.toml")).unwrap();
    let mut values = BTreeMap::new();
    flatten("", &table, &mut values);
    for option in values.keys() {
        assert!(
            row(&doc, option).is_some(),
            "{option} (walrelay.example.toml) has no row in docs/configuration.md"
        );
    }
}

#[test]
fn every_flag_and_environment_variable_is_documented() {
    let doc = read("docs/configuration.md");
    let mut command = walrelay::commands::cli::Cli::command();
    command.build();
    let mut commands = vec![command.clone()];
    commands.extend(command.get_subcommands().cloned());
    let mut seen = 0;
    for cmd in &commands {
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            seen += 1;
            // `--flag` or `--flag VALUE`, in backticks.
            let flag = format!("`--{long}");
            let mentions = |text: &str| {
                text.contains(&format!("{flag}`")) || text.contains(&format!("{flag} "))
            };
            assert!(
                mentions(&doc),
                "flag --{long} (command {}) is not in docs/configuration.md",
                cmd.get_name()
            );
            if let Some(env) = arg.get_env() {
                let env = format!("`{}`", env.to_string_lossy());
                assert!(
                    doc.lines().any(|l| mentions(l) && l.contains(&env)),
                    "docs/configuration.md has no line that gives both --{long} and {env}"
                );
            }
        }
    }
    assert!(seen >= 15, "only {seen} flags found");
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        assert!(
            doc.contains(&format!("`walrelay {}`", sub.get_name())),
            "docs/configuration.md does not mention `walrelay {}`",
            sub.get_name()
        );
    }
}

// ---------------------------------------------------------------------
// Container files.

#[test]
fn the_docker_configuration_parses_and_validates() {
    let text = read("docker/walrelay.toml");
    let config = Config::from_toml(&text, "docker/walrelay.toml").unwrap();
    config.validate().unwrap();
    assert!(
        !config.outbox.is_empty(),
        "the compose example relays an outbox table"
    );

    // The compose file mounts it where the image's CMD reads it, and the
    // brokers and PostgreSQL it names are services of the compose file.
    let compose = read("docker/compose.yaml");
    let dockerfile = read("docker/Dockerfile");
    assert!(dockerfile.contains(r#"CMD ["--config", "/etc/walrelay/walrelay.toml", "run"]"#));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["walrelay"]"#));
    assert!(compose.contains("./walrelay.toml:/etc/walrelay/walrelay.toml:ro"));
    for server in config.kafka.bootstrap_servers.split(',') {
        let host = server.split(':').next().unwrap();
        assert!(
            compose.contains(&format!("  {host}:\n")),
            "bootstrap server {server} is not a compose service"
        );
        assert!(
            compose.contains(&format!("PLAINTEXT://{server}")),
            "Kafka does not advertise {server} in compose.yaml"
        );
    }
    assert!(compose.contains("  postgres:\n"));
    assert!(config.postgres.url.contains("@postgres:5432/"));
    // Every outbox table of the example exists in the init script.
    let init = read("docker/init/01-outbox.sql");
    for o in &config.outbox {
        let (schema, table) = o.qualified_name();
        assert!(
            init.contains(&format!("CREATE TABLE {schema}.{table}")),
            "docker/init/01-outbox.sql does not create {schema}.{table}"
        );
    }
    // `docker compose stop` must give the relay its 30 s drain.
    let grace = compose
        .lines()
        .find_map(|l| l.trim().strip_prefix("stop_grace_period:"))
        .expect("stop_grace_period in compose.yaml");
    let grace: u64 = grace.trim().trim_end_matches('s').parse().unwrap();
    assert!(
        grace > 30,
        "stop_grace_period {grace}s is not above the 30 s drain"
    );
}

#[test]
fn the_systemd_unit_outlasts_the_drain() {
    let unit = read("docker/walrelay.service");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key}= missing from docker/walrelay.service"))
            .trim()
            .to_owned()
    };
    let timeout = value("TimeoutStopSec");
    let seconds: u64 = timeout.trim_end_matches('s').parse().unwrap();
    assert!(
        seconds > 30,
        "TimeoutStopSec={timeout} is not above the 30 s drain"
    );
    assert_eq!(value("KillSignal"), "SIGTERM");
    assert_eq!(value("Restart"), "on-failure");
    assert_eq!(value("User"), "walrelay");
    assert!(value("ExecStart").ends_with(" run"));
}

// ---------------------------------------------------------------------
// Troubleshooting: quoted messages still exist.

/// Source text as it prints: Rust string continuations joined, `\"`
/// unescaped, `{{`/`}}` unescaped, whitespace collapsed.
fn normalize_source(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'\n') => {
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
            }
            '\\' if chars.peek() == Some(&'"') => {
                chars.next();
                out.push('"');
            }
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            _ => out.push(c),
        }
    }
    collapse(&out)
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn rust_sources(dir: &Path, out: &mut String) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&normalize_source(&fs::read_to_string(&path).unwrap()));
            out.push('\n');
        }
    }
}

#[test]
fn troubleshooting_quotes_walrelays_real_messages() {
    let mut source = String::new();
    for krate in fs::read_dir(repo_root().join("crates")).unwrap() {
        rust_sources(&krate.unwrap().path().join("src"), &mut source);
    }
    let doc = read("docs/troubleshooting.md");
    let mut entries = 0;
    let mut checked = 0;
    // Entries are `### ` sections; each quotes the message in a ```text
    // block and names its stable parts on a "Checked text:" line.
    for section in doc.split("\n### ").skip(1) {
        let title = section.lines().next().unwrap_or_default();
        entries += 1;
        let mut examples = String::new();
        let mut in_block = false;
        let mut fragments = Vec::new();
        for line in section.lines() {
            if line.starts_with("```") {
                in_block = !in_block && line.starts_with("```text");
                continue;
            }
            if in_block {
                examples.push_str(line);
                examples.push('\n');
            } else if let Some(rest) = line.strip_prefix("Checked text:") {
                fragments.extend(rest.split('`').skip(1).step_by(2).map(str::to_owned));
            }
        }
        assert!(
            !fragments.is_empty(),
            "troubleshooting entry {title:?} has no \"Checked text:\" line"
        );
        let examples = collapse(&examples);
        for fragment in fragments {
            let fragment = collapse(&fragment);
            assert!(
                source.contains(&fragment),
                "troubleshooting entry {title:?} quotes {fragment:?}, which is no longer in the source: update docs/troubleshooting.md"
            );
            assert!(
                examples.contains(&fragment),
                "troubleshooting entry {title:?}: the example message does not contain {fragment:?}"
            );
            checked += 1;
        }
    }
    assert!(entries >= 20, "only {entries} troubleshooting entries");
    assert!(checked >= entries, "only {checked} quoted fragments");
}

#[test]
fn operations_lists_the_status_exit_codes() {
    let doc = read("docs/operations.md");
    for health in [
        Health::Ok,
        Health::WalLevel,
        Health::Missing,
        Health::Lost,
        Health::AtRisk,
        Health::Inactive,
    ] {
        let code = health.exit_code();
        assert!(
            doc.contains(&format!("| {code} |")),
            "docs/operations.md has no row for `walrelay status` exit code {code} ({health:?})"
        );
    }
    assert!(doc.contains("| 1 |"), "exit code 1 (could not check)");
    assert!(
        doc.contains(&format!("| {} |", walrelay::commands::status::USAGE)),
        "usage error exit code"
    );
}

// ---------------------------------------------------------------------
// The README: a front door whose paths exist and whose layout names every
// top-level part.

/// The README's paths in backquotes (those under a top-level part of the
/// repository) and its relative links.
fn readme_paths(readme: &str) -> BTreeSet<String> {
    const ROOTS: [&str; 11] = [
        "crates/",
        "deploy/",
        "python/",
        "conformance/",
        "bench/",
        "benches/",
        "tests/",
        "sql/",
        "scripts/",
        "docker/",
        "docs/",
    ];
    // Prose only: code blocks hold commands and examples, not paths.
    let mut fenced = false;
    let prose: String = readme
        .lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .map(|line| format!("{line}\n"))
        .collect();
    let readme = prose.as_str();
    let mut paths = BTreeSet::new();
    for (i, quoted) in readme.split('`').enumerate() {
        if i % 2 == 1 && ROOTS.iter().any(|r| quoted.starts_with(r)) && !quoted.contains(' ') {
            paths.insert(quoted.to_owned());
        }
    }
    for link in readme.split("](").skip(1) {
        let target = link.split(')').next().unwrap_or_default();
        let target = target.split('#').next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") {
            paths.insert(target.to_owned());
        }
    }
    paths
}

/// The benchmarks doc is the method and the latest results; dated notes
/// go with their runs under `bench/results/` (it once grew to 2,655 lines
/// of them, and again to 908).
#[test]
fn the_benchmarks_doc_stays_a_manual() {
    let doc = read("docs/benchmarks.md");
    let lines = doc.lines().count();
    assert!(
        lines < 600,
        "docs/benchmarks.md has {lines} lines: keep the method and the latest results \
         (< 600); move dated write-ups to their run's NOTES.md or bench/results/HISTORY.md"
    );
}

#[test]
fn the_readme_is_a_front_door_whose_paths_exist() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: keep it a front door (<= 200), details go to docs/"
    );
    let root = repo_root();
    let missing: Vec<String> = readme_paths(&readme)
        .into_iter()
        .filter(|p| !p.contains('*') && !root.join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "README.md names paths that do not exist: {missing:?}"
    );
    // The layout table names every crate and every top-level folder.
    let layout = readme
        .split("## Layout")
        .nth(1)
        .expect("README.md has a Layout section");
    let mut parts: Vec<String> = fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| format!("crates/{}", e.expect("entry").file_name().to_string_lossy()))
        .collect();
    for dir in fs::read_dir(&root).expect("the repository") {
        let dir = dir.expect("entry");
        let name = dir.file_name().to_string_lossy().into_owned();
        if dir.path().is_dir() && !name.starts_with('.') && name != "target" && name != "crates" {
            parts.push(format!("{name}/"));
        }
    }
    let unnamed: Vec<&String> = parts
        .iter()
        .filter(|p| !layout.contains(&format!("`{p}")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "README.md's layout table lacks {unnamed:?}"
    );
}

// ---------------------------------------------------------------------
// Relative links: every `[text](path)`, `[text](path#anchor)` and
// `[text](#anchor)` of the user docs names a file that exists, and an
// anchor names a heading of that file.

/// The Markdown files whose relative links are checked.
fn linked_docs() -> Vec<String> {
    let root = repo_root();
    let mut files: Vec<String> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    files.sort();
    for file in [
        "README.md",
        "conformance/README.md",
        "python/README.md",
        "java/README.md",
    ] {
        if root.join(file).exists() {
            files.push(file.to_owned());
        }
    }
    files
}

/// The lines of a Markdown file outside fenced code blocks, numbered
/// from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading: links reduced to their text, lowercase,
/// every character but letters, digits, spaces, '-' and '_' dropped
/// (backticks and other punctuation), spaces turned into '-'.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading.trim();
    // `[text](target)` reads as `text`.
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find("](").map(|c| open + c);
        let end = close.and_then(|c| rest[c..].find(')').map(|e| c + e));
        match (close, end) {
            (Some(close), Some(end)) => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..close]);
                rest = &rest[end + 1..];
            }
            _ => break,
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings, duplicates suffixed -1, -2.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of a line's inline links, `[text](target)`.
fn link_targets(line: &str) -> Vec<&str> {
    line.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.is_empty() && !target.contains(char::is_whitespace))
        .collect()
}

#[test]
fn the_slug_rule_matches_githubs() {
    assert_eq!(
        slug("End-to-end bench (`walrelay-bench`)"),
        "end-to-end-bench-walrelay-bench"
    );
    assert_eq!(
        slug("Lever: librdkafka's `linger.ms` on Kafka"),
        "lever-librdkafkas-lingerms-on-kafka"
    );
    assert_eq!(
        slug("Micro-benchmarks: `hot_path`"),
        "micro-benchmarks-hot_path"
    );
    assert_eq!(slug("See [relay](relay.md) now"), "see-relay-now");
    let text = "# A\n## Kept\n```sh\n# not a heading\n```\n## Kept\n### Kept\n";
    let found = anchors(text);
    let expected: BTreeSet<String> = ["a", "kept", "kept-1", "kept-2"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, expected);
    assert_eq!(
        link_targets("see [a](x.md#b), [c](#d) and [e](https://f) `[g](h i)`"),
        vec!["x.md#b", "#d", "https://f"]
    );
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let root = repo_root();
    let mut anchor_cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in linked_docs() {
        let text = read(&file);
        let dir = Path::new(&file).parent().unwrap_or(Path::new(""));
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.starts_with("http://")
                    || target.starts_with("https://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((path, anchor)) => (path, Some(anchor)),
                    None => (target, None),
                };
                let linked = if path.is_empty() {
                    root.join(&file)
                } else {
                    root.join(dir).join(path)
                };
                if !linked.exists() {
                    broken.push(format!("{file}:{number}: {target}: no such file"));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if linked.extension().and_then(|e| e.to_str()) != Some("md") {
                    continue;
                }
                let known = anchor_cache.entry(linked.clone()).or_insert_with(|| {
                    anchors(
                        &fs::read_to_string(&linked)
                            .unwrap_or_else(|e| panic!("cannot read {}: {e}", linked.display())),
                    )
                });
                if !known.contains(anchor) {
                    broken.push(format!(
                        "{file}:{number}: {target}: no heading with that anchor"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} relative links found: the scan is broken"
    );
    assert!(
        broken.is_empty(),
        "broken relative links:\n{}",
        broken.join("\n")
    );
}
