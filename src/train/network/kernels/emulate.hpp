// A host emulation of the CUDA the trainer's kernels use, so that the same
// `.cu` text runs on a CPU — under AddressSanitizer, UndefinedBehaviorSanitizer
// and ThreadSanitizer — against the Rust CPU twins (src/train/network/kernels/emulator.rs
// compiles it in front of common.cuh and the kernels, as C++20).
//
// A launch runs its blocks one after another; the threads of a block are
// std::threads. `__syncthreads` is a barrier of the block's threads, a warp
// shuffle a write to the warp's slots between two barriers of the warp; a
// thread that returns leaves both barriers (CUDA counts only live threads).
// `__shared__` variables are static, one per block as blocks do not overlap,
// in a section of their own that is poisoned (every byte 0xff, a NaN) as each
// block starts: a read of a slot no thread of the block wrote shows, as on a
// GPU, where shared memory holds whatever an earlier block left there.
#include <barrier>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static __attribute__((section("emu_shared")))
#define __align__(n) __attribute__((aligned(n)))

extern "C" char __start_emu_shared[] __attribute__((weak));
extern "C" char __stop_emu_shared[] __attribute__((weak));
// Byte by byte through a volatile pointer: no memset for the sanitizers to
// check against the redzones between the variables.
__attribute__((no_sanitize("address", "thread"))) inline void poison_shared() {
    for (volatile char* p = __start_emu_shared; p < __stop_emu_shared; ++p) *p = (char)0xff;
}

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// A lane's operands of mma_bf16, as the warp gathers them.
struct MmaFragments {
    unsigned a[4], b[2];
    const unsigned short* row; // ldmatrix_x2_trans's
};

// What a thread of the running block sees.
struct BlockState {
    std::unique_ptr<std::barrier<>> all;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<float> slots; // one per thread, for shuffles
    std::vector<MmaFragments> mma; // one per thread, for mma_bf16
};

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline thread_local BlockState* block_state = nullptr;

inline void __syncthreads() { block_state->all->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    const unsigned t = threadIdx.x;
    std::barrier<>& warp = *block_state->warps[t / 32];
    block_state->slots[t] = v;
    warp.arrive_and_wait();
    const float other = block_state->slots[(t & ~31u) | ((t % 32) ^ (unsigned)lane_mask)];
    warp.arrive_and_wait();
    return other;
}

// mma.sync m16n8k16 (common.cuh gives the layouts) as a warp collective:
// each lane puts its fragments in the warp's slots, and computes its four
// outputs from the lanes that PTX says hold each operand. Products of bf16
// values are exact in f32; they are summed in k's order and then added to c.
inline void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const unsigned t = threadIdx.x, base = t & ~31u, lane = t % 32;
    std::barrier<>& warp = *block_state->warps[t / 32];
    MmaFragments& mine = block_state->mma[t];
    for (int r = 0; r < 4; ++r) mine.a[r] = a[r];
    mine.b[0] = b0;
    mine.b[1] = b1;
    warp.arrive_and_wait();
    auto half = [](unsigned word, unsigned k) {
        const unsigned bits = (word >> (16 * (k % 2))) & 0xffffu;
        float f;
        const unsigned u = bits << 16;
        std::memcpy(&f, &u, sizeof f);
        return f;
    };
    const std::vector<MmaFragments>& all = block_state->mma;
    float out[4];
    for (unsigned i = 0; i < 4; ++i) {
        const unsigned row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {
            const unsigned a_word = all[base + 4 * (row % 8) + (k % 8) / 2].a[row / 8 + 2 * (k / 8)];
            const unsigned b_word = all[base + 4 * col + (k % 8) / 2].b[k / 8];
            sum += half(a_word, k) * half(b_word, k);
        }
        out[i] = sum;
    }
    warp.arrive_and_wait();
    for (unsigned i = 0; i < 4; ++i) c[i] += out[i];
}

// ldmatrix.sync.m8n8.x2.trans (common.cuh gives the layout) as a warp
// collective: each lane puts its row's address in the warp's slots and takes
// its values from the rows lanes 0–15 gave.
inline void ldmatrix_x2_trans(unsigned& r0, unsigned& r1, const unsigned short* row) {
    const unsigned t = threadIdx.x, base = t & ~31u, lane = t % 32;
    std::barrier<>& warp = *block_state->warps[t / 32];
    block_state->mma[t].row = row;
    warp.arrive_and_wait();
    const std::vector<MmaFragments>& all = block_state->mma;
    const unsigned col = lane / 4, r = 2 * (lane % 4);
    auto pair = [&](unsigned m) {
        return (unsigned)all[base + 8 * m + r].row[col] | (unsigned)all[base + 8 * m + r + 1].row[col] << 16;
    };
    const unsigned a = pair(0), b = pair(1);
    warp.arrive_and_wait();
    r0 = a;
    r1 = b;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
template <typename T> inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }

// Runs `body` as a grid of blocks of threads (x dimensions only beside the
// grid's y: what the trainer launches). One team of threads runs every
// block in turn: each block gets fresh barriers (a thread that returned
// leaves them), and the team meets between blocks.
inline void emulate_launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    gridDim = grid;
    blockDim = block;
    const unsigned threads = block.x * block.y * block.z;
    const unsigned blocks = grid.x * grid.y * grid.z;
    std::barrier<> team_barrier(threads);
    BlockState state;
    auto fresh = [&] {
        state.all = std::make_unique<std::barrier<>>(threads);
        state.warps.clear();
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
            const unsigned in_warp = std::min(32u, threads - w * 32);
            state.warps.push_back(std::make_unique<std::barrier<>>(in_warp));
        }
        state.slots.assign(threads, 0.0f);
        state.mma.assign(threads, MmaFragments{});
        poison_shared();
    };
    std::vector<std::thread> team;
    team.reserve(threads);
    for (unsigned t = 0; t < threads; ++t) {
        team.emplace_back([&, t] {
            threadIdx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            block_state = &state;
            for (unsigned b = 0; b < blocks; ++b) {
                if (t == 0) fresh();
                team_barrier.arrive_and_wait(); // the block's state is ready
                blockIdx = dim3{b % grid.x, (b / grid.x) % grid.y, b / (grid.x * grid.y)};
                body();
                // A thread that returned no longer counts in this block.
                state.warps[t / 32]->arrive_and_drop();
                state.all->arrive_and_drop();
                team_barrier.arrive_and_wait(); // the block is done
            }
        });
    }
    for (auto& th : team) th.join();
}
