//! The image store against a real registry (Debian's `docker-registry` on loopback, filled by
//! `skopeo` from the project's OCI layout): pulls, index resolution, shared downloads, basic
//! auth, corrupted and truncated blobs, hostile layers, OCI-layout import and GC.
//!
//! Runs on the host (no VM): `cargo test -p qemu-tests --test registry`.

use std::path::Path;
use std::sync::Arc;

use qemu_tests::registry::{HOSTILE, TestRegistry, write_test_images};
use runtime::image::http::Client;
use runtime::image::registry::{Credentials, host_architecture};
use runtime::image::store::{ImageStore, PullOptions};

fn layout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write_test_images(dir.path(), &["amd64", "arm64"]).expect("test images");
    dir
}

fn store(dir: &Path) -> ImageStore {
    ImageStore::open(dir, Client::new(b"").expect("client"), vec![]).expect("store")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn pulls_an_index_for_each_platform_and_shares_downloads() {
    let reg = TestRegistry::start(None).expect("registry");
    let oci = layout();
    reg.push(oci.path(), "busybox:1", "busybox:1", None)
        .expect("push");
    let r = format!("{}/busybox:1", reg.host());

    let root = tempfile::tempdir().expect("tempdir");
    let s = Arc::new(store(root.path()));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (s, r) = (s.clone(), r.clone());
            std::thread::spawn(move || s.pull(&r, &PullOptions::default()))
        })
        .collect();
    let recs: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("thread").expect("pull"))
        .collect();
    assert!(
        recs.iter().all(|x| x == &recs[0]),
        "every concurrent pull got the same image"
    );
    assert_eq!(
        s.downloads(),
        1,
        "four concurrent pulls of a one-layer image downloaded it once"
    );
    let rec = &recs[0];
    assert_eq!(rec.reference, r);
    assert_eq!(rec.architecture, host_architecture());
    assert_eq!(rec.config.cmd, vec!["sh"]);
    let lower = s.lower_dirs(rec);
    assert_eq!(lower.len(), 1);
    let want = std::fs::read(qemu_tests::registry::busybox_for(host_architecture()).expect("busybox"))
        .expect("read");
    assert_eq!(
        std::fs::read(lower[0].join("bin/busybox")).expect("layer file"),
        want
    );
    assert_eq!(
        std::fs::read_link(lower[0].join("bin/sh")).expect("applet"),
        Path::new("busybox")
    );
    assert_eq!(s.get(&r).expect("get").as_ref(), Some(rec));
    // Pulling again downloads nothing.
    s.pull(&r, &PullOptions::default()).expect("second pull");
    assert_eq!(s.downloads(), 1);

    // The other platform of the same index.
    let other = if host_architecture() == "amd64" {
        "arm64"
    } else {
        "amd64"
    };
    let root2 = tempfile::tempdir().expect("tempdir");
    let s2 = store(root2.path()).with_architecture(other);
    let rec2 = s2.pull(&r, &PullOptions::default()).expect("pull other arch");
    assert_eq!(rec2.architecture, other);
    assert_ne!(rec2.manifest_digest, rec.manifest_digest);
    let want = std::fs::read(qemu_tests::registry::busybox_for(other).expect("busybox")).expect("read");
    assert_eq!(
        std::fs::read(s2.lower_dirs(&rec2)[0].join("bin/busybox")).expect("file"),
        want
    );

    // Unknown tag and repository: the registry's 404 comes back as a clear error.
    let err = s
        .pull(&format!("{}/busybox:nope", reg.host()), &PullOptions::default())
        .expect_err("404");
    assert!(err.to_string().contains("HTTP 404"), "{err}");
    let err = s
        .pull("Not A Reference", &PullOptions::default())
        .expect_err("bad ref");
    assert!(err.to_string().contains("invalid image reference"), "{err}");
}

#[test]
fn refuses_corrupted_and_truncated_blobs_and_keeps_nothing() {
    let reg = TestRegistry::start(None).expect("registry");
    let oci = layout();
    reg.push(oci.path(), "layered:1", "corrupt:1", None)
        .expect("push");
    reg.push(oci.path(), "layered:1", "truncated:1", None)
        .expect("push");
    let root = tempfile::tempdir().expect("tempdir");
    let s = store(root.path());
    // Find the layers through a good pull into another store, then damage the registry's copy.
    let probe_root = tempfile::tempdir().expect("tempdir");
    let rec = store(probe_root.path())
        .pull(&format!("{}/corrupt:1", reg.host()), &PullOptions::default())
        .expect("pull");
    let top = rec.layers.last().expect("layers").clone();
    let path = reg.blob_path(&top);
    let mut bytes = std::fs::read(&path).expect("blob");
    let good = bytes.clone();
    let n = bytes.len();
    bytes[n / 2] ^= 0xff;
    std::fs::write(&path, &bytes).expect("corrupt");
    let err = s
        .pull(&format!("{}/corrupt:1", reg.host()), &PullOptions::default())
        .expect_err("corrupted");
    assert!(err.to_string().contains("digest mismatch"), "{err}");
    std::fs::write(&path, &good[..n - 10]).expect("truncate");
    let err = s
        .pull(&format!("{}/truncated:1", reg.host()), &PullOptions::default())
        .expect_err("truncated");
    assert!(err.to_string().contains("size mismatch"), "{err}");
    assert!(s.list().expect("list").is_empty(), "no image recorded");
    assert!(!s.layer_dir(&top).exists(), "no damaged layer kept");
    assert_eq!(names(s.tmp_dir()), Vec::<String>::new(), "no partial files left");
}

