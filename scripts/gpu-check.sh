#!/usr/bin/env bash
# On a GPU machine (no Rust there): the GPU build's tests, the train-step
# benchmark beside PyTorch, and the GPU quickstart, from the artifacts that
# `scripts/build-gpu.sh --tests` made on a build machine and that were carried
# here (target/gpu/{sweep,it}-<features>-sm<cap>.xz and target/gpu/BUILD_ROOT).
#
#   scripts/gpu-check.sh [tests] [bench] [quickstart]   (default: all three)
#
# Figures and logs go to $OUT (default results/gpu-check/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-results/gpu-check}
FEATURES=${FEATURES:-flash-attn}
CAP=${CAP:-90}
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(tests bench quickstart)
mkdir -p "$OUT" target/gpu/release

# The binaries, unpacked where the test binary expects them: the repository
# it was built in, linked to this copy when the paths differ.
built_in=$(cat target/gpu/BUILD_ROOT)
if [[ $built_in != "$PWD" && ! -e $built_in ]]; then
    mkdir -p "$(dirname "$built_in")"
    ln -s "$PWD" "$built_in"
fi
unpack() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; chmod +x "$2"; }
unpack "target/gpu/sweep-$FEATURES-sm$CAP.xz" target/gpu/release/sweep
SWEEP=$PWD/target/gpu/release/sweep

# CUDA's runtime libraries from the Python environment's NVIDIA packages.
LD_LIBRARY_PATH=$(python3 -c 'import nvidia, os
print(":".join(sorted({os.path.join(r, d) for p in nvidia.__path__ for r, ds, _ in os.walk(p) for d in ds if d == "lib"})))')${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
nvidia-smi -L | tee "$OUT/device.txt"
"$SWEEP" --version | tee -a "$OUT/device.txt"

# Each step runs even when an earlier one failed; the exit status says
# whether any did.
status=0
for step in "${STEPS[@]}"; do
    case $step in
        tests)
            unpack "target/gpu/it-$FEATURES-sm$CAP.xz" target/gpu/it
            # One at a time: they share the GPU.
            target/gpu/it --ignored gpu:: --test-threads 1 >"$OUT/tests.txt" 2>&1 || status=1
            tail -n 30 "$OUT/tests.txt"
            ;;
        bench)
            {
                # sweep's own kernels first: each against its CPU twin (a wrong
                # one fails here), their time and the composed ops' beside them.
                "$SWEEP" bench kernels --device cuda --json "$OUT/kernels.json" || status=1
                # The same train steps through candle's composed ops instead,
                # the measure of what the kernels bought.
                SWEEP_CUDA_KERNELS=composed "$SWEEP" bench train --device cuda --layers 8 --only ref-8b --steps 5 || status=1
                # And with the memory pool handing freed memory back to the
                # driver at every sync (the driver's default), the measure of
                # keeping it.
                SWEEP_CUDA_POOL=release "$SWEEP" bench train --device cuda --layers 8 --only ref-8b --steps 5 || status=1
                # The goal's cases: ref-1b and the 8B-shaped model, recorded
                # for bench.json; ref-1b at batch 8 without recomputation, and with it.
                "$SWEEP" bench train --device cuda --layers 8 --steps 5 --json "$OUT/sweep-train.json" || status=1
                "$SWEEP" bench train --device cuda --only ref-1b --steps 5 --recompute blocks || status=1
                # The NCCL path at world size 1 (one GPU allows one rank) against no engine.
                "$SWEEP" bench ddp --device cuda --ranks 1 --engine-at-one --model ref-1b --batch 8 --seq-len 2048 --steps 10 || status=1
                python3 scripts/torch-gpu-baseline.py --model ref-1b --batch 8 --json "$OUT/torch-ref-1b.json" || status=1
                python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 2 --json "$OUT/torch-8b-8l.json" || status=1
                python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 1 --json "$OUT/torch-8b-8l-b1.json" || status=1
            } >"$OUT/bench.txt" 2>&1
            cat "$OUT/bench.txt"
            # Every case of sweep and of PyTorch side by side, with the device,
            # the date and the commit built (docs/gpu-bench.json is the latest).
            python3 - "$OUT" "$(cat target/gpu/BUILD_COMMIT 2>/dev/null || echo unknown)" <<'PY' || status=1
import datetime, glob, json, os, sys
out, commit = sys.argv[1], sys.argv[2]
cases = []
for name in ["sweep-train.json"] + sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "torch-*.json"))):
    path = os.path.join(out, name)
    if os.path.exists(path):
        cases += json.load(open(path))
devices = sorted({c["device"] for c in cases if c.get("device")})
bench = {
    "device": devices[0] if len(devices) == 1 else devices,
    "date": datetime.date.today().isoformat(),
    "commit": commit,
    "cases": cases,
}
json.dump(bench, open(os.path.join(out, "bench.json"), "w"), indent=1)
print(f"bench.json: {len(cases)} cases on {bench['device']}")
PY
            ;;
        quickstart)
            "$SWEEP" run experiments/gpu-quickstart.toml >"$OUT/quickstart.txt" 2>&1 || status=1
            cat results/gpu-quickstart/summary.md >>"$OUT/quickstart.txt" 2>&1 || status=1
            tail -n 40 "$OUT/quickstart.txt"
            # The runs' logs and metrics and the report, without checkpoints or data.
            tar -czf "$OUT/quickstart.tgz" --exclude='checkpoints' --exclude='*.parquet' \
                --exclude='*.arrow' results/gpu-quickstart plots/gpu-quickstart 2>/dev/null || true
            ;;
        *) echo "gpu-check: unknown step $step (tests, bench, quickstart)" >&2; exit 2 ;;
    esac
done
exit $status
