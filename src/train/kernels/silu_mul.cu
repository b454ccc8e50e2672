// The SwiGLU gate silu(a) * b and its backward, element by element
// (src/train/ops/silu_mul.rs holds the CPU twin and the launches).

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__device__ void silu_mul_fwd(const T* a, const T* b, T* y, u64 n) {
    for (u64 i = grid_index(); i < n; i += grid_stride()) {
        const float av = load(a, i);
        store(y, i, av * sigmoid(av) * load(b, i));
    }
}

// out[0..n) = da = dy b s (1 + a (1 - s)), out[n..2n) = db = dy a s, s = sigmoid(a).
template <typename T>
__device__ void silu_mul_bwd(const T* a, const T* b, const T* dy, T* out, u64 n) {
    for (u64 i = grid_index(); i < n; i += grid_stride()) {
        const float av = load(a, i), g = load(dy, i), s = sigmoid(av);
        store(out, i, g * load(b, i) * s * (1.0f + av * (1.0f - s)));
        store(out, n + i, g * av * s);
    }
}

#define SILU_MUL(NAME, T)                                                                            \
    extern "C" __global__ void silu_mul_fwd_##NAME(const T* a, const T* b, T* y, u64 n) {            \
        silu_mul_fwd(a, b, y, n);                                                                    \
    }                                                                                                \
    extern "C" __global__ void silu_mul_bwd_##NAME(const T* a, const T* b, const T* dy, T* out,      \
                                                   u64 n) {                                          \
        silu_mul_bwd(a, b, dy, out, n);                                                              \
    }
SILU_MUL(f32, float)
SILU_MUL(bf16, bf16)
