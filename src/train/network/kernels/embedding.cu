// The embedding's gradient added into its buffer without atomics, so that
// it is the same bits every run (src/train/network/ops/accumulate.rs holds the CPU
// twin and the launch). The host groups the positions by token:
// plan = [order: N positions sorted by token (stable)] [starts: U + 1]
// [tokens: U distinct ids]. Block (u, c) sums, for token u, the rows of dy
// at its positions in order, in f32, over 256 columns, and adds the sum into
// the buffer's row: one writer per element.
template <typename T>
__device__ void add_rows(T* buf, const T* dy, const u32* plan, u32 n, u32 u, u32 d) {
    const u32 col = blockIdx.y * blockDim.x + threadIdx.x, token = blockIdx.x;
    if (col >= d || token >= u) return;
    const u32* order = plan;
    const u32* starts = plan + n;
    const u32* tokens = plan + n + u + 1;
    float acc = 0.0f;
    for (u32 k = starts[token]; k < starts[token + 1]; ++k) acc += load(dy, (u64)order[k] * d + col);
    const u64 i = (u64)tokens[token] * d + col;
    store(buf, i, load(buf, i) + acc);
}

extern "C" __global__ void add_rows_f32(float* buf, const float* dy, const u32* plan, u32 n, u32 u,
                                        u32 d) {
    add_rows(buf, dy, plan, n, u, d);
}
extern "C" __global__ void add_rows_bf16(bf16* buf, const bf16* dy, const u32* plan, u32 n, u32 u,
                                         u32 d) {
    add_rows(buf, dy, plan, n, u, d);
}
