//! Which cluster and which node a node directory belongs to, and the
//! checks that keep a node out of a cluster that is not its own.
//!
//! A node records its identity in the file `identity` of its directory
//! when it is initialised (`POST /cluster/init`) or joined to a cluster
//! (`POST /cluster/join`, which the leader's `/cluster/add-learner` and
//! the initialising node's `/cluster/init` call on the nodes they add):
//! the cluster's id (16 random bytes drawn at `init`) and the node's id.
//! Every Raft RPC names the cluster it comes from and the node it is for
//! (the headers [`CLUSTER_HEADER`] and [`TARGET_HEADER`]), and a node
//! refuses (409) an RPC
//!
//! - for another node id: its address reaches the wrong node (swapped or
//!   misconfigured directories or ports);
//! - from another cluster: the node was started on another cluster's
//!   directory, or at an address another cluster uses;
//! - from a cluster while it holds no data and was never joined: its data
//!   was lost (an emptied or replaced disk). Replication into such a node
//!   would let it vote without the entries it acknowledged before; the
//!   operator removes it (`/cluster/change-membership`) and adds it again
//!   (`/cluster/add-learner`), which joins it afresh.
//!
//! A node starts only with the `--id` its directory records. A directory
//! written before identities were recorded holds data but no `identity`
//! file: such a node answers RPCs from any cluster as before, and records
//! none (taking one from an RPC would let a single forged request cut it
//! off from its cluster for good); a peer that sends no cluster id is
//! answered as before too.
//!
//! A node put back from an older copy of its own directory keeps its
//! identity; the leader fences it off instead (see [`crate::network`]).
//!
//! `FORMAT.md` ("Node identity") gives the file's bytes; an encrypted node
//! seals them like its other files.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use okaywal::encryption::{KeyId, Seal, SEAL_BYTES};
use okaywal::fs::FileSystem;
use parking_lot::Mutex;

use crate::encryption::{read_all, write_durably, SharedKeys};
use crate::error::{Error, Result};
use crate::types::NodeId;

/// The file, in the node directory, that records the node's identity.
pub const IDENTITY_FILE: &str = "identity";
/// The header naming the cluster an RPC comes from (32 hex digits).
pub const CLUSTER_HEADER: &str = "sediment-raft-cluster";
/// The header naming the node id an RPC is for.
pub const TARGET_HEADER: &str = "sediment-raft-target";

const PLAIN_MAGIC: &[u8; 8] = b"SRIDNT1P";
const SEALED_MAGIC: &[u8; 8] = b"SRIDNT1S";
/// Cluster id and node id.
const BODY_BYTES: usize = 16 + 8;
const SEAL_CONTEXT: &[u8] = b"sediment-raft identity v1";

/// A cluster's id: 16 random bytes drawn when the cluster is initialised.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId([u8; 16]);

impl ClusterId {
    /// A new random id.
    ///
    /// # Errors
    ///
    /// The operating system's random generator failed.
    pub fn random() -> Result<Self> {
        let mut bytes = [0_u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::io(
                "drawing a cluster id",
                io::Error::other(format!("the operating system's random generator: {e}")),
            )
        })?;
        Ok(Self(bytes))
    }

    /// Parses 32 hex digits.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0_u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

/// Why a node refused an RPC or a join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node's identity: its id, and the cluster its directory belongs to
/// once it is known.
pub struct Identity {
    node: NodeId,
    cluster: Mutex<Option<ClusterId>>,
    store: Store,
}

