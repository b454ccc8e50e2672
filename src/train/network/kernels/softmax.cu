// Attention's scaled softmax over rows of scores and its backward
// (src/train/network/ops/softmax.rs holds the CPU twins and the launches). One block
// per row of `keys` scores, f32 arithmetic whatever the storage.
//
// Rows are query positions offset + row % period (the queries of a KV head's
// group stacked, a tile of `period` positions starting at `offset`): a causal
// row sees keys 0..=position and gets probability 0 past them.

// A row is read and written by groups of 16 bytes' worth of values
// (Group, common.cuh), the last keys % lanes values one each. At 2,048 keys
// a bf16 row is one 16-byte load per thread of a 256-thread block.
//
// The first HELD groups of each thread stay in registers between the pass
// that finds the row's maximum and sum and the pass that writes the
// probabilities, so a row of up to HELD groups a thread is read from memory
// once (a tile's scores are far larger than L2: a second read was a third of
// the kernel's traffic). Groups wholly past a causal row's position are
// written as zeros without being read. The arithmetic is the same either way.
constexpr u32 HELD = 4;

// Probabilities of group j of a row from its scores `in`.
template <typename T>
__device__ __forceinline__ void softmax_group(const Group<T>& in, const T* x, T* p, u32 j, u32 visible,
                                              float scale, RowStats stats, float inv, bool wide) {
    constexpr u32 L = Lanes<T>::n;
    Group<T> out(wide);
    for (u32 k = 0; k < L; ++k) {
        const u32 i = j * L + k;
        out.put(p, j, k, i < visible ? expf(in.at(x, j, k) * scale - stats.max) * inv : 0.0f);
    }
    out.write(p, j);
}

template <typename T>
__device__ void softmax_fwd(const T* scores, T* probs, u32 keys, u32 period, u32 offset, u32 causal,
                            float scale) {
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    constexpr u32 L = Lanes<T>::n;
    const u64 row = blockIdx.x;
    const T* x = scores + row * keys;
    T* p = probs + row * keys;
    const u32 position = offset + (u32)(row % period);
    const u32 visible = causal && position < keys ? position + 1 : keys;
    const bool wide = aligned16(x) && aligned16(p);
    const u32 seen = visible / L, groups = keys / L;
    Vec16 held[HELD]; // registers only where both loops over it unroll
    float m = NEG_INF, s = 0.0f;
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < seen) {
            Group<T> g(wide);
            g.read(x, j);
            held[r] = g.w;
            for (u32 k = 0; k < L; ++k) online_add(m, s, g.at(x, j, k) * scale);
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < seen; j += blockDim.x) {
        Group<T> g(wide);
        g.read(x, j);
        for (u32 k = 0; k < L; ++k) online_add(m, s, g.at(x, j, k) * scale);
    }
    for (u32 i = seen * L + threadIdx.x; i < visible; i += blockDim.x) online_add(m, s, load(x, i) * scale);
    const RowStats stats = block_max_and_sum(m, s, scratch, maxes);
    const float inv = 1.0f / stats.sum;
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < groups) {
            Group<T> in(wide);
            if (j < seen) in.w = held[r];
            else if (j * L < visible) in.read(x, j);
            softmax_group(in, x, p, j, visible, scale, stats, inv, wide);
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < groups; j += blockDim.x) {
        Group<T> in(wide);
        if (j * L < visible) in.read(x, j);
        softmax_group(in, x, p, j, visible, scale, stats, inv, wide);
    }
    for (u32 i = groups * L + threadIdx.x; i < keys; i += blockDim.x) {
        store(p, i, i < visible ? expf(load(x, i) * scale - stats.max) * inv : 0.0f);
    }
}

