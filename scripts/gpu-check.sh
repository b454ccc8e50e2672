#!/usr/bin/env bash
# On a GPU machine (no Rust there): the GPU build's checks and measurements,
# from the artifacts that `scripts/build-gpu.sh --tests` made on a build
# machine and that were carried here (target/gpu/{sweep,it}-<features>-sm<cap>.xz,
# target/gpu/BUILD_ROOT and BUILD_COMMIT).
#
#   scripts/gpu-check.sh STEP [STEP ...]      (no step: all of them, in order)
#
# Steps, each meant as one call of a machine lent for minutes at a time (each
# well under 10 minutes on an H100; STEP_BUDGET seconds, default 540, bound a
# step's commands together, STEP:SECONDS one step's, and what a step measured is in $OUT as soon as it
# is measured, so a step cut off still leaves its figures):
#   first-light  the GPU, the libraries the binary needs and which file each
#                resolves to (libraries.txt), `sweep --version`, one train step
#                of a one-layer 8B-shaped model, and the device-open self-check
#                at its shapes: failures and seconds (selfcheck.txt)
#   tests        the GPU integration tests (tests/it/gpu.rs), one at a time
#   kernels      `sweep bench kernels --device cuda`: every kernel against its
#                CPU twin (a wrong kernel fails here), timed beside the
#                composed ops (kernels.json)
#   train        `sweep bench train --device cuda`: the goal's cases (sweep-train.json)
#   torch        scripts/torch-gpu-baseline.py on the same cases, eager and
#                torch.compile (torch-*.json); then bench.json, every case of
#                both side by side with the device, the date and the commit
#   full         the whole ref-8b (8.0B parameters, 64 GB of bf16 states before
#                activations) at batch 1 and 2, sweep beside PyTorch eager
#                (sweep-train-full.json, torch-8b-b*.json), on a GPU with
#                120 GB or more (an H200); skipped, and said, on a smaller one
#   variants     the same steps through the composed ops, with the memory pool
#                released at every sync, with recomputation, and through NCCL
#   sanitizer    compute-sanitizer's memcheck, racecheck, synccheck and initcheck
#                over `sweep bench kernels` on small shapes (sanitizer.txt):
#                every launch of sweep's kernels (and the libraries') checked
#   timeline     the floor: every matrix product of a ref-1b batch-8 step timed alone
#                (`sweep bench gemms`, gemms.json) and the same through PyTorch
#                (gemms-torch.json); then an Nsight Systems timeline of three ref-1b steps (batch 2, 8): kernel and
#                API summaries (timeline-*.csv), where a full Nsight Systems is
#                installed; else each kernel's GPU time in one ref-1b batch-8 step (the one
#                `bench train --parts` records) by Nsight Compute (ncu, gpu__time_duration, caches and clocks left
#                alone), summed by kernel name (kernel-times.csv)
#   quickstart   experiments/gpu-quickstart.toml, its logs and report (quickstart.tgz)
#   goals        docs/performance.md's GPU goals in one call: sweep beside PyTorch
#                eager and torch.compile on ref-1b at batch 8 and the 8B-shaped
#                model (8 layers) at batch 2, and on a GPU of 120 GB or more the
#                whole ref-8b at batch 1 and 2 beside eager; sweep's rows carry
#                watts and joules per token, goals.txt the kernels the device's
#                opening timed and chose; then bench.json
#
# Figures and logs go to $OUT (default results/gpu-check/); the exit status
# says whether any command failed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-results/gpu-check}
FEATURES=${FEATURES:-flash-attn}
CAP=${CAP:-90}
STEP_BUDGET=${STEP_BUDGET:-540}
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(first-light tests kernels sanitizer train torch full variants timeline quickstart)
for step in "${STEPS[@]}"; do
    [[ $step =~ ^[a-z-]+(:[1-9][0-9]*)?$ ]] || { echo "gpu-check: a step is NAME or NAME:SECONDS, not $step" >&2; exit 2; }
    case ${step%%:*} in
        first-light|tests|kernels|sanitizer|train|torch|full|variants|timeline|quickstart|goals) ;;
        *) echo "gpu-check: unknown step $step (see the head of $0)" >&2; exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" target/gpu/release

# The binaries, unpacked where the test binary expects them: the repository
# it was built in, linked to this copy when the paths differ.
built_in=$(cat target/gpu/BUILD_ROOT)
if [[ $built_in != "$PWD" && ! -e $built_in ]]; then
    mkdir -p "$(dirname "$built_in")"
    ln -s "$PWD" "$built_in"