/// Where the identity is kept.
struct Store {
    fs: Arc<dyn FileSystem>,
    directory: PathBuf,
    keys: Option<SharedKeys>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("node", &self.node)
            .field("cluster", &*self.cluster.lock())
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Reads the identity recorded in `directory` for node `node`.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the directory records another node id;
    /// [`Error::Corrupt`] if the file is damaged; [`Error::Key`] if it is
    /// sealed and the key does not open it; [`Error::Io`] if it cannot be
    /// read.
    pub fn load(
        fs: Arc<dyn FileSystem>,
        directory: &Path,
        keys: Option<SharedKeys>,
        node: NodeId,
    ) -> Result<Self> {
        let path = directory.join(IDENTITY_FILE);
        let shown = path.display().to_string();
        let exists = fs
            .exists(&path)
            .map_err(|e| Error::io(format!("looking for {shown}"), e))?;
        let cluster = if exists {
            let bytes =
                read_all(&*fs, &path).map_err(|e| Error::io(format!("reading {shown}"), e))?;
            let (cluster, recorded, sealed_with) = decode(&bytes, keys.as_ref(), &shown)?;
            if recorded != node {
                return Err(Error::Config(format!(
                    "{} belongs to node {recorded} of cluster {cluster}, not node {node}: start \
                     it with --id {recorded}, or give node {node} a directory of its own",
                    directory.display()
                )));
            }
            // After a key rotation the file moves to the current key, like
            // the key check, so that the old key can be retired.
            if let (Some(keys), Some(sealed_with)) = (&keys, sealed_with) {
                let current = keys
                    .cipher()
                    .current_key_id()
                    .map_err(|e| Error::io("asking the key provider for its current key", e))?;
                if current != sealed_with {
                    let bytes = encode(cluster, node, Some(keys))?;
                    write_durably(&*fs, directory, IDENTITY_FILE, &bytes)
                        .map_err(|e| Error::io(format!("writing {shown}"), e))?;
                }
            }
            Some(cluster)
        } else {
            None
        };
        Ok(Self {
            node,
            cluster: Mutex::new(cluster),
            store: Store {
                fs,
                directory: directory.to_path_buf(),
                keys,
            },
        })
    }

    /// This node's id.
    #[must_use]
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The cluster this node belongs to, if it knows.
    #[must_use]
    pub fn cluster(&self) -> Option<ClusterId> {
        *self.cluster.lock()
    }

    /// Records `cluster` as this node's, durably.
    fn record(&self, cluster: ClusterId) -> Result<()> {
        let store = &self.store;
        let bytes = encode(cluster, self.node, store.keys.as_ref())?;
        write_durably(&*store.fs, &store.directory, IDENTITY_FILE, &bytes).map_err(|e| {
            Error::io(
                format!("writing {}", store.directory.join(IDENTITY_FILE).display()),
                e,
            )
        })?;
        *self.cluster.lock() = Some(cluster);
        Ok(())
    }

    /// The cluster id for `POST /cluster/init` on this node: the one it
    /// was joined to if it holds no data yet, else a new one; recorded.
    ///
    /// # Errors
    ///
    /// As for writing the identity file.
    pub fn for_init(&self, holds_data: bool) -> Result<ClusterId> {
        let known = self.cluster();
        let cluster = match known {
            Some(cluster) => cluster,
            // A node that holds data but records no cluster was written by
            // an older version: openraft refuses to initialise it again.
            None if holds_data => return ClusterId::random(),
            None => ClusterId::random()?,
        };
        if known != Some(cluster) {
            self.record(cluster)?;
        }
        Ok(cluster)
    }

    /// `POST /cluster/join`: makes this node a member of `cluster` as
    /// `node`, unless it is another node or holds another cluster's data.
    ///
    /// # Errors
    ///
    /// `Ok(Err(refusal))` when the join is refused; `Err` when it could
    /// not be recorded.
    pub fn join(
        &self,
        cluster: ClusterId,
        node: NodeId,
        holds_data: bool,
    ) -> Result<std::result::Result<(), Refusal>> {
        if node != self.node {
            return Ok(Err(Refusal(format!(
                "this is node {}, not node {node}: the address given for node {node} reaches \
                 another node",
                self.node
            ))));
        }
        match self.cluster() {
            Some(own) if own == cluster => return Ok(Ok(())),
            Some(own) if holds_data => {
                return Ok(Err(Refusal(format!(
                    "node {} belongs to cluster {own} and holds its data; start it on an empty \
                     directory to add it to cluster {cluster}",
                    self.node
                ))));
            }
            None if holds_data => {
                return Ok(Err(Refusal(format!(
                    "node {} holds the data of another cluster; start it on an empty directory \
                     to add it to cluster {cluster}",
                    self.node
                ))));
            }
            // Joined before (an `init` that failed, a learner that was
            // removed) but given nothing: it may join again.
            _ => {}
        }
        self.record(cluster)?;
        Ok(Ok(()))
    }

