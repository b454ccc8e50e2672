#!/usr/bin/env bash
# sweep for NVIDIA GPUs: a release build with candle's CUDA kernels, the
# flash-attention forward kernels and NCCL (data parallelism), for one compute
# capability, packed as a stripped, compressed binary small enough to carry to
# a GPU machine.
#
#   scripts/build-gpu.sh [--cap 90] [--features flash-attn|cuda] [--tests]
#
# Uses the CUDA toolkit in $CUDA_HOME when set (a cluster's module), else the
# offline one of scripts/cuda-toolkit.sh (installed on first use). Output:
#   target/gpu/release/sweep                 the binary
#   target/gpu/sweep-<features>-sm<cap>.xz   stripped and xz-compressed
#   target/gpu/it-<features>-sm<cap>.xz      with --tests: the integration tests
#                                            (scripts/gpu-check.sh runs them on a GPU)
# It needs at run time libcudart.so.13, libcublas.so.13, libcublasLt.so.13,
# libcurand.so.10, libnvrtc.so.13 and libnccl.so.2 (the NVIDIA Python wheels
# carry them; point LD_LIBRARY_PATH at their lib folders) and the driver's
# libcuda.so.1.
#
# The flash-attention kernels take hours of CPU time to compile in full. Two
# things cut that:
# - Only the variants the trainer runs are compiled: the kernels' own switches
#   FLASHATTENTION_DISABLE_{DROPOUT,ALIBI,SOFTCAP,LOCAL} drop the dropout,
#   ALiBi, soft-capping and sliding-window instantiations of every file. nvcc
#   reads them from NVCC_APPEND_FLAGS, with -Xfatbin=-compress-all, which also
#   compresses the machine code (driver 580 loads it).
# - The compiled objects are kept in .cache/ (CANDLE_FLASH_ATTN_BUILD_DIR), so
#   a rebuild after a Rust change compiles no kernel. candle-flash-attn's cache
#   does not see NVCC_APPEND_FLAGS: the folder is named after a hash of them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CAP=90
FEATURES=flash-attn
TESTS=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --cap) CAP=$2; shift 2 ;;
        --features) FEATURES=$2; shift 2 ;;
        --tests) TESTS=1; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "build-gpu: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case $FEATURES in
    cuda|flash-attn) ;;
    *) echo "build-gpu: --features is cuda or flash-attn, not $FEATURES" >&2; exit 2 ;;
esac

if [[ -z ${CUDA_HOME:-} ]]; then
    eval "$(scripts/cuda-toolkit.sh)"
fi
export CUDA_COMPUTE_CAP=$CAP
export NVCC_APPEND_FLAGS="-DFLASHATTENTION_DISABLE_DROPOUT -DFLASHATTENTION_DISABLE_ALIBI -DFLASHATTENTION_DISABLE_SOFTCAP -DFLASHATTENTION_DISABLE_LOCAL -Xfatbin=-compress-all${NVCC_APPEND_FLAGS:+ $NVCC_APPEND_FLAGS}"
flags_id=$(printf '%s' "$NVCC_APPEND_FLAGS" | sha256sum | cut -c1-12)
export CANDLE_FLASH_ATTN_BUILD_DIR=$PWD/.cache/flash-attn-sm$CAP-$flags_id
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}
mkdir -p "$CANDLE_FLASH_ATTN_BUILD_DIR"

echo "build-gpu: sweep --features $FEATURES,nccl for sm_$CAP with $(nvcc --version | grep -o 'release [0-9.]*'), kernel cache $CANDLE_FLASH_ATTN_BUILD_DIR" >&2
started=$(date +%s)
cargo build --release --locked --features "$FEATURES,nccl" --target-dir target/gpu
built=$(( $(date +%s) - started ))

# Stripped and compressed: what travels to a GPU machine.
pack() {
    strip -o "$2.stripped" "$1"
    xz -9 -T0 -c "$2.stripped" >"$2"
    rm "$2.stripped"
    echo "build-gpu: $2 is $(du -h "$2" | cut -f1) ($(du -h "$1" | cut -f1) unstripped)" >&2
    echo "$2"
}
echo "build-gpu: built in ${built} s" >&2
# Test binaries find the repository and the sweep binary where they were built.
echo "$PWD" >target/gpu/BUILD_ROOT
# And the commit they were built from, for the figures' JSON (bench.json).
{ git rev-parse HEAD 2>/dev/null || echo unknown; } | tr -d '\n' >target/gpu/BUILD_COMMIT
git diff --quiet HEAD 2>/dev/null || echo -n "-dirty" >>target/gpu/BUILD_COMMIT
pack target/gpu/release/sweep "target/gpu/sweep-$FEATURES-sm$CAP.xz"
if [[ $TESTS -eq 1 ]]; then
    tests=$(cargo test --release --locked --features "$FEATURES,nccl" --target-dir target/gpu --test it --no-run \
        --message-format json | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
    pack "$tests" "target/gpu/it-$FEATURES-sm$CAP.xz"
fi
