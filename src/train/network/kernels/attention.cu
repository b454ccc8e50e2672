// Attention's backward fused on tensor cores, FlashAttention-2's way: the
// scores never leave the chip (src/train/network/ops/attention.rs holds the
// launches; the tiled backward there is its twin). Two kernels, no atomics,
// so the same bits every run:
// - attention_bwd_dq, a block per 128 query rows of a head: a first pass over
//   the keys the rows see finds each row's log-sum-exp and Σ P∘dP (online,
//   as the softmax kernels do), a second recomputes P and dP and sums
//   dQ = scale·dS K; the row statistics go to `lse` and `delta` for
// - attention_bwd_dkdv, a block per 128 keys of a KV head: over the queries
//   of its group that see them, dV = Pᵀ dO and dK = scale·dSᵀ Q.
// Each warp owns 16 rows (queries or keys). Products take bf16 operands and
// sum in f32 (mma_bf16, common.cuh) whatever the storage; P and dS are
// rounded to bf16 between products, as FlashAttention's backward does.
// q, d_o, dq [B, H, T, D]; k, v, dk, dv [B, KV, T, D]; D a multiple of 16
// up to 128 (the launch checks); lse, delta [B, H, T] f32.

constexpr u32 ATT_ROWS = 128; // rows of a block: 8 warps of 16
constexpr u32 ATT_TILE = 32;  // keys (dq) or queries (dkdv) staged at a time
constexpr u32 ATT_DMAX = 128;
constexpr u32 ATT_PAD = ATT_DMAX + 8; // a staged row's stride: fewer bank conflicts

// Two values of x from element i as a bf16 pair (the lower index in the
// low half, as the fragments want them).
__device__ __forceinline__ u32 bf16_pair(const float* x, u64 i) {
    return (u32)f32_to_bf16(x[i]) | ((u32)f32_to_bf16(x[i + 1]) << 16);
}
__device__ __forceinline__ u32 bf16_pair(const bf16* x, u64 i) {
    if (((u64)(x + i) & 3u) == 0) return *(const u32*)(x + i); // stored as the pair already
    return (u32)x[i] | ((u32)x[i + 1] << 16);
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}
// Staged values (bf16 bits) at (row, col) and (row, col + 1), col even: one
// 4-byte load (the staged arrays are 16-byte aligned, a row 272 bytes).
__device__ __forceinline__ u32 across(const bf16 (*s)[ATT_PAD], u32 row, u32 col) {
    return *(const u32*)&s[row][col];
}

// Rows first..first + ATT_TILE of a [T, D] matrix into `s` as bf16, zeros
// past T; the whole block takes part.
// bf16 rows move 16 bytes at a time where x is 16-byte aligned (d is a
// multiple of 16: so is a row).
template <typename T>
__device__ __forceinline__ void stage(bf16 (*s)[ATT_PAD], const T* x, u32 first, u32 t, u32 d) {
    if (sizeof(T) == 2 && aligned16(x)) {
        for (u32 i = threadIdx.x; i < ATT_TILE * d / 8; i += blockDim.x) {
            const u32 r = i * 8 / d, c = i * 8 % d;
            *(Vec16*)&s[r][c] = first + r < t ? ((const Vec16*)(x + (u64)(first + r) * d))[c / 8] : Vec16{};
        }
        return;
    }
    for (u32 i = threadIdx.x; i < ATT_TILE * d; i += blockDim.x) {
        const u32 r = i / d, c = i % d;
        s[r][c] = first + r < t ? f32_to_bf16(load(x, (u64)(first + r) * d + c)) : (bf16)0;
    }
}

// The A fragment of a warp's 16 rows r0.. of a [T, D] matrix at k-step kk
// of its D columns (rows past T are zeros).
template <typename T>
__device__ __forceinline__ void row_fragment(u32 (&a)[4], const T* x, u32 r0, u32 kk, u32 t, u32 d) {
    const u32 lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (u32 r = 0; r < 4; ++r) {
        const u32 row = r0 + g + 8 * (r % 2), col = kk * 16 + 2 * q + 8 * (r / 2);
        a[r] = row < t ? bf16_pair(x, (u64)row * d + col) : 0u;
    }
}

