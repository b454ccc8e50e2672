#!/usr/bin/env bash
# What building, testing and running sweep need beyond the Rust toolchain, installed
# once and idempotently: Python packages for the interoperability tests (pyarrow and
# polars read sweep's Parquet files; `tokenizers` checks our token ids; junitparser
# reads `sweep check --junit` as CI servers do), PyTorch for the foreign-program
# tests, and MPI for
# the data-parallel tests (`--features mpi`: Open MPI, its PMIx for `srun --mpi=pmix`,
# and libclang for the mpi crate's bindings), and headless Chromium for the report
# page's browser tests, from Debian packages.
#
#   scripts/setup.sh            both parts below
#   scripts/setup.sh debian     the Debian packages (the build needs MPI and libclang)
#   scripts/setup.sh python     the Python packages and PyTorch's environment
#                               (downloads only: scripts/test.sh runs it beside the build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PART=${1:-all}
case $PART in
    all | debian | python) ;;
    *) echo "setup: unknown part '$PART' (debian, python, or none for both)" >&2; exit 2 ;;
esac

debian_part() {
    # Open MPI 4.1 and SLURM's pmix plugin share Debian's PMIx; the plugin loads
    # libpmix.so, which only libpmix-dev provides.
    DEB_PACKAGES=(openmpi-bin libopenmpi-dev libpmix-dev libclang-dev chromium)
    missing=()
    command -v mpirun >/dev/null || missing+=(openmpi-bin)
    multiarch=$(gcc -print-multiarch)   # x86_64-linux-gnu, aarch64-linux-gnu
    [ -e "/usr/lib/$multiarch/openmpi/include/mpi.h" ] || missing+=(libopenmpi-dev)
    compgen -G "/usr/lib/$multiarch/pmix2/lib/libpmix.so" >/dev/null || missing+=(libpmix-dev)
    compgen -G "/usr/lib/llvm-*/lib/libclang.so" >/dev/null || missing+=(libclang-dev)
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    if [ ${#missing[@]} -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || { echo "setup: missing ${missing[*]}; run as root or: apt-get install ${DEB_PACKAGES[*]}" >&2; exit 1; }
        echo "setup: installing ${missing[*]} from Debian packages" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/tmp/sweep-setup-apt.log 2>&1 ||
            { cat /tmp/sweep-setup-apt.log >&2; echo "setup: apt-get install failed" >&2; exit 1; }
    fi
}

python_part() {
    PY_PACKAGES=(pyarrow==18.1.0 polars==1.17.1 tokenizers==0.21.0 junitparser==3.2.0)
    if ! python3 -c 'import pyarrow, polars, tokenizers, junitparser' 2>/dev/null; then
        echo "setup: installing ${PY_PACKAGES[*]} from PyPI" >&2
        python3 -m pip install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
    fi

    # PyTorch for the foreign-program tests (tests/it/foreign.rs: a script of
    # ours run as a command sweep, torchrun included), in an environment of its
    # own kept between runs: its Linux wheel imports only with NVIDIA's library
    # wheels beside it, ~5 GB even for the CPU (a few minutes the first time).
    TORCH_VENV=.cache/torch-venv
    # Hugging Face's Trainer (transformers, accelerate, tqdm) beside it: the
    # most common training loop of others, logged by a progress bar.
    TORCH_PACKAGES=(torch==2.5.1 numpy transformers==4.46.3 accelerate==1.1.1 tqdm==4.67.1)
    if ! "$TORCH_VENV/bin/python" -c 'import torch, transformers, accelerate' 2>/dev/null; then
        echo "setup: installing ${TORCH_PACKAGES[*]} into $TORCH_VENV from PyPI (~5 GB)" >&2
        [ -x "$TORCH_VENV/bin/python" ] || python3 -m venv "$TORCH_VENV" ||
            { echo "setup: python3 -m venv failed: install python3-venv" >&2; exit 1; }
        "$TORCH_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${TORCH_PACKAGES[@]}"
    fi
}

[ "$PART" = python ] || debian_part
[ "$PART" = debian ] || python_part
