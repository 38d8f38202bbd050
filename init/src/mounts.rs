//! Early mounts, the move from the initramfs onto a tmpfs root, cgroup2 setup and unmounting at
//! shutdown.
//!
//! Why the move: `pivot_root(2)` fails with EINVAL when the current root is the initramfs `rootfs`
//! (it has no parent mount), and container runtimes pivot into their rootfs (docs/RUNTIME-NOTES.md §4 P1).
//! So PID 1 copies what it still needs onto a tmpfs, makes the tmpfs `/`, and frees the
//! initramfs in the background.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::ffi::CString;
use std::os::fd::AsRawFd;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Errors of the mount steps; each names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mount {fstype} on {target}: {source}")]
    Mount {
        fstype: &'static str,
        target: String,
        source: nix::Error,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{op}: {source}")]
    Sys { op: &'static str, source: nix::Error },
}

type Result<T> = std::result::Result<T, MountError>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_err("mkdir", path))
}

fn mount_fs(fstype: &'static str, target: &str, flags: MsFlags, data: Option<&str>) -> Result<()> {
    mkdir(Path::new(target), 0o755)?;
    mount(Some(fstype), target, Some(fstype), flags, data).map_err(|source| MountError::Mount {
        fstype,
        target: target.into(),
        source,
    })
}

