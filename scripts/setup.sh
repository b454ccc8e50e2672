#!/usr/bin/env bash
# What building, testing and running sweep need beyond the Rust toolchain, installed
# once and idempotently: Python packages for the interoperability tests (pyarrow and
# polars read sweep's Parquet files; `tokenizers` checks our token ids).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY_PACKAGES=(pyarrow==18.1.0 polars==1.17.1 tokenizers==0.21.0)
if ! python3 -c 'import pyarrow, polars, tokenizers' 2>/dev/null; then
    echo "setup: installing ${PY_PACKAGES[*]} from PyPI" >&2
    python3 -m pip install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