// acc[j] (16 × 8, n-tile j of ATT_TILE columns) = the warp's 16 rows of x
// times the staged rows' transpose: scores against keys, or dP against
// values. The rows' fragments come from `held` (kept in registers by the
// caller) or, without it, from x one k-step at a time.
template <typename T>
__device__ __forceinline__ void times_staged_t(float (&acc)[ATT_TILE / 8][4], const u32 (*held)[4], const T* x,
                                               u32 r0, const bf16 (*s)[ATT_PAD], u32 t, u32 d) {
    const u32 lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    for (u32 j = 0; j < ATT_TILE / 8; ++j)
        for (u32 c = 0; c < 4; ++c) acc[j][c] = 0.0f;
#pragma unroll
    for (u32 kk = 0; kk < ATT_DMAX / 16; ++kk) {
        if (kk * 16 >= d) break;
        u32 a[4];
        if (held) {
            for (u32 r = 0; r < 4; ++r) a[r] = held[kk][r];
        } else {
            row_fragment(a, x, r0, kk, t, d);
        }
#pragma unroll
        for (u32 j = 0; j < ATT_TILE / 8; ++j)
            mma_bf16(acc[j], a, across(s, 8 * j + g, kk * 16 + 2 * q), across(s, 8 * j + g, kk * 16 + 2 * q + 8));
    }
}

