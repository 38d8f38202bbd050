//! `store-stress DIR CLIENTS`: writes to the embedded store from CLIENTS concurrent tasks until
//! killed, printing `ack <key> <revision>` (flushed) for every acknowledged write. The crash test
//! kills it with SIGKILL and checks every acknowledged key survived.

use std::io::Write as _;
use std::sync::Arc;

use controlplane::storage::embedded::{EmbeddedConfig, EmbeddedStore};
use controlplane::storage::{Store, Write};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: store-stress DIR CLIENTS")?;
    let clients: usize = args.next().unwrap_or_else(|| "16".into()).parse()?;
    let mut cfg = EmbeddedConfig::new(dir);
    // Small threshold so compaction also runs during the storm.
    cfg.compact_log_bytes = 256 << 10;
    let store = Arc::new(EmbeddedStore::open(cfg)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let store = store.clone();
            let out = out.clone();
            tasks.push(tokio::spawn(async move {
                let pid = std::process::id();
                for i in 0u64.. {
                    let key = format!("/stress/{pid}/{c}/{i}");
                    let value = format!("{{\"client\":{c},\"i\":{i},\"pad\":\"{}\"}}", "x".repeat(200))
                        .into_bytes()
                        .into();
                    match store
                        .write(Write::Create {
                            key: key.clone(),
                            value,
                        })
                        .await
                    {
                        Ok(ev) => {
                            if let Ok(mut o) = out.lock() {
                                let _ = writeln!(o, "ack {key} {}", ev.kv.mod_revision);
                                let _ = o.flush();
                            }
                        }
                        Err(e) => {
                            eprintln!("write failed: {e}");
                            return;
                        }
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
    Ok(())
}
