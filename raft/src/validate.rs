//! What a node accepts from its peers and from its own files.
//!
//! The Raft RPCs arrive from the network, so a node checks each one before
//! openraft sees it, and refuses the whole RPC (400) if any part is wrong:
//!
//! - **Bodies** are decoded with [`decode`]: bincode 1.x in its default
//!   format (what `bincode::serialize` writes) with a byte limit, so a
//!   length prefix can never ask for more than the input holds. Nothing in
//!   the types recurses (a [`Request::Batch`](crate::types::Request) holds
//!   flat [`Change`](crate::types::Change)s), so decoding depth is fixed.
//! - **Terms and indexes** must be at most [`MAX_TERM`] and
//!   [`MAX_LOG_INDEX`]: openraft computes `term + 1` when it starts an
//!   election and `index + 1` for the next entry, and a value near
//!   `u64::MAX`, once saved, would make every later start fail.
//! - **Entries** must follow `prev_log_id` one index at a time, with terms
//!   that never decrease and never exceed the sender's vote, as a leader's
//!   do; every command must pass [`Request::check`](crate::types::Request::check)
//!   with the format's value limit (the rules of the client API), and every
//!   membership [`check_membership`].
//! - **Snapshots** must have an id made of letters, digits, `-` and `_`
//!   (it becomes part of a file name) and a valid membership.
//! - **Stage requests** ([`crate::stage`]) are checked as AppendEntries
//!   is, and must carry a committed vote and at least one entry, each
//!   created by that vote's leader ([`check_stage`]).
//!
//! The stores apply the same bounds to what they load ([`check_log_id`],
//! [`check_vote`]): a node whose files hold a term or index beyond them
//! refuses to start with an error naming the file and the value, instead
//! of letting openraft's core panic later.

use std::collections::BTreeSet;

use bincode::Options;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{EntryPayload, Membership};
use serde::de::DeserializeOwned;

use crate::stage::StageRequest;
use crate::types::{Entry, LogId, Node, NodeId, TypeConfig, Vote, MAX_VALUE_BYTES};

/// The highest term a node accepts or loads: 2^48. A term grows by one per
/// election, and an election takes at least four heartbeat intervals of
/// silence; at 1 ms heartbeats (the smallest setting) that is at most 250
/// elections a second, so reaching 2^48 would take over 35,000 years. Any
/// larger term can only come from a forged or corrupted message, and
/// keeping far below `u64::MAX` keeps openraft's `term + 1` from
/// overflowing.
pub const MAX_TERM: u64 = 1 << 48;

/// The highest log index a node accepts or loads: 2^62, more than a
/// billion entries a second for a century, and far enough below `u64::MAX`
/// that openraft's index arithmetic cannot overflow.
pub const MAX_LOG_INDEX: u64 = 1 << 62;

/// The most nodes a membership may list.
pub const MAX_MEMBERS: usize = 1024;

/// The largest encoded Raft entry a node decodes from its log: a value of
/// [`MAX_VALUE_BYTES`] plus room for its key, a batch's framing or a
/// membership.
pub const MAX_ENTRY_BYTES: u64 = MAX_VALUE_BYTES as u64 + (1 << 20);

/// Decodes bincode written by `bincode::serialize` (fixed-width
/// little-endian integers, `u64` lengths, trailing bytes allowed: the
/// options `bincode::deserialize` uses), reading at most `limit` bytes: a
/// length prefix larger than what is left fails instead of allocating.
///
/// The decoder is built over the slice directly: bincode 1.3's
/// `Options::deserialize(&[u8])` replaces any limit with none (it relies on
/// the slice's length alone), so `with_limit` would not bound it.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, bincode::Error> {
    let options = bincode::options()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit);
    T::deserialize(&mut bincode::Deserializer::from_slice(bytes, options))
}

/// Decodes `bytes` whole (the limit is their length). Input that ends
/// before what it encodes (cut short, or not this kind of request) is said
/// to be so, not reported as bincode's "size limit".
pub fn decode_all<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    decode(bytes, bytes.len() as u64).map_err(|err| match *err {
        bincode::ErrorKind::SizeLimit => Box::new(bincode::ErrorKind::Custom(format!(
            "its {} bytes end before what they encode does (cut short, or not this request)",
            bytes.len()
        ))),
        other => Box::new(other),
    })
}

/// Checks a term against [`MAX_TERM`].
pub fn check_term(term: u64, what: &str) -> Result<(), String> {
    if term > MAX_TERM {
        Err(format!(
            "{what} has term {term}, above the highest a leader can reach ({MAX_TERM})"
        ))
    } else {
        Ok(())
    }
}

