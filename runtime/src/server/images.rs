//! Images: `PullImage`, `ImageStatus`, `ListImages`, `RemoveImage` over the node's store.
//!
//! A pull takes seconds to minutes of network and disk, and the runtime's loop must keep
//! answering meanwhile, without a thread (fork safety, see the module doc of `server`). So each
//! pull runs in a forked child of the runtime process: it opens the store for itself (its own
//! scratch directory), pulls, writes its reply as one JSON line into a pipe and `_exit`s. The
//! loop reads the pipe and reaps the child through its pidfd; pulls of one reference share one
//! child. The store is safe for concurrent processes (everything is renamed into place once
//! verified); the forked child holds copies of the runtime's descriptors for its lifetime, which
//! is harmless as nothing waits for their EOF (pulls complete through the pidfd).

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
#[cfg(test)]
use runtime_api::Request;
use runtime_api::{Auth, ErrorKind, Image, PullPolicy, Reply, ReplyError};

use super::Runtime;
use super::container::set_nonblocking;
use super::errors::{RuntimeError, errno_ctx, io_ctx, store_error_kind};
use crate::image::http;
use crate::image::reference::Reference;
use crate::image::registry::Credentials;
use crate::image::store::{ImageRecord, ImageStore, PullOptions};

/// A pull in progress in a child process.
pub(super) struct Pull {
    pub pid: Pid,
    pub pidfd: Option<OwnedFd>,
    /// The read end of the child's reply pipe (None at EOF).
    pub out: Option<OwnedFd>,
    buf: Vec<u8>,
    waiters: Vec<u64>,
}

/// What clients see of a stored image.
fn image_of(rec: &ImageRecord) -> Image {
    Image {
        reference: rec.reference.clone(),
        id: rec.config_digest.clone(),
        digest: rec.manifest_digest.clone(),
        size: rec.size,
    }
}

impl Runtime {
    /// `PullImage`: the reply now when the policy is satisfied by what is present, else later
    /// (`None`), when the pull child is done.
    pub(super) fn pull_image(
        &mut self,
        conn: u64,
        image: &str,
        policy: PullPolicy,
        auth: Option<Auth>,
        insecure_registries: Vec<String>,
    ) -> Result<Option<Reply>, RuntimeError> {
        let name = Reference::parse(image)
            .map_err(crate::image::store::StoreError::from)?
            .to_string();
        if policy != PullPolicy::Always
            && let Some(rec) = self.present(&name)?
        {
            return Ok(Some(Reply::Image {
                image: image_of(&rec),
            }));
        }
        if policy == PullPolicy::Never {
            return Err(RuntimeError::NotFound(format!(
                "image {name} is not present on this node"
            )));
        }
        if let Some(p) = self.pulls.get_mut(&name) {
            p.waiters.push(conn);
            return Ok(None);
        }
        let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(errno_ctx("pipe"))?;
        set_nonblocking(&out_r)?;
        let root = self.opts.image_root.clone();
        let opts = PullOptions {
            credentials: auth.map(|a| Credentials {
                username: a.username,
                password: a.password,
            }),
        };
        match crate::sys::fork().map_err(io_ctx("forking the image pull"))? {
            ForkResult::Child => {
                drop(out_r);
                pull_child(&root, &name, &opts, insecure_registries, out_w)
            }
            ForkResult::Parent { child } => {
                drop(out_w);
                let pidfd = crate::sys::pidfd_open(child.as_raw()).map_err(io_ctx("pidfd of the image pull"));
                let pidfd = match pidfd {
                    Ok(fd) => fd,
                    Err(e) => {
                        // Without a pidfd its end would go unseen: wait for it here.
                        let _ = waitpid(child, None);
                        return Err(e);
                    }
                };
                tracing::info!(image = %name, pid = child.as_raw(), "pulling");
                self.pulls.insert(
                    name,
                    Pull {
                        pid: child,
                        pidfd: Some(pidfd),
                        out: Some(out_r),
                        buf: Vec::new(),
                        waiters: vec![conn],
                    },
                );
                Ok(None)
            }
        }
    }

    /// The image if it is present with all its layers.
    fn present(&self, reference: &str) -> Result<Option<ImageRecord>, RuntimeError> {
        Ok(self
            .images
            .get(reference)?
            .filter(|rec| rec.layers.iter().all(|d| self.images.layer_dir(d).is_dir())))
    }

    pub(super) fn image_status(&self, image: &str) -> Result<Option<Image>, RuntimeError> {
        Ok(self.present(image)?.as_ref().map(image_of))
    }

    pub(super) fn list_images(&self) -> Result<Vec<Image>, RuntimeError> {
        Ok(self.images.list()?.iter().map(image_of).collect())
    }

