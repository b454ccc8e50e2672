//! The train step alone (synthetic batches): tokens/s, FLOP/s and their share of the peak (on
//! the CPU the same kernel's matmul peak on the same threads, on a GPU the table's dense bf16),
//! the time split into forward, backward and optimizer, and peak memory.

use crate::config::{
    AttentionKind, BatchSize, DeviceKind, ModelConfig, ModelOverrides, Precision, Recompute,
    RuntimeOptions, TrainConfig,
};
use crate::data::samples::IGNORE;
use crate::data::{Batch, LoaderState, SpecialTokens, TextTokenizer};
use crate::train::network::device::PeakMemory;
use crate::train::network::parts::PartTime;
use crate::train::run::peak::Kernel;
use crate::train::Trainer;
use anyhow::Result;
use std::path::Path;
use std::sync::Arc;

#[derive(Clone)]
pub struct TrainCase {
    pub label: String,
    pub preset: String,
    /// Changes to the preset (vocabulary, layers).
    pub overrides: ModelOverrides,
    pub seq: usize,
    pub batch: usize,
    pub precision: Precision,
    pub attention: AttentionKind,
    pub device: DeviceKind,
}

impl TrainCase {
    pub fn precision(&self) -> &'static str {
        match self.precision {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Bf16Mixed => "bf16-mixed",
        }
    }
}

pub struct TrainRow {
    pub case: TrainCase,
    pub params: usize,
    pub flops_per_token: f64,
    pub tokens_per_s: f64,
    pub gflops: f64,
    pub peak_gflops: f64,
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
    pub peak_memory_mb: f64,
    /// The device's average power over the timed steps, where it has a counter.
    pub watts: Option<f64>,
    /// The device as the driver names it (`cpu` on the CPU).
    pub device_name: String,
    /// Where one more step's time went, op by op (`--parts`).
    pub parts: Option<Vec<PartTime>>,
}

/// How `sweep bench train` times its cases.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Timed steps, after two warm-up steps.
    pub steps: usize,
    pub threads: usize,
    /// The accelerator's name in the peak table, where the driver's differs.
    pub gpu: Option<String>,
    pub recompute: Recompute,
    /// One more step after the timed ones, recorded op by op (not in the timed figures).
    pub parts: bool,
}

/// One case as `--json` writes it, in `scripts/torch-gpu-baseline.py`'s keys (so gpu-check sets
/// them side by side); a failed case has `error` and no figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JsonRow {
    pub implementation: &'static str,
    pub model: String,
    pub precision: &'static str,
    pub batch: usize,
    pub seq: usize,
    pub device: String,
    pub tokens_per_second: Option<f64>,
    pub mfu_pct: Option<f64>,
    pub tflops: Option<f64>,
    /// The device's peak memory in GiB (PyTorch's rows count 2^30 bytes too).
    pub peak_memory_gb: Option<f64>,
    /// Average watts over the timed steps and those over tokens per second.
    pub watts: Option<f64>,
    pub joules_per_token: Option<f64>,
    pub step_s: Option<f64>,
    /// The step's phases, synchronised (sweep's own; PyTorch's rows have none).
    pub forward_s: Option<f64>,
    pub backward_s: Option<f64>,
    pub optimizer_s: Option<f64>,
    pub params: Option<usize>,
    /// With `--parts`: one more step's time by pass and op.
    pub parts: Option<Vec<PartTime>>,
    pub error: Option<String>,
}

impl JsonRow {
    pub fn timed(r: &TrainRow, device: &str) -> JsonRow {
        let step = r.forward_s + r.backward_s + r.optimizer_s;
        JsonRow {
            tokens_per_second: Some(r.tokens_per_s),
            mfu_pct: Some(crate::estimate::mfu_pct(r.gflops, r.peak_gflops)),
            tflops: Some(r.gflops / 1e3),
            peak_memory_gb: Some(r.peak_memory_mb / 1024.0),
            watts: r.watts,
            joules_per_token: r.watts.map(|w| w / r.tokens_per_s),
            step_s: Some(step),
            forward_s: Some(r.forward_s),
            backward_s: Some(r.backward_s),
            optimizer_s: Some(r.optimizer_s),
            params: Some(r.params),
            parts: r.parts.clone(),
            ..JsonRow::untimed(&r.case, device, None)
        }
    }

    pub fn failed(f: &Failed, device: &str) -> JsonRow {
        JsonRow::untimed(&f.case, device, Some(format!("{:#}", f.error)))
    }

