//! How large a request body each endpoint accepts, and what the leader
//! packs into one AppendEntries so that its peers accept it.
//!
//! Bodies are refused with 413 as soon as they pass their limit: a
//! `Content-Length` over it is refused before any of the body is read,
//! and a body without one is counted while it streams in.
//!
//! | endpoint | limit |
//! | --- | --- |
//! | `PUT /kv/{key}` | the node's [`max_value_bytes`](crate::node::NodeConfig::max_value_bytes) |
//! | `POST /cluster/*` | [`MAX_CLUSTER_BODY_BYTES`] (1 MiB of JSON) |
//! | `POST /raft/append` | [`MAX_APPEND_BODY_BYTES`]: one largest entry and its framing, 65 MiB |
//! | `POST /raft/snapshot` | [`MAX_SNAPSHOT_BODY_BYTES`]: one chunk and its metadata, 4 MiB |
//! | `POST /raft/stage` | [`MAX_STAGE_BODY_BYTES`]: the entries of one append of at most [`MAX_STAGE_PAYLOAD_BYTES`] of keys and values and their framing, 3 MiB |
//! | `POST /raft/vote` | [`MAX_VOTE_BODY_BYTES`] (64 KiB) |
//! | anything else | [`MAX_OTHER_BODY_BYTES`] (64 KiB) |
//!
//! **Why AppendEntries fits in 65 MiB.** openraft 0.9 puts up to
//! `max_payload_entries` (300) entries in an AppendEntries whatever their
//! size, and an entry can carry a value of up to
//! [`MAX_VALUE_BYTES`] (64 MiB): 300 of
//! them would be 19 GiB. The leader's [`Network`](crate::network::Network)
//! therefore sends only the first entries that fit in
//! [`APPEND_PACK_BYTES`] (8 MiB), at least one, and answers openraft with a
//! `PartialSuccess` up to the last one sent; openraft sends the rest next.
//! The largest single entry is one put of a 64 MiB value with its key
//! (1 KiB at most); a batch of writes ([`crate::batch`]) carries at most
//! [`MAX_BATCH_BYTES`](crate::batch::MAX_BATCH_BYTES) (1 MiB) of keys and
//! values in at most 1,024 commands; a membership entry lists each node's
//! id and address. [`FRAMING_BYTES`] (1 MiB) covers the log ids, the vote,
//! bincode's tags and lengths and a membership of up to a few thousand
//! nodes. The format's value limit, not the node's own
//! [`max_value_bytes`](crate::node::NodeConfig::max_value_bytes), is used:
//! entries come from whichever node leads, and a leader started with a
//! longer heartbeat accepts larger values than a follower with a short one
//! would.
//!
//! **Snapshots** go in chunks of [`SNAPSHOT_CHUNK_BYTES`] (3 MiB, set in
//! openraft's `snapshot_max_chunk_size`), each with the snapshot's
//! metadata (its log id, membership and id).

use axum::http::Method;

use crate::network::{APPEND_PATH, SNAPSHOT_PATH, VOTE_PATH};
use crate::stage::{MAX_STAGE_PAYLOAD_BYTES, STAGE_PATH};
use crate::types::{MAX_KEY_BYTES, MAX_VALUE_BYTES};

/// Room for everything in a Raft RPC besides keys, values and snapshot
/// bytes: log ids, the vote, bincode's tags and lengths, membership.
pub const FRAMING_BYTES: usize = 1 << 20;

/// The leader puts entries into one AppendEntries until the next would
/// take it past this many bytes (a first entry always goes, whatever its
/// size).
pub const APPEND_PACK_BYTES: usize = 8 << 20;

/// The largest `/raft/append` body a node accepts: the largest single
/// entry (a put of a [`MAX_VALUE_BYTES`] value under a [`MAX_KEY_BYTES`]
/// key) plus [`FRAMING_BYTES`]. [`APPEND_PACK_BYTES`] and a batch's
/// [`MAX_BATCH_BYTES`](crate::batch::MAX_BATCH_BYTES) are below it.
pub const MAX_APPEND_BODY_BYTES: usize = MAX_VALUE_BYTES + MAX_KEY_BYTES + FRAMING_BYTES;

// What the leader packs, and a full batch of writes with bincode's 20 or
// so bytes per command, fit in an AppendEntries body with room to spare.
const _: () = assert!(APPEND_PACK_BYTES + FRAMING_BYTES <= MAX_APPEND_BODY_BYTES);
const _: () = assert!(
    crate::batch::MAX_BATCH_BYTES + crate::batch::MAX_BATCH_LEN * 64 + FRAMING_BYTES
        <= MAX_APPEND_BODY_BYTES
);

/// Bytes of snapshot data per InstallSnapshot RPC (openraft's
/// `snapshot_max_chunk_size`).
pub const SNAPSHOT_CHUNK_BYTES: usize = 3 << 20;

