// AdamW in one pass over a parameter, its gradient and both moments, with
// f32 arithmetic whatever the storage (f32, or bf16 rounded to nearest even).
// The gradient scale (clipping) is clip[1], written on the device by
// grad_norm.cu's clip_scale; NaN (a non-finite norm) leaves everything as it is.
// Compiled at run time by NVRTC (src/train/network/ops/adamw.rs launches it and holds
// the CPU twin); checked offline by scripts/check-gpu-offline.sh.
__device__ void step(float& p, float& m, float& v, float g, float lr, float scale, float b1, float b2,
                     float bc1, float bc2, float eps, float wd) {
    g *= scale;
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * g * g;
    p = p * (1.0f - lr * wd) - lr * ((m / bc1) / (sqrtf(v / bc2) + eps));
}

// The pass moves 14 (bf16) or 28 (f32) bytes a value and computes little:
// it is bound by memory bandwidth, so each thread moves 16 bytes of each
// array at a time where all four are 16-byte aligned (the gradient buckets'
// views and the pool's allocations are), single values otherwise and for
// the last n % lanes. Every value gets the same arithmetic either way.
template <typename T>
__device__ void adamw(T* p, const T* g, T* m, T* v, const float* clip, u64 n, float lr, float b1, float b2,
                      float bc1, float bc2, float eps, float wd) {
    const float scale = clip[1];
    if (scale != scale) return;
    constexpr u32 L = Lanes<T>::n;
    u64 done = 0;
    if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v)) {
        const u64 groups = n / L;
        for (u64 j = grid_index(); j < groups; j += grid_stride()) {
            Vec16 pw = ((const Vec16*)p)[j], mw = ((const Vec16*)m)[j], vw = ((const Vec16*)v)[j];
            const Vec16 gw = ((const Vec16*)g)[j];
            for (u32 k = 0; k < L; ++k) {
                float pi = lane(pw, k, p), mi = lane(mw, k, m), vi = lane(vw, k, v);
                step(pi, mi, vi, lane(gw, k, g), lr, scale, b1, b2, bc1, bc2, eps, wd);
                set_lane(pw, k, pi, p);
                set_lane(mw, k, mi, m);
                set_lane(vw, k, vi, v);
            }
            ((Vec16*)p)[j] = pw;
            ((Vec16*)m)[j] = mw;
            ((Vec16*)v)[j] = vw;
        }
        done = groups * L;
    }
    for (u64 i = done + grid_index(); i < n; i += grid_stride()) {
        float pi = load(p, i), mi = load(m, i), vi = load(v, i);
        step(pi, mi, vi, load(g, i), lr, scale, b1, b2, bc1, bc2, eps, wd);
        store(p, i, pi);
        store(m, i, mi);
        store(v, i, vi);
    }
}
extern "C" __global__ void adamw_f32(float* p, const float* g, float* m, float* v, const float* clip, u64 n,
        float lr, float b1, float b2, float bc1, float bc2, float eps, float wd) {
    adamw(p, g, m, v, clip, n, lr, b1, b2, bc1, bc2, eps, wd);
}
extern "C" __global__ void adamw_bf16(bf16* p, const bf16* g, bf16* m, bf16* v, const float* clip, u64 n,
        float lr, float b1, float b2, float bc1, float bc2, float eps, float wd) {
    adamw(p, g, m, v, clip, n, lr, b1, b2, bc1, bc2, eps, wd);
}