    /// Removes an image no container uses; the layers no image or container uses go too, unless
    /// a pull is running (the layers it placed have no record yet): then at a later removal.
    pub(super) fn remove_image(&mut self, image: &str) -> Result<(), RuntimeError> {
        let Some(rec) = self.images.get(image)? else {
            return Ok(());
        };
        if let Some(c) = self
            .containers
            .values()
            .find(|c| c.rec.status.image == rec.reference)
        {
            return Err(RuntimeError::Conflict(format!(
                "image {} is in use by container {} ({})",
                rec.reference, c.rec.status.id, c.rec.status.name
            )));
        }
        self.images.remove(&rec.reference)?;
        tracing::info!(image = %rec.reference, "image removed");
        if self.pulls.is_empty() {
            let keep: Vec<String> = self.images.list()?.into_iter().map(|r| r.reference).collect();
            let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
            let in_use: Vec<String> = self
                .containers
                .values()
                .flat_map(|c| c.rec.layers.iter().cloned())
                .collect();
            self.images.gc_keeping_layers(&keep, &in_use)?;
        }
        Ok(())
    }

    /// A pull child's reply pipe is readable.
    pub(super) fn on_pull_output(&mut self, name: &str) {
        if let Some(p) = self.pulls.get_mut(name) {
            read_reply(p);
        }
    }

    /// A pull child ended: its reply (or why there is none) goes to every waiter.
    pub(super) fn on_pull_exit(&mut self, name: &str) {
        let Some(mut p) = self.pulls.remove(name) else {
            return;
        };
        read_reply(&mut p);
        let status = waitpid(p.pid, None);
        let line = p.buf.split(|b| *b == b'\n').next().unwrap_or_default();
        let reply = match serde_json::from_slice::<Reply>(line) {
            Ok(r) => r,
            Err(_) => Reply::Error(ReplyError::new(
                ErrorKind::Internal,
                format!("the image pull of {name} ended without a result ({status:?})"),
            )),
        };
        match &reply {
            Reply::Image { image } => {
                tracing::info!(image = %image.reference, digest = %image.digest, "pulled")
            }
            Reply::Error(e) => tracing::warn!(image = %name, error = %e, "pull failed"),
            _ => {}
        }
        for conn in p.waiters {
            self.outbox.push((conn, reply.clone()));
        }
    }
}

/// Reads what the child has written so far.
fn read_reply(p: &mut Pull) {
    let Some(fd) = p.out.as_ref() else { return };
    let mut buf = [0u8; 16 * 1024];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => {
                p.out = None;
                return;
            }
            Ok(n) => p.buf.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => return,
            Err(_) => {
                p.out = None;
                return;
            }
        }
    }
}

