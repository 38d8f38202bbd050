//! Thin wrappers over the system calls PID 1 needs that `nix` does not cover: loading compressed
//! kernel modules and the network-interface ioctls. All of init's `unsafe` lives here.

use std::ffi::CString;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

/// `finit_module(2)` flag: the kernel decompresses the file itself (`CONFIG_MODULE_DECOMPRESS`).
const MODULE_INIT_COMPRESSED_FILE: libc::c_uint = 4;

/// Loads a kernel module from an open `.ko`/`.ko.xz` file.
pub fn finit_module(file: &std::fs::File, compressed: bool) -> io::Result<()> {
    let flags = if compressed {
        MODULE_INIT_COMPRESSED_FILE
    } else {
        0
    };
    let params = c"";
    // SAFETY: the fd is valid for the duration of the call (borrowed from `file`), `params` is a
    // NUL-terminated string that outlives the call, and the syscall does not retain either.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A datagram socket used only as a handle for interface ioctls.
fn ioctl_socket() -> io::Result<OwnedFd> {
    let sock = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    Ok(sock)
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let bytes = cname.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    // SAFETY: ifreq is a plain C struct of integers and unions of integers; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(req)
}

/// `request` is one of libc's `SIOC*` constants (`c_ulong`); musl's `ioctl` takes a `c_int`.
fn ioctl(sock: &OwnedFd, request: libc::c_ulong, req: *mut libc::c_void) -> io::Result<()> {
    #[allow(clippy::cast_possible_truncation)]
    let request = request as libc::Ioctl;
    // SAFETY: callers pass a pointer to a live, correctly sized struct for `request` (ifreq or
    // rtentry), which the kernel reads or writes only during the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), request, req) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets IFF_UP on the interface.
pub fn link_up(name: &str) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let mut req = ifreq_for(name)?;
    ioctl(&sock, libc::SIOCGIFFLAGS, (&mut req as *mut libc::ifreq).cast())?;
    // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    ioctl(&sock, libc::SIOCSIFFLAGS, (&mut req as *mut libc::ifreq).cast())
}

/// The interface's hardware (MAC) address.
pub fn hw_addr(name: &str) -> io::Result<[u8; 6]> {
    let sock = ioctl_socket()?;
    let mut req = ifreq_for(name)?;
    ioctl(&sock, libc::SIOCGIFHWADDR, (&mut req as *mut libc::ifreq).cast())?;
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member of the union.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(data.iter()) {
        // c_char is i8 on x86_64 and u8 on aarch64.
        #[allow(clippy::unnecessary_cast)]
        let byte = *src as u8;
        *dst = byte;
    }
    Ok(mac)
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux and sockaddr is the generic view
    // the kernel expects for AF_INET addresses.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Assigns an IPv4 address and prefix to the interface.
pub fn set_ipv4(name: &str, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl(&sock, libc::SIOCSIFADDR, (&mut req as *mut libc::ifreq).cast())?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    };
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_in(Ipv4Addr::from(mask));
    ioctl(&sock, libc::SIOCSIFNETMASK, (&mut req as *mut libc::ifreq).cast())
}

/// Adds a default route through `gateway` on `dev`.
pub fn add_default_route(dev: &str, gateway: Ipv4Addr) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let cdev = CString::new(dev).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: rtentry is a plain C struct of integers, pointers and sockaddrs; all-zero is valid.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_in(gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    rt.rt_dev = cdev.as_ptr() as *mut libc::c_char;
    match ioctl(&sock, libc::SIOCADDRT, (&mut rt as *mut libc::rtentry).cast()) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}

/// Seconds and milliseconds since the kernel started (CLOCK_BOOTTIME).
pub fn boot_ms() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(ts) => (ts.tv_sec() as u64) * 1000 + (ts.tv_nsec() as u64) / 1_000_000,
        Err(_) => 0,
    }
}

/// Moves the calling thread to SCHED_IDLE: it runs only when nothing else wants the CPU. Used by
/// the background boot work (late modules, freeing the initramfs) so it does not slow the boot path.
pub fn make_thread_idle() -> io::Result<()> {
    // SAFETY: sched_param is a plain C struct of integers (musl adds reserved fields); all-zero
    // is valid and means priority 0, the only priority SCHED_IDLE accepts.
    let param: libc::sched_param = unsafe { std::mem::zeroed() };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 names the calling
    // thread on Linux, and the kernel only reads `param`.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A close-on-exec duplicate of `fd` numbered at least `min` (F_DUPFD_CLOEXEC).
pub fn dup_cloexec(fd: i32, min: i32) -> io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let new = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(new) })
}
