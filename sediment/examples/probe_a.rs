use std::time::Instant;
fn main() {
    let dir = tempfile::tempdir_in("/work/main/target/probe").unwrap();
    let db = sediment::Database::recover(dir.path()).unwrap();
    let n = 2000;
    let start = Instant::now();
    for i in 0..n {
        let mut tx = db.begin_transaction().unwrap();
        tx.write(&(i as u128).to_le_bytes()).unwrap();
        tx.commit().unwrap();
    }
    let el = start.elapsed();
    println!("{} tx/s", n as f64 / el.as_secs_f64());
    db.shutdown().unwrap();
}
