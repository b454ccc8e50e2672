#!/usr/bin/env bash
# Compiles every CUDA kernel of the trainer (src/train/kernels/*.cu, which
# the trainer compiles at run time with NVRTC after common.cuh) offline with
# nvcc, for a GPU
# architecture, and reports registers, shared memory and spills: a syntax
# error, a register spill or shared memory over the limit is caught here,
# without a GPU, before a GPU machine's time is spent on it.
#
#   scripts/check-kernels.sh [--arch sm_90]
#
# nvcc comes from $CUDA_HOME, else the offline toolkit (scripts/cuda-toolkit.sh,
# installed on first use). Exits non-zero on a compile error or a spill.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ARCH=sm_90
while [ $# -gt 0 ]; do
    case "$1" in
        --arch) ARCH="$2"; shift 2 ;;
        *) echo "usage: scripts/check-kernels.sh [--arch sm_90]" >&2; exit 2 ;;
    esac
done

if [ -z "${CUDA_HOME:-}" ]; then
    eval "$(scripts/cuda-toolkit.sh)"
fi
NVCC="$CUDA_HOME/bin/nvcc"
[ -x "$NVCC" ] || { echo "check-kernels: no nvcc at $NVCC" >&2; exit 1; }

shopt -s nullglob
kernels=(src/train/kernels/*.cu)
[ ${#kernels[@]} -gt 0 ] || { echo "check-kernels: no kernels in src/train/kernels" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for k in "${kernels[@]}"; do
    name=$(basename "$k" .cu)
    # NVRTC compiles common.cuh and the file, with no host code: so does this.
    if ! report=$("$NVCC" -arch="$ARCH" -cubin -Xptxas -v -include src/train/kernels/common.cuh \
        -o "$out/$name.cubin" "$k" 2>&1); then
        echo "$k: does not compile for $ARCH" >&2
        echo "$report" >&2
        status=1
        continue
    fi
    # ptxas prints, per function: "Used N registers, ... M bytes smem" and
    # "K bytes stack frame, S bytes spill stores, L bytes spill loads".
    echo "$report" | grep -E "Compiling entry function|Used [0-9]+ registers|spill" | sed "s|^|$name: |"
    if echo "$report" | grep -Eq "[1-9][0-9]* bytes spill (stores|loads)"; then
        echo "$k: registers spill to local memory on $ARCH" >&2
        status=1
    fi
done

# And NVRTC itself, as the trainer calls it (common.cuh in front, CUBIN for
# the architecture): it has none of the headers nvcc includes implicitly, so
# a kernel nvcc accepts may still not compile at run time.
python3 - "$CUDA_HOME" "$ARCH" src/train/kernels/common.cuh "${kernels[@]}" <<'PY' || status=1
import ctypes, glob, os, sys
home, arch, common, kernels = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
lib = lambda name: sorted(glob.glob(os.path.join(home, "lib*", name)))[0]
# NVRTC opens its builtins by name at compile time: load them first.
ctypes.CDLL(lib("libnvrtc-builtins.so.*"), mode=ctypes.RTLD_GLOBAL)
nvrtc = ctypes.CDLL(lib("libnvrtc.so*"))
failed = 0
for k in kernels:
    src = (open(common).read() + open(k).read()).encode()
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(k).encode(), 0, None, None):
        sys.exit(f"{k}: nvrtcCreateProgram failed")
    options = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    rc = nvrtc.nvrtcCompileProgram(prog, 1, options)
    cubin = ctypes.c_size_t()
    if not rc:
        rc = nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)) or (cubin.value == 0)
    if rc:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        print(f"{k}: NVRTC does not compile it:\n{log.value.decode()}", file=sys.stderr)
        failed = 1
    else:
        print(f"{os.path.basename(k)[:-3]}: NVRTC compiles it ({cubin.value} bytes of {arch} CUBIN)")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
sys.exit(failed)
PY
exit $status
