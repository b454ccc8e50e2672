#!/usr/bin/env bash
# An offline CUDA 13.0 toolkit for building sweep's `cuda` and `flash-attn`
# features on a machine with no system CUDA, no GPU and no network but PyPI:
# NVIDIA's own wheels, pinned by version and sha256, unpacked into a
# project-local folder and arranged like a toolkit install.
#
#   scripts/cuda-toolkit.sh                  install (idempotent), then print the environment
#   eval "$(scripts/cuda-toolkit.sh)"        ... and use it in this shell
#   scripts/cuda-toolkit.sh --arch aarch64   for that architecture (default: this machine's,
#                                            x86_64 or aarch64, as `uname -m` says)
#
# Where: $SWEEP_CUDA_DIR (default .cuda/ in the repository, ignored by git);
# another architecture than this machine's in a folder of its own, <dir>/<arch>/.
# On an aarch64 machine (a GH200 node) the toolkit is the aarch64 one, nvcc
# included. Another architecture's programs (nvcc) cannot run here, so for it
# this prints only where cargo's link of that target finds its libraries
# (CARGO_TARGET_<ARCH>_UNKNOWN_LINUX_GNU_RUSTFLAGS), for a cross build beside
# this machine's own toolkit (docs/gpu.md, "GH200 (aarch64)"):
#   eval "$(scripts/cuda-toolkit.sh)"; eval "$(scripts/cuda-toolkit.sh --arch aarch64)"
#
# What else it arranges:
# - CUDA 13.0, not newer: candle's kernels are loaded as PTX, which driver 580
#   accepts only from toolkits up to 13.0.
# - The wheels ship no `libcuda.so` (the driver's library, which the build links
#   against): a stub with the driver functions cudarc declares is compiled
#   into lib/stubs/. At run time the GPU machine's real driver is used. The
#   same for `libnccl.so` (the `nccl` feature): clusters provide NCCL as a
#   module, PyTorch environments as the nvidia-nccl-cu13 wheel, and a stub
#   saves downloading 300 MB to link against it.
# - candle-flash-attn's build clones CUTLASS v3.5.0 with git. The PyPI wheel
#   nvidia-cutlass 3.5.0.0 carries the same header trees; they are placed in
#   cudaforge's cache folder ($CUDAFORGE_HOME/git/checkouts/cutlass-<commit>/)
#   with HEAD naming that commit, which is what its cache check asks.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOST_ARCH=$(uname -m)
ARCH=$HOST_ARCH
while [[ $# -gt 0 ]]; do
    case $1 in
        --arch) ARCH=${2:-}; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "cuda-toolkit: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

DEST=${SWEEP_CUDA_DIR:-$PWD/.cuda}
[[ $ARCH == "$HOST_ARCH" ]] || DEST=$DEST/$ARCH
TOP=$DEST/toolkit
CUTLASS_COMMIT=7d49e6c7e2f8896c47f586706e67e1fb215529dc   # tag v3.5.0, as candle-flash-attn 0.11 pins it
CUTLASS_DIR=$DEST/cudaforge/git/checkouts/cutlass-${CUTLASS_COMMIT:0:16}

# The same versions for both architectures, each wheel's sha256 its
# architecture's (PyPI's simple index lists them).
case $ARCH in
    x86_64)
        CUDA_TARGET=x86_64-linux
        REQUIREMENTS='nvidia-cuda-nvcc==13.0.88 --hash=sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03
nvidia-nvvm==13.0.88 --hash=sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0
nvidia-cuda-crt==13.0.88 --hash=sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4
nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
nvidia-cuda-cccl==13.0.85 --hash=sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
nvidia-cublas==13.1.0.3 --hash=sha256:ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171
nvidia-curand==10.4.0.35 --hash=sha256:1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc' ;;
    aarch64)
        CUDA_TARGET=sbsa-linux   # NVIDIA's name for aarch64 servers (Grace)
        REQUIREMENTS='nvidia-cuda-nvcc==13.0.88 --hash=sha256:c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f
