//! Hostile input through the real kubectl (issue 13, item 3): a JSON patch bomb and an object
//! over etcd's 1.5 MiB limit are refused with a 4xx and change nothing, on whichever store the
//! suite runs on.

use std::path::Path;

use controlplane::process::TestCluster;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_controlplane"))
}

#[test]
fn patch_bombs_and_oversized_objects_are_refused_and_change_nothing() {
    let c = TestCluster::start(bin(), &["--no-scheduler", "--no-controllers"], &[]);
    c.kubectl(&["create", "configmap", "cm", "--from-literal=a=1"]);
    let rv = c.jsonpath(&["cm", "cm"], "{.metadata.resourceVersion}");

    // Doubling copies: 24 of them would turn 1 KiB into 16 GiB.
    let mut ops = vec![format!(
        r#"{{"op":"add","path":"/data/seed","value":"{}"}}"#,
        "x".repeat(1024)
    )];
    ops.push(r#"{"op":"add","path":"/metadata/annotations","value":{"a":"x"}}"#.into());
    for i in 0..24 {
        ops.push(format!(
            r#"{{"op":"copy","from":"/metadata/annotations","path":"/metadata/annotations/b{i}"}}"#
        ));
    }
    let bomb = format!("[{}]", ops.join(","));
    let (ok, _, err) = c.kubectl_result(&["patch", "cm", "cm", "--type=json", "-p", &bomb], None);
    assert!(!ok);
    assert!(
        err.contains("Unable to complete the copy, the accumulated size increase of copy is")
            && err.contains("exceeding the limit 3145728"),
        "{err}"
    );
    assert_eq!(c.jsonpath(&["cm", "cm"], "{.metadata.resourceVersion}"), rv);

    // 1.6 MB fits the request limit (3 MiB) but not the store's: refused before it is written.
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("big");
    std::fs::write(&big, "y".repeat(1_600_000)).expect("write");
    let from_file = format!("--from-file={}", big.display());
    let (ok, _, err) = c.kubectl_result(&["create", "configmap", "big", &from_file], None);
    assert!(!ok);
    assert!(err.contains("etcdserver: request is too large"), "{err}");
    let (found, _, _) = c.kubectl_result(&["get", "cm", "big"], None);
    assert!(!found, "nothing was created");
    // The same growth through a patch of an existing object is refused too.
    let grow = format!(
        r#"[{{"op":"add","path":"/data/big","value":"{}"}}]"#,
        "z".repeat(1_600_000)
    );
    let patch_file = dir.path().join("grow.json");
    std::fs::write(&patch_file, grow).expect("write");
    let patch_arg = format!("--patch-file={}", patch_file.display());
    let (ok, _, err) = c.kubectl_result(&["patch", "cm", "cm", "--type=json", &patch_arg], None);
    assert!(!ok);
    assert!(err.contains("etcdserver: request is too large"), "{err}");
    assert_eq!(c.jsonpath(&["cm", "cm"], "{.metadata.resourceVersion}"), rv);
}

/// 2,000 connections that never send a byte do not keep a normal client out: they wait in their
/// handshake (dropped after 10 s) while kubectl gets its answers.
#[test]
fn idle_connections_do_not_stop_a_normal_client() {
    controlplane::rlimit::raise_open_files_limit();
    let c = TestCluster::start(bin(), &["--no-scheduler", "--no-controllers"], &[]);
    let addr = c.server.as_ref().expect("server").addr();
    let idle: Vec<std::net::TcpStream> = (0..2000)
        .map(|_| std::net::TcpStream::connect(&addr).expect("connect"))
        .collect();
    // A client that would have to wait out the idle connections' 10 s handshake timeout fails
    // its own 5 s request timeout.
    let (ok, out, err) = c.kubectl_result(&["get", "namespaces", "-o", "name", "--request-timeout=5s"], None);
    assert!(ok && out.contains("namespace/default"), "{out}{err}");
    drop(idle);
}

/// A watcher that stops reading is dropped once it holds its budget (16 MiB) for 10 s, instead
/// of the server keeping every event for it: kubectl, its output unread while 60 ConfigMaps of
/// 900 kB are created, sees its watch end before the last of them.
#[test]
fn a_watcher_that_stops_reading_is_dropped() {
    use std::io::Read;
    let c = TestCluster::start(bin(), &["--no-scheduler", "--no-controllers"], &[]);
    c.kubectl(&["create", "configmap", "marker", "--from-literal=a=1"]);
    let mut watch = std::process::Command::new("kubectl")
        .env("KUBECONFIG", c.kubeconfig())
        .args(["get", "configmaps", "--watch", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl");
    let mut out = watch.stdout.take().expect("stdout");
    // Read until the watch has delivered the marker, then stop reading.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"marker\"") {
        let n = out.read(&mut buf).expect("read");
        assert!(n > 0, "kubectl ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let value = "v".repeat(900_000);
    let items: Vec<String> = (0..60)
        .map(|i| {
            format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"big-{i}"}},"data":{{"v":"{value}"}}}}"#)
        })
        .collect();
    let list = dir.path().join("list.json");
    std::fs::write(
        &list,
        format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
            items.join(",")
        ),
    )
    .expect("write");
    c.kubectl(&["create", "-f", &list.display().to_string()]);
    // Over budget for longer than the patience: the server drops the watch.
    std::thread::sleep(std::time::Duration::from_secs(25));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        let _ = done_tx.send(rest);
    });
    let rest = done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the watch never ended: the server kept the events of a client that did not read");
    let _ = watch.kill();
    let _ = watch.wait();
    let text = String::from_utf8_lossy(&rest);
    let delivered = (0..60)
        .filter(|i| text.contains(&format!("\"name\": \"big-{i}\"")))
        .count();
    assert!(
        delivered < 60,
        "all 60 events were delivered to a client that stopped reading"
    );
    // Everyone else is served as before.
    let names = c.kubectl(&["get", "configmaps", "-o", "name"]);
    assert_eq!(
        names.lines().filter(|l| l.starts_with("configmap/big-")).count(),
        60
    );
}