    fn untimed(case: &TrainCase, device: &str, error: Option<String>) -> JsonRow {
        JsonRow {
            implementation: "sweep",
            model: case.label.clone(),
            precision: case.precision(),
            batch: case.batch,
            seq: case.seq,
            device: device.to_string(),
            tokens_per_second: None,
            mfu_pct: None,
            tflops: None,
            peak_memory_gb: None,
            watts: None,
            joules_per_token: None,
            step_s: None,
            forward_s: None,
            backward_s: None,
            optimizer_s: None,
            params: None,
            parts: None,
            error,
        }
    }
}

fn case(
    label: &str,
    preset: &str,
    vocab: usize,
    seq: usize,
    batch: usize,
    bf16: bool,
) -> TrainCase {
    TrainCase {
        label: label.into(),
        preset: preset.into(),
        overrides: ModelOverrides {
            vocab_size: Some(vocab),
            ..Default::default()
        },
        seq,
        batch,
        precision: if bf16 {
            Precision::Bf16Mixed
        } else {
            Precision::F32
        },
        attention: AttentionKind::Eager,
        device: DeviceKind::Cpu,
    }
}

/// The presets as the quickstart trains them and the CPU speed-goal model (`small`, vocab 8192,
/// seq 256, batch 8), in f32 and bf16-mixed.
pub fn default_cases() -> Vec<TrainCase> {
    vec![
        case("tiny (quickstart shape)", "tiny", 32000, 512, 2, false),
        case("small (vocab 32000)", "small", 32000, 512, 2, false),
        case("small (vocab 8192)", "small", 8192, 256, 8, false),
        case("small (vocab 8192)", "small", 8192, 256, 8, true),
    ]
}

/// The GPU cases as the reference trained: `ref-1b` at batch 8 (and 2), sequence 2048, and
/// `layers` of `ref-8b`'s 32 layers at batch 1 and 2, bf16 flash; `ref-1b` eager too.
pub fn gpu_cases(layers: usize) -> Vec<TrainCase> {
    let gpu = |label: String, preset: &str, n_layers: Option<usize>, batch, attention| TrainCase {
        label,
        preset: preset.into(),
        overrides: ModelOverrides {
            n_layers,
            ..Default::default()
        },
        seq: 2048,
        batch,
        precision: Precision::Bf16,
        attention,
        device: DeviceKind::Cuda,
    };
    let eight = |batch| {
        let label = if layers == 32 {
            "ref-8b".to_string()
        } else {
            format!("ref-8b ({layers} layers)")
        };
        gpu(label, "ref-8b", Some(layers), batch, AttentionKind::Flash)
    };
    vec![
        // Batch 2 first: how memory and speed grow toward batch 8.
        gpu("ref-1b".into(), "ref-1b", None, 2, AttentionKind::Flash),
        gpu("ref-1b".into(), "ref-1b", None, 8, AttentionKind::Flash),
        gpu(
            "ref-1b eager".into(),
            "ref-1b",
            None,
            8,
            AttentionKind::Eager,
        ),
        eight(1),
        eight(2),
    ]
}

/// The peak MFU is measured against: on the CPU the case's kernel's matmul peak, on a GPU the
/// table's (`gpu` overrides the driver's name).
fn peak(c: &TrainCase, device_name: &str, threads: usize, gpu: Option<&str>) -> Result<f64> {
    Ok(match c.device {
        DeviceKind::Cpu => {
            let bf16 = c.precision == Precision::Bf16Mixed;
            let mut best = 0f64;
            for kernel in Kernel::for_precision(bf16) {
                best = best.max(crate::train::run::peak::refresh(kernel, threads)?);
            }
            best
        }
        DeviceKind::Cuda => {
            let cfg = TrainConfig {
                gpu: gpu.map(str::to_string),
                ..Default::default()
            };
            crate::train::run::metrics::peak_flops(&cfg, Some(device_name), threads)?.0
        }
    })
}

/// A case that could not be timed (out of device memory, say), and why.
pub struct Failed {
    pub case: TrainCase,
    pub error: anyhow::Error,
}

