//! The `tracing` feature's spans, seen by a subscriber that records every
//! span's name and fields: `cargo test -p okaywal --features tracing
//! --test tracing`.
#![cfg(feature = "tracing")]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use okaywal::{LogVoid, WriteAheadLog};
use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span: its name and its fields, formatted with `Debug`.
type Span = (String, BTreeMap<String, String>);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

#[derive(Clone, Default)]
struct Recorder {
    spans: Arc<Mutex<Vec<Span>>>,
    next_id: Arc<AtomicU64>,
}

impl Subscriber for Recorder {
    fn enabled(&self, _metadata: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, attributes: &Attributes<'_>) -> Id {
        let mut fields = Fields::default();
        attributes.record(&mut fields);
        let name = attributes.metadata().name().to_string();
        if attributes.metadata().target().starts_with("okaywal") {
            self.spans.lock().push((name, fields.0));
        }
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, _event: &Event<'_>) {}

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a BTreeMap<String, String>> {
    spans
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, fields)| fields)
        .collect()
}

#[test]
fn open_commit_sync_switch_and_checkpoint_enter_spans_with_their_fields() {
    let recorder = Recorder::default();
    // Global, not per thread: checkpoints run on the log's own thread.
    tracing::subscriber::set_global_default(recorder.clone()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    let mut ids = Vec::new();
    for (i, len) in [10_usize, 300].into_iter().enumerate() {
        let mut entry = log.begin_entry().unwrap();
        entry.write_chunk(&vec![i as u8; len]).unwrap();
        ids.push(entry.commit().unwrap().0);
    }
    let mut entry = log.begin_entry().unwrap();
    entry.write_chunk(&[7; 20]).unwrap();
    let buffered = entry.commit_buffered().unwrap().0;
    log.sync().unwrap();
    log.checkpoint_active().unwrap();
    log.shutdown().unwrap();
    drop(log);
    let log = WriteAheadLog::recover(dir.path(), LogVoid).unwrap();
    log.shutdown().unwrap();

    let spans = recorder.spans.lock().clone();
    let opens = named(&spans, "open");
    assert_eq!(opens.len(), 2, "{spans:?}");
    let shown = dir.path().display().to_string();
    for open in &opens {
        assert!(open["directory"].contains(&shown), "{open:?}");
    }

    let commits = named(&spans, "commit");
    let committed: Vec<(String, String, String)> = commits
        .iter()
        .map(|c| {
            (
                c["entry"].clone(),
                c["bytes"].clone(),
                c["durability"].clone(),
            )
        })
        .collect();
    assert_eq!(
        committed,
        [
            (ids[0].to_string(), "10".into(), "Durable".into()),
            (ids[1].to_string(), "300".into(), "Durable".into()),
            (buffered.to_string(), "20".into(), "Buffered".into()),
        ]
    );

    let syncs = named(&spans, "sync");
    assert!(!syncs.is_empty(), "{spans:?}");
    let covered: u64 = syncs
        .iter()
        .map(|s| s["commits"].parse::<u64>().unwrap())
        .sum();
    assert!(covered >= 2, "{syncs:?}");
    assert!(syncs.iter().any(|s| s["segments"] != "0"), "{syncs:?}");

    // The first segment at open, its successor at checkpoint_active, and
    // a new one at the second open.
    assert!(named(&spans, "switch_segment").len() >= 3, "{spans:?}");

    let checkpoints = named(&spans, "checkpoint");
    assert!(
        checkpoints
            .iter()
            .any(|c| c["last_entry_id"] == format!("Some({buffered})")),
        "{checkpoints:?}"
    );
}
