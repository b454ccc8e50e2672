#!/usr/bin/env bash
# The trainer's CUDA code checked without a GPU (CI runs this on every
# submission, from scripts/test.sh):
#
# 1. the kernels (src/train/network/kernels/*.cu): each compiled by NVRTC exactly as
#    the trainer compiles it at run time (the same program text and options,
#    from the Rust code), for sm_80, sm_90 and sm_100; in each CUBIN exactly
#    the entry points of the kernels' table (src/train/network/kernels/mod.rs), each
#    with parameters of the table's sizes where a launch puts them (read by
#    cuobjdump), no spills, no stack, registers and static shared memory
#    within a 256-thread block's — the test `train::network::kernels::offline`; and
#    every op's GPU plan (its launches, grids and arguments as the trainer
#    makes them) run by a host emulation of CUDA under AddressSanitizer,
#    UndefinedBehaviorSanitizer and ThreadSanitizer against the op's CPU
#    twin — the `under_emulation` tests (g++ only);
# 2. the CUDA feature sets type-checked one by one (`cuda`, `cuda,nccl`;
#    with --flash-attn also `cuda,flash-attn` and `cuda,flash-attn,nccl`,
#    whose kernel build takes an hour cold): code that only one feature set
#    compiles is caught;
# 3. with --link, each of those feature sets built (debug, linked against
#    the offline toolkit and its stub driver) and started: `sweep --version`
#    lists the set's features, and with the stub driver in place of a GPU's
#    (every driver call fails) `sweep bench kernels --device cuda` stops at
#    the device with its message, no crash (~15 minutes per set cold: not in
#    CI; before submitting a change to how the device opens).
#
#   scripts/check-gpu-offline.sh [--kernels | --feature-sets] [--flash-attn] [--link] [-- <cargo test args>]
#   scripts/check-gpu-offline.sh --fetch
#
# --kernels runs only step 1 (seconds once built: for a kernel change);
# --feature-sets only steps 2 and 3 (scripts/test.sh runs it beside the
# integration tests: minutes of compiling that needs no cluster).
# --fetch only downloads what the checks need (NVRTC, cuobjdump, nvdisasm and the
# offline toolkit) and exits: scripts/test.sh runs it beside the build.
# NVRTC, cuobjdump and nvdisasm come from NVIDIA's PyPI wheels, pinned by sha256 (no
# CUDA toolkit); step 2 uses the offline toolkit of scripts/cuda-toolkit.sh.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

KERNELS_ONLY=0
SETS_ONLY=0
FETCH_ONLY=0
FLASH=0
LINK=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --kernels) KERNELS_ONLY=1; shift ;;
        --feature-sets) SETS_ONLY=1; shift ;;
        --fetch) FETCH_ONLY=1; shift ;;
        --flash-attn) FLASH=1; shift ;;
        --link) LINK=1; shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "check-gpu-offline: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "check-gpu-offline: $*" >&2; }

