#!/usr/bin/env bash
# sweep for aarch64, the architecture of the GH200 nodes the reference study
# ran on (a Grace CPU beside an H100-class GPU), built and tested from an
# x86-64 machine. On an aarch64 machine none of this is needed: `cargo build
# --release` there builds the same program (docs/gpu.md, "GH200 (aarch64)").
#
#   scripts/aarch64.sh build   a release build of sweep for aarch64-unknown-linux-gnu:
#                              target/aarch64/aarch64-unknown-linux-gnu/release/sweep
#   scripts/aarch64.sh toolchain  install the cross compilers, qemu and the Rust
#                              target only (scripts/test.sh does it beside the build)
#   scripts/aarch64.sh check   type-check every default-build target for aarch64,
#                              tests and benchmarks included (CI runs this: scripts/test.sh);
#                              with `--features cuda,nccl`, the GPU build's
#   scripts/aarch64.sh test    build, then under qemu-aarch64: the unit tests; a
#                              small study end to end through the local executor
#                              (pretokenize stages, two trained runs, the report)
#                              and one of its runs in bf16-mixed; and every loss of
#                              these, step by step, against the same runs on this
#                              machine's own build (the first step's bit for bit)
#
# On an aarch64 machine the same commands build and test natively (no qemu).
# Each exits non-zero on the first failure. What they need is installed on first
# use (as root; otherwise they say what to install): Debian's aarch64 cross
# compilers (SQLite, zstd, Oniguruma and mimalloc are C code built for the
# target), qemu-user-static, and the Rust target.
#
# How a study's jobs run under emulation: sweep starts each job's script, which
# starts `sweep train`, the aarch64 binary, as a child process. User-mode qemu
# runs one program; its children are started by the kernel, which runs an
# aarch64 binary only through binfmt_misc. So `test` registers qemu with
# binfmt_misc (mounting it where it is not mounted; both need root) and
# removes the entry again at exit. No part of sweep knows it runs emulated:
# the jobs start exactly as on a GH200 node. Where binfmt_misc cannot be
# used, `test` says so and fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

TARGET=aarch64-unknown-linux-gnu
TARGET_DIR=target/aarch64          # its own: a cross build never touches target/release
BIN=$TARGET_DIR/$TARGET/release/sweep
SYSROOT=/usr/aarch64-linux-gnu     # Debian's aarch64 C library, for qemu
QEMU=/usr/bin/qemu-aarch64-static
BINFMT=/proc/sys/fs/binfmt_misc
BINFMT_ENTRY=sweep-aarch64

