#!/usr/bin/env python3
"""The PyTorch side of the GPU speed comparison: the same LLaMA-style models
as sweep's presets, trained one step after another on one GPU, eager and
torch.compile'd, printing what `sweep bench train --device cuda` prints.

Models (sweep's presets, see src/config/model.rs):
  ref-1b   dim 2048, 16 layers, 16 / 4 heads, FFN 5632, vocab 131072
  ref-8b   dim 4096, 32 layers, 32 / 8 heads, FFN 14336, vocab 131072
           (`--layers N` keeps the layer shapes with fewer layers, to fit a GPU)

Training as the reference study (and sweep's `precision = "bf16"`): bf16
parameters, gradients and AdamW state, PyTorch's SDPA (flash attention on
Hopper) with GQA, loss = mean cross-entropy over labels != -100, grad-norm
clipping at 1.0. FLOPs per token = 6 N + 12 L H Q T with N the parameters
without the token embedding, MFU against the device's dense bf16 peak.

    python3 scripts/torch-gpu-baseline.py --model ref-1b --batch 8
    python3 scripts/torch-gpu-baseline.py --model ref-8b --layers 8 --batch 2 --json out.json
"""
import argparse
import json
import os
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # dim, layers, heads, kv heads, ffn hidden, vocab, rope theta
    "ref-1b": (2048, 16, 16, 4, 5632, 131072, 500000.0),
    "ref-8b": (4096, 32, 32, 8, 14336, 131072, 500000.0),
}
# Dense bf16 peak FLOP/s, as sweep's table (src/train/run/metrics.rs).
PEAK = {"H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12, "B200": 2250e12}


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q = self.wq(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, d))


def rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.attention = Attention(dim, heads, kv_heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, dim, layers, heads, kv_heads, ffn, vocab, theta, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        freqs = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids):
        x = self.tok(ids)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.output(self.norm(x))


def peak_flops(name, override):
    if override:
        return override
    for key, value in PEAK.items():
        if key in name.upper():
            return value
    raise SystemExit(f"no peak FLOPs known for {name}; pass --peak-flops")


def run(args, compiled):
    dim, layers, heads, kv_heads, ffn, vocab, theta = PRESETS[args.model]
    layers = args.layers or layers
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    model = Llama(dim, layers, heads, kv_heads, ffn, vocab, theta, args.seq).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    step_fn = torch.compile(model) if compiled else model
    n = sum(p.numel() for p in model.parameters()) - model.tok.weight.numel()
    flops_per_token = 6 * n + 12 * layers * heads * (dim // heads) * args.seq
    ids = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
    labels = torch.randint(0, vocab, (args.batch, args.seq), device="cuda")
    labels[:, 0] = -100
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        logits = step_fn(ids)
        loss = F.cross_entropy(logits.view(-1, vocab).float(), labels.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    assert math.isfinite(loss.item())
    step_s = sum(times) / len(times)
    tokens_per_s = args.batch * args.seq / step_s
    peak = peak_flops(torch.cuda.get_device_name(), args.peak_flops)
    return {
        "implementation": "torch.compile" if compiled else "PyTorch eager",
        "model": args.model + (f" ({layers} layers)" if args.layers else ""),
        "batch": args.batch,
        "seq": args.seq,
        "tokens_per_second": tokens_per_s,
        "mfu_pct": 100 * tokens_per_s * flops_per_token / peak,
        "tflops": tokens_per_s * flops_per_token / 1e12,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
        "step_s": step_s,
        "params": n + model.tok.weight.numel(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(PRESETS), default="ref-1b")
    p.add_argument("--layers", type=int, default=0, help="fewer layers of the same shape (0: the preset's)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-flops", type=float, default=0.0)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.cuda.get_device_name()
    print(f"PyTorch {torch.__version__} on {device}: {a.steps} timed steps after {a.warmup} warm-up steps")
    rows = []
    for compiled in [False] if a.no_compile else [False, True]:
        r = run(a, compiled)
        r["device"] = device
        rows.append(r)
        print(
            f"  {r['implementation']:<14} {r['model']:<20} batch {r['batch']}: {r['tokens_per_second']:9.0f} tokens/s"
            f"  MFU {r['mfu_pct']:5.1f}%  {r['tflops']:6.1f} TFLOP/s  peak {r['peak_memory_gb']:5.1f} GiB"
        )
        torch.cuda.empty_cache()
        # After each row, not at the end: a run cut off during
        # torch.compile (minutes on a lease) keeps eager's figures.
        if a.json:
            with open(a.json + ".part", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(a.json + ".part", a.json)


if __name__ == "__main__":
    main()
