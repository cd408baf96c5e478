//! The effective configuration as TOML, for `walrelay config`: every
//! option as the relay will use it, secrets masked.

use super::{Config, OutboxConfig};

/// The configuration as TOML for `walrelay config`, with secrets masked.
pub fn render(config: &Config) -> String {
    let mut out = String::new();
    let masked_url = walrelay_pg::Config::parse(&config.postgres.url)
        .map(|c| c.redacted_url())
        .unwrap_or_else(|_| "<unparsable>".into());
    out.push_str(&format!(
        "[postgres]\nurl = {masked_url:?}\nslot = {:?}\npublication = {:?}\nstatus_interval = {:?}\npublication_check_interval = {:?}\nslot_failover = {}\n\n",
        config.postgres.slot,
        config.postgres.publication,
        humantime::format_duration(config.postgres.status_interval).to_string(),
        humantime::format_duration(config.postgres.publication_check_interval).to_string(),
        config.postgres.slot_failover
    ));
    out.push_str(&format!(
        "[kafka]\nbootstrap_servers = {:?}\n\n[kafka.properties]\n",
        config.kafka.bootstrap_servers
    ));
    for (k, v) in &config.kafka.properties {
        // Secret references (`env:NAME`, `file:/path`) are shown as written,
        // secrets themselves never.
        out.push_str(&format!(
            "{k:?} = {:?}\n",
            crate::secrets::displayable(k, v)
        ));
    }
    out.push_str(&format!(
        "\n[relay]\n{}max_in_flight_events = {}\nmax_in_flight_bytes = {}\nignore_prefixes = {:?}\nmax_backoff = {:?}\nstandby_poll = {:?}\nfence = {}\nfence_timeout = {:?}\nheaders = {:?}\nkeyless_placement = {:?}\nsource_record_topic = {:?}\n",
        config
            .relay
            .source_id
            .as_ref()
            .map(|s| format!("source_id = {s:?}\n"))
            .unwrap_or_default(),
        config.relay.max_in_flight_events,
        config.relay.max_in_flight_bytes,
        config.relay.ignore_prefixes,
        humantime::format_duration(config.relay.max_backoff).to_string(),
        humantime::format_duration(config.relay.standby_poll).to_string(),
        config.relay.fence,
        humantime::format_duration(config.relay.fence_timeout).to_string(),
        config.relay.headers.as_str(),
        config.relay.keyless_placement.as_str(),
        config.relay.source_record_topic
    ));
    for m in &config.messages {
        out.push_str(&format!(
            "\n[[messages]]\nprefix = {:?}\ntopic = {:?}\n",
            m.prefix, m.topic
        ));
    }
    for o in &config.outbox {
        render_outbox(&mut out, o);
    }
    if let Some(topic) = &config.dead_letter.topic {
        out.push_str(&format!("\n[dead_letter]\ntopic = {topic:?}\n"));
    }
    out
}

fn render_outbox(out: &mut String, o: &OutboxConfig) {
    let c = &o.columns;
    out.push_str(&format!(
        "\n[[outbox]]\ntable = {:?}\ntopic = {:?}\n\n[outbox.columns]\nid = {:?}\naggregatetype = {:?}\naggregateid = {:?}\ntype = {:?}\npayload = {:?}\nheaders = {:?}\n",
        o.table, o.topic, c.id, c.aggregatetype, c.aggregateid, c.event_type, c.payload, c.headers
    ));
}