/// The largest `/raft/snapshot` body: one chunk and its metadata.
pub const MAX_SNAPSHOT_BODY_BYTES: usize = SNAPSHOT_CHUNK_BYTES + FRAMING_BYTES;

/// The largest `/raft/stage` body: the entries of one append carrying at
/// most [`MAX_STAGE_PAYLOAD_BYTES`] of keys and values (larger appends are
/// not staged) plus [`FRAMING_BYTES`].
pub const MAX_STAGE_BODY_BYTES: usize = MAX_STAGE_PAYLOAD_BYTES + FRAMING_BYTES;

// A full batch of writes can be staged.
const _: () = assert!(crate::batch::MAX_BATCH_BYTES <= MAX_STAGE_PAYLOAD_BYTES);

/// The largest `/raft/vote` body (a vote and a log id are a few dozen
/// bytes).
pub const MAX_VOTE_BODY_BYTES: usize = 64 << 10;

/// The largest `/cluster/*` body (JSON naming nodes and addresses).
pub const MAX_CLUSTER_BODY_BYTES: usize = 1 << 20;

/// The largest body of any other request (`GET`, `DELETE`, unknown paths).
pub const MAX_OTHER_BODY_BYTES: usize = 64 << 10;

/// The body limit of a request to `path` with `method` on a node whose
/// values are limited to `max_value_bytes`.
#[must_use]
pub fn request_body_limit(method: &Method, path: &str, max_value_bytes: usize) -> usize {
    match path {
        APPEND_PATH => MAX_APPEND_BODY_BYTES,
        SNAPSHOT_PATH => MAX_SNAPSHOT_BODY_BYTES,
        STAGE_PATH => MAX_STAGE_BODY_BYTES,
        VOTE_PATH => MAX_VOTE_BODY_BYTES,
        _ if path.starts_with("/cluster/") => MAX_CLUSTER_BODY_BYTES,
        _ if *method == Method::PUT && path.starts_with("/kv") => {
            max_value_bytes.max(MAX_OTHER_BODY_BYTES)
        }
        _ => MAX_OTHER_BODY_BYTES,
    }
}

/// Keeps the first `entries` whose bincode sizes add up to at most
/// [`APPEND_PACK_BYTES`] (at least one) and returns how many were dropped.
pub fn pack_entries<T: serde::Serialize>(entries: &mut Vec<T>) -> usize {
    let mut total: u64 = 0;
    let mut keep = 0;
    for entry in entries.iter() {
        let size = bincode::serialized_size(entry).unwrap_or(u64::MAX);
        if keep > 0 && total.saturating_add(size) > APPEND_PACK_BYTES as u64 {
            break;
        }
        total = total.saturating_add(size);
        keep += 1;
    }
    let dropped = entries.len() - keep;
    entries.truncate(keep);
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_endpoint() {
        let limit = |m: Method, p: &str| request_body_limit(&m, p, 1000);
        assert_eq!(limit(Method::POST, APPEND_PATH), MAX_APPEND_BODY_BYTES);
        assert_eq!(limit(Method::POST, SNAPSHOT_PATH), MAX_SNAPSHOT_BODY_BYTES);
        assert_eq!(limit(Method::POST, VOTE_PATH), MAX_VOTE_BODY_BYTES);
        assert_eq!(limit(Method::POST, STAGE_PATH), MAX_STAGE_BODY_BYTES);
        assert_eq!(limit(Method::POST, "/cluster/init"), MAX_CLUSTER_BODY_BYTES);
        assert_eq!(limit(Method::PUT, "/kv/a"), MAX_OTHER_BODY_BYTES);
        assert_eq!(
            request_body_limit(&Method::PUT, "/kv/a", 10 << 20),
            10 << 20
        );
        assert_eq!(
            request_body_limit(&Method::GET, "/kv/a", 10 << 20),
            MAX_OTHER_BODY_BYTES
        );
    }

    #[test]
    fn packing_keeps_a_prefix_within_the_budget_and_always_one() {
        let big = vec![serde_bytes::ByteBuf::from(vec![0u8; APPEND_PACK_BYTES])];
        let mut one = big.clone();
        assert_eq!(pack_entries(&mut one), 0);
        assert_eq!(one.len(), 1);
        let mut entries: Vec<serde_bytes::ByteBuf> = (0..20)
            .map(|_| serde_bytes::ByteBuf::from(vec![0u8; 1 << 20]))
            .collect();
        let dropped = pack_entries(&mut entries);
        assert_eq!(
            entries.len(),
            7,
            "seven 1 MiB entries and their lengths fit in 8 MiB"
        );
        assert_eq!(dropped, 13);
        let mut small: Vec<u32> = (0..300).collect();
        assert_eq!(pack_entries(&mut small), 0);
        assert_eq!(small.len(), 300);
    }
}
