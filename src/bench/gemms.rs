//! `sweep bench gemms`: the floor of a training step — every matrix product
//! of the linear layers and the output head in one step of the block-wise
//! trainer, each distinct shape timed alone through the trainer's own
//! product functions (`linear`, `matmul` and `add_product`: on a GPU the
//! same cuBLAS calls) and multiplied by how often the step makes it. Set
//! beside the step's time (`sweep bench train`), it says how much of the
//! step is these products and how much everything else: the norms, RoPE,
//! SwiGLU, the loss, attention itself, the optimizer, copies and gaps.
//!
//! Attention's own products (the flash forward, the tiled backward's
//! score products) are not here: `sweep bench kernels` times the attention
//! backward at the model's shapes.

use super::MAX_ELEMENTS;
use crate::config::ModelConfig;
use crate::estimate::memory::head_rows;
use crate::train::network::ops::linear;
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;
use std::time::Instant;

/// What to measure.
#[derive(Debug, Clone)]
pub struct GemmWork {
    pub model: String,
    pub batch: usize,
    pub seq_len: usize,
    /// Timed calls per shape (the median counts).
    pub repeats: usize,
}

/// Which of a linear layer's three products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Product {
    /// y = x·wᵀ, x [rows, in], w [out, in].
    Forward,
    /// dx = dy·w.
    InputGrad,
    /// w's gradient += dyᵀ·x.
    WeightGrad,
}

impl Product {
    pub fn as_str(self) -> &'static str {
        match self {
            Product::Forward => "forward x·wᵀ",
            Product::InputGrad => "input grad dy·w",
            Product::WeightGrad => "weight grad dyᵀ·x",
        }
    }
}

/// One shape of product the step makes `count` times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepGemm {
    /// `blocks` or `head`.
    pub part: &'static str,
    pub product: Product,
    /// The weights it belongs to (`wq, wo`, `output`).
    pub weights: String,
    /// x's rows (tokens, or a slice of the head's), the weight's in and out.
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
    pub count: usize,
}

impl StepGemm {
    /// Its floating-point operations, once.
    pub fn flops(&self) -> f64 {
        2.0 * self.rows as f64 * self.inp as f64 * self.out as f64
    }
}

/// The products of one step over `tokens` tokens, each distinct shape once
/// with its count: per layer the seven weights' forward, input-gradient and
/// weight-gradient products; the head's three per slice of rows, as the
/// trainer slices them on this kind of device (`gpu`).
pub fn step_gemms(cfg: &ModelConfig, tokens: usize, gpu: bool) -> Vec<StepGemm> {
    let (d, f) = (cfg.dim, cfg.ffn_hidden());
    let (q, kv) = (
        cfg.n_heads * cfg.head_dim(),
        cfg.n_kv_heads * cfg.head_dim(),
    );
    // [out, in] of each block weight, in the order the block uses them.
    let weights = [
        ("wq", q, d),
        ("wk", kv, d),
        ("wv", kv, d),
        ("wo", d, q),
        ("w1", f, d),
        ("w3", f, d),
        ("w2", d, f),
    ];
    let mut out: Vec<StepGemm> = Vec::new();
    let mut add = |part, product, name: &str, rows, inp, w_out, count| {
        let same = |g: &&mut StepGemm| {
            (g.part, g.product, g.rows, g.inp, g.out) == (part, product, rows, inp, w_out)
        };
        match out.iter_mut().find(|g| same(g)) {
            Some(g) => {
                if !g.weights.split(", ").any(|w| w == name) {
                    g.weights = format!("{}, {name}", g.weights);
                }
                g.count += count;
            }
            None => out.push(StepGemm {
                part,
                product,
                weights: name.to_string(),
                rows,
                inp,
                out: w_out,
                count,
            }),
        }
    };
    for product in [Product::Forward, Product::InputGrad, Product::WeightGrad] {
        for (name, w_out, inp) in weights {
            add("blocks", product, name, tokens, inp, w_out, cfg.n_layers);
        }
    }
    let vocab = cfg.vocab_size;
    let rows = head_rows(tokens, vocab, gpu);
    let (full, tail) = (tokens / rows, tokens % rows);
    for product in [Product::Forward, Product::InputGrad, Product::WeightGrad] {
        if full > 0 {
            add("head", product, "output", rows, d, vocab, full);
        }
        if tail > 0 {
            add("head", product, "output", tail, d, vocab, 1);
        }
    }
    out
}