nvidia-nvvm==13.0.88 --hash=sha256:c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1
nvidia-cuda-crt==13.0.88 --hash=sha256:ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003
nvidia-cuda-runtime==13.0.96 --hash=sha256:ef9bcbe90493a2b9d810e43d249adb3d02e98dd30200d86607d8d02687c43f55
nvidia-cuda-cccl==13.0.85 --hash=sha256:6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:d27f20a0ca67a4bb34268a5e951033496c5b74870b868bacd046b1b8e0c3267b
nvidia-cublas==13.1.0.3 --hash=sha256:c86fc7f7ae36d7528288c5d88098edcb7b02c633d262e7ddbb86b0ad91be5df2
nvidia-curand==10.4.0.35 --hash=sha256:133df5a7509c3e292aaa2b477afd0194f06ce4ea24d714d616ff36439cee349a' ;;
    *) echo "cuda-toolkit: --arch is x86_64 or aarch64, not '$ARCH'" >&2; exit 2 ;;
esac
REQUIREMENTS="$REQUIREMENTS
nvidia-cutlass==3.5.0.0 --hash=sha256:4ec3ab4820dd4ae3ebc2c5ddf23352b0dc90f779435284e7dce822006adc51f6"
# The wheels' platform tags, each named: pip matches them exactly.
PLATFORMS=(--platform any)
for tag in manylinux2010 manylinux_2_12 manylinux2014 manylinux_2_17 manylinux_2_27 manylinux_2_28; do
    PLATFORMS+=(--platform "${tag}_$ARCH")
done
# The stubs are compiled for the toolkit's architecture (scripts/aarch64.sh
# installs Debian's aarch64 cross compiler).
CC=gcc
[[ $ARCH == "$HOST_ARCH" ]] || CC=$ARCH-linux-gnu-gcc

log() { echo "cuda-toolkit: $*" >&2; }

print_env() {
    if [[ $ARCH != "$HOST_ARCH" ]]; then
        # On the target's link line, not in LIBRARY_PATH: a cross GCC ignores it.
        cat <<EOF
export CARGO_TARGET_${ARCH^^}_UNKNOWN_LINUX_GNU_RUSTFLAGS='-L native=$TOP/lib -L native=$TOP/lib/stubs'
EOF
        return
    fi
    cat <<EOF
export CUDA_HOME='$TOP'
export CUDA_PATH='$TOP'
export PATH='$TOP/bin':"\$PATH"
export LIBRARY_PATH='$TOP/lib:$TOP/lib/stubs'\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export CUDAFORGE_HOME='$DEST/cudaforge'
EOF
}

stamp=$(printf '%s nccl-stub' "$REQUIREMENTS" | sha256sum | cut -c1-16)
if [[ -f $DEST/.installed && $(cat "$DEST/.installed") == "$stamp" ]]; then
    print_env
    exit 0
fi

# 1. The wheels, checked against their pinned sha256 (pip refuses any other).
mkdir -p "$DEST/wheels"
printf '%s\n' "$REQUIREMENTS" >"$DEST/requirements.txt"
log "downloading the pinned wheels (~650 MB) into $DEST/wheels"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: "${PLATFORMS[@]}" \
    -r "$DEST/requirements.txt" -d "$DEST/wheels"

# 2. Unpacked side by side: every NVIDIA wheel puts its part under nvidia/cu13/.
rm -rf "$DEST/unpacked" "$TOP"
mkdir -p "$DEST/unpacked"
for w in "$DEST"/wheels/nvidia_cuda_*.whl "$DEST"/wheels/nvidia_nvvm-*.whl \
    "$DEST"/wheels/nvidia_cublas-*.whl "$DEST"/wheels/nvidia_curand-*.whl; do
    unzip -q -o "$w" 'nvidia/*' -d "$DEST/unpacked"