/// Checks a log id's term and index against [`MAX_TERM`] and
/// [`MAX_LOG_INDEX`].
pub fn check_log_id(log_id: &LogId, what: &str) -> Result<(), String> {
    check_term(log_id.leader_id.term, what)?;
    if log_id.index > MAX_LOG_INDEX {
        return Err(format!(
            "{what} has index {}, above the highest a log can reach ({MAX_LOG_INDEX})",
            log_id.index
        ));
    }
    Ok(())
}

/// [`check_log_id`] for an optional log id.
pub fn check_opt_log_id(log_id: Option<&LogId>, what: &str) -> Result<(), String> {
    log_id.map_or(Ok(()), |id| check_log_id(id, what))
}

/// Checks a vote's term against [`MAX_TERM`].
pub fn check_vote(vote: &Vote, what: &str) -> Result<(), String> {
    check_term(vote.leader_id().get_term(), what)
}

/// Checks a node address: `host:port` with a non-zero port, the host an IP
/// address or a name of letters, digits, dots and dashes.
pub fn check_addr(addr: &str) -> Result<(), String> {
    let valid = if let Ok(socket) = addr.parse::<std::net::SocketAddr>() {
        socket.port() > 0
    } else {
        addr.rsplit_once(':').is_some_and(|(host, port)| {
            port.parse::<u16>().is_ok_and(|p| p > 0)
                && !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
    };
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{addr:?} is not a node address (host:port, e.g. 127.0.0.1:21001)"
        ))
    }
}

/// Checks a membership: one config, or two during a change (joint
/// consensus); none empty; every voter listed among the nodes; at most
/// [`MAX_MEMBERS`] nodes; every address valid ([`check_addr`]).
pub fn check_membership(membership: &Membership<NodeId, Node>) -> Result<(), String> {
    let configs = membership.get_joint_config();
    if configs.is_empty() || configs.len() > 2 {
        return Err(format!(
            "a membership has one voter set, or two during a change, not {}",
            configs.len()
        ));
    }
    if configs.iter().any(BTreeSet::is_empty) {
        return Err("a membership's voter set is empty".into());
    }
    let nodes = membership.nodes().count();
    if nodes > MAX_MEMBERS {
        return Err(format!(
            "a membership lists {nodes} nodes; the limit is {MAX_MEMBERS}"
        ));
    }
    for voter in membership.voter_ids() {
        if membership.get_node(&voter).is_none() {
            return Err(format!("voter {voter} has no address in the membership"));
        }
    }
    for (id, node) in membership.nodes() {
        check_addr(&node.addr).map_err(|e| format!("node {id}: {e}"))?;
    }
    Ok(())
}

/// Checks a snapshot id: 1 to 128 ASCII letters, digits, `-` or `_` (it is
/// part of the snapshot's file name).
pub fn check_snapshot_id(id: &str) -> Result<(), String> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "snapshot id {:?} is not 1 to 128 letters, digits, '-' or '_'",
            id.chars().take(64).collect::<String>()
        ))
    }
}

/// Checks an AppendEntries request as described in the module docs.
pub fn check_append(request: &AppendEntriesRequest<TypeConfig>) -> Result<(), String> {
    check_vote(&request.vote, "the vote")?;
    let term = request.vote.leader_id().get_term();
    check_opt_log_id(request.prev_log_id.as_ref(), "prev_log_id")?;
    check_opt_log_id(request.leader_commit.as_ref(), "leader_commit")?;
    for (what, id) in [
        ("prev_log_id", request.prev_log_id.as_ref()),
        ("leader_commit", request.leader_commit.as_ref()),
    ] {
        if let Some(id) = id {
            if id.leader_id.term > term {
                return Err(format!(
                    "{what} has term {}, above the sender's vote term {term}",
                    id.leader_id.term
                ));
            }
        }
    }
    check_entries(term, request.prev_log_id, &request.entries)
}

/// Checks entries sent by a node whose vote has `term`: they follow
/// `prev` one index at a time, with terms that never decrease and never
/// exceed `term`, and every command and membership is valid.
fn check_entries(term: u64, prev: Option<LogId>, entries: &[Entry]) -> Result<(), String> {
    let mut previous = prev;
    for entry in entries {
        let id = entry.log_id;
        check_log_id(&id, "an entry")?;
        let expected = previous.map_or(0, |p| p.index + 1);
        if id.index != expected {
            return Err(format!(
                "entry {} does not follow {} (expected index {expected})",
                id.index,
                previous.map_or_else(|| "the start of the log".to_string(), |p| p.to_string()),
            ));
        }
        if previous.is_some_and(|p| id.leader_id.term < p.leader_id.term) {
            return Err(format!(
                "entry {} has a lower term than the entry before it",
                id.index
            ));
        }
        if id.leader_id.term > term {
            return Err(format!(
                "entry {} has term {}, above the sender's vote term {term}",
                id.index, id.leader_id.term
            ));
        }
        match &entry.payload {
            EntryPayload::Blank => {}
            EntryPayload::Normal(command) => command
                .check(MAX_VALUE_BYTES)
                .map_err(|e| format!("entry {}: {e}", id.index))?,
            EntryPayload::Membership(membership) => {
                check_membership(membership).map_err(|e| format!("entry {}: {e}", id.index))?
            }
        }
        previous = Some(id);
    }
    Ok(())
}

