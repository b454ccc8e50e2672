// The head's loss and its gradient in one kernel, in place over the logits
// (src/train/ops/cross_entropy/mod.rs holds the CPU twin and the launch). One
// block per row of V logits: the row's max and sum of exponentials in one
// pass (online), then d logits = scale (softmax - onehot(label)) written over
// the logits, and the row's loss lse - x[label] (0 where the label is
// ignored: labels[row] = 0xffffffff, and its d logits are 0).
template <typename T>
__device__ void loss_and_grad(T* logits, const u32* labels, float* row_loss, u32 v, float scale) {
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    const u32 label = labels[blockIdx.x];
    T* x = logits + (u64)blockIdx.x * v;
    if (label == 0xffffffffu) {
        for (u32 i = threadIdx.x; i < v; i += blockDim.x) store(x, i, 0.0f);
        if (threadIdx.x == 0) row_loss[blockIdx.x] = 0.0f;
        return; // the whole block leaves together
    }
    // The label's logit, read before anything is overwritten.
    const float picked = load(x, label);
    float m = NEG_INF, s = 0.0f;
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) online_add(m, s, load(x, i));
    const RowStats row = block_max_and_sum(m, s, scratch, maxes);
    const float lse = row.max + logf(row.sum);
    for (u32 i = threadIdx.x; i < v; i += blockDim.x) {
        const float d = scale * expf(load(x, i) - lse);
        store(x, i, i == label ? d - scale : d);
    }
    if (threadIdx.x == 0) row_loss[blockIdx.x] = lse - picked;
}

extern "C" __global__ void loss_and_grad_f32(float* logits, const u32* labels, float* row_loss, u32 v,
                                             float scale) {
    loss_and_grad(logits, labels, row_loss, v, scale);
}
extern "C" __global__ void loss_and_grad_bf16(bf16* logits, const u32* labels, float* row_loss, u32 v,
                                              float scale) {
    loss_and_grad(logits, labels, row_loss, v, scale);
}
