// The global L2 norm of every gradient and the factor clipping scales them
// by, on the device, so that the optimizer step needs no read of the host
// (src/train/network/ops/grad_norm.rs launches these and holds the host's tensor
// ops). A fixed launch shape and fixed orders of addition: the same bits
// every run.

// Each block's sum of squares over its grid-stride share of one gradient of
// n values, into partial[blockIdx.x] (a block with no values writes 0).
// A thread takes groups of 16 bytes' worth of values (Group, common.cuh:
// the bits do not depend on where the gradient lies), then the last
// n % lanes values one each.
template <typename T>
__device__ void sum_squares(const T* g, u64 n, float* partial) {
    __shared__ float scratch[32];
    constexpr u32 L = Lanes<T>::n;
    const u64 groups = n / L;
    const bool wide = aligned16(g);
    float s = 0.0f;
    for (u64 j = grid_index(); j < groups; j += grid_stride()) {
        Group<T> x(wide);
        x.read(g, j);
        for (u32 k = 0; k < L; ++k) {
            const float v = x.at(g, j, k);
            s += v * v;
        }
    }
    for (u64 i = groups * L + grid_index(); i < n; i += grid_stride()) {
        const float x = load(g, i);
        s += x * x;
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

extern "C" __global__ void sum_squares_f32(const float* g, u64 n, float* partial) { sum_squares(g, n, partial); }
extern "C" __global__ void sum_squares_bf16(const bf16* g, u64 n, float* partial) { sum_squares(g, n, partial); }

// One block: the norm over `count` partial sums and the clip scale,
// out = [norm, scale]; scale = max_norm / norm where max_norm > 0 and the norm
// exceeds it, else 1; NaN where the norm is not finite (the fused AdamW then
// leaves every parameter as it is, and the trainer stops on the norm).
extern "C" __global__ void clip_scale_f32(const float* partial, u32 count, float max_norm, float* out) {
    __shared__ float scratch[32];
    float s = 0.0f;
    for (u32 i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        const float norm = sqrtf(s);
        const bool finite = norm == norm && norm < __int_as_float(0x7f800000u);
        const float scale = !finite ? __int_as_float(0x7fc00000u)
                            : (max_norm > 0.0f && norm > max_norm) ? max_norm / norm
                                                                    : 1.0f;
        out[0] = norm;
        out[1] = scale;
    }
}