/// Checks a stage request ([`crate::stage`]) as AppendEntries is checked,
/// and more strictly: the vote must be committed (only a leader stages
/// entries), there must be entries, and each must have been created by the
/// vote's leader (a leader stages only the entries it appends).
pub fn check_stage(request: &StageRequest) -> Result<(), String> {
    check_vote(&request.vote, "the vote")?;
    if !request.vote.is_committed() {
        return Err("the vote is not committed: only a leader stages entries".into());
    }
    let term = request.vote.leader_id().get_term();
    check_opt_log_id(request.prev.as_ref(), "prev")?;
    if let Some(prev) = &request.prev {
        if prev.leader_id.term > term {
            return Err(format!(
                "prev has term {}, above the sender's vote term {term}",
                prev.leader_id.term
            ));
        }
    }
    if request.entries.is_empty() {
        return Err("a stage request holds no entries".into());
    }
    if let Some(entry) = request
        .entries
        .iter()
        .find(|entry| entry.log_id.leader_id != *request.vote.leader_id())
    {
        return Err(format!(
            "entry {} was not created by the vote's leader",
            entry.log_id.index
        ));
    }
    check_entries(term, request.prev, &request.entries)
}

/// Checks a RequestVote request's terms and indexes.
pub fn check_vote_request(request: &VoteRequest<NodeId>) -> Result<(), String> {
    check_vote(&request.vote, "the vote")?;
    check_opt_log_id(request.last_log_id.as_ref(), "last_log_id")
}

/// Checks an InstallSnapshot chunk's vote and metadata.
pub fn check_install_snapshot(request: &InstallSnapshotRequest<TypeConfig>) -> Result<(), String> {
    check_vote(&request.vote, "the vote")?;
    let meta = &request.meta;
    check_opt_log_id(meta.last_log_id.as_ref(), "the snapshot's last log id")?;
    check_opt_log_id(
        meta.last_membership.log_id().as_ref(),
        "the snapshot's membership",
    )?;
    check_membership(meta.last_membership.membership())?;
    check_snapshot_id(&meta.snapshot_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Change, Request};
    use openraft::CommittedLeaderId;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn bounded_decoding_reads_what_bincode_serialize_writes() {
        let request = Request::Batch(vec![
            Change::Put {
                key: "a".into(),
                value: vec![1, 2, 3],
            },
            Change::Delete { key: "b".into() },
        ]);
        let bytes = bincode::serialize(&request).unwrap();
        assert_eq!(decode_all::<Request>(&bytes).unwrap(), request);
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(b"more");
        assert_eq!(decode_all::<Request>(&trailing).unwrap(), request);
        assert!(decode::<Request>(&bytes, bytes.len() as u64 - 1).is_err());
        // A length prefix beyond the input fails without allocating it.
        let mut huge = bincode::serialize(&Request::Delete { key: "k".into() }).unwrap();
        huge[4..12].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
        let err = decode_all::<Request>(&huge).unwrap_err().to_string();
        assert!(err.contains("end before what they encode"), "{err}");
        let short = decode_all::<Request>(&bytes[..bytes.len() - 1])
            .unwrap_err()
            .to_string();
        assert!(!short.contains("size limit"), "{short}");
        assert!(short.contains("cut short"), "{short}");
    }

    #[test]
    fn terms_and_indexes_have_bounds() {
        assert!(check_log_id(&log_id(MAX_TERM, MAX_LOG_INDEX), "x").is_ok());
        assert!(check_log_id(&log_id(MAX_TERM + 1, 1), "x").is_err());
        assert!(check_log_id(&log_id(1, u64::MAX), "x").is_err());
        assert!(check_vote(&Vote::new(u64::MAX, 1), "x").is_err());
        assert!(check_vote(&Vote::new_committed(7, 1), "x").is_ok());
    }

    #[test]
    fn snapshot_ids_cannot_leave_the_directory() {
        assert!(check_snapshot_id("3-1-200-0").is_ok());
        for bad in ["", "../x", "a/b", "a.b", &"x".repeat(129)] {
            assert!(check_snapshot_id(bad).is_err(), "{bad:?}");
        }
    }
}
