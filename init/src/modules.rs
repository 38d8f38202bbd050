//! Loads the kernel modules the image builder selected. The builder computed the dependency
//! closure and the load order from the modules' own `depends=` data and wrote it to
//! [`LOAD_LIST`], one path per line, dependencies first; no depmod runs on the node.
//!
//! Modules above the `# background` line (machine config, network, power button) load before
//! boot goes on; the rest are opened at once (the files vanish with the initramfs) and load on a
//! background thread while boot continues. When they are all in, `init: modules done` is logged
//! and [`DONE_MARKER`] is written so the agent can wait for them.

use std::fs::File;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::sys;

/// The load order written by the image builder.
pub const LOAD_LIST: &str = "/lib/modules/load.list";
/// Written once every module of the list has been tried.
pub const DONE_MARKER: &str = "/run/nodeos/modules.done";
const BACKGROUND: &str = "# background";

/// What happened to a set of modules.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LoadReport {
    pub loaded: usize,
    pub already: usize,
    pub failed: usize,
    pub millis: u128,
}

/// The list split at the `# background` line: (boot-critical, background).
pub fn split_list(text: &str) -> (Vec<String>, Vec<String>) {
    let (mut early, mut late) = (Vec::new(), Vec::new());
    let mut in_late = false;
    for line in text.lines().map(str::trim) {
        if line == BACKGROUND {
            in_late = true;
        } else if !line.is_empty() && !line.starts_with('#') {
            if in_late { &mut late } else { &mut early }.push(line.to_string());
        }
    }
    (early, late)
}

fn load_files(files: Vec<(String, std::io::Result<File>)>) -> LoadReport {
    let t0 = Instant::now();
    let mut report = LoadReport::default();
    for (path, file) in files {
        let compressed = path.ends_with(".xz") || path.ends_with(".zst");
        match file.and_then(|f| sys::finit_module(&f, compressed)) {
            Ok(()) => report.loaded += 1,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => report.already += 1,
            Err(e) => {
                report.failed += 1;
                tracing::warn!(module = %path, error = %e, "module failed to load");
            }
        }
    }
    report.millis = t0.elapsed().as_millis();
    report
}

/// Loads the boot-critical modules now and starts the background loader for the rest.
pub fn load(list: &Path) -> (LoadReport, Option<JoinHandle<()>>) {
    let text = match std::fs::read_to_string(list) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(list = %list.display(), error = %e, "no module list; loading no modules");
            return (LoadReport::default(), None);
        }
    };
    let (early, late) = split_list(&text);
    let open = |paths: Vec<String>| {
        paths
            .into_iter()
            .map(|p| {
                let f = File::open(&p);
                (p, f)
            })
            .collect::<Vec<_>>()
    };
    let early = load_files(open(early));
    let late = open(late);
    let handle = std::thread::Builder::new().name("modules".into()).spawn(move || {
        if let Err(e) = sys::make_thread_idle() {
            tracing::debug!(error = %e, "cannot lower the module loader's priority");
        }
        let r = load_files(late);
        tracing::info!(
            loaded = r.loaded,
            builtin_or_loaded = r.already,
            failed = r.failed,
            ms = r.millis as u64,
            "modules done"
        );
        let marker = Path::new(DONE_MARKER);
        if let Some(dir) = marker.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let _ = std::fs::write(marker, format!("loaded={} failed={}\n", r.loaded, r.failed));
    });
    match handle {
        Ok(h) => (early, Some(h)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the background module loader");
            (early, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_splits_at_marker() {
        let (e, l) = split_list("/a.ko\n/b.ko\n# background\n/c.ko\n\n/d.ko\n");
        assert_eq!(e, ["/a.ko", "/b.ko"]);
        assert_eq!(l, ["/c.ko", "/d.ko"]);
        let (e, l) = split_list("/a.ko\n");
        assert_eq!((e.len(), l.len()), (1, 0));
    }
}
