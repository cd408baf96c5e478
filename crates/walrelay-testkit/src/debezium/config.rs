//! The worker's and the connector's properties files, from the templates
//! under `bench/debezium/` (compiled in, so a run always uses the files
//! that are committed beside the code): the variant picks the files, the
//! run fills the `${UPPER_CASE}` placeholders.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Context};

const WORKER: &str = include_str!("../../../../bench/debezium/worker.properties");
const WORKER_TUNED: &str = include_str!("../../../../bench/debezium/worker-tuned.properties");
const CONNECTOR: &str = include_str!("../../../../bench/debezium/connector.properties");
const CONNECTOR_TUNED: &str = include_str!("../../../../bench/debezium/connector-tuned.properties");
const WORKER_STANDALONE: &str =
    include_str!("../../../../bench/debezium/worker-standalone.properties");
const WORKER_EXACTLY_ONCE: &str =
    include_str!("../../../../bench/debezium/worker-exactly-once.properties");
const CONNECTOR_EXACTLY_ONCE: &str =
    include_str!("../../../../bench/debezium/connector-exactly-once.properties");

/// How the worker delivers: Kafka Connect's two ways of running a source
/// connector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConnectDelivery {
    /// A standalone worker (offsets in a local file, committed every
    /// `offset.flush.interval.ms`): at least once, as most users run it.
    #[default]
    AtLeastOnce,
    /// KIP-618: a distributed worker with
    /// `exactly.once.source.support=enabled` (offsets in a Kafka topic,
    /// written in the same producer transaction as the records), the
    /// connector created over REST with `exactly.once.support=required`:
    /// `worker-exactly-once.properties` and
    /// `connector-exactly-once.properties` appended to the variant's files.
    ExactlyOnce,
}

impl ConnectDelivery {
    /// The worker's properties template for `variant`: its files, then
    /// `worker-standalone.properties` or `worker-exactly-once.properties`.
    pub(crate) fn worker_template(self, variant: Variant) -> String {
        let (overlay, name) = match self {
            ConnectDelivery::AtLeastOnce => (WORKER_STANDALONE, "worker-standalone.properties"),
            ConnectDelivery::ExactlyOnce => (WORKER_EXACTLY_ONCE, "worker-exactly-once.properties"),
        };
        appended(variant.worker_template(), overlay, name)
    }

    /// The connector's properties template for `variant`: its files, then
    /// for exactly once `connector-exactly-once.properties`.
    pub(crate) fn connector_template(self, variant: Variant) -> String {
        match self {
            ConnectDelivery::AtLeastOnce => variant.connector_template(),
            ConnectDelivery::ExactlyOnce => appended(
                variant.connector_template(),
                CONNECTOR_EXACTLY_ONCE,
                "connector-exactly-once.properties",
            ),
        }
    }
}

/// `template` with `overlay` appended under a line naming its file (in a
/// Java properties file a later line wins).
fn appended(template: String, overlay: &str, name: &str) -> String {
    format!("{template}\n# ---- appended: bench/debezium/{name} ----\n{overlay}")
}

/// Which of the two set-ups in `bench/debezium/` a worker runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Variant {
    /// Debezium's and Kafka Connect's defaults (plus what correctness and
    /// durability need: `worker.properties`, `connector.properties`).
    Defaults,
    /// As Debezium's docs and users tune it for throughput and latency:
    /// the defaults with `worker-tuned.properties` and
    /// `connector-tuned.properties` appended.
    #[default]
    Tuned,
}

