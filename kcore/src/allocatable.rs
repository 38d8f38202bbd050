//! What a node keeps for itself (docs/SEEDS-SPEC.md NODE-9, NODE-43): the agent reports
//! `allocatable` from it and the runtime limits `kubepods.slice` with it, so both use these
//! numbers.
//!
//! - `allocatable.memory` = capacity − system-reserved − the hard eviction threshold
//!   (`memory.available`, by default 100Mi as the kubelet's; the agent passes the configured
//!   one);
//! - kubepods `memory.max` = capacity − system-reserved (the threshold is *not* subtracted:
//!   it is the window in which eviction acts before the kernel's OOM killer);
//! - kubepods `pids.max` = the kernel's `pid_max` − the process IDs reserved for the system, so
//!   a fork bomb in pods cannot take the last PIDs PID 1, the agent and the runtime need.
//!
//! - `allocatable.ephemeral-storage` = capacity − the hard eviction threshold
//!   (`nodefs.available`, by default 10 %), the capacity being the size of the file system at
//!   [`EPHEMERAL_ROOT`] (the agent computes it from its thresholds).
//!
//! The upstream kubelet reserves nothing unless told to (`--system-reserved`); this node's own
//! userspace is small and fixed, so it reserves a fixed amount for it by default.

/// Memory reserved for the node's own processes (PID 1, agent, runtime, kernel slack).
pub const SYSTEM_RESERVED_MEMORY: u64 = 64 << 20;
/// The kubelet's default hard eviction threshold for `memory.available`.
pub const EVICTION_HARD_MEMORY: u64 = 100 << 20;
/// The kubelet's default hard eviction threshold for `nodefs.available`, in percent.
pub const EVICTION_HARD_NODEFS_PERCENT: f64 = 10.0;
/// Process IDs reserved for the node's own processes.
pub const SYSTEM_RESERVED_PIDS: u64 = 1024;

/// The node's ephemeral storage: one file system of a fixed size (a tmpfs mounted by init)
/// holding containers' writable layers, their logs and pods' volumes, so that what pods write
/// is bounded and never fills the file systems the node's own services use.
pub const EPHEMERAL_ROOT: &str = "/var/lib/nodeos/ephemeral";
/// `status.allocatable.memory` (bytes) of a node with `capacity` bytes whose hard
/// `memory.available` eviction threshold is `eviction_threshold` bytes.
pub fn allocatable_memory(capacity: u64, eviction_threshold: u64) -> u64 {
    capacity.saturating_sub(SYSTEM_RESERVED_MEMORY + eviction_threshold)
}

/// `memory.max` of `kubepods.slice` (bytes) on a node with `capacity` bytes.
pub fn kubepods_memory_max(capacity: u64) -> u64 {
    capacity.saturating_sub(SYSTEM_RESERVED_MEMORY)
}

/// `pids.max` of `kubepods.slice` on a kernel with `pid_max`; never below 1024 pids for pods.
pub fn kubepods_pids_max(pid_max: u64) -> u64 {
    pid_max.saturating_sub(SYSTEM_RESERVED_PIDS).max(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations() {
        const MI: u64 = 1 << 20;
        // capacity, allocatable, kubepods memory.max
        for (capacity, allocatable, kubepods) in [
            (1024 * MI, 860 * MI, 960 * MI),
            (8_320_299_008, 8_320_299_008 - 164 * MI, 8_320_299_008 - 64 * MI),
            (100 * MI, 0, 36 * MI),
            (0, 0, 0),
        ] {
            let threshold = EVICTION_HARD_MEMORY;
            assert_eq!(allocatable_memory(capacity, threshold), allocatable, "{capacity}");
            assert_eq!(kubepods_memory_max(capacity), kubepods, "{capacity}");
            assert!(kubepods_memory_max(capacity) >= allocatable_memory(capacity, threshold));
        }
        assert_eq!(allocatable_memory(1024 * MI, 600 * MI), 360 * MI);
        assert_eq!(allocatable_memory(1024 * MI, 0), 960 * MI);
        for (pid_max, want) in [(32_768, 31_744), (4_194_304, 4_193_280), (1500, 1024), (0, 1024)] {
            assert_eq!(kubepods_pids_max(pid_max), want, "{pid_max}");
        }
    }
}
