// The head's loss and its gradient in one kernel, in place over the logits
// (src/train/ops/cross_entropy.rs holds the CPU twin and the launch). One
// block per row of V logits: the row's max and sum of exponentials in one
// pass (online), then d logits = scale (softmax - onehot(label)) written over
// the logits, and the row's loss lse - x[label] (0 where the label is
// ignored: labels[row] = 0xffffffff, and its d logits are 0).
template <typename T>
__device__ void loss_and_grad(T* logits, const u32* labels, float* row_loss, u32 v, float scale) {
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    const u32 row = blockIdx.x, label = labels[row];
    T* x = logits + (u64)row * v;
    if (label == 0xffffffffu) {
        for (u32 i = threadIdx.x; i < v; i += blockDim.x) store(x, i, 0.0f);
        if (threadIdx.x == 0) row_loss[row] = 0.0f;
        return; // the whole block leaves together
    }
    // The label's logit, read before anything is overwritten.
    const float picked = load(x, label);
    float m = NEG_INF, s = 0.0f;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) {
        const float xi = load(x, i);
        if (xi > m) {
            s = s * expf(m - xi) + 1.0f;
            m = xi;
        } else {
            s += expf(xi - m);
        }
    }
    // The block's max, then every thread's sum rescaled to it.
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float wm = m;
    for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, o));
    if (lane == 0) maxes[warp] = wm;
    __syncthreads();
    float bm = lane < warps ? maxes[lane] : NEG_INF;
    for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
    const float total = block_sum(s == 0.0f ? 0.0f : s * expf(m - bm), scratch);
    const float lse = bm + logf(total);
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) {
        const float d = scale * expf(load(x, i) - lse);
        store(x, i, i == label ? d - scale : d);
    }
    if (threadIdx.x == 0) row_loss[row] = lse - picked;
}

extern "C" __global__ void loss_and_grad_f32(float* logits, const u32* labels, float* row_loss, u32 v,
                                             float scale) {
    loss_and_grad(logits, labels, row_loss, v, scale);
}
extern "C" __global__ void loss_and_grad_bf16(bf16* logits, const u32* labels, float* row_loss, u32 v,
                                              float scale) {
    loss_and_grad(logits, labels, row_loss, v, scale);
}