const NOSUID_NODEV_NOEXEC: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// Mounts /proc, /sys, /dev (devtmpfs), /dev/pts, /dev/shm and /run.
pub fn mount_early() -> Result<()> {
    mount_fs("proc", "/proc", NOSUID_NODEV_NOEXEC, None)?;
    mount_fs("sysfs", "/sys", NOSUID_NODEV_NOEXEC, None)?;
    mount_fs("devtmpfs", "/dev", MsFlags::MS_NOSUID, Some("mode=0755"))?;
    mount_fs(
        "devpts",
        "/dev/pts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("gid=5,mode=620,ptmxmode=666"),
    )?;
    mount_fs(
        "tmpfs",
        "/dev/shm",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    mount_fs(
        "tmpfs",
        "/run",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;
    Ok(())
}

/// Mounts a sized file system for what pods and images may fill: a tmpfs of `size` (the tmpfs
/// option: `N%` of memory or bytes) at `root`, with one directory of it bound at each of
/// `binds`. The node's ephemeral storage ([`kcore::allocatable::EPHEMERAL_ROOT`], bound at the
/// containers' writable layers, their logs and pods' volumes) and its image file system
/// ([`runtime::IMAGE_ROOT`], no binds) are each one: a pod filling its writable layer or an
/// emptyDir, or a node pulling large images, fills that file system only, never `/run` or `/`
/// where the node's own services keep their state.
pub fn mount_sized(root: &str, size: &str, binds: &[(&str, &Path)]) -> Result<()> {
    fs::create_dir_all(root).map_err(io_err("mkdir", Path::new(root)))?;
    mount_fs(
        "tmpfs",
        root,
        MsFlags::MS_NODEV,
        Some(&format!("size={size},mode=0700")),
    )?;
    for (dir, target) in binds {
        let src = Path::new(root).join(dir);
        mkdir(&src, 0o755)?;
        fs::create_dir_all(target).map_err(io_err("mkdir", target))?;
        mount(Some(&src), *target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|source| {
            MountError::Mount {
                fstype: "bind",
                target: target.display().to_string(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Mounts cgroup2 at /sys/fs/cgroup and enables the controllers the node needs for children.
/// Returns the controllers now enabled in the root's `cgroup.subtree_control`.
pub fn mount_cgroup2() -> Result<String> {
    mount_fs(
        "cgroup2",
        "/sys/fs/cgroup",
        NOSUID_NODEV_NOEXEC,
        Some("nsdelegate,memory_recursiveprot"),
    )?;
    let ctl = Path::new("/sys/fs/cgroup/cgroup.subtree_control");
    let available = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").map_err(io_err("read", ctl))?;
    let enable: Vec<String> = ["cpu", "memory", "pids", "io", "cpuset", "hugetlb"]
        .iter()
        .filter(|c| available.split_whitespace().any(|a| a == **c))
        .map(|c| format!("+{c}"))
        .collect();
    fs::write(ctl, enable.join(" ")).map_err(io_err("write", ctl))?;
    Ok(fs::read_to_string(ctl)
        .map_err(io_err("read", ctl))?
        .trim()
        .to_string())
}

/// Returns true when `/` is the initramfs (`rootfs`), i.e. when [`switch_to_tmpfs`] is needed.
pub fn root_is_initramfs() -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(4) == Some("/") && l.contains(" - rootfs "))
        })
        .unwrap_or(false)
}

/// Copies `keep` (paths relative to `/`) from the initramfs onto a new tmpfs, makes the tmpfs the
/// root, and deletes the initramfs's files on a background thread to give their memory back.
pub fn switch_to_tmpfs(keep: &[&str]) -> Result<()> {
    let new_root = Path::new("/newroot");
    mkdir(new_root, 0o755)?;
    mount(
        Some("tmpfs"),
        new_root,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("mode=0755"),
    )
    .map_err(|source| MountError::Mount {
        fstype: "tmpfs",
        target: "/newroot".into(),
        source,
    })?;
    for rel in keep {
        let src = Path::new("/").join(rel);
        if src.symlink_metadata().is_ok() {
            copy_tree(&src, &new_root.join(rel))?;
        }
    }
    // Keep a handle on the initramfs root: once the tmpfs is `/` it is no longer reachable by
    // path, and its files are freed in the background through this handle.
    let old_root = Dir::open(
        "/",
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| MountError::Sys { op: "open /", source })?;
    let root_dev = fs::metadata("/").map_err(io_err("stat", Path::new("/")))?.dev();
    for m in ["/proc", "/sys", "/dev", "/run"] {
        let target = new_root.join(&m[1..]);
        mkdir(&target, 0o755)?;
        mount(Some(m), &target, None::<&str>, MsFlags::MS_MOVE, None::<&str>).map_err(|source| {
            MountError::Mount {
                fstype: "move",
                target: target.display().to_string(),
                source,
            }
        })?;
    }
    nix::unistd::chdir(new_root).map_err(|source| MountError::Sys {
        op: "chdir /newroot",
        source,
    })?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>).map_err(|source| {
        MountError::Mount {
            fstype: "move",
            target: "/".into(),
            source,
        }
    })?;
    nix::unistd::chroot(".").map_err(|source| MountError::Sys { op: "chroot", source })?;
    nix::unistd::chdir("/").map_err(|source| MountError::Sys {
        op: "chdir /",
        source,
    })?;
    let freeing = std::thread::Builder::new()
        .name("free-initramfs".into())
        .spawn(move || {
            let _ = crate::sys::make_thread_idle();
            let mut old_root = old_root;
            remove_children(&mut old_root, root_dev);
        });
    if let Err(e) = freeing {
        tracing::warn!(error = %e, "cannot free the initramfs");
    }
    Ok(())
}

/// Removes everything below `dir` that is on device `dev` (never crossing into other mounts).
/// Best effort: what cannot be removed only costs memory.
fn remove_children(dir: &mut Dir, dev: u64) {
    let fd = dir.as_raw_fd();
    let names: Vec<CString> = dir
        .iter()
        .flatten()
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for name in names {
        let Ok(st) = fstatat(Some(fd), name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        if st.st_dev != dev {
            continue;
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            if let Ok(mut sub) = Dir::openat(Some(fd), name.as_c_str(), flags, Mode::empty()) {
                remove_children(&mut sub, dev);
            }
            let _ = unlinkat(Some(fd), name.as_c_str(), UnlinkatFlags::RemoveDir);
        } else {
            let _ = unlinkat(Some(fd), name.as_c_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    let meta = src.symlink_metadata().map_err(io_err("stat", src))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        mkdir(dst, meta.mode() & 0o7777)?;
        for e in fs::read_dir(src).map_err(io_err("readdir", src))? {
            let e = e.map_err(io_err("readdir", src))?;
            copy_tree(&e.path(), &dst.join(e.file_name()))?;
        }
    } else if ft.is_symlink() {
        let target = fs::read_link(src).map_err(io_err("readlink", src))?;
        std::os::unix::fs::symlink(&target, dst).map_err(io_err("symlink", dst))?;
    } else if ft.is_file() {
        if let Some(parent) = dst.parent() {
            mkdir(parent, 0o755)?;
        }
        fs::copy(src, dst).map_err(io_err("copy", src))?;
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(io_err("chmod", dst))?;
    }
    // Device nodes and fifos are not carried over: devtmpfs provides /dev.
    Ok(())
}

/// Unmounts everything but `/`, deepest first, at shutdown. Busy mounts are detached lazily.
/// Returns how many mounts were unmounted.
pub fn unmount_all() -> usize {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return 0;
    };
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| *p != "/")
        .map(unescape)
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    let mut n = 0;
    for p in points {
        if umount2(p.as_str(), MntFlags::empty()).is_ok() || umount2(p.as_str(), MntFlags::MNT_DETACH).is_ok()
        {
            n += 1;
        }
    }
    // Make the root read-only so nothing is half-written when the machine goes down.
    let _ = mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    );
    n
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/run/a\\040b"), "/run/a b");
    }

    #[test]
    fn copy_tree_keeps_files_links_and_modes() -> std::result::Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("etc"))?;
        fs::write(src.join("etc/os-release"), "ID=nodeos\n")?;
        fs::write(src.join("init"), "bin")?;
        fs::set_permissions(src.join("init"), fs::Permissions::from_mode(0o755))?;
        std::os::unix::fs::symlink("init", src.join("sbin-init"))?;
        let dst = tmp.path().join("dst");
        copy_tree(&src, &dst)?;
        assert_eq!(fs::read_to_string(dst.join("etc/os-release"))?, "ID=nodeos\n");
        assert_eq!(fs::metadata(dst.join("init"))?.mode() & 0o777, 0o755);
        assert_eq!(fs::read_link(dst.join("sbin-init"))?, Path::new("init"));
        Ok(())
    }
}