    /// Checks a Raft RPC's headers (`cluster`, `target`) against this
    /// node; `holds_data` says whether the node holds any log entry or
    /// snapshot. A node written by an older version (data, no recorded
    /// cluster) admits RPCs from any cluster.
    ///
    /// # Errors
    ///
    /// The refusal, when the RPC must be refused.
    pub fn admit(
        &self,
        cluster: Option<&str>,
        target: Option<&str>,
        holds_data: bool,
    ) -> std::result::Result<(), Refusal> {
        if let Some(target) = target {
            let for_us = target.trim().parse::<NodeId>().ok() == Some(self.node);
            if !for_us {
                return Err(Refusal(format!(
                    "this is node {}, not node {}: the cluster's address for node {} reaches \
                     another node",
                    self.node,
                    target.trim(),
                    target.trim()
                )));
            }
        }
        let Some(cluster) = cluster else {
            // A peer that names no cluster: one of an older version, or of
            // a cluster initialised before identities were recorded.
            return Ok(());
        };
        let Some(cluster) = ClusterId::parse(cluster) else {
            return Err(Refusal(format!(
                "the {CLUSTER_HEADER} header is not 32 hex digits"
            )));
        };
        match self.cluster() {
            Some(own) if own == cluster => Ok(()),
            Some(own) => Err(Refusal(format!(
                "node {} belongs to cluster {own}, not to cluster {cluster}: it was started on \
                 another cluster's directory, or at an address of that cluster",
                self.node
            ))),
            None if holds_data => Ok(()),
            None => Err(Refusal(format!(
                "node {} holds no data and was never joined to cluster {cluster}: if its data \
                 was lost, remove node {} from the cluster (/cluster/change-membership) and add \
                 it again (/cluster/add-learner)",
                self.node, self.node
            ))),
        }
    }
}

