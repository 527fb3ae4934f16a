//! What `Database::verify` reports: a leaf, so that the error type can
//! carry a report without depending on the database.

use std::fmt;

use okaywal::encryption::KeyId;

use crate::commit_record::CommitLogDamage;
use crate::grain_id::GrainId;

/// One thing `verify` found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file (and offset, where it applies) holding the problem.
    pub location: String,
    /// The grain concerned, if any.
    pub grain: Option<GrainId>,
    /// What is wrong.
    pub description: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.grain {
            Some(grain) => write!(f, "{}: grain {grain}: {}", self.location, self.description),
            None => write!(f, "{}: {}", self.location, self.description),
        }
    }
}

/// What [`Database::verify`](crate::Database::verify) checked and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Every problem found; empty for a healthy database.
    pub problems: Vec<Problem>,
    /// Blobs whose checksum was checked.
    pub grains_checked: u64,
    /// Stratum files checked.
    pub strata_checked: u64,
    /// Commit records checked.
    pub commit_records_checked: u64,
    /// Each damaged stretch of the commit log (also listed in `problems`):
    /// where it is and which sequences' records cannot be read.
    pub commit_log_damage: Vec<CommitLogDamage>,
    /// In an encrypted store, the ids of the keys that sealed what
    /// `verify` read (grains, stratum headers and their stamp pages, the
    /// index, commit records, blobs still in the WAL, and the WAL's
    /// segments), in order: the keys the store still needs. Empty for a plain store. After a
    /// [`Database::rekey`](crate::Database::rekey) it is the current key
    /// alone.
    pub key_ids_in_use: Vec<KeyId>,
}

impl VerifyReport {
    /// True if nothing is wrong.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for problem in &self.problems {
            writeln!(f, "{problem}")?;
        }
        write!(
            f,
            "checked {} grains in {} strata and {} commit records: {} problem(s)",
            self.grains_checked,
            self.strata_checked,
            self.commit_records_checked,
            self.problems.len()
        )?;
        if !self.key_ids_in_use.is_empty() {
            let ids: Vec<String> = self
                .key_ids_in_use
                .iter()
                .map(|id| id.get().to_string())
                .collect();
            write!(f, "; key ids in use: {}", ids.join(", "))?;
        }
        Ok(())
    }
}