/// One shape, timed.
#[derive(Debug, Clone, Serialize)]
pub struct GemmRow {
    #[serde(flatten)]
    pub gemm: StepGemm,
    pub ms_each: f64,
    pub tflop_per_s: f64,
    /// `ms_each` × count.
    pub ms_total: f64,
}

/// The whole run, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct GemmReport {
    pub device: String,
    pub model: String,
    pub batch: usize,
    pub seq_len: usize,
    pub dtype: &'static str,
    pub rows: Vec<GemmRow>,
    /// Σ ms_total: the step's time if nothing but these products ran.
    pub floor_ms: f64,
    /// Their FLOPs, and the step's by the MFU convention (6·N + attention).
    pub gemm_tflop: f64,
    pub step_tflop: f64,
}

/// Times every product of a step on `device` (bf16 on a GPU, f32 on the CPU).
pub fn run(work: &GemmWork, device: &Device, device_name: &str) -> Result<GemmReport> {
    let cfg = super::preset_shapes(&work.model, None)?;
    let tokens = work.batch.saturating_mul(work.seq_len);
    if tokens == 0 || work.repeats == 0 {
        bail!("--batch, --seq-len and --repeats must be at least 1");
    }
    let gemms = step_gemms(&cfg, tokens, device.is_cuda());
    let largest = gemms
        .iter()
        .flat_map(|g| {
            [
                g.rows.checked_mul(g.inp),
                g.rows.checked_mul(g.out),
                g.inp.checked_mul(g.out),
            ]
        })
        .try_fold(0usize, |m, e| e.map(|e| m.max(e)));
    if largest.is_none_or(|e| e > MAX_ELEMENTS) {
        bail!(
            "batch {} × sequence {} with the {} shapes makes operands of more than {MAX_ELEMENTS} values",
            work.batch,
            work.seq_len,
            work.model
        );
    }
    let dtype = if device.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let mut rows = Vec::with_capacity(gemms.len());
    for g in gemms {
        let ms_each = time(&g, device, dtype, work.repeats)? * 1e3;
        eprintln!(
            "bench gemms: {} {} ({}) {}×{}×{}: {ms_each:.3} ms × {}",
            g.part,
            g.product.as_str(),
            g.weights,
            g.rows,
            g.inp,
            g.out,
            g.count
        );
        rows.push(GemmRow {
            tflop_per_s: g.flops() / (ms_each * 1e-3) / 1e12,
            ms_total: ms_each * g.count as f64,
            ms_each,
            gemm: g,
        });
    }
    Ok(GemmReport {
        device: device_name.to_string(),
        model: work.model.clone(),
        batch: work.batch,
        seq_len: work.seq_len,
        dtype: crate::train::network::ops::check::dtype_name(dtype),
        floor_ms: rows.iter().map(|r| r.ms_total).sum(),
        gemm_tflop: rows
            .iter()
            .map(|r| r.gemm.flops() * r.gemm.count as f64)
            .sum::<f64>()
            / 1e12,
        step_tflop: cfg.flops_per_token(work.seq_len) * tokens as f64 / 1e12,
        rows,
    })
}

/// The median time of `repeats` calls of one product after a warm-up,
/// waiting for the device after each, on operands made once.
fn time(g: &StepGemm, device: &Device, dtype: DType, repeats: usize) -> Result<f64> {
    let random = |shape: (usize, usize)| -> Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, shape, device)?.to_dtype(dtype)?)
    };
    let w = random((g.out, g.inp))?;
    let (x, dy) = (random((g.rows, g.inp))?, random((g.rows, g.out))?);
    let mut sum = Tensor::zeros((g.out, g.inp), dtype, device)?;
    crate::train::network::ops::check::median_after_warmup(repeats, || {
        device.synchronize()?;
        let start = Instant::now();
        match g.product {
            Product::Forward => drop(linear::linear(&x, &w, false)?),
            Product::InputGrad => drop(linear::matmul(&dy, &w, false)?),
            Product::WeightGrad => linear::add_product(&mut sum, &dy, &x, false)?,
        }
        device.synchronize()?;
        Ok(start.elapsed().as_secs_f64())
    })
}

