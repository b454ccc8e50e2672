// Rotary position embeddings fused with the move between the projections'
// layout [B, T, H, Q] and attention's [B, H, T, Q] (src/train/network/ops/rope.rs
// holds the CPU twin and the launches). Pairs are (k, k + Q/2); the tables
// are f32 [T_max, Q/2]. A thread takes, in output order, 16 bytes' worth of
// pairs (Lanes: 8 bf16 or 4 f32, one 16-byte load from each half of the
// head) where Q/2 is a multiple of them and x and y are 16-byte aligned, one
// pair otherwise; the same arithmetic for every pair either way.
//
// forward (sign = +1): x [B, T, H, Q] -> y [B, H, T, Q], rotated by +angle;
// backward (sign = -1): dy [B, H, T, Q] -> dx [B, T, H, Q], rotated by -angle.
// `rotate` = 0 only moves (v and its gradient).

// Pair (x1, x2) rotated by the angle of (c, s), or only moved.
__device__ __forceinline__ void rotate_pair(float& x1, float& x2, const float* cos_k, const float* sin_k,
                                            float sign, u32 rotate) {
    if (!rotate) return;
    const float c = *cos_k, s = *sin_k, y1 = x1 * c - sign * x2 * s, y2 = x2 * c + sign * x1 * s;
    x1 = y1;
    x2 = y2;
}

template <typename T>
__device__ void rope(const T* x, T* y, const float* cos_t, const float* sin_t, u32 b, u32 d1,
                     u32 d2, u32 q, float sign, u32 rotate, u32 forward) {
    constexpr u32 L = Lanes<T>::n;
    // Input dims (b, d1, d2, q); output dims (b, d2, d1, q).
    const u32 half = q / 2;
    const bool wide = half % L == 0 && aligned16(x) && aligned16(y);
    const u32 per = wide ? L : 1, chunks = half / per;
    const u64 n = (u64)b * d1 * d2 * chunks;
    for (u64 idx = grid_index(); idx < n; idx += grid_stride()) {
        const u32 k = (u32)(idx % chunks) * per;
        u64 rest = idx / chunks;
        const u32 i = rest % d1; // output dim 2 = input dim 1
        rest /= d1;
        const u32 j = rest % d2; // output dim 1 = input dim 2
        const u64 bi = rest / d2;
        const u64 src = ((bi * d1 + i) * d2 + j) * q + k;
        const u64 dst = ((bi * d2 + j) * d1 + i) * q + k;
        // The position: input dim 1 going forward ([B, T, H, Q]), dim 2 back.
        const u64 at = (u64)(forward ? i : j) * half + k;
        if (wide) {
            const Vec16 a = *(const Vec16*)(x + src), c = *(const Vec16*)(x + src + half);
            Vec16 ya = {}, yc = {};
            for (u32 e = 0; e < L; ++e) {
                float x1 = lane(a, e, x), x2 = lane(c, e, x);
                rotate_pair(x1, x2, cos_t + at + e, sin_t + at + e, sign, rotate);
                set_lane(ya, e, x1, y);
                set_lane(yc, e, x2, y);
            }
            *(Vec16*)(y + dst) = ya;
            *(Vec16*)(y + dst + half) = yc;
        } else {
            float x1 = load(x, src), x2 = load(x, src + half);
            rotate_pair(x1, x2, cos_t + at, sin_t + at, sign, rotate);
            store(y, dst, x1);
            store(y, dst + half, x2);
        }
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