impl Variant {
    /// `defaults` or `tuned`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Defaults => "defaults",
            Variant::Tuned => "tuned",
        }
    }

    /// The worker's properties template.
    pub(crate) fn worker_template(self) -> String {
        self.with_overlay(WORKER, WORKER_TUNED, "worker-tuned.properties")
    }

    /// The connector's properties template.
    pub(crate) fn connector_template(self) -> String {
        self.with_overlay(CONNECTOR, CONNECTOR_TUNED, "connector-tuned.properties")
    }

    /// `base`, then for the tuned variant `overlay`: in a Java properties
    /// file a later line wins, so the file written is the audit trail of
    /// both (what Debezium's defaults were and what tuning changed).
    fn with_overlay(self, base: &str, overlay: &str, name: &str) -> String {
        match self {
            Variant::Defaults => base.to_owned(),
            Variant::Tuned => appended(base.to_owned(), overlay, name),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Variant {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Variant> {
        match s {
            "defaults" | "default" => Ok(Variant::Defaults),
            "tuned" => Ok(Variant::Tuned),
            other => bail!("unknown Debezium variant {other:?} (defaults, tuned)"),
        }
    }
}

/// Replaces every `${NAME}` whose NAME is upper case (letters, digits,
/// `_`) by `values[NAME]`; fails on such a placeholder without a value, so
/// a template cannot silently keep one. Other `${...}` (the Event Router's
/// `${routedByValue}`) stay as they are. Comment lines are copied
/// unchanged.
pub(crate) fn render(template: &str, values: &BTreeMap<&str, String>) -> anyhow::Result<String> {
    let mut out = String::with_capacity(template.len());
    for (n, line) in template.split_inclusive('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .with_context(|| format!("line {}: unclosed \"${{\" in {line:?}", n + 1))?;
            let name = &after[..end];
            let is_placeholder = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if is_placeholder {
                let value = values.get(name).with_context(|| {
                    format!("line {}: no value for the placeholder ${{{name}}}", n + 1)
                })?;
                out.push_str(&escape_value(value));
            } else {
                out.push_str(&rest[start..start + 2 + end + 1]);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
    }
    Ok(out)
}

/// The properties a filled file sets, as Java reads them (a later line
/// wins): what a distributed worker's REST API takes as the connector's
/// configuration. Handles `key=value` and `key:value` lines, comments and
/// the escapes [`escape_value`] and the templates write (`\\`, `\n`,
/// `\r`, `\t`, `\=`, `\:`); refuses a continued line (a trailing `\`),
/// which no template uses, rather than read it wrong.
pub(crate) fn parse_properties(text: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let mut key = String::new();
        let mut value = String::new();
        let mut in_value = false;
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            let c = if c == '\\' {
                match chars.next() {
                    Some('n') => '\n',
                    Some('r') => '\r',
                    Some('t') => '\t',
                    Some(other) => other,
                    None => bail!(
                        "line {}: a continued line (trailing backslash) in {raw:?} is not supported",
                        n + 1
                    ),
                }
            } else if !in_value && (c == '=' || c == ':') {
                in_value = true;
                value.clear();
                continue;
            } else {
                c
            };
            if in_value {
                if value.is_empty() && c == ' ' {
                    continue;
                }
                value.push(c);
            } else {
                key.push(c);
            }
        }
        if !in_value {
            bail!("line {}: no '=' in {raw:?}", n + 1);
        }
        out.insert(key.trim_end().to_owned(), value);
    }
    Ok(out)
}

/// A value written so that a Java properties file reads it back as it is:
/// backslashes doubled (a path or a regular expression keeps its `\`) and
/// line breaks escaped.
fn escape_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_upper_case_placeholders_only() {
        let values = BTreeMap::from([("SLOT", "dbz_slot".to_owned()), ("DIR", r"C:\x".to_owned())]);
        let text = "# ${NOT_FILLED} in a comment\nslot.name=${SLOT}\n\
                    route=outbox.event.${routedByValue}\npath=${DIR}/a\n";
        assert_eq!(
            render(text, &values).unwrap(),
            "# ${NOT_FILLED} in a comment\nslot.name=dbz_slot\n\
             route=outbox.event.${routedByValue}\npath=C:\\\\x/a\n"
        );
        let err = render("a=${MISSING}\n", &values).unwrap_err();
        assert!(format!("{err:#}").contains("${MISSING}"), "{err:#}");
        assert!(render("a=${SLOT\n", &values).is_err());
    }

    #[test]
    fn reads_properties_as_java_does() {
        let text = "# comment\n! also\n\n  a = 1\nb:two words\nre=dbz\\\\.message\n\
                    path=C\\:\\\\x\na=3\nempty=\n";
        let p = parse_properties(text).unwrap();
        assert_eq!(p["a"], "3", "a later line wins");
        assert_eq!(p["b"], "two words");
        assert_eq!(p["re"], "dbz\\.message");
        assert_eq!(p["path"], "C:\\x");
        assert_eq!(p["empty"], "");
        assert_eq!(p.len(), 5);
        // What render writes, read back.
        let values = BTreeMap::from([("V", "a\\b\nc".to_owned())]);
        let filled = render("k=${V}\n", &values).unwrap();
        assert_eq!(parse_properties(&filled).unwrap()["k"], "a\\b\nc");
        assert!(parse_properties("k=a\\\n").is_err());
        assert!(parse_properties("novalue\n").is_err());
    }

    #[test]
    fn the_templates_name_every_placeholder_the_runner_fills() {
        let names = super::super::PLACEHOLDERS;
        let values: BTreeMap<&str, String> = names.iter().map(|n| (*n, "v".to_owned())).collect();
        for variant in [Variant::Defaults, Variant::Tuned] {
            for template in [variant.worker_template(), variant.connector_template()] {
                render(&template, &values).unwrap();
            }
        }
        for delivery in [ConnectDelivery::AtLeastOnce, ConnectDelivery::ExactlyOnce] {
            for variant in [Variant::Defaults, Variant::Tuned] {
                let worker = render(&delivery.worker_template(variant), &values).unwrap();
                let connector = render(&delivery.connector_template(variant), &values).unwrap();
                let worker = parse_properties(&worker).unwrap();
                // A distributed worker passes offset.storage.* to its
                // offsets topic as topic configs.
                assert_eq!(
                    worker.contains_key("offset.storage.file.filename"),
                    delivery == ConnectDelivery::AtLeastOnce
                );
                let connector = parse_properties(&connector).unwrap();
                assert_eq!(
                    connector.get("exactly.once.support").map(String::as_str),
                    (delivery == ConnectDelivery::ExactlyOnce).then_some("required"),
                );
            }
        }
        let tuned = Variant::Tuned.connector_template();
        assert!(tuned.contains("poll.interval.ms=") && tuned.contains("plugin.name=pgoutput"));
        assert!(!Variant::Defaults
            .connector_template()
            .contains("poll.interval.ms="));
    }
}
