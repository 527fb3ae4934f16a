//! Runs every fuzz target over its committed seed corpus.

use std::path::PathBuf;

#[test]
fn seed_corpus_passes_every_target() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut total = 0;
    for target in fuzzing::TARGETS {
        let dir = root.join(target);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no seeds for {target}");
        for file in &files {
            let data = std::fs::read(file).unwrap();
            let outcome = std::panic::catch_unwind(|| fuzzing::run(target, &data));
            assert!(
                outcome.is_ok(),
                "{target} failed on seed {}",
                file.display()
            );
        }
        println!("{target}: {} seeds", files.len());
        total += files.len();
    }
    println!("{total} seeds in all");
}
