//! openraft's storage conformance suite against the okaywal log store and
//! the sediment state machine, each test on fresh real directories.

use openraft::testing::{StoreBuilder, Suite};
use sediment_raft::types::{StorageError, TypeConfig};
use sediment_raft::{LogStore, StateMachine};
use tempfile::TempDir;

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for OnDisk {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = LogStore::open(dir.path().join("log")).expect("opening the log store");
        let sm = StateMachine::open(dir.path().join("state")).expect("opening the state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(OnDisk).expect("the storage suite passes");
}
