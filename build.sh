#!/usr/bin/env bash
# The one entry point: setup | build | image | run | test [SUITE] | bench [NAME]
# Every command runs `setup` itself when something is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"

# Pinned inputs (overridable from the environment).
KERNEL_VERSION="${KERNEL_VERSION:-$(cat "$ROOT/image/kernel.version")}"
ARCHES_ALL="x86_64 aarch64"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export NODEOS_CACHE="${NODEOS_CACHE:-$CARGO_TARGET_DIR/cache}"
CACHE_DIR="$NODEOS_CACHE"
OUT_DIR="${NODEOS_OUT:-$ROOT/out}"
export CC_aarch64_unknown_linux_musl="${CC_aarch64_unknown_linux_musl:-aarch64-linux-gnu-gcc}"
export RUSTUP_AUTO_INSTALL=0
# The pinned toolchain (rust-toolchain.toml).
RUST_TOOLCHAIN=$(awk -F'"' '/^channel/ {print $2}' "$ROOT/rust-toolchain.toml")

say()  { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die()  { printf '\033[31merror:\033[0m %s\n' "$*" >&2; exit 1; }
# Runs "$@" under a heading; returns its status (callers use `step ... || die`, where set -e is off).
step() { local t0=$SECONDS; say "$1"; shift; "$@" || return $?; say "done in $((SECONDS - t0)) s"; }

deb_arch() { case "$1" in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) die "unknown arch '$1' (use x86_64, aarch64 or all)" ;; esac; }

# ---------------------------------------------------------------------------------------------
# setup: idempotent; installs host packages, rustup targets, and fetches the pinned kernels.
# ---------------------------------------------------------------------------------------------
APT_PKGS=(qemu-system-x86 qemu-system-arm ovmf qemu-efi-aarch64 systemd-boot-efi mtools dosfstools make
          gdisk qemu-utils gcc-aarch64-linux-gnu libc6-dev-arm64-cross musl-tools xz-utils
          busybox-static etcd-server docker-registry skopeo nftables iproute2)

setup_needed() {
  local p
  for p in qemu-system-x86_64 qemu-system-aarch64 qemu-img aarch64-linux-gnu-gcc musl-gcc make nft ip; do
    command -v "$p" >/dev/null || return 0
  done
  [ -f /usr/share/OVMF/OVMF_CODE_4M.fd ] && [ -f /usr/share/AAVMF/AAVMF_CODE.fd ] || return 0
  [ -f /usr/lib/systemd/boot/efi/linuxx64.efi.stub ] || return 0
  rustup run "$RUST_TOOLCHAIN" rustc --version >/dev/null 2>&1 || return 0
  rustup target list --installed 2>/dev/null | grep -q aarch64-unknown-linux-musl || return 0
  rustup target list --installed 2>/dev/null | grep -q x86_64-unknown-linux-musl || return 0
  [ -x "$CACHE_DIR/pyvenv/bin/python" ] || return 0
  local a; for a in $ARCHES_ALL; do
    [ -f "$CACHE_DIR/kernel/$KERNEL_VERSION/$(deb_arch "$a")/ok" ] || return 0
    [ -f "$CACHE_DIR/stub/$(deb_arch "$a")/ok" ] || return 0
    [ -f "$CACHE_DIR/busybox/$(deb_arch "$a")/ok" ] || return 0
  done
  return 1
}

apt_backports() {
  # qemu-system matching the machine's qemu-utils lives in bookworm-backports; reuse the mirror and
  # keyring of the machine's own sources file (never hard-code a registry host).
  local src=/etc/apt/sources.list.d/debian.sources
  local dst=/etc/apt/sources.list.d/nodeos-backports.sources
  [ -f "$dst" ] && return 0
  [ -f "$src" ] || die "$src not found: cannot derive the Debian mirror for bookworm-backports"
  local uri key
  uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$src")
  key=$(awk '/^Signed-By:/ {print $2; exit}' "$src")
  [ -n "$uri" ] || die "no URIs: line in $src"
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' "$uri" "$key" >"$dst"
}