// dS = scale * P o (dP - rowsum(P o dP)); entries past a causal row's
// position have P = 0, so their gradient is 0 without a mask. As in the
// forward, each thread's first HELD groups of P and dP stay in registers
// between the row's sum and the pass that writes dS: a row of up to HELD
// groups a thread is read once, where it was read twice.
template <typename T>
__device__ void softmax_bwd(const T* probs, const T* dprobs, T* dscores, u32 keys, float scale) {
    __shared__ float scratch[32];
    constexpr u32 L = Lanes<T>::n;
    const u64 row = blockIdx.x;
    const T* p = probs + row * keys;
    const T* dp = dprobs + row * keys;
    T* ds = dscores + row * keys;
    const bool wide = aligned16(p) && aligned16(dp) && aligned16(ds);
    const u32 groups = keys / L;
    Vec16 held_p[HELD], held_dp[HELD]; // registers only where both loops over them unroll
    float dot = 0.0f;
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < groups) {
            Group<T> a(wide), b(wide);
            a.read(p, j);
            b.read(dp, j);
            held_p[r] = a.w;
            held_dp[r] = b.w;
            for (u32 k = 0; k < L; ++k) dot += a.at(p, j, k) * b.at(dp, j, k);
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < groups; j += blockDim.x) {
        Group<T> a(wide), b(wide);
        a.read(p, j);
        b.read(dp, j);
        for (u32 k = 0; k < L; ++k) dot += a.at(p, j, k) * b.at(dp, j, k);
    }
    for (u32 i = groups * L + threadIdx.x; i < keys; i += blockDim.x) dot += load(p, i) * load(dp, i);
    dot = block_sum(dot, scratch);
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < groups) {
            Group<T> a(wide), b(wide), out(wide);
            a.w = held_p[r];
            b.w = held_dp[r];
            for (u32 k = 0; k < L; ++k) out.put(ds, j, k, scale * a.at(p, j, k) * (b.at(dp, j, k) - dot));
            out.write(ds, j);
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < groups; j += blockDim.x) {
        Group<T> a(wide), b(wide), out(wide);
        a.read(p, j);
        b.read(dp, j);
        for (u32 k = 0; k < L; ++k) out.put(ds, j, k, scale * a.at(p, j, k) * (b.at(dp, j, k) - dot));
        out.write(ds, j);
    }
    for (u32 i = groups * L + threadIdx.x; i < keys; i += blockDim.x) {
        store(ds, i, scale * load(p, i) * (load(dp, i) - dot));
    }
}

// The tiled attention backward's two softmax passes in one, given the
// scores S and the probabilities' gradient dP of a tile: P (as the forward
// writes it) and dS = scale * P o (dP - rowsum(P o dP)), reading S and dP
// once where the two kernels read S, then P and dP, and wrote P between.
// rowsum(P o dP) comes from the same online pass as the row's maximum and
// sum: t = sum of exp(x - m) dP, rescaled with the sum when the maximum
// moves, so dot = t / sum. Entries past a causal row's position are written
// as zeros unread, in both outputs.
__device__ __forceinline__ void online_add_dot(float& m, float& s, float& t, float x, float g) {
    if (x > m) {
        const float c = expf(m - x);
        s = s * c + 1.0f;
        t = t * c + g;
        m = x;
    } else {
        const float e = expf(x - m);
        s += e;
        t += e * g;
    }
}

template <typename T>
__device__ __forceinline__ void softmax_fwd_bwd_group(const Group<T>& in, const Group<T>& din, const T* x,
                                                      const T* g, T* p, T* ds, u32 j, u32 visible,
                                                      float scale, float max, float inv, float dot,
                                                      bool wide) {
    constexpr u32 L = Lanes<T>::n;
    Group<T> out(wide), dout(wide);
    for (u32 k = 0; k < L; ++k) {
        const bool seen = j * L + k < visible;
        const float pv = seen ? expf(in.at(x, j, k) * scale - max) * inv : 0.0f;
        out.put(p, j, k, pv);
        dout.put(ds, j, k, seen ? scale * pv * (din.at(g, j, k) - dot) : 0.0f);
    }
    out.write(p, j);
    dout.write(ds, j);
}

