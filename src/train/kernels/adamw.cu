// AdamW in one pass over a parameter, its gradient and both moments, with
// f32 arithmetic whatever the storage (f32, or bf16 rounded to nearest even).
// The gradient scale (clipping) is clip[1], written on the device by
// grad_norm.cu's clip_scale; NaN (a non-finite norm) leaves everything as it is.
// Compiled at run time by NVRTC (src/train/ops/adamw.rs launches it and holds
// the CPU twin); checked offline by scripts/check-gpu-offline.sh.
__device__ void step(float& p, float& m, float& v, float g, float lr, float scale, float b1, float b2,
                     float bc1, float bc2, float eps, float wd) {
    g *= scale;
    m = b1 * m + (1.0f - b1) * g;
    v = b2 * v + (1.0f - b2) * g * g;
    p = p * (1.0f - lr * wd) - lr * ((m / bc1) / (sqrtf(v / bc2) + eps));
}
extern "C" __global__ void adamw_f32(float* p, const float* g, float* m, float* v, const float* clip, u64 n,
        float lr, float b1, float b2, float bc1, float bc2, float eps, float wd) {
    const float scale = clip[1];
    if (scale != scale) return;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)blockDim.x * gridDim.x) {
        float pi = p[i], mi = m[i], vi = v[i];
        step(pi, mi, vi, g[i], lr, scale, b1, b2, bc1, bc2, eps, wd);
        p[i] = pi; m[i] = mi; v[i] = vi;
    }
}
extern "C" __global__ void adamw_bf16(bf16* p, const bf16* g, bf16* m,
        bf16* v, const float* clip, u64 n,
        float lr, float b1, float b2, float bc1, float bc2, float eps, float wd) {
    const float scale = clip[1];
    if (scale != scale) return;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n;
         i += (u64)blockDim.x * gridDim.x) {
        float pi = bf16_to_f32(p[i]), mi = bf16_to_f32(m[i]), vi = bf16_to_f32(v[i]);
        step(pi, mi, vi, bf16_to_f32(g[i]), lr, scale, b1, b2, bc1, bc2, eps, wd);
        p[i] = f32_to_bf16(pi); m[i] = f32_to_bf16(mi); v[i] = f32_to_bf16(vi);
    }
}