fi
unpack() {
    [[ -x $2 && $2 -nt $1 ]] && return 0
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
    chmod +x "$2"
}
unpack "target/gpu/sweep-$FEATURES-sm$CAP.xz" target/gpu/release/sweep
SWEEP=$PWD/target/gpu/release/sweep

# The libraries a GPU build links (docs/gpu.md), and NVRTC's builtins, which
# NVRTC opens beside itself. They come from the Python environment's NVIDIA
# packages (cu13 wheels) and, after them, the CUDA toolkit's lib64.
LIBS=(libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libnccl.so.2)
lib_dirs=$(python3 -c 'import os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
print(":".join(sorted({os.path.join(r, d) for p in roots for r, ds, _ in os.walk(p) for d in ds if d == "lib"})))' || true)
for dir in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
    [[ -d $dir ]] && lib_dirs=${lib_dirs:+$lib_dirs:}$dir
done
# (No empty entry: the loader reads one as the current directory.)
LD_LIBRARY_PATH=$(IFS=:; printf '%s' "$lib_dirs:${LD_LIBRARY_PATH:-}" | tr -s : | sed 's/^://; s/:$//')
export LD_LIBRARY_PATH

status=0
deadline=0
# run LOG CMD...: CMD with its output appended to $OUT/LOG as it comes, within
# what is left of the step's budget; a failure is recorded, not fatal.
run() {
    local log=$OUT/$1 left=$((deadline - SECONDS))
    shift
    if ((left < 15)); then
        echo "gpu-check: skipped, the step's ${budget} s are spent: $*" | tee -a "$log"
        status=1
        return 0
    fi
    echo "\$ $*" >>"$log"
    local code=0
    timeout --kill-after=10 "$left" "$@" 2>&1 | tee -a "$log" || code=${PIPESTATUS[0]}
    if ((code != 0)); then
        local why=""
        ((code == 124 || code == 137)) && why=" (out of the step's ${budget} s)"
        echo "gpu-check: exit $code$why: $*" | tee -a "$log"
        status=1
    fi
}

# Every case of sweep and of PyTorch side by side, each kernel's check, the
# tests and the sanitizer's verdicts, with the device, the date and the commit
# built (scripts/gpu-bench-json.py).
merge_bench() {
    python3 scripts/gpu-bench-json.py "$OUT" "$(cat target/gpu/BUILD_COMMIT 2>/dev/null || echo unknown)" || status=1
}

# nsys: on the PATH, or inside an Nsight install.
find_nsys() {
    command -v nsys && return 0
    ls /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda/bin/nsys \
        /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -n 1
}

for step in "${STEPS[@]}"; do
    budget=$STEP_BUDGET
    [[ $step == *:* ]] && budget=${step#*:}
    step=${step%%:*}
    deadline=$((SECONDS + budget))
    case $step in
        first-light)
            log=first-light.txt
            run $log nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
            {
                echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
                echo "# ldd: what the binary links"
                ldd "$SWEEP"
                echo "# each library a GPU build needs, as the loader finds it"
                IFS=: read -ra dirs <<<"$LD_LIBRARY_PATH"
                # NVRTC opens its builtins (named by its minor version) beside itself.
                for lib in "${LIBS[@]}" 'libnvrtc-builtins.so.13.*'; do
                    found=""
                    for dir in "${dirs[@]}"; do
                        # shellcheck disable=SC2086 # the builtins' name is a pattern
                        [[ -n $dir ]] && found=$(ls $dir/$lib 2>/dev/null | head -n 1) && [[ -n $found ]] && break
                    done
                    [[ -z $found ]] && found=$(ldconfig -p | awk -v l="$lib" '$1 == l { print $NF; exit }')
                    echo "$lib ${found:-NOT FOUND}"
                done
            } >"$OUT/libraries.txt" 2>&1
            cat "$OUT/libraries.txt"
            run $log "$SWEEP" --version
            # One step of a small model: the device opens, the kernels
            # compile with NVRTC and a step runs.
            run $log "$SWEEP" bench train --device cuda --layers 1 --only 'ref-8b (1 layers)' --steps 1 --json "$OUT/first-step.json"
            # The device-open self-check at ref-8b's shapes: its failures, the
            # kernels' times against their twins, and what each cost.
            grep -h -e 'kernel self-check' -e 'composed twin' \
                "$OUT/$log" >"$OUT/selfcheck.txt" || echo "no self-check line" >"$OUT/selfcheck.txt"
            cat "$OUT/selfcheck.txt"
            ;;
        tests)
            unpack "target/gpu/it-$FEATURES-sm$CAP.xz" target/gpu/it
            # One at a time: they share the GPU.
            run tests.txt target/gpu/it --ignored gpu:: --test-threads 1
            merge_bench
            ;;
        kernels)
            # sweep's own kernels, each against its CPU twin, their time and the
            # composed ops' beside them.
            run kernels.txt "$SWEEP" bench kernels --device cuda --json "$OUT/kernels.json"
            merge_bench
            ;;
        sanitizer)
            # Small shapes: under the sanitizer a launch runs 10-100x slower.
            # NVRTC compiles with line information, so a report names the line.
            cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -n 1 || true)
            if [[ -z $cs ]]; then
                echo "gpu-check: no compute-sanitizer on this machine" | tee -a "$OUT/sanitizer.txt"
                status=1
            else
                # The control for initcheck: a bf16 cuBLAS product read by one
                # element-wise kernel, through PyTorch, nothing of sweep's. A
                # report here is initcheck's own (cuBLAS's Hopper stores), and
                # the same report under sweep's composed ops means nothing more.
                run sanitizer.txt "$cs" --tool initcheck --print-limit 5 python3 -c 'import torch
