//! The do-nothing `/init` of the boot benchmark's floor: print the boot time and power off.
//! It shares nothing with the node's init but the kernel it boots on.

#![forbid(unsafe_code)]

fn main() {
    let ms = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(|t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
        .unwrap_or(0);
    println!("floor: ready boot_ms={ms}");
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
}
