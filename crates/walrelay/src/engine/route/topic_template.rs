//! An outbox table's topic template (`outbox.topic`, e.g.
//! `outbox.event.{aggregatetype}`), compiled once: `{schema}` and
//! `{table}` are the table's and filled in at start, `{aggregatetype}` is
//! the row's. Rendering a row's topic is then a lookup of its aggregate
//! type among those seen before (a handful in practice), not a string
//! search and three new strings per row; the first row of a type builds
//! and checks the name.
//!
//! The cache is bounded ([`CACHE_LIMIT`] types, emptied when full), so
//! rows with ever new aggregate types cost a render each but never grow
//! memory without bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::envelope::is_valid_topic;

/// Aggregate types remembered per template.
pub(super) const CACHE_LIMIT: usize = 1024;

/// Rendered topics by aggregate type; `None`: not a valid topic name.
type Rendered = HashMap<Box<[u8]>, Option<Arc<str>>>;

/// The placeholder filled in per row.
const AGGREGATETYPE: &str = "{aggregatetype}";

#[derive(Debug, Clone)]
pub(super) struct TopicTemplate {
    /// The template with `{schema}` and `{table}` filled in, split at
    /// each `{aggregatetype}`: one piece more than placeholders.
    pieces: Vec<String>,
    /// A cell: rendering is a read of the router, whose row borrows its
    /// routes (one session's task owns the router).
    cache: RefCell<Rendered>,
}

impl TopicTemplate {
    pub(super) fn new(template: &str, schema: &str, table: &str) -> TopicTemplate {
        let filled = template
            .replace("{schema}", schema)
            .replace("{table}", table);
        TopicTemplate {
            pieces: filled.split(AGGREGATETYPE).map(str::to_owned).collect(),
            cache: RefCell::new(HashMap::new()),
        }
    }

    /// The topic of a row whose aggregate type is `aggregatetype`: `Ok`
    /// with the shared name, or `Err` with the rendered text, which is no
    /// valid topic name.
    pub(super) fn render(&self, aggregatetype: &str) -> Result<Arc<str>, String> {
        let mut cache = self.cache.borrow_mut();
        if let Some(hit) = cache.get(aggregatetype.as_bytes()) {
            return hit.clone().ok_or_else(|| self.text(aggregatetype));
        }
        let text = self.text(aggregatetype);
        let topic = is_valid_topic(&text).then(|| Arc::<str>::from(text.as_str()));
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(aggregatetype.as_bytes().into(), topic.clone());
        topic.ok_or(text)
    }

    fn text(&self, aggregatetype: &str) -> String {
        self.pieces.join(aggregatetype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_filled_as_the_documented_template_says() {
        let t = TopicTemplate::new(
            "{schema}.{table}.{aggregatetype}.v1.{aggregatetype}",
            "public",
            "outbox",
        );
        assert_eq!(&*t.render("order").unwrap(), "public.outbox.order.v1.order");
        // The same name, shared, the second time.
        let (a, b) = (t.render("order").unwrap(), t.render("order").unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        let constant = TopicTemplate::new("events", "s", "t");
        assert_eq!(&*constant.render("anything").unwrap(), "events");
    }

    #[test]
    fn an_invalid_name_is_an_error_every_time_with_its_text() {
        let t = TopicTemplate::new("outbox.event.{aggregatetype}", "public", "outbox");
        for _ in 0..2 {
            assert_eq!(t.render("a b").unwrap_err(), "outbox.event.a b");
        }
        assert_eq!(t.render("").unwrap().as_ref(), "outbox.event.");
    }

    #[test]
    fn the_cache_stays_bounded() {
        let t = TopicTemplate::new("t.{aggregatetype}", "s", "t");
        for i in 0..(CACHE_LIMIT * 2 + 7) {
            assert_eq!(&*t.render(&format!("a{i}")).unwrap(), format!("t.a{i}"));
            assert!(t.cache.borrow().len() <= CACHE_LIMIT);
        }
    }
}