// out (16 × D, n-tile n of 8 columns in out[n]) += x (16 × ATT_TILE, in the
// accumulators' layout, rounded to bf16) times the staged rows: the C
// fragments of two n-tiles are the A fragment of one k-step.
__device__ __forceinline__ void add_times_staged(float (&out)[ATT_DMAX / 8][4], const float (&x)[ATT_TILE / 8][4],
                                                 const bf16 (*s)[ATT_PAD], u32 d) {
    const u32 lane = threadIdx.x % 32;
#pragma unroll
    for (u32 kk = 0; kk < ATT_TILE / 16; ++kk) {
        const u32 a[4] = {pack_bf16(x[2 * kk][0], x[2 * kk][1]), pack_bf16(x[2 * kk][2], x[2 * kk][3]),
                          pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
        for (u32 n = 0; n < ATT_DMAX / 8; ++n) {
            if (n * 8 >= d) break;
            // Rows kk·16 … + 15 at columns n·8 … + 7, down their columns.
            u32 b0, b1;
            ldmatrix_x2_trans(b0, b1, &s[kk * 16 + lane % 16][n * 8]);
            mma_bf16(out[n], a, b0, b1);
        }
    }
}

// Whether a key is seen by a query (both inside the sequence).
__device__ __forceinline__ bool seen(u32 key, u32 query, u32 t, u32 causal) {
    return key < t && query < t && (!causal || key <= query);
}

// Rows r of a warp's 16 (r0 + g, r0 + g + 8) written from the accumulators,
// times `scale`.
template <typename T>
__device__ __forceinline__ void write_rows(T* x, const float (&acc)[ATT_DMAX / 8][4], u32 r0, u32 t, u32 d,
                                           float scale) {
    const u32 lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (u32 n = 0; n < ATT_DMAX / 8; ++n) {
        if (n * 8 >= d) break;
        for (u32 c = 0; c < 4; ++c) {
            const u32 row = r0 + g + 8 * (c / 2), col = n * 8 + 2 * q + c % 2;
            if (row < t) store(x, (u64)row * d + col, acc[n][c] * scale);
        }
    }
}

template <typename T>
__device__ void attention_bwd_dq(const T* q, const T* k, const T* v, const T* d_o, T* dq, float* lse, float* delta,
                                 u32 t, u32 d, u32 heads, u32 kv_heads, u32 causal, float scale) {
    __shared__ __align__(16) bf16 ks[ATT_TILE][ATT_PAD];
    __shared__ __align__(16) bf16 vs[ATT_TILE][ATT_PAD];
    const u32 lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
    const u32 head = blockIdx.y, kv = head / heads * kv_heads + head % heads / (heads / kv_heads);
    const u64 qoff = (u64)head * t * d, koff = (u64)kv * t * d;
    const u32 first = blockIdx.x * ATT_ROWS, r0 = first + threadIdx.x / 32 * 16;
    const u32 keys = causal ? min(t, first + ATT_ROWS) : t;
    u32 qa[ATT_DMAX / 16][4], oa[ATT_DMAX / 16][4]; // the warp's rows, held
#pragma unroll
    for (u32 kk = 0; kk < ATT_DMAX / 16; ++kk) {
        if (kk * 16 >= d) break;
        row_fragment(qa[kk], q + qoff, r0, kk, t, d);
        row_fragment(oa[kk], d_o + qoff, r0, kk, t, d);
    }
    // Rows g and g + 8 of the warp's: their running max, sum of exp and
    // Σ exp·dP over this lane's keys (scores scaled), then over the quad's.
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, u[2] = {0.0f, 0.0f};
    float s[ATT_TILE / 8][4], dp[ATT_TILE / 8][4];
    for (u32 k0 = 0; k0 < keys; k0 += ATT_TILE) {
        __syncthreads(); // the last tile is read
        stage(ks, k + koff, k0, t, d);
        stage(vs, v + koff, k0, t, d);
        __syncthreads();
        if (k0 > r0 + 15 && causal) continue; // the warp's rows see none of them
        times_staged_t(s, qa, q + qoff, r0, ks, t, d);
        times_staged_t(dp, oa, d_o + qoff, r0, vs, t, d);
        for (u32 j = 0; j < ATT_TILE / 8; ++j)
            for (u32 c = 0; c < 4; ++c) {
                const u32 row = r0 + g + 8 * (c / 2), key = k0 + 8 * j + 2 * quad + c % 2;
                if (!seen(key, row, t, causal)) continue;
                const float x = s[j][c] * scale;
                float& mr = m[c / 2];
                if (x > mr) {
                    const float shrink = expf(mr - x);
                    l[c / 2] = l[c / 2] * shrink + 1.0f;
                    u[c / 2] = u[c / 2] * shrink + dp[j][c];
                    mr = x;
                } else {
                    const float e = expf(x - mr);
                    l[c / 2] += e;
                    u[c / 2] += e * dp[j][c];
                }
            }
    }
    float row_lse[2], row_delta[2];
    for (u32 h = 0; h < 2; ++h) {
        float mq = m[h];
        for (int o = 1; o < 4; o <<= 1) mq = fmaxf(mq, __shfl_xor_sync(0xffffffffu, mq, o));
        const float w = l[h] == 0.0f ? 0.0f : expf(m[h] - mq);
        float lq = l[h] * w, uq = u[h] * w;
        for (int o = 1; o < 4; o <<= 1) {
            lq += __shfl_xor_sync(0xffffffffu, lq, o);
            uq += __shfl_xor_sync(0xffffffffu, uq, o);
        }
        // Rows past T see no key: statistics that make every P zero.
        row_lse[h] = lq > 0.0f ? mq + logf(lq) : __int_as_float(0x7f800000);
        row_delta[h] = lq > 0.0f ? uq / lq : 0.0f;
        const u32 row = r0 + g + 8 * h;
        if (quad == 0 && row < t) {
            lse[(u64)head * t + row] = row_lse[h];
            delta[(u64)head * t + row] = row_delta[h];
        }
    }
    float acc[ATT_DMAX / 8][4] = {};
    for (u32 k0 = 0; k0 < keys; k0 += ATT_TILE) {
        __syncthreads();
        stage(ks, k + koff, k0, t, d);
        stage(vs, v + koff, k0, t, d);
        __syncthreads();
        if (k0 > r0 + 15 && causal) continue;
        times_staged_t(s, qa, q + qoff, r0, ks, t, d);
        times_staged_t(dp, oa, d_o + qoff, r0, vs, t, d);
        for (u32 j = 0; j < ATT_TILE / 8; ++j)
            for (u32 c = 0; c < 4; ++c) {
                const u32 row = r0 + g + 8 * (c / 2), key = k0 + 8 * j + 2 * quad + c % 2;
                const float p = seen(key, row, t, causal) ? expf(s[j][c] * scale - row_lse[c / 2]) : 0.0f;
                s[j][c] = p * (dp[j][c] - row_delta[c / 2]); // dS
            }
        add_times_staged(acc, s, ks, d);
    }
    write_rows(dq + qoff, acc, r0, t, d, scale);
}

template <typename T>
__device__ void attention_bwd_dkdv(const T* q, const T* k, const T* v, const T* d_o, const float* lse,
                                   const float* delta, T* dk, T* dv, u32 t, u32 d, u32 heads, u32 kv_heads,
                                   u32 causal, float scale) {
    __shared__ __align__(16) bf16 qs[ATT_TILE][ATT_PAD];
    __shared__ __align__(16) bf16 os[ATT_TILE][ATT_PAD];
    __shared__ float lse_s[ATT_TILE];
    __shared__ float delta_s[ATT_TILE];
    const u32 lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
    const u32 kv = blockIdx.y, rep = heads / kv_heads, batch = kv / kv_heads;
    const u64 koff = (u64)kv * t * d;
    const u32 first = blockIdx.x * ATT_ROWS, r0 = first + threadIdx.x / 32 * 16;
    float dk_acc[ATT_DMAX / 8][4] = {}, dv_acc[ATT_DMAX / 8][4] = {};
    float s[ATT_TILE / 8][4], dp[ATT_TILE / 8][4];
    for (u32 h = 0; h < rep; ++h) {
        const u32 head = batch * heads + kv % kv_heads * rep + h;
        const u64 qoff = (u64)head * t * d;
        for (u32 q0 = causal ? first / ATT_TILE * ATT_TILE : 0; q0 < t; q0 += ATT_TILE) {
            __syncthreads();
            stage(qs, q + qoff, q0, t, d);
            stage(os, d_o + qoff, q0, t, d);
            for (u32 i = threadIdx.x; i < ATT_TILE; i += blockDim.x) {
                lse_s[i] = q0 + i < t ? lse[(u64)head * t + q0 + i] : 0.0f;
                delta_s[i] = q0 + i < t ? delta[(u64)head * t + q0 + i] : 0.0f;
            }
            __syncthreads();
            if (r0 >= t || (causal && r0 > q0 + ATT_TILE - 1)) continue; // no query here sees the warp's keys
            // The warp's keys and values are read again each tile (L1):
            // registers hold the two sums instead.
            times_staged_t(s, (const u32(*)[4]) nullptr, k + koff, r0, qs, t, d);  // Sᵀ: keys × queries
            times_staged_t(dp, (const u32(*)[4]) nullptr, v + koff, r0, os, t, d); // dPᵀ
            for (u32 j = 0; j < ATT_TILE / 8; ++j)
                for (u32 c = 0; c < 4; ++c) {
                    const u32 key = r0 + g + 8 * (c / 2), i = 8 * j + 2 * quad + c % 2;
                    const float p = seen(key, q0 + i, t, causal) ? expf(s[j][c] * scale - lse_s[i]) : 0.0f;
                    s[j][c] = p;
                    dp[j][c] = p * (dp[j][c] - delta_s[i]); // dSᵀ
                }
            add_times_staged(dv_acc, s, os, d);
            add_times_staged(dk_acc, dp, qs, d);
        }
    }
    write_rows(dk + koff, dk_acc, r0, t, d, scale);
    write_rows(dv + koff, dv_acc, r0, t, d, 1.0f);
}

#define ATTENTION_ENTRY_POINTS(NAME, T)                                                                            \
    extern "C" __global__ void attention_bwd_dq_##NAME(const T* q, const T* k, const T* v, const T* d_o, T* dq,  \
                                                        float* lse, float* delta, u32 t, u32 d, u32 heads,        \
                                                        u32 kv_heads, u32 causal, float scale) {                 \
        attention_bwd_dq(q, k, v, d_o, dq, lse, delta, t, d, heads, kv_heads, causal, scale);                     \
    }                                                                                                              \
    extern "C" __global__ void attention_bwd_dkdv_##NAME(const T* q, const T* k, const T* v, const T* d_o,       \
                                                          const float* lse, const float* delta, T* dk, T* dv,     \
                                                          u32 t, u32 d, u32 heads, u32 kv_heads, u32 causal,      \
                                                          float scale) {                                          \
        attention_bwd_dkdv(q, k, v, d_o, lse, delta, dk, dv, t, d, heads, kv_heads, causal, scale);               \
    }
ATTENTION_ENTRY_POINTS(f32, float)
ATTENTION_ENTRY_POINTS(bf16, bf16)
