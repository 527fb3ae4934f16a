//! A replicated key-value store: [`openraft`] drives consensus, an
//! [`okaywal`] write-ahead log is its durable Raft log ([`LogStore`]) and a
//! [`sediment`] blob store is its state machine ([`StateMachine`]). Nodes
//! talk HTTP, or HTTPS with a bearer token or mutual TLS ([`security`]),
//! through a server that caps and times out connections and bounds bodies
//! ([`server`], [`limits`]) to the Raft RPCs ([`network`]) and the client
//! API ([`api`]); [`node::start`] starts one. A node keeps to its own
//! cluster and node id ([`identity`]): it refuses RPCs meant for another
//! node or sent by another cluster, and its data is never replicated into
//! after it was lost.
//!
//! ```no_run
//! use sediment_raft::node::{self, NodeConfig};
//!
//! # async fn example() -> Result<(), sediment_raft::Error> {
//! let config = NodeConfig::new(1, "127.0.0.1:21001".parse().unwrap(), "node-1");
//! let running = node::start(config).await?;
//! // PUT/GET/DELETE http://127.0.0.1:21001/kv/{key}, POST /cluster/init ...
//! running.wait().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Durability
//!
//! - An append is acknowledged to openraft (`LogFlushed`) only after the
//!   WAL sync that covers it; concurrent appends share that sync.
//! - Votes, truncations and purges are synced before the call that saves
//!   them returns; the committed log id rides on the next append's sync.
//! - Client writes that arrive together are proposed as one entry
//!   ([`batch`]) and each is acknowledged only once that entry is committed
//!   and applied.
//! - Applying entries commits their values, the replaced values' archiving
//!   and the last applied log id and membership in one sediment
//!   transaction: the state machine never disagrees with its applied id.
//!   That transaction is not synced on its own (the store syncs every
//!   500 ms and before each snapshot): after a crash the node applies the
//!   lost entries again from its log. A write costs each node one
//!   `fdatasync`, its log append's (`FORMAT.md`, "One sync per write").
//! - A leader sends the entries it appends to its followers while it
//!   syncs them itself ([`stage`]), so that their syncs overlap; a
//!   follower acknowledges an entry only through openraft's AppendEntries
//!   and only once it is durable (`FORMAT.md`, "Pre-staged entries").
//!
//! # Encryption at rest
//!
//! A node given a key provider ([`node::NodeConfig::key_provider`],
//! `sediment-raft node --key-file`) encrypts its WAL and its sediment store
//! with their own encryption and seals every file of its own (the log's
//! metadata and archives, snapshot files) bound to its place, so that a
//! wrong key is refused at start and damage or moved bytes are detected
//! ([`encryption`]).
//!
//! `FORMAT.md` in the crate describes every file a node writes.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod batch;
pub mod encryption;
mod error;
pub mod identity;
pub mod journal;
pub mod limits;
pub mod log_format;
pub mod log_store;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod node;
pub mod sealed_snapshot;
pub mod security;
pub mod server;
pub mod snapshot;
pub mod snapshot_data;
pub mod stage;
pub mod state_machine;
pub mod types;
pub mod validate;

pub use error::{Error, Result};
pub use log_store::{LogStore, LogStoreConfig};
pub use state_machine::{StateMachine, StateMachineConfig};
pub use types::{NodeId, Request, Response, TypeConfig};
