//! `ls`: the live blobs of a store.

use std::io::Write;
use std::path::Path;

use sediment::GrainInfo;
use serde::Serialize;

use crate::error::{is_corruption, one_line, say, CliError};
use crate::inspect::write_json;
use crate::store::{self, run_then_shutdown};

/// One line of `ls --json`.
#[derive(Serialize)]
struct JsonGrain {
    id: String,
    length: u64,
    sequence: u64,
    archived: bool,
}

impl From<&GrainInfo> for JsonGrain {
    fn from(info: &GrainInfo) -> Self {
        Self {
            id: info.id.to_string(),
            length: info.length,
            sequence: info.sequence.0,
            archived: info.archived,
        }
    }
}

/// One line of `ls`: id, length, the sequence that wrote it, and
/// `archived` for archived blobs.
fn ls_line(info: &GrainInfo) -> String {
    format!(
        "{:<16} {:>10} bytes  sequence {}{}",
        info.id,
        info.length,
        info.sequence,
        if info.archived { "  archived" } else { "" }
    )
}

/// `sediment ls DB [--json]`
pub fn ls(db_path: &Path, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let db = store::open_read_only(db_path)?;
    run_then_shutdown(db, |db| {
        store::warn_if_commit_log_damaged(db);
        // A blob whose header cannot be read is reported and skipped: the
        // others are still worth listing.
        let mut unreadable = 0_u64;
        let mut damaged = false;
        for item in db.grains()? {
            let info = match item {
                Ok(info) => info,
                Err(sediment::Error::ShutDown) => return Err(sediment::Error::ShutDown.into()),
                Err(err) => {
                    damaged |= is_corruption(&err);
                    unreadable += 1;
                    out.flush().map_err(CliError::output)?;
                    say!("sediment: {}", one_line(&err.to_string()));
                    continue;
                }
            };
            if json {
                write_json(out, &JsonGrain::from(&info))?;
            } else {
                writeln!(out, "{}", ls_line(&info)).map_err(CliError::output)?;
            }
        }
        out.flush().map_err(CliError::output)?;
        if unreadable > 0 {
            let what = if damaged {
                "the store is damaged: "
            } else {
                ""
            };
            return Err(CliError::failure(format!(
                "{what}{unreadable} blob(s) could not be listed (see above); \
                 `sediment verify` checks every grain"
            )));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_the_id_length_sequence_and_archived_mark() {
        let db = sediment::Database::in_memory();
        let mut tx = db.begin_transaction().unwrap();
        let kept = tx.write(b"kept").unwrap();
        let archived = tx.write(b"archived").unwrap();
        tx.commit().unwrap();
        let mut tx = db.begin_transaction().unwrap();
        tx.archive(archived).unwrap();
        tx.commit().unwrap();
        let lines: Vec<String> = db.grains().unwrap().map(|i| ls_line(&i.unwrap())).collect();
        assert_eq!(
            lines,
            vec![
                format!("{kept:<16} {:>10} bytes  sequence 1", 4),
                format!("{archived:<16} {:>10} bytes  sequence 1  archived", 8),
            ]
        );
    }
}