#[test]
fn refuses_every_hostile_layer_and_writes_nothing_outside() {
    let reg = TestRegistry::start(None).expect("registry");
    let oci = layout();
    let root = tempfile::tempdir().expect("tempdir");
    let s = store(root.path());
    let want = [
        ("dotdot", "path contains '..'"),
        ("absolute", "absolute path"),
        ("symlink-escape", "goes through the symlink \"evil\""),
        ("hardlink-escape", "hard link target"),
        ("device-node", "device nodes are not allowed"),
    ];
    assert_eq!(want.len(), HOSTILE.len());
    for (case, msg) in want {
        reg.push(
            oci.path(),
            &format!("hostile/{case}:1"),
            &format!("hostile/{case}:1"),
            None,
        )
        .expect("push");
        let err = s
            .pull(
                &format!("{}/hostile/{case}:1", reg.host()),
                &PullOptions::default(),
            )
            .expect_err(case);
        assert!(err.to_string().contains(msg), "{case}: {err}");
        assert!(
            s.get(&format!("{}/hostile/{case}:1", reg.host()))
                .expect("get")
                .is_none(),
            "{case}"
        );
    }
    // Only the shared busybox base layer was kept; nothing half-written, nothing escaped.
    assert_eq!(names(&root.path().join("layers")).len(), 1);
    assert_eq!(names(s.tmp_dir()), Vec::<String>::new());
    assert!(!Path::new("/tmp/escaped").exists());
    assert!(!root.path().join("escaped").exists());
}

#[test]
fn basic_auth_is_required_and_checked() {
    let hash = std::process::Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            "import crypt; print(crypt.crypt('s3cret', crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))",
        ])
        .output()
        .expect("python3 crypt");
    let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    assert!(hash.starts_with("$2b$"), "bcrypt hash: {hash:?}");
    let reg = TestRegistry::start(Some(&format!("tester:{hash}"))).expect("registry");
    let oci = layout();
    reg.push(
        oci.path(),
        "busybox:1",
        "private/busybox:1",
        Some("tester:s3cret"),
    )
    .expect("push");
    let r = format!("{}/private/busybox:1", reg.host());
    let root = tempfile::tempdir().expect("tempdir");
    let s = store(root.path());
    let err = s.pull(&r, &PullOptions::default()).expect_err("anonymous");
    assert!(err.to_string().contains("wants a username and password"), "{err}");
    let wrong = PullOptions {
        credentials: Some(Credentials {
            username: "tester".into(),
            password: "nope".into(),
        }),
    };
    let err = s.pull(&r, &wrong).expect_err("wrong password");
    assert!(err.to_string().contains("credentials rejected"), "{err}");
    let right = PullOptions {
        credentials: Some(Credentials {
            username: "tester".into(),
            password: "s3cret".into(),
        }),
    };
    let rec = s.pull(&r, &right).expect("authenticated pull");
    assert_eq!(rec.layers.len(), 1);
}

#[test]
fn imports_layouts_and_collects_garbage() {
    let oci = tempfile::tempdir().expect("tempdir");
    {
        use runtime::image::layout::{LayoutWriter, busybox_layer};
        let bb = std::fs::read(qemu_tests::registry::busybox_for(host_architecture()).expect("busybox"))
            .expect("read");
        let mut w = LayoutWriter::new(oci.path()).expect("layout");
        let l = busybox_layer(&bb).expect("layer");
        let d = w
            .image(host_architecture(), &[l], &Default::default())
            .expect("image");
        w.tag("airgap/busybox:1", &d);
        w.tag("airgap/busybox:2", &d);
        w.finish().expect("finish");
    }
    let root = tempfile::tempdir().expect("tempdir");
    let s = store(root.path());
    let recs = s.import_layout(oci.path()).expect("import dir");
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].reference, "docker.io/airgap/busybox:1");
    // The same layout as a tar archive.
    let tarball = root.path().join("../layout.tar");
    let status = std::process::Command::new("tar")
        .args(["-C"])
        .arg(oci.path())
        .args(["-cf"])
        .arg(&tarball)
        .arg(".")
        .status()
        .expect("tar");
    assert!(status.success());
    let root2 = tempfile::tempdir().expect("tempdir");
    let s2 = store(root2.path());
    assert_eq!(s2.import_layout(&tarball).expect("import tar").len(), 2);
    let _ = std::fs::remove_file(&tarball);
    // A layout whose blob was tampered with is refused.
    let bad = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", oci.path().display()))
        .arg(bad.path())
        .status()
        .expect("cp");
    assert!(status.success());
    for e in std::fs::read_dir(bad.path().join("blobs/sha256"))
        .expect("blobs")
        .flatten()
    {
        if std::fs::metadata(e.path()).expect("meta").len() > 100_000 {
            std::fs::write(e.path(), b"tampered").expect("tamper");
        }
    }
    let root3 = tempfile::tempdir().expect("tempdir");
    let err = store(root3.path())
        .import_layout(bad.path())
        .expect_err("tampered");
    assert!(
        err.to_string().contains("size mismatch") || err.to_string().contains("digest mismatch"),
        "{err}"
    );

    // GC: keeping tag 2 keeps the shared layer; keeping nothing removes everything.
    assert_eq!(
        s.gc(&["airgap/busybox:2"]).expect("gc"),
        vec!["docker.io/airgap/busybox:1".to_string()]
    );
    assert_eq!(names(&root.path().join("layers")).len(), 1);
    assert_eq!(
        s.gc(&[]).expect("gc"),
        vec!["docker.io/airgap/busybox:2".to_string()]
    );
    assert!(names(&root.path().join("layers")).is_empty());
    assert!(names(&root.path().join("blobs/sha256")).is_empty());
}
