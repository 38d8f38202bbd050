//! The pause program: what every pod sandbox runs to hold its namespaces. It blocks SIGINT,
//! SIGTERM and SIGCHLD, waits for them with `rt_sigtimedwait`, reaps every exited child on
//! SIGCHLD (it is PID 1 of a pod's shared pid namespace, where orphans come to it) and exits 0 on
//! SIGINT or SIGTERM: the upstream pause container's behaviour.
//!
//! It is a static ELF executable of about 300 bytes that the runtime writes as `/pause` into the
//! pause root, not the node binary run in a `pause` role as it was: measured in `./build.sh bench pods`, each
//! pause process of the 11 MB static-pie node binary held 1.16 MB resident (0.53 MB of it its
//! own: the start-up relocation dirties the binary's whole `.data.rel.ro`, and the C and Rust
//! start-up touches text and data besides), so 30 pods' pauses were 36 MB of the node's 63 MB;
//! and the binary's copy in the pause root took 11 MB of tmpfs. This program's pause process
//! holds 10 KB (31 of them: 312 KB resident).
//!
//! The machine code is below with its assembly, per architecture (Linux system call numbers:
//! x86_64 `rt_sigprocmask` 14, `rt_sigtimedwait` 128, `wait4` 61, `exit_group` 231; arm64 135,
//! 137, 260, 94). The signal set is bits 1, 14 and 16 (SIGINT 2, SIGTERM 15, SIGCHLD 17): 0x14002.
//! Every branch is relative, so the code runs wherever it is loaded.

/// x86_64.
#[rustfmt::skip]
const X86_64: &[u8] = &[
    0x68, 0x02, 0x40, 0x01, 0x00,       // _start: push 0x14002       (the set, on the stack)
    0x31, 0xff,                         //   xor edi, edi              (SIG_BLOCK)
    0x48, 0x89, 0xe6,                   //   mov rsi, rsp
    0x31, 0xd2,                         //   xor edx, edx
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00, //   mov r10d, 8               (sigsetsize)
    0xb8, 0x0e, 0x00, 0x00, 0x00,       //   mov eax, 14               (rt_sigprocmask)
    0x0f, 0x05,                         //   syscall
    0x48, 0x89, 0xe7,                   // wait: mov rdi, rsp
    0x31, 0xf6,                         //   xor esi, esi              (no siginfo)
    0x31, 0xd2,                         //   xor edx, edx              (no timeout)
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00, //   mov r10d, 8
    0xb8, 0x80, 0x00, 0x00, 0x00,       //   mov eax, 128              (rt_sigtimedwait)
    0x0f, 0x05,                         //   syscall
    0x83, 0xf8, 0x11,                   //   cmp eax, 17               (SIGCHLD)
    0x74, 0x0c,                         //   je reap
    0x83, 0xf8, 0x02,                   //   cmp eax, 2                (SIGINT)
    0x74, 0x25,                         //   je done
    0x83, 0xf8, 0x0f,                   //   cmp eax, 15               (SIGTERM)
    0x74, 0x20,                         //   je done
    0xeb, 0xdb,                         //   jmp wait                  (an error: wait again)
    0x48, 0xc7, 0xc7, 0xff, 0xff, 0xff, 0xff, // reap: mov rdi, -1     (any child)
    0x31, 0xf6,                         //   xor esi, esi              (no status)
    0xba, 0x01, 0x00, 0x00, 0x00,       //   mov edx, 1                (WNOHANG)
    0x45, 0x31, 0xd2,                   //   xor r10d, r10d            (no rusage)
    0xb8, 0x3d, 0x00, 0x00, 0x00,       //   mov eax, 61               (wait4)
    0x0f, 0x05,                         //   syscall
    0x85, 0xc0,                         //   test eax, eax
    0x7f, 0xe4,                         //   jg reap                   (one reaped: next)
    0xeb, 0xbd,                         //   jmp wait
    0x31, 0xff,                         // done: xor edi, edi
    0xb8, 0xe7, 0x00, 0x00, 0x00,       //   mov eax, 231              (exit_group)
    0x0f, 0x05,                         //   syscall
];

/// arm64 (little-endian instruction words).
#[rustfmt::skip]
const AARCH64: &[u32] = &[
    0xd2880049, // _start: mov x9, #0x4002
    0xf2a00029, //   movk x9, #0x1, lsl #16
    0xf81f0fe9, //   str x9, [sp, #-16]!     (the set, on the stack)
    0xd2800000, //   mov x0, #0              (SIG_BLOCK)
    0x910003e1, //   mov x1, sp
    0xd2800002, //   mov x2, #0
    0xd2800103, //   mov x3, #8              (sigsetsize)
    0xd28010e8, //   mov x8, #135            (rt_sigprocmask)
    0xd4000001, //   svc #0
    0x910003e0, // wait: mov x0, sp
    0xd2800001, //   mov x1, #0              (no siginfo)
    0xd2800002, //   mov x2, #0              (no timeout)
    0xd2800103, //   mov x3, #8
    0xd2801128, //   mov x8, #137            (rt_sigtimedwait)
    0xd4000001, //   svc #0
    0xf100441f, //   cmp x0, #17             (SIGCHLD)
    0x540000c0, //   b.eq reap
    0xf100081f, //   cmp x0, #2              (SIGINT)
    0x540001a0, //   b.eq done
    0xf1003c1f, //   cmp x0, #15             (SIGTERM)
    0x54000160, //   b.eq done
    0x17fffff4, //   b wait                  (an error: wait again)
    0x92800000, // reap: mov x0, #-1         (any child)
    0xd2800001, //   mov x1, #0              (no status)
    0xd2800022, //   mov x2, #1              (WNOHANG)
    0xd2800003, //   mov x3, #0              (no rusage)
    0xd2802088, //   mov x8, #260            (wait4)
    0xd4000001, //   svc #0
    0xf100001f, //   cmp x0, #0
    0x54ffff2c, //   b.gt reap               (one reaped: next)
    0x17ffffeb, //   b wait
    0xd2800000, // done: mov x0, #0
    0xd2800bc8, //   mov x8, #94             (exit_group)
    0xd4000001, //   svc #0
];