cmd_setup() {
  if ! setup_needed && [ "${1:-}" != "--force" ]; then return 0; fi
  say "setup: host packages, rust targets, kernels"
  apt_backports
  dpkg --print-foreign-architectures | grep -q arm64 || dpkg --add-architecture arm64
  local stamp=/var/lib/apt/periodic/nodeos-update
  if [ ! -f "$stamp" ] || [ -n "$(find /etc/apt/sources.list.d -newer "$stamp")" ]; then
    apt-get update -q || die "apt-get update failed"
    mkdir -p "$(dirname $stamp)"; touch "$stamp"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -t bookworm-backports qemu-system-x86 qemu-system-arm qemu-utils \
    || die "installing qemu-system from bookworm-backports failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${APT_PKGS[@]}" || die "apt-get install failed"
  ensure_toolchain
  rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl || die "rustup target add failed"
  setup_python
  local a; for a in $ARCHES_ALL; do fetch_kernel "$a"; fetch_stub "$a"; fetch_busybox "$a"; done
}

# apt-get download PKG into DIR/deb (DIR is recreated), check the .deb against the archive's
# signed index (apt-cache show gives its SHA256) and unpack it into DIR/root.
apt_fetch_verified() {
  local pkg="$1" dir="$2"
  rm -rf "$dir"; mkdir -p "$dir/deb"
  ( cd "$dir/deb" && apt-get download "$pkg" ) || return 1
  local deb; deb=$(ls "$dir"/deb/*.deb)
  local want got
  want=$(apt-cache show "$pkg" 2>/dev/null | awk -v v="$(dpkg-deb -f "$deb" Version)" '/^Version:/ {ok = ($2 == v)} ok && /^SHA256:/ {print $2; exit}')
  got=$(sha256sum "$deb" | awk '{print $1}')
  [ -n "$want" ] || die "no SHA256 for $pkg in the apt index (run apt-get update)"
  [ "$want" = "$got" ] || die "$deb: sha256 $got does not match the archive's $want"
  dpkg-deb -x "$deb" "$dir/root" || die "cannot unpack $deb"
  echo "$got" >"$dir/deb.sha256"
}

# Fetch and unpack the pinned Debian cloud kernel for one arch into the cache.
fetch_kernel() {
  local da; da=$(deb_arch "$1")
  local dir="$CACHE_DIR/kernel/$KERNEL_VERSION/$da"
  [ -f "$dir/ok" ] && return 0
  say "kernel: fetching linux-image-$KERNEL_VERSION-cloud-$da"
  local pkg="linux-image-$KERNEL_VERSION-cloud-$da"
  [ "$da" = arm64 ] && pkg="$pkg:arm64"
  apt_fetch_verified "$pkg" "$dir" \
    || die "apt-get download $pkg failed (is the version in image/kernel.version still in the archive? override with KERNEL_VERSION=...)"
  ls "$dir"/root/boot/vmlinuz-* >/dev/null 2>&1 || die "$pkg has no /boot/vmlinuz-*"
  touch "$dir/ok"
}

# Debian's static busybox for one arch: the test images are built from it (both arches).
fetch_busybox() {
  local da; da=$(deb_arch "$1")
  local dir="$CACHE_DIR/busybox/$da"
  [ -f "$dir/ok" ] && return 0
  apt_fetch_verified "busybox-static:$da" "$dir" || die "apt-get download busybox-static:$da failed"
  cp "$dir/root/bin/busybox" "$dir/busybox"
  touch "$dir/ok"
}

# The systemd EFI stub of the arch (the arm64 stub comes from the arm64 build of systemd-boot-efi).
fetch_stub() {
  local da; da=$(deb_arch "$1")
  local dir="$CACHE_DIR/stub/$da"
  [ -f "$dir/ok" ] && return 0
  rm -rf "$dir"; mkdir -p "$dir"
  ( cd "$dir" && apt-get download "systemd-boot-efi:$da" ) || die "apt-get download systemd-boot-efi:$da failed"
  dpkg-deb -x "$dir"/*.deb "$dir/root"
  touch "$dir/ok"
}

# The official Kubernetes Python client, in a venv of its own (tests of the API server).
PY_VENV="$CACHE_DIR/pyvenv"
setup_python() {
  [ -x "$PY_VENV/bin/python" ] && "$PY_VENV/bin/python" -c 'import kubernetes' 2>/dev/null && return 0
  say "setup: Python venv with the kubernetes client"
  python3 -m venv "$PY_VENV" || die "python3 -m venv failed"
  "$PY_VENV/bin/pip" install -q 'kubernetes==37.*' || die "pip install kubernetes failed"
}

# The pinned toolchain must exist under its version name. These machines ship one stable
# toolchain; when it is the pinned release but only known as `stable`, it is linked under the
# version name (nothing can be downloaded here). Any other release is an error, not a silent drift.
ensure_toolchain() {
  rustup run "$RUST_TOOLCHAIN" rustc --version >/dev/null 2>&1 && return 0
  local have; have=$(rustup run stable rustc --version 2>/dev/null | awk '{print $2}')
  [ "$have" = "$RUST_TOOLCHAIN" ] || die "toolchain $RUST_TOOLCHAIN (rust-toolchain.toml) is not installed and stable is '$have'"
  local home host; home=$(rustup show home); host=$(rustup run stable rustc -vV | awk '/^host:/ {print $2}')
  ln -sfn "$home/toolchains/stable-$host" "$home/toolchains/$RUST_TOOLCHAIN-$host" \
    || die "cannot link toolchain $RUST_TOOLCHAIN"
  rustup run "$RUST_TOOLCHAIN" rustc --version >/dev/null || die "toolchain $RUST_TOOLCHAIN still unusable"
}

cmd_setup_if_needed() { if setup_needed; then cmd_setup; fi; }

triple() { echo "$1-unknown-linux-musl"; }
node_bin() { echo "$CARGO_TARGET_DIR/$(triple "$1")/release/nodeos"; }
host_bin() { echo "$CARGO_TARGET_DIR/debug/$1"; }

parse_arches() {
  local a="${1:-all}"
  case "$a" in all|mixed) echo "$ARCHES_ALL" ;; x86_64|aarch64) echo "$a" ;; *) die "unknown arch '$a' (x86_64, aarch64 or all)" ;; esac
}

# build [--arch A]: the static node binary per arch (release, size-tuned) and the host tools.
cmd_build() {
  local arches; arches=$(parse_arches "$(arg_arch "$@")")
  cmd_setup_if_needed
  local a
  for a in $arches; do
    step "build: node binary for $a ($(triple "$a"))" \
      cargo build --release --locked --target "$(triple "$a")" -p init \
      || die "building the $a node binary failed (see the cargo output above)"
  done
  step "build: host tools (image builder, VM harness, control plane)" cargo build --locked -p image -p qemu-tests -p controlplane \
    || die "building the host tools failed"
}

# In-guest programs of the runtime crate (static, per arch): built only for VM tests/benchmarks.
build_guest_bin() {
  local a
  for a in $ARCHES_ALL; do
    step "build: in-guest $1 for $a" \
      cargo build --release --locked --target "$(triple "$a")" -p runtime --bin "$1" \
      || die "building the $a $1 failed"
  done
}

# Debian's runc and crun with the libraries they load, unpacked into one root per arch (the
# runtime benchmark appends it to the guest's initramfs).
BENCH_DEBS=(runc crun libc6 libgcc-s1 libcap2 libgcrypt20 libgpg-error0 liblz4-1 liblzma5 libseccomp2
            libsystemd0 libyajl2 libzstd1)
fetch_bench_root() {
  local da; da=$(deb_arch "$1")
  local dir="$CACHE_DIR/bench/$da"
  [ -f "$dir/ok" ] && return 0
  rm -rf "$dir"; mkdir -p "$dir/root"
  local p
  for p in "${BENCH_DEBS[@]}"; do
    apt_fetch_verified "$p:$da" "$dir/pkgs/$p" || die "apt-get download $p:$da failed"
    cp -a "$dir/pkgs/$p/root/." "$dir/root/"
  done
  touch "$dir/ok"
}

stub_for() {
  case "$1" in
    x86_64) echo "$CACHE_DIR/stub/amd64/root/usr/lib/systemd/boot/efi/linuxx64.efi.stub" ;;
    aarch64) echo "$CACHE_DIR/stub/arm64/root/usr/lib/systemd/boot/efi/linuxaa64.efi.stub" ;;
  esac
}

# image [--arch A]: out/<arch>/{vmlinuz,initramfs.img,node.efi,disk.raw,disk.qcow2,SHA256SUMS}
cmd_image() {
  local arches; arches=$(parse_arches "$(arg_arch "$@")")
  cmd_build "$@"
  local a
  for a in $arches; do
    local da; da=$(deb_arch "$a")
    step "image: $a" "$(host_bin nodeos-image)" build --arch "$a" \
      --kernel-root "$CACHE_DIR/kernel/$KERNEL_VERSION/$da/root" --stub "$(stub_for "$a")" \
      --node-bin "$(node_bin "$a")" --out "$OUT_DIR/$a" >"$OUT_DIR/$a.build.json" \
      || die "building the $a image failed"
    "$(host_bin nodeos-image)" floor --bin "$CARGO_TARGET_DIR/$(triple "$a")/release/floor" \
      --out "$OUT_DIR/$a/floor-initramfs.img" || die "building the $a floor initramfs failed"
    say "image: $a -> $OUT_DIR/$a ($(du -h "$OUT_DIR/$a/node.efi" | cut -f1) node.efi)"
  done
}

arg_arch() {
  while [ $# -gt 0 ]; do
    case "$1" in --arch) echo "${2:-}"; return ;; --arch=*) echo "${1#--arch=}"; return ;; esac
    shift
  done
  echo all
}

# run: build the x86_64 image (or --arch), boot it in QEMU and show the node ready.
cmd_run() {
  local arch; arch=$(arg_arch "$@"); [ "$arch" = all ] && arch=x86_64
  mkdir -p "$OUT_DIR"
  cmd_image --arch "$arch"
  local extra=(); for x in "$@"; do case "$x" in --uefi|--stay) extra+=("$x") ;; esac; done
  NODEOS_OUT="$OUT_DIR" "$(host_bin nodeos-vm)" run --arch "$arch" "${extra[@]}"
}

# cluster up [--nodes N] [--arch x86_64|aarch64|mixed] [--data-dir D] | down | status | node NAME
# poweroff|kill|start: a local multi-node cluster that stays up (qemu-tests/src/devcluster.rs).
cmd_cluster() {
  local sub="${1:-}"
  case "$sub" in
    up)
      local arch; arch=$(arg_arch "$@"); [ "$arch" = all ] && arch=x86_64
      local build_arch="$arch"; [ "$arch" = mixed ] && build_arch=all
      mkdir -p "$OUT_DIR"
      cmd_image --arch "$build_arch"
      ;;
    down|status|node) cmd_setup_if_needed ;;
    *) die "usage: ./build.sh cluster up [--nodes N] [--arch x86_64|aarch64|mixed] [--data-dir D] | down | status | node NAME poweroff|kill|start" ;;
  esac
  [ -x "$(host_bin nodeos-vm)" ] || cmd_build --arch x86_64
  NODEOS_OUT="$OUT_DIR" "$(host_bin nodeos-vm)" cluster "$@"
}

# test [unit|api|vm|runtime|all]
cmd_test() {
  local suite="${1:-all}"
  cmd_setup_if_needed
  case "$suite" in
    unit|api|all|vm|runtime) ;;
    *) die "unknown test suite '$suite' (unit, api, vm, runtime or all)" ;;
  esac
  if [ "$suite" = unit ] || [ "$suite" = all ]; then
    step "lint: cargo fmt --check" cargo fmt --all -- --check \
      || die "formatting differs from rustfmt.toml (run: cargo fmt --all)"
    step "lint: cargo clippy -D warnings (workspace lints)" \
      cargo clippy --locked --workspace --all-targets -- -D warnings || die "clippy found problems"
    step "test: unit and host integration tests (incl. the API server with the real kubectl)" \
      cargo test --locked --workspace || die "unit tests failed"
    NODEOS_TEST_STORE=etcd step "test: the API handler suite again, on a real etcd" \
      cargo test --locked -p controlplane --lib api::tests || die "API tests on etcd failed"
    NODEOS_TEST_STORE=etcd step "test: the kubectl suite again, on a real etcd" \
      cargo test --locked -p controlplane --test kubectl || die "kubectl tests on etcd failed"
  fi
  if [ "$suite" = api ] || [ "$suite" = all ]; then
    NODEOS_PYTHON="$PY_VENV/bin/python" step "test: API server with the official Python client" \
      cargo test --locked -p controlplane --test kubectl -- --ignored || die "API client tests failed"
  fi
  if [ "$suite" = vm ] || [ "$suite" = runtime ] || [ "$suite" = all ]; then
    mkdir -p "$OUT_DIR"
    cmd_image --arch all
    build_guest_bin runtime-suite
    export NODEOS_OUT="$OUT_DIR" NODEOS_KERNEL_CACHE="$CACHE_DIR/kernel/$KERNEL_VERSION" NODEOS_STUB_CACHE="$CACHE_DIR/stub"
    export NODEOS_PYTHON="$PY_VENV/bin/python"
    local which=(--test '*'); [ "$suite" = runtime ] && which=(--test runtime)
    step "test: VM tests ($suite; QEMU TCG, both arches)" \
      cargo test --locked -p qemu-tests "${which[@]}" -- --ignored --test-threads="${VM_TEST_THREADS:-2}" \
      || die "VM tests failed (serial logs are kept under $CARGO_TARGET_DIR/qemu-tests/)"
  fi
}

# bench [boot|api|runtime|pods|scheduler|controllers]
cmd_bench() {
  local name="${1:-boot}"
  case "$name" in
    boot)
      mkdir -p "$OUT_DIR/bench"
      cmd_image --arch all
      NODEOS_OUT="$OUT_DIR" "$(host_bin nodeos-vm)" bench-boot --runs "${BENCH_RUNS:-5}" --json "$OUT_DIR/bench/boot.json"
      say "bench boot -> $OUT_DIR/bench/boot.json"
      ;;
    api)
      mkdir -p "$OUT_DIR/bench"
      cmd_setup_if_needed
      step "build: control plane and benchmark (release)" cargo build --locked --release -p controlplane --features testing \
        || die "building the control plane failed"
      "$CARGO_TARGET_DIR/release/api-bench" "$OUT_DIR/bench/api.json" || die "the API benchmark failed"
      say "bench api -> $OUT_DIR/bench/api.json"
      ;;
    pods)
      mkdir -p "$OUT_DIR/bench"
      cmd_image --arch x86_64
      # The node's pods go through the release control plane, as a user's would.
      step "build: control plane (release)" cargo build --locked --release -p controlplane --features testing \
        || die "building the control plane failed"
      NODEOS_OUT="$OUT_DIR" "$(host_bin nodeos-vm)" bench-pods --runs "${BENCH_RUNS:-5}" --json "$OUT_DIR/bench/pods.json" \
        || die "the pods benchmark failed"
      say "bench pods -> $OUT_DIR/bench/pods.json"
      ;;
    runtime)
      mkdir -p "$OUT_DIR/bench"
      cmd_image --arch all
      build_guest_bin runtime-bench
      local a; for a in $ARCHES_ALL; do fetch_bench_root "$a"; done
      NODEOS_OUT="$OUT_DIR" "$(host_bin nodeos-vm)" bench-runtime --runs "${BENCH_RUNS:-20}" --json "$OUT_DIR/bench/runtime.json" \
        || die "the runtime benchmark failed"
      say "bench runtime -> $OUT_DIR/bench/runtime.json"
      ;;
    scheduler)
      mkdir -p "$OUT_DIR/bench"
      cmd_setup_if_needed
      step "build: control plane and scheduler benchmark (release)" cargo build --locked --release -p controlplane --features testing \
        || die "building the control plane failed"
      "$CARGO_TARGET_DIR/release/scheduler-bench" "$OUT_DIR/bench/scheduler.json" || die "the scheduler benchmark failed"
      say "bench scheduler -> $OUT_DIR/bench/scheduler.json"
      ;;
    controllers)
      mkdir -p "$OUT_DIR/bench"
      cmd_setup_if_needed
      step "build: control plane and controllers benchmark (release)" cargo build --locked --release -p controlplane --features testing \
        || die "building the control plane failed"
      "$CARGO_TARGET_DIR/release/controllers-bench" "$OUT_DIR/bench/controllers.json" || die "the controllers benchmark failed"
      say "bench controllers -> $OUT_DIR/bench/controllers.json"
      ;;
    *) die "unknown benchmark '$name' (boot, api, runtime, scheduler or controllers)" ;;
  esac
}

main() {
  local cmd="${1:-}"; shift || true
  case "$cmd" in
    setup) cmd_setup "$@" ;;
    build) mkdir -p "$OUT_DIR"; cmd_build "$@" ;;
    image) mkdir -p "$OUT_DIR"; cmd_image "$@" ;;
    run)   cmd_run "$@" ;;
    cluster) cmd_cluster "$@" ;;
    test)  cmd_test "$@" ;;
    bench) cmd_bench "$@" ;;
    *) die "usage: ./build.sh setup|build|image [--arch x86_64|aarch64|all]|run [--arch A] [--uefi] [--stay]|cluster up|down|status|node ...|test [unit|api|vm|runtime|all]|bench [boot|api|runtime|pods|scheduler|controllers]" ;;
  esac
}
main "$@"