template <typename T>
__device__ void softmax_fwd_bwd(const T* scores, const T* dprobs, T* probs, T* dscores, u32 keys, u32 period,
                                u32 offset, u32 causal, float scale) {
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    constexpr u32 L = Lanes<T>::n;
    const u64 row = blockIdx.x;
    const T* x = scores + row * keys;
    const T* g = dprobs + row * keys;
    T* p = probs + row * keys;
    T* ds = dscores + row * keys;
    const u32 position = offset + (u32)(row % period);
    const u32 visible = causal && position < keys ? position + 1 : keys;
    const bool wide = aligned16(x) && aligned16(g) && aligned16(p) && aligned16(ds);
    const u32 seen = visible / L, groups = keys / L;
    Vec16 held_x[HELD], held_g[HELD]; // registers only where both loops over them unroll
    float m = NEG_INF, s = 0.0f, t = 0.0f;
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < seen) {
            Group<T> a(wide), b(wide);
            a.read(x, j);
            b.read(g, j);
            held_x[r] = a.w;
            held_g[r] = b.w;
            for (u32 k = 0; k < L; ++k) online_add_dot(m, s, t, a.at(x, j, k) * scale, b.at(g, j, k));
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < seen; j += blockDim.x) {
        Group<T> a(wide), b(wide);
        a.read(x, j);
        b.read(g, j);
        for (u32 k = 0; k < L; ++k) online_add_dot(m, s, t, a.at(x, j, k) * scale, b.at(g, j, k));
    }
    for (u32 i = seen * L + threadIdx.x; i < visible; i += blockDim.x)
        online_add_dot(m, s, t, load(x, i) * scale, load(g, i));
    const RowStats stats = block_max_and_sum(m, s, scratch, maxes);
    const float inv = 1.0f / stats.sum;
    const float dot = block_sum(s == 0.0f ? 0.0f : t * expf(m - stats.max), scratch) * inv;
#pragma unroll
    for (u32 r = 0; r < HELD; ++r) {
        const u32 j = threadIdx.x + r * blockDim.x;
        if (j < groups) {
            Group<T> a(wide), b(wide);
            if (j < seen) {
                a.w = held_x[r];
                b.w = held_g[r];
            } else if (j * L < visible) {
                a.read(x, j);
                b.read(g, j);
            }
            softmax_fwd_bwd_group(a, b, x, g, p, ds, j, visible, scale, stats.max, inv, dot, wide);
        }
    }
    for (u32 j = threadIdx.x + HELD * blockDim.x; j < groups; j += blockDim.x) {
        Group<T> a(wide), b(wide);
        if (j * L < visible) {
            a.read(x, j);
            b.read(g, j);
        }
        softmax_fwd_bwd_group(a, b, x, g, p, ds, j, visible, scale, stats.max, inv, dot, wide);
    }
    for (u32 i = groups * L + threadIdx.x; i < keys; i += blockDim.x) {
        const bool seen_i = i < visible;
        const float pv = seen_i ? expf(load(x, i) * scale - stats.max) * inv : 0.0f;
        store(p, i, pv);
        store(ds, i, seen_i ? scale * pv * (load(g, i) - dot) : 0.0f);
    }
}

extern "C" __global__ void softmax_fwd_f32(const float* scores, float* probs, u32 keys, u32 period, u32 offset,
                                           u32 causal, float scale) {
    softmax_fwd(scores, probs, keys, period, offset, causal, scale);
}
extern "C" __global__ void softmax_fwd_bf16(const bf16* scores, bf16* probs, u32 keys, u32 period, u32 offset,
                                            u32 causal, float scale) {
    softmax_fwd(scores, probs, keys, period, offset, causal, scale);
}
extern "C" __global__ void softmax_bwd_f32(const float* probs, const float* dprobs, float* dscores, u32 keys,
                                           float scale) {
    softmax_bwd(probs, dprobs, dscores, keys, scale);
}
extern "C" __global__ void softmax_bwd_bf16(const bf16* probs, const bf16* dprobs, bf16* dscores, u32 keys,
                                            float scale) {
    softmax_bwd(probs, dprobs, dscores, keys, scale);
}
extern "C" __global__ void softmax_fwd_bwd_f32(const float* scores, const float* dprobs, float* probs,
                                               float* dscores, u32 keys, u32 period, u32 offset, u32 causal,
                                               float scale) {
    softmax_fwd_bwd(scores, dprobs, probs, dscores, keys, period, offset, causal, scale);
}
extern "C" __global__ void softmax_fwd_bwd_bf16(const bf16* scores, const bf16* dprobs, bf16* probs,
                                                bf16* dscores, u32 keys, u32 period, u32 offset, u32 causal,
                                                float scale) {
    softmax_fwd_bwd(scores, dprobs, probs, dscores, keys, period, offset, causal, scale);
}
