// The head's loss and its gradient in one kernel, in place over the logits
// (src/train/network/ops/cross_entropy/mod.rs holds the CPU twin and the launch). One
// block per row of V logits: the row's max and sum of exponentials in one
// pass (online), then d logits = scale (softmax - onehot(label)) written over
// the logits, and the row's loss lse - x[label] (0 where the label is
// ignored: labels[row] = 0xffffffff, and its d logits are 0).
//
// Both passes are bound by memory bandwidth (a row is 256 KB at LLaMA 3's
// 128,256 logits): a row moves by groups of 16 bytes' worth of values
// (Group, common.cuh) where it is 16-byte aligned, value by value where not,
// with the same arithmetic in the same order either way; its last v % lanes
// values one each.
template <typename T>
__device__ void loss_and_grad(T* logits, const u32* labels, float* row_loss, u32 v, float scale) {
    __shared__ float scratch[32];
    __shared__ float maxes[32];
    constexpr u32 L = Lanes<T>::n;
    const u32 label = labels[blockIdx.x];
    T* x = logits + (u64)blockIdx.x * v;
    const bool wide = aligned16(x);
    const u32 groups = v / L;
    if (label == 0xffffffffu) {
        for (u32 j = threadIdx.x; j < groups; j += blockDim.x) {
            Group<T> out(wide);
            for (u32 k = 0; k < L; ++k) out.put(x, j, k, 0.0f);
            out.write(x, j);
        }
        for (u32 i = groups * L + threadIdx.x; i < v; i += blockDim.x) store(x, i, 0.0f);
        if (threadIdx.x == 0) row_loss[blockIdx.x] = 0.0f;
        return; // the whole block leaves together
    }
    // The label's logit, read before anything is overwritten.
    const float picked = load(x, label);
    float m = NEG_INF, s = 0.0f;
    for (u32 j = threadIdx.x; j < groups; j += blockDim.x) {
        Group<T> in(wide);
        in.read(x, j);
        for (u32 k = 0; k < L; ++k) online_add(m, s, in.at(x, j, k));
    }
    for (u32 i = groups * L + threadIdx.x; i < v; i += blockDim.x) online_add(m, s, load(x, i));
    const RowStats row = block_max_and_sum(m, s, scratch, maxes);
    const float lse = row.max + logf(row.sum);
    for (u32 j = threadIdx.x; j < groups; j += blockDim.x) {
        Group<T> in(wide), out(wide);
        in.read(x, j);
        for (u32 k = 0; k < L; ++k) {
            const float d = scale * expf(in.at(x, j, k) - lse);
            out.put(x, j, k, j * L + k == label ? d - scale : d);
        }
        out.write(x, j);
    }
    for (u32 i = groups * L + threadIdx.x; i < v; i += blockDim.x) {
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