/// Times every case; `tokenizer` is the trainer's (ids are synthetic). A failing case is
/// reported and the next runs.
pub fn run(
    cases: Vec<TrainCase>,
    settings: &Settings,
    tokenizer: &Path,
    rt: &RuntimeOptions,
) -> Vec<std::result::Result<TrainRow, Box<Failed>>> {
    let tok = TextTokenizer::load(tokenizer, &SpecialTokens::default()).map(Arc::new);
    cases
        .into_iter()
        .map(|case| {
            let outcome = match &tok {
                Ok(tok) => time_case(&case, settings, tok, rt),
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
            };
            // As each case ends: the table comes only after the last one.
            match &outcome {
                Ok(r) => eprintln!(
                    "bench train: {} b{}: {:.0} tokens/s, peak {:.0} MB",
                    case.label, case.batch, r.tokens_per_s, r.peak_memory_mb
                ),
                Err(e) => eprintln!("bench train: {} b{}: {e:#}", case.label, case.batch),
            }
            outcome.map_err(|error| Box::new(Failed { case, error }))
        })
        .collect()
}

fn time_case(
    case: &TrainCase,
    settings: &Settings,
    tok: &Arc<TextTokenizer>,
    rt: &RuntimeOptions,
) -> Result<TrainRow> {
    let case = case.clone();
    let cfg = TrainConfig {
        model: case.preset.clone(),
        architecture: case.overrides.clone(),
        sequence_length: case.seq,
        batch_size: BatchSize::Fixed(case.batch),
        precision: case.precision,
        attention: case.attention,
        device: case.device,
        recompute: settings.recompute,
        seed: 1,
        threads: settings.threads,
        ..Default::default()
    };
    // The case's vocabulary, whatever the tokenizer's: the ids are synthetic.
    let model = ModelConfig::resolve(&case.preset, &case.overrides)?;
    let vocab = model.vocab_size;
    let mut t = Trainer::with_model(cfg, model, Arc::clone(tok), settings.threads, rt)?;
    t.sync_forward = true;
    // What the device's opening timed (the process keeps its choices).
    for k in &t.kernel_timings {
        eprintln!(
            "bench train: {} b{}: {}",
            case.label,
            case.batch,
            k.describe()
        );
    }
    let device = t.device.clone();
    let row = measure(t, case, settings, vocab);
    // The pool keeps what the case freed: handed back so the next case's peak is its own.
    crate::train::network::device::release_pool(&device)?;
    row
}

/// `settings.steps` timed steps after two warm-ups, and one op by op with `parts` (`t` freed
/// on return).
fn measure(mut t: Trainer, case: TrainCase, settings: &Settings, vocab: usize) -> Result<TrainRow> {
    let steps = settings.steps;
    let device_name = crate::train::network::device::name(&t.device)?;
    let peak = peak(
        &case,
        &device_name,
        settings.threads,
        settings.gpu.as_deref(),
    )?;
    let n = case.batch * case.seq;
    let batch = Batch {
        inputs: (0..n).map(|i| ((i * 7919) % vocab) as u32).collect(),
        labels: (0..n)
            .map(|i| match i % case.seq {
                0 => IGNORE,
                _ => ((i * 104729) % vocab) as i64,
            })
            .collect(),
        batch_size: case.batch,
        seq_len: case.seq,
        training_tokens: n - case.batch,
        state: LoaderState::default(),
    };
    let mut memory = PeakMemory::default();
    let (mut fwd, mut bwd, mut upd) = (0.0, 0.0, 0.0);
    let mut meter = None;
    for step in 0..steps + 2 {
        if step == 2 {
            meter = crate::train::run::energy::open(&t.device);
        }
        let out = t.step(std::slice::from_ref(&batch), 1e-4, &mut memory, None)?;
        if step >= 2 {
            // The first two steps warm up allocations and caches.
            fwd += out.phases.forward_s;
            bwd += out.phases.backward_s;
            upd += out.phases.optimizer_s;
        }
    }
    let watts = meter.as_mut().and_then(|m| m.watts());
    let parts = if settings.parts {
        crate::train::network::parts::start(&t.device)?;
        let step = t.step(std::slice::from_ref(&batch), 1e-4, &mut memory, None);
        // Finished whatever the step did: the recording is this thread's.
        let parts = crate::train::network::parts::finish();
        step?;
        Some(parts?)
    } else {
        None
    };
    let cfg = &t.model_spec.cfg;
    let total = fwd + bwd + upd;
    let tokens_per_s = (n * steps) as f64 / total;
    let flops_per_token = cfg.flops_per_token(case.seq);
    Ok(TrainRow {
        params: t.params.count(),
        flops_per_token,
        tokens_per_s,
        gflops: tokens_per_s * flops_per_token / 1e9,
        peak_gflops: peak / 1e9,
        forward_s: fwd / steps as f64,
        backward_s: bwd / steps as f64,
        optimizer_s: upd / steps as f64,
        peak_memory_mb: memory.peak_mb(&t.device),
        watts,
        device_name,
        parts,
        case,
    })
}