/// Where the program is loaded (the classic base of a static executable).
const BASE: u64 = 0x40_0000;
const EHDR: usize = 64;
const PHDR: usize = 56;

/// The machine of the node binary's own architecture (`e_machine`) and the code for it.
fn code() -> (u16, Vec<u8>) {
    if cfg!(target_arch = "aarch64") {
        (183, AARCH64.iter().flat_map(|w| w.to_le_bytes()).collect())
    } else {
        (62, X86_64.to_vec())
    }
}

/// The pause program for this node's architecture: an ELF header, two program headers (the
/// code, loaded read+execute; a non-executable stack) and the code.
pub fn program() -> Vec<u8> {
    let (machine, code) = code();
    let headers = EHDR + 2 * PHDR;
    let size = (headers + code.len()) as u64;
    let mut elf = Vec::with_capacity(headers + code.len());
    // e_ident: ELF, 64-bit, little-endian, version 1, System V ABI.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // e_type: ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes()); // e_version
    elf.extend_from_slice(&(BASE + headers as u64).to_le_bytes()); // e_entry
    elf.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff: no sections
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    elf.extend_from_slice(&(EHDR as u16).to_le_bytes()); // e_ehsize
    elf.extend_from_slice(&(PHDR as u16).to_le_bytes()); // e_phentsize
    elf.extend_from_slice(&2u16.to_le_bytes()); // e_phnum
    elf.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
    // PT_LOAD: the whole file at BASE, read + execute.
    program_header(&mut elf, 1, 5, 0, BASE, size, 0x1000);
    // PT_GNU_STACK: read + write, not executable.
    program_header(&mut elf, 0x6474_e551, 6, 0, 0, 0, 16);
    elf.extend_from_slice(&code);
    elf
}

fn program_header(elf: &mut Vec<u8>, kind: u32, flags: u32, offset: u64, addr: u64, size: u64, align: u64) {
    elf.extend_from_slice(&kind.to_le_bytes());
    elf.extend_from_slice(&flags.to_le_bytes());
    elf.extend_from_slice(&offset.to_le_bytes());
    elf.extend_from_slice(&addr.to_le_bytes()); // p_vaddr
    elf.extend_from_slice(&addr.to_le_bytes()); // p_paddr
    elf.extend_from_slice(&size.to_le_bytes()); // p_filesz
    elf.extend_from_slice(&size.to_le_bytes()); // p_memsz
    elf.extend_from_slice(&align.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;
    use std::time::{Duration, Instant};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    use super::*;

    #[test]
    fn the_program_is_a_well_formed_executable() {
        let elf = program();
        let (machine, code) = code();
        assert_eq!(elf.len(), EHDR + 2 * PHDR + code.len());
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), machine);
        let entry = u64::from_le_bytes(elf[24..32].try_into().expect("8 bytes"));
        assert_eq!(entry, BASE + (EHDR + 2 * PHDR) as u64);
        // The loaded segment covers the file, so the entry point lies in it.
        let filesz = u64::from_le_bytes(elf[EHDR + 32..EHDR + 40].try_into().expect("8 bytes"));
        assert_eq!(filesz, elf.len() as u64);
        assert!(entry < BASE + filesz);
        assert_eq!(AARCH64.len() * 4, 0x88, "the arm64 listing's length");
        assert_eq!(X86_64.len(), 0x65, "the x86_64 listing's length");
    }

    /// Waits up to 10 s for `child` to exit.
    fn exit_of(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn write_program(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("pause");
        std::fs::write(&path, program()).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        path
    }

    /// Runs the program of the machine the tests run on: a SIGCHLD with nothing to reap leaves
    /// it waiting; SIGTERM and SIGINT end it with status 0.
    #[test]
    fn the_program_runs_until_sigterm_or_sigint() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_program(dir.path());
        for stop in [Signal::SIGTERM, Signal::SIGINT] {
            let mut child = Command::new(&path).spawn().expect("the pause program starts");
            let pid = Pid::from_raw(child.id() as i32);
            std::thread::sleep(Duration::from_millis(200));
            // SIGCHLD with nothing to reap leaves it waiting.
            kill(pid, Signal::SIGCHLD).expect("SIGCHLD");
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "it kept running after SIGCHLD"
            );
            kill(pid, stop).expect("stop");
            let st = exit_of(&mut child).expect("it exits");
            assert_eq!((st.code(), st.signal()), (Some(0), None), "{stop}");
        }
    }

    /// A child it inherits (a shell starts one, then becomes the program) is reaped when it
    /// exits: no zombie is left.
    #[test]
    fn the_program_reaps_its_children() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_program(dir.path());
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 0.3 & echo $!; exec {}", path.display()))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh starts");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("pid");
        let orphan: i32 = line.trim().parse().expect("a pid");
        let stat = format!("/proc/{orphan}/stat");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&stat).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left = std::fs::read_to_string(&stat).unwrap_or_default();
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).expect("stop");
        let st = exit_of(&mut child).expect("it exits");
        assert!(left.is_empty(), "the child was not reaped: {left}");
        assert_eq!(st.code(), Some(0));
    }
}