/// The table `sweep bench gemms` prints.
pub fn table(r: &GemmReport) -> String {
    let mut out = format!(
        "the matrix products of one training step: {}, batch {} × sequence {}, {}, on {}\n",
        r.model, r.batch, r.seq_len, r.dtype, r.device
    );
    out += &format!(
        "{:<7} {:<18} {:<16} {:>22} {:>6} {:>10} {:>8} {:>10}\n",
        "part", "product", "weights", "rows × in × out", "count", "ms each", "TFLOP/s", "ms total"
    );
    for row in &r.rows {
        let g = &row.gemm;
        out += &format!(
            "{:<7} {:<18} {:<16} {:>22} {:>6} {:>10.3} {:>8.2} {:>10.2}\n",
            g.part,
            g.product.as_str(),
            g.weights,
            format!("{} × {} × {}", g.rows, g.inp, g.out),
            g.count,
            row.ms_each,
            row.tflop_per_s,
            row.ms_total
        );
    }
    let by = |part: &str, product: Product| -> f64 {
        r.rows
            .iter()
            .filter(|row| row.gemm.part == part && row.gemm.product == product)
            .map(|row| row.ms_total)
            .sum()
    };
    out += &format!(
        "floor: {:.1} ms for {:.2} TFLOP ({:.2} TFLOP/s) of the step's {:.2} (6·N + attention); \
         the blocks' forward {:.1} ms, their backward {:.1} ms, the head {:.1} ms\n",
        r.floor_ms,
        r.gemm_tflop,
        r.gemm_tflop / (r.floor_ms * 1e-3),
        r.step_tflop,
        by("blocks", Product::Forward),
        by("blocks", Product::InputGrad) + by("blocks", Product::WeightGrad),
        by("head", Product::Forward)
            + by("head", Product::InputGrad)
            + by("head", Product::WeightGrad),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_products_do_the_six_n_flops_of_its_matrices() {
        for (name, tokens) in [
            ("ref-1b", 16_384),
            ("ref-8b", 4096),
            ("tiny", 100),
            ("small", 2049),
        ] {
            for gpu in [false, true] {
                let cfg = super::super::preset_shapes(name, None).unwrap();
                let gemms = step_gemms(&cfg, tokens, gpu);
                let flops: f64 = gemms.iter().map(|g| g.flops() * g.count as f64).sum();
                // The non-embedding parameters less the norms' (2 a layer, 1 final).
                let norms = (2 * cfg.n_layers + 1) * cfg.dim;
                let matrices = cfg.non_embedding_params() - norms as u64;
                assert_eq!(flops, 6.0 * matrices as f64 * tokens as f64, "{name} {gpu}");
            }
        }
    }

    #[test]
    fn shapes_are_listed_once_with_their_counts_and_the_head_by_its_slices() {
        let cfg = super::super::preset_shapes("ref-1b", None).unwrap();
        let gemms = step_gemms(&cfg, 16_384, true);
        // wq and wo are both 2048 × 2048, w1 and w3 both 5632 × 2048; wk and wv 512 × 2048.
        let forward: Vec<_> = gemms
            .iter()
            .filter(|g| g.part == "blocks" && g.product == Product::Forward)
            .map(|g| (g.weights.as_str(), g.count))
            .collect();
        assert_eq!(
            forward,
            [("wq, wo", 32), ("wk, wv", 32), ("w1, w3", 32), ("w2", 16)]
        );
        // 2,048 rows a slice of a GPU's head (2^28 logits), 512 on the CPU (2^26).
        let head = |gpu| -> Vec<(usize, usize)> {
            step_gemms(&cfg, 16_384 + 100, gpu)
                .iter()
                .filter(|g| g.part == "head" && g.product == Product::WeightGrad)
                .map(|g| (g.rows, g.count))
                .collect()
        };
        assert_eq!(head(true), [(2048, 8), (100, 1)]);
        assert_eq!(head(false), [(512, 32), (100, 1)]);
    }

    #[test]
    fn every_product_is_timed_on_the_cpu_and_huge_sizes_are_refused() -> Result<()> {
        let work = GemmWork {
            model: "tiny".into(),
            batch: 1,
            seq_len: 4,
            repeats: 1,
        };
        let r = run(&work, &Device::Cpu, "cpu")?;
        assert_eq!(r.rows.len(), 3 * 4 + 3, "{:?}", r.rows);
        assert!(r
            .rows
            .iter()
            .all(|row| row.ms_each > 0.0 && row.ms_total >= row.ms_each));
        assert!(r.gemm_tflop < r.step_tflop && r.floor_ms > 0.0);
        assert!(table(&r).contains("floor:"));
        let huge = GemmWork {
            batch: 1 << 20,
            seq_len: 1 << 20,
            ..work
        };
        let e = run(&huge, &Device::Cpu, "cpu").unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
        Ok(())
    }
}
