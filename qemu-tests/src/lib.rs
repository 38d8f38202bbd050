//! The VM harness: a factory that builds QEMU guests (TCG only) from the node images, serial
//! console to a log file, wait-for-line with a timeout, QMP for power events, every VM killed on
//! drop, and logs kept under the target directory when a test fails.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod devcluster;
pub mod guest;
pub mod registry;
pub mod vm;

pub use vm::{Arch, Boot, Nic, Vm, VmConfig, VmFactory};