/// The forked child: pulls `reference` into the store at `root` and writes the reply.
fn pull_child(root: &Path, reference: &str, opts: &PullOptions, insecure: Vec<String>, out: OwnedFd) -> ! {
    let reply = match http::Client::with_system_roots() {
        Err(e) => Reply::Error(ReplyError::new(
            ErrorKind::Internal,
            format!("registry client: {e}"),
        )),
        Ok(client) => match ImageStore::open(root, client, insecure) {
            Err(e) => Reply::Error(ReplyError::new(store_error_kind(&e), e.to_string())),
            Ok(store) => {
                let r = store.pull(reference, opts);
                let _ = fs::remove_dir_all(store.tmp_dir());
                match r {
                    Ok(rec) => Reply::Image {
                        image: image_of(&rec),
                    },
                    Err(e) => Reply::Error(ReplyError::new(store_error_kind(&e), e.to_string())),
                }
            }
        },
    };
    let mut line = serde_json::to_vec(&reply).unwrap_or_default();
    line.push(b'\n');
    let ok = fs::File::from(out).write_all(&line).is_ok();
    crate::sys::exit_child(if ok { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use runtime_api::{ContainerStatus, State};

    use super::*;
    use crate::image::layout::{self, Entry, LayoutWriter};
    use crate::server::state::{ContainerRecord, Ctr};

    /// Imports one single-layer image under `tags`.
    pub(in crate::server) fn import(rt: &Runtime, dir: &Path, tags: &[&str]) -> ImageRecord {
        let oci = dir.join("oci");
        let mut w = LayoutWriter::new(&oci).expect("layout");
        let l = layout::layer(&[Entry::File {
            path: "hello".into(),
            mode: 0o644,
            data: b"hi".to_vec(),
        }])
        .expect("layer");
        let d = w
            .image(
                crate::image::registry::host_architecture(),
                &[l],
                &Default::default(),
            )
            .expect("image");
        for t in tags {
            w.tag(t, &d);
        }
        w.finish().expect("finish");
        rt.images.import_layout(&oci).expect("import").remove(0)
    }

    fn user_of(rt: &mut Runtime, rec: &ImageRecord) {
        let status = ContainerStatus {
            id: "c1".into(),
            sandbox_id: "s1".into(),
            name: "app".into(),
            image: rec.reference.clone(),
            state: State::Running,
            pid: None,
            created_at: String::new(),
            started_at: None,
            finished_at: None,
            exit_code: None,
            signal: None,
            reason: None,
            cgroup: "/x".into(),
            log_path: None,
        };
        rt.containers.insert(
            "c1".into(),
            Ctr {
                rec: ContainerRecord {
                    status,
                    profile: Default::default(),
                    mounted: false,
                    start_time: None,
                    layers: rec.layers.clone(),
                },
                dir: "/nonexistent".into(),
                run: None,
                kill_at: None,
                waiters: Vec::new(),
            },
        );
    }

    #[test]
    fn images_as_clients_see_them() {
        let rec = ImageRecord {
            reference: "docker.io/library/busybox:1".into(),
            manifest_digest: "sha256:m".into(),
            config_digest: "sha256:c".into(),
            layers: vec!["sha256:l".into()],
            config: Default::default(),
            architecture: "amd64".into(),
            size: 42,
        };
        assert_eq!(
            image_of(&rec),
            Image {
                reference: "docker.io/library/busybox:1".into(),
                id: "sha256:c".into(),
                digest: "sha256:m".into(),
                size: 42
            }
        );
    }

    #[test]
    fn status_list_and_removal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        let a = import(&rt, dir.path(), &["local/a:1", "local/b:1"]);
        let status = rt.image_status("local/a:1").expect("status").expect("present");
        assert_eq!(status.reference, "docker.io/local/a:1");
        assert_eq!(status.digest, a.manifest_digest);
        assert_eq!(rt.image_status("local/c:1").expect("status"), None);
        let bad = rt.image_status("Not A Reference").expect_err("invalid");
        assert_eq!(bad.kind(), ErrorKind::Invalid);
        assert_eq!(rt.list_images().expect("list").len(), 2);

        user_of(&mut rt, &a);
        let busy = rt.remove_image("local/a:1").expect_err("in use");
        assert_eq!(busy.kind(), ErrorKind::Conflict);
        assert!(busy.to_string().contains("in use by container c1"), "{busy}");
        rt.remove_image("local/b:1").expect("b is not in use");
        assert_eq!(rt.image_status("local/b:1").expect("status"), None);
        let layer = rt.images.layer_dir(&a.layers[0]);
        assert!(layer.is_dir(), "still a's");
        rt.containers.clear();
        rt.remove_image("local/a:1").expect("no user left");
        assert!(!layer.exists(), "collected with its last image");
        rt.remove_image("local/a:1")
            .expect("removing an absent image is no error");
    }

    #[test]
    fn layers_of_a_container_outlive_its_image_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        let a = import(&rt, dir.path(), &["local/a:1", "local/b:1"]);
        user_of(&mut rt, &a);
        // The record the container was made from is replaced (a re-pull moved the tag).
        rt.images.remove("local/a:1").expect("record gone");
        rt.remove_image("local/b:1").expect("b is not in use");
        assert!(
            rt.images.layer_dir(&a.layers[0]).is_dir(),
            "the container's root keeps its layers"
        );
    }

    #[test]
    fn pulls_satisfied_by_what_is_present_answer_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut rt = crate::server::test_runtime(dir.path());
        import(&rt, dir.path(), &["local/a:1"]);
        let pull = |image: &str, policy| Request::PullImage {
            image: image.into(),
            policy,
            auth: None,
            insecure_registries: vec![],
        };
        let r = rt.handle(1, pull("local/a:1", PullPolicy::IfNotPresent), &mut Vec::new());
        assert!(matches!(r, Some(Reply::Image { .. })), "{r:?}");
        let r = rt.handle(1, pull("local/a:1", PullPolicy::Never), &mut Vec::new());
        assert!(matches!(r, Some(Reply::Image { .. })), "{r:?}");
        let r = rt.handle(1, pull("local/zzz:1", PullPolicy::Never), &mut Vec::new());
        assert!(
            matches!(&r, Some(Reply::Error(e)) if e.kind == ErrorKind::NotFound),
            "{r:?}"
        );
        let r = rt.handle(1, pull("BAD REF", PullPolicy::Always), &mut Vec::new());
        assert!(
            matches!(&r, Some(Reply::Error(e)) if e.kind == ErrorKind::Invalid),
            "{r:?}"
        );
        assert!(rt.pulls.is_empty(), "nothing went to a child");
    }
}
