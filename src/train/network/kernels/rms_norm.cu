// RMSNorm forward and backward over rows of length d (src/train/network/ops/rms_norm.rs
// holds the CPU twin and the launches). Both passes are bound by memory
// bandwidth: rows move by groups of 16 bytes' worth of values (Group,
// common.cuh) where they are 16-byte aligned, value by value where not, with
// the same arithmetic in the same order either way; the last d % lanes
// values of a row one each.

// y = x * r * w, r = 1 / sqrt(mean(x^2) + eps). One warp per row: rows are
// 2-16 KB, and a warp's shuffles reduce without shared memory or barriers;
// the second read of the row comes from the cache the first filled.
template <typename T>
__device__ void rms_norm_fwd(const T* x, const T* w, T* y, u32 rows, u32 d, float eps) {
    constexpr u32 L = Lanes<T>::n;
    const u32 row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return; // the whole warp leaves together
    const T* xr = x + (u64)row * d;
    T* yr = y + (u64)row * d;
    const bool wide = aligned16(xr) && aligned16(yr) && aligned16(w);
    const u32 groups = d / L;
    float ss = 0.0f;
    for (u32 j = lane; j < groups; j += 32) {
        Group<T> a(wide);
        a.read(xr, j);
        for (u32 k = 0; k < L; ++k) {
            const float v = a.at(xr, j, k);
            ss += v * v;
        }
    }
    for (u32 i = groups * L + lane; i < d; i += 32) {
        const float v = load(xr, i);
        ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    for (u32 j = lane; j < groups; j += 32) {
        Group<T> a(wide), g(wide), out(wide);
        a.read(xr, j);
        g.read(w, j);
        for (u32 k = 0; k < L; ++k) out.put(yr, j, k, a.at(xr, j, k) * r * g.at(w, j, k));
        out.write(yr, j);
    }
    for (u32 i = groups * L + lane; i < d; i += 32) store(yr, i, load(xr, i) * r * load(w, i));
}

// The backward reads x and dy once: dx = r (w dy) - x r^3 mean(x w dy) per
// row, and dw's partial sums over a slab of rows (sum of dy x r) in the same
// pass. Block s takes rows s*per.. below `rows`; thread t the groups t,
// t + blockDim, … of every row, so it alone sums their dw, in row order (no
// atomics: the same bits every run). Its first NORM_HELD groups of a row stay
// in registers between the row's sums and its dx (a bf16 row of up to 4,096
// values is read once), and their dw sums too; the groups past them are read
// again and summed in the thread's own entries of `partial`.
constexpr u32 NORM_HELD = 2;

template <typename T>
__device__ void rms_norm_bwd(const T* x, const T* w, const T* dy, T* dx, float* partial, u32 rows,
                             u32 d, u32 per, float eps) {
    __shared__ float scratch[32];
    constexpr u32 L = Lanes<T>::n;
    const u32 t = threadIdx.x, step = blockDim.x, groups = d / L;
    const u32 first = blockIdx.x * per, last = min(rows, first + per);
    float* part = partial + (u64)blockIdx.x * d;
    float held_dw[NORM_HELD][L];
    float tail_dw = 0.0f;
#pragma unroll
    for (u32 h = 0; h < NORM_HELD; ++h)
#pragma unroll
        for (u32 k = 0; k < L; ++k) held_dw[h][k] = 0.0f;
    for (u32 j = t + NORM_HELD * step; j < groups; j += step)
        for (u32 k = 0; k < L; ++k) part[j * L + k] = 0.0f;
    for (u32 row = first; row < last; ++row) {
        const u64 base = (u64)row * d;
        const T* xr = x + base;
        const T* gr = dy + base;
        T* dxr = dx + base;
        const bool wide = aligned16(xr) && aligned16(gr) && aligned16(dxr) && aligned16(w);
        Vec16 hx[NORM_HELD] = {}, hg[NORM_HELD] = {}; // registers only where the loops unroll
        float ss = 0.0f, dot = 0.0f;
#pragma unroll
        for (u32 h = 0; h < NORM_HELD; ++h) {
            const u32 j = t + h * step;
            if (j < groups) {
                Group<T> a(wide), g(wide), v(wide);
                a.read(xr, j);
                g.read(gr, j);
                v.read(w, j);
                hx[h] = a.w;
                hg[h] = g.w;
                for (u32 k = 0; k < L; ++k) {
                    const float xv = a.at(xr, j, k);
                    ss += xv * xv;
                    dot += xv * g.at(gr, j, k) * v.at(w, j, k);
                }
            }
        }
        for (u32 j = t + NORM_HELD * step; j < groups; j += step) {
            Group<T> a(wide), g(wide), v(wide);
            a.read(xr, j);
            g.read(gr, j);
            v.read(w, j);
            for (u32 k = 0; k < L; ++k) {
                const float xv = a.at(xr, j, k);
                ss += xv * xv;
                dot += xv * g.at(gr, j, k) * v.at(w, j, k);
            }
        }
        const u32 i = groups * L + t; // a row's last d % L values: one each for the first threads
        if (i < d) {
            const float xv = load(xr, i);
            ss += xv * xv;
            dot += xv * load(gr, i) * load(w, i);
        }
        const float r = 1.0f / sqrtf(block_sum(ss, scratch) / d + eps);
        const float c = r * r * r * block_sum(dot, scratch) / d;
#pragma unroll
        for (u32 h = 0; h < NORM_HELD; ++h) {
            const u32 j = t + h * step;
            if (j < groups) {
                Group<T> a(wide), g(wide), v(wide), out(wide);
                a.w = hx[h];
                g.w = hg[h];
                v.read(w, j);
                for (u32 k = 0; k < L; ++k) {
                    const float xv = a.at(xr, j, k), gv = g.at(gr, j, k);
                    out.put(dxr, j, k, r * v.at(w, j, k) * gv - xv * c);
                    held_dw[h][k] += gv * xv * r;
                }
                out.write(dxr, j);
            }
        }
        for (u32 j = t + NORM_HELD * step; j < groups; j += step) {
            Group<T> a(wide), g(wide), v(wide), out(wide);
            a.read(xr, j);
            g.read(gr, j);
            v.read(w, j);
            for (u32 k = 0; k < L; ++k) {
                const float xv = a.at(xr, j, k), gv = g.at(gr, j, k);
                out.put(dxr, j, k, r * v.at(w, j, k) * gv - xv * c);
                part[j * L + k] += gv * xv * r;
            }
            out.write(dxr, j);
        }
        if (i < d) {
            const float xv = load(xr, i), gv = load(gr, i);
            store(dxr, i, r * load(w, i) * gv - xv * c);
            tail_dw += gv * xv * r;
        }
    }
#pragma unroll
    for (u32 h = 0; h < NORM_HELD; ++h) {
        const u32 j = t + h * step;
        if (j < groups)
#pragma unroll
            for (u32 k = 0; k < L; ++k) part[j * L + k] = held_dw[h][k];
    }
    if (groups * L + t < d) part[groups * L + t] = tail_dw;
}

// dw[col] = the slabs' partials summed in slab order.
template <typename T>
__device__ void rms_norm_bwd_dw_sum(const float* partial, T* dw, u32 slabs, u32 d) {
    const u32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d) return;
    float acc = 0.0f;
    for (u32 s = 0; s < slabs; ++s) acc += partial[(u64)s * d + col];
    store(dw, col, acc);
}

#define RMS_NORM(NAME, T)                                                                            \
    extern "C" __global__ void rms_norm_fwd_##NAME(const T* x, const T* w, T* y, u32 rows, u32 d,   \
                                                   float eps) {                                      \
        rms_norm_fwd(x, w, y, rows, d, eps);                                                         \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_##NAME(const T* x, const T* w, const T* dy, T* dx,      \
                                                   float* partial, u32 rows, u32 d, u32 per,         \
                                                   float eps) {                                      \
        rms_norm_bwd(x, w, dy, dx, partial, rows, d, per, eps);                                      \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_dw_sum_##NAME(const float* partial, T* dw, u32 slabs,   \
                                                          u32 d) {                                   \
        rms_norm_bwd_dw_sum(partial, dw, slabs, d);                                                  \
    }
RMS_NORM(f32, float)
RMS_NORM(bf16, bf16)
