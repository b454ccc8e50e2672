// Rotary position embeddings fused with the move between the projections'
// layout [B, T, H, Q] and attention's [B, H, T, Q] (src/train/ops/rope.rs
// holds the CPU twin and the launches). Pairs are (k, k + Q/2); the tables
// are f32 [T_max, Q/2]. One thread per output pair, in output order.
//
// forward (sign = +1): x [B, T, H, Q] -> y [B, H, T, Q], rotated by +angle;
// backward (sign = -1): dy [B, H, T, Q] -> dx [B, T, H, Q], rotated by -angle.
// `rotate` = 0 only moves (v and its gradient).
template <typename T>
__device__ void rope(const T* x, T* y, const float* cos_t, const float* sin_t, u32 b, u32 d1,
                     u32 d2, u32 q, float sign, u32 rotate, u32 forward) {
    // Input dims (b, d1, d2, q); output dims (b, d2, d1, q).
    const u32 half = q / 2;
    const u64 n = (u64)b * d1 * d2 * half;
    for (u64 idx = grid_index(); idx < n; idx += grid_stride()) {
        const u32 k = idx % half;
        u64 rest = idx / half;
        const u32 i = rest % d1; // output dim 2 = input dim 1
        rest /= d1;
        const u32 j = rest % d2; // output dim 1 = input dim 2
        const u64 bi = rest / d2;
        const u64 src = ((bi * d1 + i) * d2 + j) * q + k;
        const u64 dst = ((bi * d2 + j) * d1 + i) * q + k;
        const float x1 = load(x, src), x2 = load(x, src + half);
        if (!rotate) {
            store(y, dst, x1);
            store(y, dst + half, x2);
            continue;
        }
        // The position: input dim 1 going forward ([B, T, H, Q]), dim 2 back.
        const u32 t = forward ? i : j;
        const float c = cos_t[(u64)t * half + k], s = sin_t[(u64)t * half + k];
        store(y, dst, x1 * c - sign * x2 * s);
        store(y, dst + half, x2 * c + sign * x1 * s);
    }
}

#define ROPE(NAME, T)                                                                                \
    extern "C" __global__ void rope_##NAME(const T* x, T* y, const float* cos_t,                     \
                                           const float* sin_t, u32 b, u32 d1, u32 d2, u32 q,         \
                                           float sign, u32 rotate, u32 forward) {                    \
        rope(x, y, cos_t, sin_t, b, d1, d2, q, sign, rotate, forward);                               \
    }
ROPE(f32, float)
ROPE(bf16, bf16)