done
mv "$DEST/unpacked/nvidia/cu13" "$TOP"
rm -rf "$DEST/unpacked"
chmod +x "$TOP"/bin/* "$TOP"/nvvm/bin/*

# 3. The layout build scripts expect of a toolkit: lib64, targets/<arch>/, and
#    unversioned library names for the linker.
ln -sfn lib "$TOP/lib64"
mkdir -p "$TOP/targets/$CUDA_TARGET"
ln -sfn ../../include "$TOP/targets/$CUDA_TARGET/include"
ln -sfn ../../lib "$TOP/targets/$CUDA_TARGET/lib"
for lib in cudart cublas cublasLt curand nvrtc; do
    real=$(cd "$TOP/lib" && ls "lib$lib.so."* | sort | head -n1)
    ln -sfn "$real" "$TOP/lib/lib$lib.so"
done

# 4. A link-time stub of the driver library: every cu* function cudarc's
#    driver bindings name, each a function that does nothing.
cargo fetch --locked --quiet
bindings=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -n1)
mkdir -p "$TOP/lib/stubs"
grep -oE 'load::<_F>\("cu[A-Za-z0-9_]+"\)' "$bindings" | sed -E 's/.*\("(cu[A-Za-z0-9_]+)"\)/\1/' | sort -u |
    awk '{ print "int " $1 "(void) { return 999; }" }' >"$TOP/lib/stubs/libcuda_stub.c"
"$CC" -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$TOP/lib/stubs/libcuda.so" "$TOP/lib/stubs/libcuda_stub.c"
log "libcuda.so stub with $(grep -c . "$TOP/lib/stubs/libcuda_stub.c") driver functions"
nccl_bindings=$(dirname "$bindings")/../../nccl/sys/mod.rs
grep -oE 'load::<_F>\("nccl[A-Za-z0-9_]+"\)' "$nccl_bindings" | sed -E 's/.*\("(nccl[A-Za-z0-9_]+)"\)/\1/' | sort -u |
    awk '{ print "int " $1 "(void) { return 999; }" }' >"$TOP/lib/stubs/libnccl_stub.c"
"$CC" -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$TOP/lib/stubs/libnccl.so" "$TOP/lib/stubs/libnccl_stub.c"
log "libnccl.so stub with $(grep -c . "$TOP/lib/stubs/libnccl_stub.c") NCCL functions"

# 5. CUTLASS for candle-flash-attn, where cudaforge's cache check finds it.
rm -rf "$CUTLASS_DIR"
mkdir -p "$CUTLASS_DIR/tools/util"
unzip -q -o "$DEST"/wheels/nvidia_cutlass-*.whl 'cutlass_library/source/include/*' \
    'cutlass_library/source/tools/util/include/*' -d "$DEST/cutlass-wheel"
mv "$DEST/cutlass-wheel/cutlass_library/source/include" "$CUTLASS_DIR/include"
mv "$DEST/cutlass-wheel/cutlass_library/source/tools/util/include" "$CUTLASS_DIR/tools/util/include"
rm -rf "$DEST/cutlass-wheel"
git -C "$CUTLASS_DIR" init --quiet
echo "$CUTLASS_COMMIT" >"$CUTLASS_DIR/.git/HEAD"

# 6. Check: nvcc runs and reports 13.0 (another architecture's: it is one,
#    and so are the stubs).
if [[ $ARCH == "$HOST_ARCH" ]]; then
    version=$("$TOP/bin/nvcc" --version | grep -o 'release [0-9.]*')
    [[ $version == "release 13.0" ]] || { log "unexpected nvcc: $version"; exit 1; }
else
    expected=$([[ $ARCH == aarch64 ]] && echo 'ARM aarch64' || echo 'x86-64')
    for f in bin/nvcc lib/stubs/libcuda.so lib/stubs/libnccl.so; do
        file -b -L "$TOP/$f" | grep -q "$expected" || { log "$f is not $ARCH code: $(file -b -L "$TOP/$f")"; exit 1; }
    done
fi
echo "$stamp" >"$DEST/.installed"
log "CUDA 13.0 toolkit for $ARCH ready in $TOP ($(du -sh "$DEST" | cut -f1) with the wheels)"
print_env