/// The bytes of the identity file (see `FORMAT.md`, "Node identity").
fn encode(cluster: ClusterId, node: NodeId, keys: Option<&SharedKeys>) -> Result<Vec<u8>> {
    let mut body = Vec::with_capacity(BODY_BYTES);
    body.extend_from_slice(&cluster.0);
    body.extend_from_slice(&node.to_le_bytes());
    let mut out = Vec::with_capacity(8 + SEAL_BYTES + BODY_BYTES + 4);
    match keys {
        None => {
            out.extend_from_slice(PLAIN_MAGIC);
            out.extend_from_slice(&body);
        }
        Some(keys) => {
            let seal = keys
                .cipher()
                .seal(SEAL_CONTEXT, &mut body)
                .map_err(|e| Error::io("sealing the node identity", e))?;
            out.extend_from_slice(SEALED_MAGIC);
            out.extend_from_slice(&seal.to_bytes());
            out.extend_from_slice(&body);
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads the identity file's bytes: the cluster id, the node id and, if
/// it is sealed, the key id it was sealed with.
fn decode(
    bytes: &[u8],
    keys: Option<&SharedKeys>,
    what: &str,
) -> Result<(ClusterId, NodeId, Option<KeyId>)> {
    let corrupt = |detail: &str| Error::Corrupt {
        what: what.to_string(),
        detail: detail.to_string(),
    };
    let Some((content, crc)) = bytes.len().checked_sub(4).map(|at| bytes.split_at(at)) else {
        return Err(corrupt("cut short"));
    };
    if crc32fast::hash(content) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(corrupt("checksum mismatch"));
    }
    let (magic, rest) = content.split_at(8.min(content.len()));
    let (body, sealed_with) = if magic == PLAIN_MAGIC && rest.len() == BODY_BYTES {
        (rest.to_vec(), None)
    } else if magic == SEALED_MAGIC && rest.len() == SEAL_BYTES + BODY_BYTES {
        let Some(keys) = keys else {
            return Err(Error::Key(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{what} is encrypted and no key was given"),
            )));
        };
        let seal = Seal::from_bytes(rest[..SEAL_BYTES].try_into().expect("a seal"));
        let mut body = rest[SEAL_BYTES..].to_vec();
        keys.cipher()
            .open(&seal, SEAL_CONTEXT, &mut body)
            .map_err(|e| crate::encryption::classify(what, e.into()))?;
        (body, Some(seal.key_id))
    } else {
        return Err(corrupt("not a node identity file"));
    };
    let cluster = ClusterId(body[..16].try_into().expect("16 bytes"));
    let node = NodeId::from_le_bytes(body[16..].try_into().expect("8 bytes"));
    Ok((cluster, node, sealed_with))
}

#[cfg(test)]
mod tests {
    use super::*;
    use okaywal::encryption::StaticKey;
    use okaywal::fs::MemoryFileSystem;

    fn load(
        fs: &Arc<MemoryFileSystem>,
        keys: Option<SharedKeys>,
        node: NodeId,
    ) -> Result<Identity> {
        fs.create_dir_all(Path::new("/node")).unwrap();
        Identity::load(fs.clone(), Path::new("/node"), keys, node)
    }

    #[test]
    fn a_recorded_identity_survives_a_restart_and_refuses_another_id() {
        let fs = Arc::new(MemoryFileSystem::new());
        let identity = load(&fs, None, 2).unwrap();
        assert_eq!(identity.cluster(), None);
        let cluster = identity.for_init(false).unwrap();
        let again = load(&fs, None, 2).unwrap();
        assert_eq!(again.cluster(), Some(cluster));
        let error = load(&fs, None, 3).unwrap_err().to_string();
        assert!(error.contains("belongs to node 2"), "{error}");
        assert!(error.contains("--id 2"), "{error}");
    }

    #[test]
    fn a_sealed_identity_needs_its_key_and_hides_the_cluster_id() {
        let fs = Arc::new(MemoryFileSystem::new());
        let keys = SharedKeys::new(StaticKey::new([4; 32]));
        let identity = load(&fs, Some(keys.clone()), 1).unwrap();
        let cluster = identity.for_init(false).unwrap();
        let bytes = read_all(&*fs, &Path::new("/node").join(IDENTITY_FILE)).unwrap();
        assert!(!bytes.windows(16).any(|w| w == cluster.0));
        assert_eq!(load(&fs, Some(keys), 1).unwrap().cluster(), Some(cluster));
        assert!(matches!(load(&fs, None, 1), Err(Error::Key(_))));
        let wrong = SharedKeys::new(StaticKey::new([5; 32]));
        assert!(load(&fs, Some(wrong), 1).is_err());
    }

    #[test]
    fn a_sealed_identity_moves_to_the_current_key_so_the_old_one_can_be_retired() {
        use okaywal::encryption::{Key, KeyProvider};
        /// Key 1, then key 2 as the current one; `old` says whether key 1
        /// is still given.
        struct Ring {
            current: u32,
            old: bool,
        }
        impl KeyProvider for Ring {
            fn current(&self) -> io::Result<(KeyId, Key)> {
                let id = KeyId::new(self.current);
                Ok((id, self.key(id)?.expect("the current key")))
            }
            fn key(&self, id: KeyId) -> io::Result<Option<Key>> {
                Ok(match id.get() {
                    1 if self.old => Some(Key::from_bytes([1; 32])),
                    2 => Some(Key::from_bytes([2; 32])),
                    _ => None,
                })
            }
        }
        let fs = Arc::new(MemoryFileSystem::new());
        let first = SharedKeys::new(Ring {
            current: 1,
            old: true,
        });
        let cluster = load(&fs, Some(first), 1).unwrap().for_init(false).unwrap();
        let rotated = SharedKeys::new(Ring {
            current: 2,
            old: true,
        });
        assert_eq!(
            load(&fs, Some(rotated), 1).unwrap().cluster(),
            Some(cluster)
        );
        let retired = SharedKeys::new(Ring {
            current: 2,
            old: false,
        });
        assert_eq!(
            load(&fs, Some(retired), 1).unwrap().cluster(),
            Some(cluster)
        );
    }

    #[test]
    fn a_damaged_identity_file_is_corrupt() {
        let fs = Arc::new(MemoryFileSystem::new());
        load(&fs, None, 1).unwrap().for_init(false).unwrap();
        let path = Path::new("/node").join(IDENTITY_FILE);
        let mut bytes = read_all(&*fs, &path).unwrap();
        bytes[10] ^= 1;
        write_durably(&*fs, Path::new("/node"), IDENTITY_FILE, &bytes).unwrap();
        assert!(matches!(load(&fs, None, 1), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn rpcs_are_admitted_only_from_the_nodes_cluster_and_for_its_id() {
        let fs = Arc::new(MemoryFileSystem::new());
        let identity = load(&fs, None, 1).unwrap();
        let other = ClusterId::random().unwrap().to_string();
        // Fresh and never joined: refused, and nothing recorded.
        let refusal = identity.admit(Some(&other), Some("1"), false).unwrap_err();
        assert!(refusal.0.contains("never joined"), "{refusal}");
        assert_eq!(identity.cluster(), None);
        // No cluster named (an older peer): admitted.
        assert!(identity.admit(None, Some("1"), false).is_ok());
        // Another node's id: refused.
        let refusal = identity.admit(None, Some("2"), false).unwrap_err();
        assert!(refusal.0.contains("not node 2"), "{refusal}");

        let own = identity.for_init(false).unwrap().to_string();
        assert!(identity.admit(Some(&own), Some("1"), true).is_ok());
        let refusal = identity.admit(Some(&other), Some("1"), true).unwrap_err();
        assert!(refusal.0.contains("belongs to cluster"), "{refusal}");
        assert!(identity.admit(Some("xyz"), Some("1"), true).is_err());
    }

    #[test]
    fn a_node_with_data_from_an_older_version_admits_any_cluster_and_records_none() {
        let fs = Arc::new(MemoryFileSystem::new());
        let identity = load(&fs, None, 1).unwrap();
        for _ in 0..2 {
            let cluster = ClusterId::random().unwrap();
            assert!(identity
                .admit(Some(&cluster.to_string()), Some("1"), true)
                .is_ok());
        }
        assert_eq!(identity.cluster(), None);
        assert_eq!(load(&fs, None, 1).unwrap().cluster(), None);
        assert!(!fs.exists(&Path::new("/node").join(IDENTITY_FILE)).unwrap());
    }

    #[test]
    fn joins_are_refused_for_another_id_or_another_clusters_data() {
        let fs = Arc::new(MemoryFileSystem::new());
        let identity = load(&fs, None, 2).unwrap();
        let (a, b) = (ClusterId::random().unwrap(), ClusterId::random().unwrap());
        assert!(identity.join(a, 3, false).unwrap().is_err());
        assert!(identity.join(a, 2, false).unwrap().is_ok());
        assert!(identity.join(a, 2, true).unwrap().is_ok());
        // Joined but given nothing yet: may join another cluster.
        assert!(identity.join(b, 2, false).unwrap().is_ok());
        assert_eq!(identity.cluster(), Some(b));
        // Holding cluster b's data: refused.
        let refusal = identity.join(a, 2, true).unwrap().unwrap_err();
        assert!(refusal.0.contains("holds its data"), "{refusal}");
        let fresh = load(&Arc::new(MemoryFileSystem::new()), None, 2).unwrap();
        assert!(fresh.join(a, 2, true).unwrap().is_err());
    }
}