log() { echo "aarch64: $*" >&2; }
fail() { log "$*"; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# The cross toolchain: C and C++ compilers for the target, qemu, the Rust target.
# On an aarch64 machine: nothing (the same commands build and run natively).
NATIVE=0
[[ $(uname -m) == aarch64 ]] && NATIVE=1
toolchain() {
    [[ $NATIVE -eq 1 ]] && return
    local missing=()
    command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
    command -v aarch64-linux-gnu-g++ >/dev/null || missing+=(g++-aarch64-linux-gnu)
    [[ -e $SYSROOT/include/stdio.h ]] || missing+=(libc6-dev-arm64-cross)
    [[ -x $QEMU ]] || missing+=(qemu-user-static)
    if [[ ${#missing[@]} -gt 0 ]]; then
        [[ $(id -u) -eq 0 ]] || fail "missing ${missing[*]}: run as root, or apt-get install ${missing[*]}"
        log "installing ${missing[*]} from Debian packages"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
            >/tmp/sweep-aarch64-apt.log 2>&1 || { cat /tmp/sweep-aarch64-apt.log >&2; fail "apt-get install failed"; }
    fi
    if ! rustup target list --installed | grep -qx $TARGET; then
        log "adding the Rust target $TARGET"
        rustup target add $TARGET >&2
    fi
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
    export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    # `cargo test --target` runs the test binaries through qemu; QEMU_LD_PREFIX
    # is where qemu finds the target's dynamic loader and C library, for the
    # binary cargo starts and for every aarch64 program that one starts.
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=$QEMU
    export QEMU_LD_PREFIX=$SYSROOT
}

build() {
    toolchain
    local started=$SECONDS
    cargo build --release --locked --target $TARGET --target-dir $TARGET_DIR
    log "built $BIN in $(( SECONDS - started )) s: $(du -h "$BIN" | cut -f1), $(file -b "$BIN" | cut -d, -f1-2)"
}

# `check --features cuda,nccl`: the GPU build, with this machine's CUDA
# toolkit (its nvcc compiles candle's kernels to PTX, which is the same for
# every host architecture) and compute capability 9.0 unless
# CUDA_COMPUTE_CAP says otherwise.
check() {
    toolchain
    if [[ " $* " == *cuda* || " $* " == *nccl* || " $* " == *flash-attn* ]]; then
        [[ -n ${CUDA_HOME:-} ]] || eval "$(scripts/cuda-toolkit.sh)"
        export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
    fi
    local started=$SECONDS
    cargo check --locked --all-targets --target $TARGET --target-dir $TARGET_DIR "$@"
    log "type-checked every target${*:+ ($*)} for $TARGET in $(( SECONDS - started )) s"
}

# Lets the kernel start aarch64 programs through qemu, for the study's jobs.
# Leaves an entry that was already there (a machine set up for emulation).
registered=0
register_binfmt() {
    [[ $NATIVE -eq 1 ]] && return
    if [[ ! -e $BINFMT/register ]]; then
        mount -t binfmt_misc binfmt_misc $BINFMT 2>/dev/null ||
            fail "binfmt_misc is not mounted and cannot be (root is needed): the study's jobs, aarch64 programs started by sweep, cannot run here"
    fi
    local entry
    for entry in "$BINFMT"/*; do
        if [[ -f $entry ]] && grep -q '^enabled' "$entry" && grep -q '^magic 7f454c460201010000000000000000000200b700' "$entry"; then
            log "binfmt_misc already starts aarch64 programs ($(basename "$entry"))"
            return
        fi
    done
    # The ELF header of an aarch64 executable (e_machine 0xb7); F: qemu opened
    # now, so it is found from any mount namespace.
    printf ':%s:M::\\x7fELF\\x02\\x01\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x02\\x00\\xb7\\x00:\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\x00\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xff\\xfe\\xff\\xff\\xff:%s:F\n' \
        $BINFMT_ENTRY $QEMU >"$BINFMT/register" 2>/dev/null ||
        fail "cannot register qemu with binfmt_misc (root is needed): the study's jobs, aarch64 programs started by sweep, cannot run here"
    registered=1
    log "registered $QEMU with binfmt_misc as $BINFMT_ENTRY (removed at exit)"
}
unregister_binfmt() {
    [[ $NATIVE -eq 1 ]] && return
    [[ $registered -eq 1 && -e $BINFMT/$BINFMT_ENTRY ]] && echo -1 >"$BINFMT/$BINFMT_ENTRY"
    return 0
}

# The small study: the quickstart's question at a size emulation can run in
# minutes (a tiny model, sequence 64, 6 steps). Run by the given sweep binary
# in the given directory.
write_study() {
    local dir=$1 root=$PWD
    mkdir -p "$dir"
    cat >"$dir/study.toml" <<EOF
name = "aarch64"
description = "On-the-fly vs pretokenized data, a tiny LLaMA, f32: sweep built for aarch64 under qemu"
executor = "local"

[defaults]
dataset = "$root/assets/data/quickstart.parquet"
tokenizer = "$root/assets/tokenizers/mistral-7b/tokenizer.json"
dataset_type = "padding-free"
batch_size = 1
sequence_length = 64
model = "tiny"
precision = "f32"
learning_rate = 1e-3
warmup_steps = 2
training_steps = 6
logging_frequency = 1
seed = 42

[sweep]
name = "{{ 'pretokenized' if pretokenized else 'baseline' }}"

[sweep.grid]
pretokenized = [false, true]

[local]
parallel = 2
threads = 1

[report]
baseline = "baseline"
EOF
}

# Two builds' losses, run by run and step by step (every metrics.jsonl under
# each directory): the first step's (the forward pass of the same weights on
# the same tokens) bit for bit the same, every later one within a relative
# 1e-5. Not all bit for bit: the gemm crate blocks a sum longer than its block
# depth (the output head's backward sums over the vocabulary) at points set by
# each architecture's microkernel, so the gradients' last bits can differ, and
# after the update the losses' (docs/gpu.md, "GH200 (aarch64)").
compare_losses() {
    python3 - "$@" <<'EOF'
import json, pathlib, sys
aarch64, native, expected, what = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def losses(top):
    out = {}
    for metrics in sorted(top.rglob("metrics.jsonl")):
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if "loss" in record and "step" in record:
                out[(str(metrics.parent.relative_to(top)), record["step"])] = record["loss"]
    return out
a, n = losses(aarch64), losses(native)
if len(a) != expected or a.keys() != n.keys():
    sys.exit(f"aarch64: {what}: expected {expected} losses from each build, got {sorted(a)} and {sorted(n)}")
worst, same = 0.0, 0
for key in sorted(a):
    if a[key] == n[key]:
        same += 1
    elif key[1] == 1:
        sys.exit(f"aarch64: {what}: {key[0]}'s first loss differs: {n[key]!r} here, {a[key]!r} on aarch64")
    worst = max(worst, abs(a[key] - n[key]) / abs(n[key]))
    if worst > 1e-5:
        sys.exit(f"aarch64: {what}: {key[0]} step {key[1]}: {n[key]!r} here, {a[key]!r} on aarch64")
print(f"aarch64: {what}: {same} of {len(a)} losses bit for bit the same, the rest within {worst:.1e} (relative)", file=sys.stderr)
EOF
}

test_() {
    build
    register_binfmt
    trap unregister_binfmt EXIT
    local started=$SECONDS
    log "unit tests$([[ $NATIVE -eq 1 ]] || echo ' under qemu')"
    cargo test --release --locked --target $TARGET --target-dir $TARGET_DIR --lib
    log "unit tests passed in $(( SECONDS - started )) s"

    # This machine's own build, to compare the losses with.
    local native_features=()
    command -v mpicc >/dev/null && native_features=(--features mpi)   # as scripts/test.sh builds it
    [[ $NATIVE -eq 1 ]] || cargo build --release --locked "${native_features[@]}"
    scripts/fetch-assets.sh >/dev/null

    local work root=$PWD
    work=$(mktemp -d /tmp/sweep-aarch64.XXXXXX)
    "$BIN" --version | grep -q '^sweep ' || fail "$BIN --version did not run"

    # The study: pretokenize stages, two runs, the report.
    started=$SECONDS
    write_study "$work/aarch64"
    (cd "$work/aarch64" && "$root/$BIN" run study.toml) ||
        fail "the study failed; its runs' logs are in $work/aarch64/results/aarch64"
    log "the study ran in $(( SECONDS - started )) s"
    grep -q '"arch": "aarch64"' "$work/aarch64/results/aarch64/baseline/environment.json" ||
        fail "the aarch64 run's environment.json does not say arch aarch64"

    # bf16-mixed: the baseline run again, through the portable bf16 kernel
    # (the one aarch64 has; SWEEP_CPU_KERNELS=portable here).
    mkdir -p "$work/bf16-aarch64" "$work/bf16-native"
    local config
    for config in "$work/bf16-aarch64/config.toml" "$work/bf16-native/config.toml"; do
        sed -e 's/^precision = .*/precision = "bf16-mixed"/' -e 's/^checkpoint_at_end = .*/checkpoint_at_end = false/' -e 's/^threads = .*/threads = 1/' \
            "$work/aarch64/results/aarch64/baseline/config.toml" >"$config"
    done
    "$root/$BIN" train --config "$work/bf16-aarch64/config.toml" 2>"$work/bf16-aarch64/err" >/dev/null ||
        { cat "$work/bf16-aarch64/err" >&2; fail "bf16-mixed training failed"; }
    grep -q 'through the portable bf16 kernel' "$work/bf16-aarch64/err" ||
        fail "bf16-mixed did not say it ran through the portable kernel"
    log "bf16-mixed trained through the portable kernel"

    if [[ $NATIVE -eq 1 ]]; then
        log "on an aarch64 machine: no other architecture's build to compare the losses with"
    else
        write_study "$work/native"
        (cd "$work/native" && "$root/target/release/sweep" run study.toml >/dev/null) ||
            fail "the same study failed on this machine's own build"
        compare_losses "$work/aarch64/results/aarch64" "$work/native/results/aarch64" 12 "f32, the study's 2 runs"
        SWEEP_CPU_KERNELS=portable "$root/target/release/sweep" train --config "$work/bf16-native/config.toml" \
            >/dev/null 2>&1 || fail "bf16-mixed training failed on this machine's own build"
        compare_losses "$work/bf16-aarch64" "$work/bf16-native" 6 "bf16-mixed, portable kernel"
    fi
    cat "$work/aarch64/results/aarch64/summary.md"
    rm -rf "$work"
}

case ${1:-} in
    build) build ;;
    toolchain) toolchain ;;
    check) shift; check "$@" ;;
    test) test_ ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
