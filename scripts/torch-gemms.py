#!/usr/bin/env python3
"""The PyTorch side of `sweep bench gemms`: the same products of one training
step (read from its JSON), each timed alone through PyTorch on the same device
and dtype, so that each shape's time through sweep (candle and sweep's own
cuBLAS calls) stands beside PyTorch's (its cuBLAS / cuBLASLt calls).

    python3 scripts/torch-gemms.py gemms.json gemms-torch.json

Per row: x·wᵀ (forward), dy·w (input gradient), sum += dyᵀ·x (weight
gradient, in place), the median of five timed calls after a warm-up (sweep's
default `--repeats`), the device synchronised around each.
"""
import json
import sys
import time

import torch


def main():
    sweep = json.load(open(sys.argv[1]))
    device = "cpu" if sweep["device"] == "cpu" else "cuda"
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[sweep["dtype"]]
    repeats = 5
    rows = []
    for r in sweep["rows"]:
        w = torch.randn(r["out"], r["inp"], device=device, dtype=dtype)
        x = torch.randn(r["rows"], r["inp"], device=device, dtype=dtype)
        dy = torch.randn(r["rows"], r["out"], device=device, dtype=dtype)
        grad = torch.zeros(r["out"], r["inp"], device=device, dtype=dtype)
        product = {
            "forward": lambda: x @ w.t(),
            "input-grad": lambda: dy @ w,
            "weight-grad": lambda: grad.addmm_(dy.t(), x),
        }[r["product"]]
        times = []
        for i in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            product()
            if device == "cuda":
                torch.cuda.synchronize()
            if i > 0:
                times.append(time.perf_counter() - start)
        ms = sorted(times)[len(times) // 2] * 1e3
        flops = 2.0 * r["rows"] * r["inp"] * r["out"]
        rows.append(
            {
                **{k: r[k] for k in ("part", "product", "weights", "rows", "inp", "out", "count")},
                "ms_each": ms,
                "tflop_per_s": flops / (ms * 1e-3) / 1e12,
                "ms_total": ms * r["count"],
                "sweep_ms_each": r["ms_each"],
            }
        )
        print(
            f"{r['part']:<7} {r['product']:<12} {r['weights']:<16} {r['rows']:>6} × {r['inp']:>6} × {r['out']:>6}"
            f"  PyTorch {ms:9.3f} ms  sweep {r['ms_each']:9.3f} ms  ({r['ms_each'] / ms:.2f}×)"
        )
    floor = sum(r["ms_total"] for r in rows)
    out = {
        "implementation": f"PyTorch {torch.__version__}",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": sweep["dtype"],
        "rows": rows,
        "floor_ms": floor,
        "sweep_floor_ms": sweep["floor_ms"],
    }
    json.dump(out, open(sys.argv[2], "w"), indent=1)
    print(f"floor: PyTorch {floor:.1f} ms, sweep {sweep['floor_ms']:.1f} ms ({sweep['floor_ms'] / floor:.2f}×)")


if __name__ == "__main__":
    main()