# NVRTC 13.0 (the version the trainer is built against), cuobjdump and the
# disassembler it calls for a kernel's instructions.
DEST=${SWEEP_CUDA_DIR:-$PWD/.cuda}/offline
REQUIREMENTS='nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
nvidia-cuda-cuobjdump==13.2.78 --hash=sha256:394087411405b846bf43aa52ca2ff603bbe18b3b8a1257cda0903e23c17bdbf3
nvidia-cuda-nvdisasm==13.2.78 --hash=sha256:b4ebcd3c5046bf8039ac52675b9dbefd843600969649ecaab0a42b0713a61dae'
stamp=$(printf '%s' "$REQUIREMENTS" | sha256sum | cut -c1-16)
if [[ ! -f $DEST/.installed || $(cat "$DEST/.installed") != "$stamp" ]]; then
    log "downloading NVRTC, cuobjdump and nvdisasm (~95 MB) into $DEST"
    rm -rf "$DEST"
    mkdir -p "$DEST/wheels"
    printf '%s\n' "$REQUIREMENTS" >"$DEST/requirements.txt"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
        -r "$DEST/requirements.txt" -d "$DEST/wheels"
    for w in "$DEST"/wheels/*.whl; do
        unzip -q -o "$w" 'nvidia/*' -d "$DEST"
    done
    chmod +x "$DEST"/nvidia/cu13/bin/cuobjdump "$DEST"/nvidia/cu13/bin/nvdisasm
    echo "$stamp" >"$DEST/.installed"
fi
export SWEEP_NVRTC=$DEST/nvidia/cu13/lib/libnvrtc.so.13
export SWEEP_CUOBJDUMP=$DEST/nvidia/cu13/bin/cuobjdump
export SWEEP_REQUIRE_GPU_OFFLINE=1
[[ -f $SWEEP_NVRTC && -x $SWEEP_CUOBJDUMP ]] || { log "no NVRTC or cuobjdump in $DEST"; exit 1; }
if [[ $FETCH_ONLY -eq 1 ]]; then
    scripts/cuda-toolkit.sh >/dev/null
    exit 0
fi

if [[ $SETS_ONLY -eq 0 ]]; then
    started=$(date +%s)
    cargo test --release --locked "$@" --lib -- train::network::kernels under_emulation
    log "kernels checked in $(($(date +%s) - started)) s"
    [[ $KERNELS_ONLY -eq 1 ]] && exit 0
fi

# The feature sets, type-checked against the offline toolkit (candle's own
# kernels are compiled once by nvcc, in target/gpu-check/, and kept there).
if [[ -z ${CUDA_HOME:-} ]]; then
    eval "$(scripts/cuda-toolkit.sh)"
fi
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
sets=(cuda cuda,nccl)
if [[ $FLASH -eq 1 ]]; then
    sets+=(cuda,flash-attn cuda,flash-attn,nccl)
    export NVCC_APPEND_FLAGS="-DFLASHATTENTION_DISABLE_DROPOUT -DFLASHATTENTION_DISABLE_ALIBI -DFLASHATTENTION_DISABLE_SOFTCAP -DFLASHATTENTION_DISABLE_LOCAL -Xfatbin=-compress-all"
    flags_id=$(printf '%s' "$NVCC_APPEND_FLAGS" | sha256sum | cut -c1-12)
    export CANDLE_FLASH_ATTN_BUILD_DIR=$PWD/.cache/flash-attn-sm$CUDA_COMPUTE_CAP-$flags_id
    export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}
    mkdir -p "$CANDLE_FLASH_ATTN_BUILD_DIR"
fi
for features in "${sets[@]}"; do
    started=$(date +%s)
    CARGO_TARGET_DIR=target/gpu-check cargo check --locked --all-targets --features "$features" 2>&1 |
        grep -E '^(warning|error)|^\s+-->' && { log "--features $features: warnings or errors (above)"; exit 1; }
    # cargo check's own status (a failure that printed no line above).
    CARGO_TARGET_DIR=target/gpu-check cargo check --locked --all-targets --features "$features" --quiet
    log "--features $features type-checks ($(($(date +%s) - started)) s)"
done

[[ $LINK -eq 1 ]] || exit 0

# Each set built and started on this machine, which has no GPU: the stub
# driver (scripts/cuda-toolkit.sh) answers every call with an error, as a
# node whose driver cannot reach its GPU does.
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
ln -s "$CUDA_HOME/lib/stubs/libcuda.so" "$stub/libcuda.so.1"
ln -s "$CUDA_HOME/lib/stubs/libnccl.so" "$stub/libnccl.so.2"
for features in "${sets[@]}"; do
    started=$(date +%s)
    CARGO_TARGET_DIR=target/gpu-check cargo build --locked --quiet --features "$features" --bin sweep
    bin=target/gpu-check/debug/sweep
    run() { LD_LIBRARY_PATH="$stub:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin" "$@"; }
    version=$(run --version)
    for f in ${features//,/ }; do
        [[ $version == *"$f"* ]] || { log "--features $features: \`sweep --version\` says '$version', without $f"; exit 1; }
    done
    set +e
    said=$(run bench kernels --device cuda --model tiny --tokens 64 --repeats 1 2>&1)
    code=$?
    set -e
    if [[ $code -eq 0 || $code -gt 128 || $said != *"CUDA device"* ]]; then
        log "--features $features: with the stub driver, bench kernels exited $code, saying:"
        printf '%s\n' "$said" >&2
        exit 1
    fi
    log "--features $features: built and started ($(($(date +%s) - started)) s): '$version'; without a GPU: $(printf '%s' "$said" | tail -n 1)"
done
