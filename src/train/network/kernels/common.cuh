// Shared by every kernel source of the trainer: NVRTC compiles each source
// with this text in front of it (src/train/network/ops/cuda.rs; the offline check,
// scripts/check-gpu-offline.sh, compiles the same text). No CUDA headers:
// NVRTC finds none on a machine without a toolkit.
//
// Storage is f32 or bf16 (as its raw 16 bits); arithmetic is f32 throughout,
// rounded once to nearest even when stored as bf16.
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short bf16;
#define NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ float bf16_to_f32(bf16 x) { return __uint_as_float(((u32)x) << 16); }
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u); // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}
__device__ __forceinline__ float load(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load(const bf16* p, u64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ void store(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(bf16* p, u64 i, float v) { p[i] = f32_to_bf16(v); }

// Sixteen bytes, the widest load or store of one thread (4 f32 or 8 bf16
// values): a pass bound by memory bandwidth keeps more bytes in flight with
// one of these than with 2-byte loads. Only where the address is a multiple
// of 16 (aligned16); the kernels fall back to single values otherwise.
struct alignas(16) Vec16 {
    u32 w[4];
};
template <typename T> struct Lanes {
    static constexpr u32 n = 16 / sizeof(T);
};
__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15u) == 0; }
__device__ __forceinline__ float lane(const Vec16& x, u32 k, const float*) { return __uint_as_float(x.w[k]); }
__device__ __forceinline__ float lane(const Vec16& x, u32 k, const bf16*) {
    return bf16_to_f32((bf16)(x.w[k / 2] >> (16 * (k % 2))));
}
__device__ __forceinline__ void set_lane(Vec16& x, u32 k, float v, const float*) { x.w[k] = __float_as_uint(v); }
__device__ __forceinline__ void set_lane(Vec16& x, u32 k, float v, const bf16*) {
    const u32 b = f32_to_bf16(v), shift = 16 * (k % 2);
    x.w[k / 2] = (x.w[k / 2] & ~(0xffffu << shift)) | (b << shift);
}

// Values taken by groups of 16 bytes' worth (Lanes): thread t of a loop
// over groups takes groups t, t + stride, …; a group moves with one 16-byte
// access where the arrays are 16-byte aligned (wide), value by value where
// not. The same values reach the same threads in the same order either way,
// so a sum's bits do not depend on where the arrays lie.
template <typename T> struct Group {
    Vec16 w = {};
    const bool wide;
    __device__ Group(bool wide) : wide(wide) {}
    __device__ void read(const T* x, u64 j) {
        if (wide) w = ((const Vec16*)x)[j];
    }
    __device__ float at(const T* x, u64 j, u32 k) const {
        return wide ? lane(w, k, x) : load(x, j * Lanes<T>::n + k);
    }
    __device__ void put(T* x, u64 j, u32 k, float v) {
        if (wide) set_lane(w, k, v, x);
        else store(x, j * Lanes<T>::n + k, v);
    }
    __device__ void write(T* x, u64 j) const {
        if (wide) ((Vec16*)x)[j] = w;
    }
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sum of v over a block of blockDim.x threads (a multiple of 32, at most
// 1024), returned to every thread; `scratch` holds 32 floats. The order of
// the additions is fixed by the launch shape: the same bits every run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); // scratch may still be read by an earlier call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

struct RowStats {
    float max, sum;
};

// For a row spread over a block, each thread holding the max m of its
// elements and s = the sum of exp(x - m) over them (0 for none): the row's
// max and its sum of exp(x - max), returned to every thread. `scratch` and
// `maxes` hold 32 floats each.
__device__ __forceinline__ RowStats block_max_and_sum(float m, float s, float* scratch, float* maxes) {
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float wm = m;
    for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, o));
    if (lane == 0) maxes[warp] = wm;
    __syncthreads();
    float bm = lane < warps ? maxes[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
    const float total = block_sum(s == 0.0f ? 0.0f : s * expf(m - bm), scratch);
    return RowStats{bm, total};
}

// One step of a running max m and sum s of exp(x - m).
__device__ __forceinline__ void online_add(float& m, float& s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
    } else {
        s += expf(x - m);
    }
}

// One warp's tensor-core product (mma.sync m16n8k16): c (16 × 8, f32) +=
// a (16 × 16, row-major) × b (16 × 8, column-major), a and b bf16 pairs with
// the lower index in the low half. Lane = 4·group + i holds, as PTX lays
// them out: a's rows group and group + 8 at columns 2i and 2i + 8 (a[0]:
// (group, 2i), a[1]: (group + 8, 2i), a[2]: (group, 2i + 8), a[3]: both);
// b's rows 2i (b0) and 2i + 8 (b1) at column group; c's rows group (c[0],
// c[1]) and group + 8 (c[2], c[3]) at columns 2i, 2i + 1. Every lane of the
// warp calls it. The host emulation (emulate.hpp) computes it from these
// layouts, so a kernel that indexes a fragment wrongly fails there too.
// Below sm_80 there is none: the product is left out, and the self-check
// at the device's opening finds the kernel wrong and leaves it out.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
// ldmatrix.sync.m8n8.x2.trans of 16-bit values: lanes 0–7 give the shared
// addresses of the 8 rows of a first 8 × 8 matrix, lanes 8–15 those of a
// second (16-byte aligned; the other lanes' are not read); lane = 4·group + i
// gets, of each, rows 2i and 2i + 1 at column group (the lower row in the
// low half): the B fragment (b0, b1) of mma_bf16 from a row-major k × n tile.
__device__ __forceinline__ void ldmatrix_x2_trans(u32& r0, u32& r1, const bf16* row) {
#if __CUDA_ARCH__ >= 800
    u32 at;
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }" : "=r"(at) : "l"(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(at));
#endif
}
#endif

// The index of this thread in a grid-stride loop, and the stride.
__device__ __forceinline__ u64 grid_index() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_stride() { return (u64)blockDim.x * gridDim.x; }