a = torch.randn(2, 2, 256, 32, device="cuda", dtype=torch.bfloat16)
b = torch.randn(2, 2, 128, 32, device="cuda", dtype=torch.bfloat16)
print("control: cuBLAS product then scale, sum", float(((a @ b.transpose(-1, -2)) * 0.5).float().sum()))'
                for tool in memcheck racecheck synccheck initcheck; do
                    # memcheck's run also keeps the kernels' checks at these shapes.
                    json=()
                    [[ $tool == memcheck ]] && json=(--json "$OUT/kernels-small.json")
                    run sanitizer.txt "$cs" --tool "$tool" --error-exitcode 9 --print-limit 20 \
                        "$SWEEP" bench kernels --device cuda --model tiny --vocab 4096 --tokens 256 --seq-len 128 --repeats 1 "${json[@]}"
                done
                merge_bench
            fi
            ;;
        train)
            # The goal's cases: ref-1b and the 8B-shaped model (8 of its layers).
            # --parts: one more step of each, its time by pass and op.
            run train.txt "$SWEEP" bench train --device cuda --layers 8 --steps 5 --parts --json "$OUT/sweep-train.json"
            merge_bench
            ;;
        torch)
            run torch.txt python3 scripts/torch-gpu-baseline.py --model ref-1b --batch 8 --json "$OUT/torch-ref-1b.json"
            run torch.txt python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 2 --json "$OUT/torch-8b-8l.json"
            run torch.txt python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 1 --json "$OUT/torch-8b-8l-b1.json"
            merge_bench
            ;;
        full)
            mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 | tr -dc 0-9)
            if ((${mib:-0} < 120000)); then
                echo "gpu-check: full: skipped, ref-8b needs more than this GPU's ${mib:-unknown} MiB" | tee -a "$OUT/full.txt"
            else
                run full.txt "$SWEEP" bench train --device cuda --layers 32 --only ref-8b --steps 3 --json "$OUT/sweep-train-full.json"
                merge_bench
                # Eager only: torch.compile of 32 layers takes minutes of a lease.
                for batch in 1 2; do
                    run full.txt python3 scripts/torch-gpu-baseline.py --model ref-8b --batch $batch --steps 5 --no-compile \
                        --json "$OUT/torch-8b-b$batch.json"
                done
                merge_bench
            fi
            ;;
        variants)
            # Through candle's composed ops instead of sweep's kernels: what
            # the kernels bought.
            SWEEP_CUDA_KERNELS=composed run variants.txt "$SWEEP" bench train --device cuda --layers 8 --only ref-8b --steps 5
            # The memory pool handing freed memory back at every sync (the
            # driver's default): what keeping it buys.
            SWEEP_CUDA_POOL=release run variants.txt "$SWEEP" bench train --device cuda --layers 8 --only ref-8b --steps 5
            run variants.txt "$SWEEP" bench train --device cuda --only ref-1b --steps 5 --recompute blocks
            # The NCCL path at world size 1 (one GPU allows one rank) against no engine.
            run variants.txt "$SWEEP" bench ddp --device cuda --ranks 1 --engine-at-one --model ref-1b --batch 8 --seq-len 2048 --steps 10
            ;;
        timeline)
            # What the step's linear layers and head would take if nothing else ran.
            run timeline.txt "$SWEEP" bench gemms --device cuda --json "$OUT/gemms.json"
            # The same shapes through PyTorch's cuBLAS calls.
            run timeline.txt python3 scripts/torch-gemms.py "$OUT/gemms.json" "$OUT/gemms-torch.json"
            # Nsight Compute ships an nsys of its own that records but cannot
            # import what it recorded (no report): only a full Nsight Systems.
            nsys=$(find_nsys || true)
            [[ $nsys == */nsight-compute/* ]] && nsys=""
            ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1 || true)
            if [[ -n $nsys ]]; then
                run timeline.txt "$nsys" profile --trace=cuda,osrt --sample=none --force-overwrite=true \
                    -o /tmp/sweep-timeline "$SWEEP" bench train --device cuda --only 'ref-1b bf16' --steps 3
                for report in cuda_gpu_kern_sum cuda_api_sum cuda_gpu_mem_time_sum; do
                    run timeline.txt "$nsys" stats --force-export=true --report "$report" --format csv \
                        --output "$OUT/timeline" /tmp/sweep-timeline.nsys-rep
                done
            elif [[ -n $ncu ]]; then
                # Every kernel of one step of ref-1b at batch 8, one at a time
                # (ncu serialises them: shares, not the step's time): the step
                # --parts records, which is the CUDA profiler's range.
                run timeline.txt "$ncu" --metrics gpu__time_duration.sum --print-units base --csv \
                    --cache-control none --clock-control none --profile-from-start off --log-file "$OUT/ncu.csv" \
                    "$SWEEP" bench train --device cuda --only 'ref-1b bf16' --batch 8 --steps 1 --parts
                run timeline.txt python3 - "$OUT/ncu.csv" "$OUT/kernel-times.csv" <<'PY'
import csv, sys
total, launches = {}, {}
lines = open(sys.argv[1]).read().splitlines()
header = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
for r in csv.DictReader(lines[header:]):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    ns = float(r["Metric Value"].replace(",", ""))
    name = r["Kernel Name"]
    total[name] = total.get(name, 0.0) + ns
    launches[name] = launches.get(name, 0) + 1
all_ns = sum(total.values()) or 1.0
rows = sorted(total, key=total.get, reverse=True)
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["kernel", "launches", "total_ms", "share_pct"])
    for name in rows:
        w.writerow([name, launches[name], round(total[name] / 1e6, 3), round(100 * total[name] / all_ns, 2)])
print(f"{sum(launches.values())} launches, {all_ns / 1e6:.1f} ms of kernels; the largest:")
for name in rows[:25]:
    print(f"{100 * total[name] / all_ns:6.2f}%  {total[name] / 1e6:9.2f} ms  {launches[name]:6d}  {name[:100]}")
PY
            else
                echo "gpu-check: neither Nsight Systems nor Nsight Compute on this machine" | tee -a "$OUT/timeline.txt"
                status=1
            fi
            ;;
        goals)
            run goals.txt "$SWEEP" bench train --device cuda --only 'ref-1b bf16' --batch 8 --steps 5 \
                --json "$OUT/sweep-train-ref-1b.json"
            run goals.txt "$SWEEP" bench train --device cuda --layers 8 --only 'ref-8b (8 layers)' --batch 2 --steps 5 \
                --json "$OUT/sweep-train-8b-8l.json"
            run goals.txt python3 scripts/torch-gpu-baseline.py --model ref-1b --batch 8 --json "$OUT/torch-ref-1b.json"
            run goals.txt python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 2 --json "$OUT/torch-8b-8l.json"
            mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1 | tr -dc 0-9)
            if ((${mib:-0} >= 120000)); then
                run goals.txt "$SWEEP" bench train --device cuda --layers 32 --only ref-8b --steps 3 --json "$OUT/sweep-train-full.json"
                for batch in 1 2; do
                    run goals.txt python3 scripts/torch-gpu-baseline.py --model ref-8b --batch $batch --steps 5 --no-compile \
                        --json "$OUT/torch-8b-b$batch.json"
                done
            fi
            merge_bench
            ;;
        quickstart)
            run quickstart.txt "$SWEEP" run experiments/gpu-quickstart.toml
            cat results/gpu-quickstart/summary.md >>"$OUT/quickstart.txt" 2>&1 || status=1
            # The runs' logs and metrics and the report, without checkpoints or data.
            tar -czf "$OUT/quickstart.tgz" --exclude='checkpoints' --exclude='*.parquet' \
                --exclude='*.arrow' results/gpu-quickstart plots/gpu-quickstart 2>/dev/null || true
            ;;
    esac
done
exit $status
