//! `nodeos-image`: the image builder's command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use image::{Arch, BuildConfig};

#[derive(Parser)]
#[command(about = "Builds node images: vmlinuz, initramfs, UKI, GPT disk (raw and qcow2)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build every artifact for one architecture into --out.
    Build {
        #[arg(long, value_enum)]
        arch: Arch,
        #[arg(long)]
        kernel_root: PathBuf,
        #[arg(long)]
        stub: PathBuf,
        #[arg(long)]
        node_bin: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Kernel command line (default: the arch's serial console, quiet, panic=-1).
        #[arg(long)]
        cmdline: Option<String>,
        /// Minimum ESP size in MiB (it grows to fit two images).
        #[arg(long, default_value_t = 64)]
        esp_mib: u64,
        #[arg(long, default_value_t = 64)]
        state_mib: u64,
    },
    /// Write an initramfs whose /init is --bin alone (the boot benchmark's do-nothing floor).
    Floor {
        #[arg(long)]
        bin: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Build {
            arch,
            kernel_root,
            stub,
            node_bin,
            out,
            cmdline,
            esp_mib,
            state_mib,
        } => {
            let cfg = BuildConfig {
                arch,
                kernel_root,
                stub,
                node_bin,
                out,
                cmdline: cmdline.unwrap_or_else(|| arch.default_cmdline().to_string()),
                esp_mib,
                state_mib,
                extra_files: Vec::new(),
            };
            let outputs =
                image::build(&cfg).with_context(|| format!("building the {} image", arch.name()))?;
            println!("{}", serde_json::to_string_pretty(&outputs)?);
        }
        Cmd::Floor { bin, out } => {
            let data = image::floor_initramfs(&bin).context("building the floor initramfs")?;
            std::fs::write(&out, data).with_context(|| format!("writing {}", out.display()))?;
        }
    }
    Ok(())
}
