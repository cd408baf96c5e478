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
            Variant::Tuned => {
                format!("{base}\n# ---- appended: bench/debezium/{name} ----\n{overlay}")
            }
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
    fn the_templates_name_every_placeholder_the_runner_fills() {
        let names = super::super::PLACEHOLDERS;
        let values: BTreeMap<&str, String> = names.iter().map(|n| (*n, "v".to_owned())).collect();
        for variant in [Variant::Defaults, Variant::Tuned] {
            for template in [variant.worker_template(), variant.connector_template()] {
                render(&template, &values).unwrap();
            }
        }
        let tuned = Variant::Tuned.connector_template();
        assert!(tuned.contains("poll.interval.ms=") && tuned.contains("plugin.name=pgoutput"));
        assert!(!Variant::Defaults
            .connector_template()
            .contains("poll.interval.ms="));
    }
}
