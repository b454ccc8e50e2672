// RMSNorm forward and backward over rows of length d (src/train/ops/rms_norm.rs
// holds the CPU twin and the launches). One warp per row: rows are 2-16 KB,
// and a warp's shuffles reduce without shared memory or block barriers.

// y = x * r * w, r = 1 / sqrt(mean(x^2) + eps).
template <typename T>
__device__ void rms_norm_fwd(const T* x, const T* w, T* y, u32 rows, u32 d, float eps) {
    const u32 row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return; // the whole warp leaves together
    const u64 base = (u64)row * d;
    float ss = 0.0f;
    for (u32 i = lane; i < d; i += 32) {
        const float v = load(x, base + i);
        ss += v * v;
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    for (u32 i = lane; i < d; i += 32) store(y, base + i, load(x, base + i) * r * load(w, i));
}

// dx = r (w dy) - x r^3 mean(x w dy) per row; r per row kept for dw.
template <typename T>
__device__ void rms_norm_bwd_dx(const T* x, const T* w, const T* dy, T* dx, float* r_out, u32 rows,
                                u32 d, float eps) {
    const u32 row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const u64 base = (u64)row * d;
    float ss = 0.0f, dot = 0.0f;
    for (u32 i = lane; i < d; i += 32) {
        const float xv = load(x, base + i);
        ss += xv * xv;
        dot += xv * load(dy, base + i) * load(w, i);
    }
    const float r = 1.0f / sqrtf(warp_sum(ss) / d + eps);
    const float c = r * r * r * warp_sum(dot) / d;
    for (u32 i = lane; i < d; i += 32)
        store(dx, base + i, r * load(w, i) * load(dy, base + i) - load(x, base + i) * c);
    if (lane == 0) r_out[row] = r;
}

// dw partials: slab blockIdx.y of `per` rows, one column per thread (reads
// along a row are coalesced): partial[slab][col] = sum dy x r over the slab.
template <typename T>
__device__ void rms_norm_bwd_dw_partial(const T* x, const T* dy, const float* r, float* partial,
                                        u32 rows, u32 d, u32 per) {
    const u32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d) return;
    const u32 start = blockIdx.y * per, end = min(rows, start + per);
    float acc = 0.0f;
    for (u32 row = start; row < end; ++row) {
        const u64 i = (u64)row * d + col;
        acc += load(dy, i) * load(x, i) * r[row];
    }
    partial[(u64)blockIdx.y * d + col] = acc;
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
    extern "C" __global__ void rms_norm_bwd_dx_##NAME(const T* x, const T* w, const T* dy, T* dx,   \
                                                      float* r, u32 rows, u32 d, float eps) {        \
        rms_norm_bwd_dx(x, w, dy, dx, r, rows, d, eps);                                              \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_dw_partial_##NAME(                                       \
        const T* x, const T* dy, const float* r, float* partial, u32 rows, u32 d, u32 per) {         \
        rms_norm_bwd_dw_partial(x, dy, r, partial, rows, d, per);                                    \
    }                                                                                                \
    extern "C" __global__ void rms_norm_bwd_dw_sum_##NAME(const float* partial, T* dw, u32 slabs,   \
                                                          u32 d) {                                   \
        rms_norm_bwd_dw_sum(partial, dw, slabs, d);                                                  \
    }
RMS_NORM(f32, float)
RMS_NORM(bf16, bf16)
