//! The state machine's journal: how the key → grain map, the last applied
//! log id and the membership are stored in sediment.
//!
//! Every apply commits one journal grain with the keys it changed and a
//! pointer to the previous journal grain; the database's embedded header
//! points at the newest. Now and then a *full* record (every key, no
//! pointer) starts a new chain and the old chain is archived, so recovery
//! reads a bounded number of grains and the chain's space is reused.

use serde::{Deserialize, Serialize};

use crate::types::{LogId, StoredMembership};
use crate::validate;

/// One journal grain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// The previous journal grain (a grain id as `u64`); `None` for a full
    /// record.
    pub prev: Option<u64>,
    /// The last log id applied once this record is.
    pub last_applied: Option<LogId>,
    /// The membership as of this record.
    pub membership: StoredMembership,
    /// Keys set to a value grain (`Some`) or removed (`None`); for a full
    /// record, every key.
    pub changes: Vec<(String, Option<u64>)>,
}

impl Journal {
    /// Encodes the record.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        bincode::serialize(self).expect("a journal record serializes")
    }

    /// Decodes a record written by [`Journal::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let record: Self =
            validate::decode_all(bytes).map_err(|e| format!("bad journal record: {e}"))?;
        validate::check_opt_log_id(record.last_applied.as_ref(), "the last applied log id")?;
        validate::check_opt_log_id(
            record.membership.log_id().as_ref(),
            "the membership's log id",
        )?;
        Ok(record)
    }
}

/// Whether the next record should be a full one. `replay_cost` is what a
/// restart replays beyond the last full record: one for each record after
/// it plus one for each key change those records carry. Once that reaches
/// half the map (and a floor), rewriting the map costs no more than what
/// replaying the chain would, so both the chain's grains and the replay
/// stay within about half the map however many keys each record changes.
#[must_use]
pub fn wants_full_record(replay_cost: usize, keys: usize) -> bool {
    replay_cost >= 64.max(keys / 2)
}

/// What one record adds to the replay cost of the chain it extends (see
/// [`wants_full_record`]).
#[must_use]
pub fn replay_cost(changes: usize) -> usize {
    1 + changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Membership};
    use std::collections::BTreeSet;

    #[test]
    fn journal_round_trips() {
        let members: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
        let record = Journal {
            prev: Some(42),
            last_applied: Some(LogId::new(CommittedLeaderId::new(2, 1), 9)),
            membership: StoredMembership::new(
                Some(LogId::new(CommittedLeaderId::new(1, 1), 1)),
                Membership::new(vec![members], None),
            ),
            changes: vec![("a".into(), Some(7)), ("b".into(), None)],
        };
        assert_eq!(Journal::decode(&record.encode()).unwrap(), record);
        assert!(Journal::decode(&[1, 2]).is_err());
    }

    #[test]
    fn full_records_bound_the_chain() {
        assert!(!wants_full_record(10, 0));
        assert!(wants_full_record(64, 0));
        assert!(!wants_full_record(64, 1000));
        assert!(wants_full_record(500, 1000));
    }

    /// Records that each add several new keys: the chain still ends, after
    /// about as many changes as the map held when it began.
    #[test]
    fn records_of_many_new_keys_still_start_new_chains() {
        for per_record in [1, 2, 8, 64] {
            let mut keys = 10_000;
            let (mut cost, mut records) = (0, 0);
            while !wants_full_record(cost, keys) {
                keys += per_record;
                cost += replay_cost(per_record);
                records += 1;
                assert!(
                    records <= 10_000,
                    "{per_record} keys a record: no full record"
                );
            }
            assert!(
                cost <= 10_000 + replay_cost(per_record) * 2,
                "{per_record}: {cost}"
            );
        }
    }
}
