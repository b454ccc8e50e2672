#!/usr/bin/env python3
"""The PyTorch side of the CPU speed comparison (`sweep bench train`).

The same LLaMA-style model as sweep's speed-goal case (preset `small`:
dim 384, 6 layers, 6 query / 2 key-value heads, SwiGLU FFN 1024, untied
head; vocab 8192, seq 256, batch 8; 82.6 MFLOP/token), trained with AdamW
on synthetic batches, in f32 eager and in bf16 autocast, on N threads.
Prints tokens/s and GFLOP/s the way `sweep bench train` does.

    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    /tmp/torch/bin/python scripts/torch-baseline.py --threads 1
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 384, 6, 6, 2, 1024, 8192, 256, 8


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * self.hd, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * self.hd, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * self.hd, bias=False)
        self.wo = nn.Linear(HEADS * self.hd, DIM, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, HEADS, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, KV_HEADS, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, KV_HEADS, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, DIM))


def rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DIM, eps=1e-5)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(DIM, eps=1e-5)
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM, eps=1e-5)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        hd = DIM // HEADS
        freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(SEQ).float(), freqs)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def flops_per_token(model):
    n = sum(p.numel() for p in model.parameters()) - model.tok.weight.numel()
    return 6 * n + 12 * LAYERS * HEADS * (DIM // HEADS) * SEQ


def bench(bf16, steps):
    torch.manual_seed(0)
    model = Llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels = torch.randint(0, VOCAB, (BATCH, SEQ))
    labels[:, 0] = -100
    elapsed = 0.0
    for step in range(steps + 2):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= 2:  # as sweep: two warm-up steps
            elapsed += time.perf_counter() - t
    tokens_per_s = BATCH * SEQ * steps / elapsed
    return tokens_per_s, flops_per_token(model), loss.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"PyTorch {torch.__version__}, {a.threads} thread(s), {a.steps} timed steps after 2 warm-up steps")
    for name, bf16 in [("f32 eager", False), ("bf16 autocast", True)]:
        tps, fpt, loss = bench(bf16, a.steps)
        assert math.isfinite(loss)
        print(f"  {name:<14} {tps:8.0f} tokens/s  {tps * fpt / 1e9:6.1f} GFLOP/s  ({fpt / 1e6:.1f} MFLOP/token)")


if __name__ == "__main__":
    main()
