//! Crash safety of the embedded store: a write storm is killed with SIGKILL (three times, on the
//! same directory); after each restart every acknowledged write is present with its revision.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use controlplane::storage::Store;
use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};

fn storm(dir: &std::path::Path, run_for: Duration) -> HashMap<String, i64> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_store-stress"))
        .arg(dir)
        .arg("16")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start store-stress");
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut acked = HashMap::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut parts = line.split_whitespace();
            if let (Some("ack"), Some(k), Some(r)) = (parts.next(), parts.next(), parts.next()) {
                acked.insert(k.to_string(), r.parse::<i64>().expect("revision"));
            }
        }
        acked
    });
    let t0 = Instant::now();
    while t0.elapsed() < run_for {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGKILL: no chance to flush anything.
    child.kill().expect("kill");
    let _ = child.wait();
    reader.join().expect("reader")
}

#[test]
fn every_acknowledged_write_survives_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut all: HashMap<String, i64> = HashMap::new();
    for round in 0..3 {
        let acked = storm(dir.path(), Duration::from_millis(1500));
        assert!(
            acked.len() > 100,
            "round {round}: only {} writes acknowledged",
            acked.len()
        );
        all.extend(acked);
        let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path())).expect("reopen after kill -9");
        rt.block_on(async {
            let present = store.list("/stress/", None, 0).await.expect("list");
            let by_key: HashMap<&str, i64> = present
                .items
                .iter()
                .map(|kv| (kv.key.as_str(), kv.mod_revision))
                .collect();
            let missing: Vec<&String> = all.keys().filter(|k| !by_key.contains_key(k.as_str())).collect();
            assert!(
                missing.is_empty(),
                "round {round}: {} acknowledged writes lost, e.g. {:?}",
                missing.len(),
                missing.first()
            );
            for (k, rev) in &all {
                assert_eq!(
                    by_key.get(k.as_str()),
                    Some(rev),
                    "round {round}: {k} has the wrong revision"
                );
            }
            let max = all.values().max().copied().unwrap_or(0);
            assert!(store.revision().await.expect("revision") >= max);
        });
        store.close();
    }
}
