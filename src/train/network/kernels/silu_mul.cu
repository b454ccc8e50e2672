// The SwiGLU gate silu(a) * b and its backward, element by element
// (src/train/network/ops/silu_mul.rs holds the CPU twin and the launches).

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float silu_mul(float a, float b) { return a * sigmoid(a) * b; }
// da = dy b s (1 + a (1 - s)), db = dy a s, s = sigmoid(a).
__device__ __forceinline__ void silu_mul_grads(float a, float b, float dy, float& da, float& db) {
    const float s = sigmoid(a);
    da = dy * b * s * (1.0f + a * (1.0f - s));
    db = dy * a * s;
}

// Both passes are bound by memory bandwidth: each thread moves 16 bytes of
// each array at a time where every array is 16-byte aligned (the pool's
// allocations are), single values otherwise and for the last n % lanes; the
// same arithmetic for every value either way.
template <typename T>
__device__ void silu_mul_fwd(const T* a, const T* b, T* y, u64 n) {
    constexpr u32 L = Lanes<T>::n;
    u64 done = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y)) {
        const u64 groups = n / L;
        for (u64 j = grid_index(); j < groups; j += grid_stride()) {
            const Vec16 aw = ((const Vec16*)a)[j], bw = ((const Vec16*)b)[j];
            Vec16 yw = {};
            for (u32 k = 0; k < L; ++k) set_lane(yw, k, silu_mul(lane(aw, k, a), lane(bw, k, b)), y);
            ((Vec16*)y)[j] = yw;
        }
        done = groups * L;
    }
    for (u64 i = done + grid_index(); i < n; i += grid_stride()) store(y, i, silu_mul(load(a, i), load(b, i)));
}

// out[0..n) = da, out[n..2n) = db.
template <typename T>
__device__ void silu_mul_bwd(const T* a, const T* b, const T* dy, T* out, u64 n) {
    constexpr u32 L = Lanes<T>::n;
    T* da = out;
    T* db = out + n;
    u64 done = 0;
    if (aligned16(a) && aligned16(b) && aligned16(dy) && aligned16(da) && aligned16(db)) {
        const u64 groups = n / L;
        for (u64 j = grid_index(); j < groups; j += grid_stride()) {
            const Vec16 aw = ((const Vec16*)a)[j], bw = ((const Vec16*)b)[j], gw = ((const Vec16*)dy)[j];
            Vec16 daw = {}, dbw = {};
            for (u32 k = 0; k < L; ++k) {
                float x, z;
                silu_mul_grads(lane(aw, k, a), lane(bw, k, b), lane(gw, k, dy), x, z);
                set_lane(daw, k, x, da);
                set_lane(dbw, k, z, db);
            }
            ((Vec16*)da)[j] = daw;
            ((Vec16*)db)[j] = dbw;
        }
        done = groups * L;
    }
    for (u64 i = done + grid_index(); i < n; i += grid_stride()) {
        float x, z;
        silu_mul_grads(load(a, i), load(b, i), load(dy, i), x, z);
        store(da, i, x);
        store(db, i, z);
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
