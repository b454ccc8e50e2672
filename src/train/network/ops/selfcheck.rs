//! The self-check a CUDA device gets as it opens: every kernel an op may use against its
//! composed twin, on tiny shapes (every tail and partial block) and the run's own, each case
//! synchronised. A kernel out of [`check::tolerance`], writing a NaN or failing takes its twin
//! there (said, recorded, reported); under `auto` the others are timed against their twins and
//! the faster runs, so a kernel written blind never makes a run slower. docs/gpu.md.

use super::check::{self, dtype_name, errors, flat_f32, prepare, tolerance, Case, Shapes};
use super::Kernel;
use crate::config::runtime::CudaKernels;
use crate::config::{ModelConfig, ModelOverrides};
use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// A kernel that disagreed with its twin, or failed to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kernel: Kernel,
    /// The case (`rms_norm forward`, ...) and dtype (none: it failed on another rank's GPU).
    pub case: &'static str,
    /// The shapes it failed at, where it ran.
    pub shape: Option<String>,
    pub dtype: Option<DType>,
    /// Max |kernel − twin| / max |twin|, where both ran.
    pub rel_err: Option<f64>,
    pub tolerance: f64,
    /// What went wrong, in words.
    pub why: String,
}

impl Failure {
    /// One line: the kernel, the case and what went wrong.
    pub fn describe(&self) -> String {
        let dtype = self
            .dtype
            .map_or(String::new(), |d| format!(" in {}", dtype_name(d)));
        let shape = self
            .shape
            .as_ref()
            .map_or(String::new(), |s| format!(" at {s}"));
        format!(
            "{}: {}{shape}{dtype}: {}",
            self.kernel.name(),
            self.case,
            self.why
        )
    }
}

/// The self-check's shapes: width 64 (4 heads of 16, 2 KV heads), 2 sequences of 32, a
/// vocabulary of 320: every tail and partial block, in a few hundred kilobytes.
pub fn tiny_model() -> Result<ModelConfig> {
    let mut cfg = ModelConfig::resolve(
        "tiny",
        &ModelOverrides {
            dim: Some(64),
            n_layers: Some(1),
            n_heads: Some(4),
            n_kv_heads: Some(2),
            multiple_of: Some(32),
            ..Default::default()
        },
    )?;
    cfg.vocab_size = 320;
    Ok(cfg)
}

/// Every case on the tiny shapes, on `device`.
pub fn cases(device: &Device) -> Result<Vec<Case>> {
    let cfg = tiny_model()?;
    crate::train::network::ops::cases::all(&Shapes {
        cfg: &cfg,
        batch: 2,
        seq: 32,
        device,
    })
}

/// The most tokens of a case at a run's shapes, checked or timed (docs/gpu.md).
pub const RUN_TOKENS: usize = 128;
pub const TIMED_TOKENS: usize = 2048;
pub const RUN_TABLE_ROWS: usize = 8_192;

/// Every case at a run's shapes (widths, heads, vocabulary), one layer, one sequence of up to
/// `most_tokens`; tables' rows capped at [`RUN_TABLE_ROWS`].
pub fn run_cases(
    device: &Device,
    run: &ModelConfig,
    seq: usize,
    most_tokens: usize,
) -> Result<Vec<Case>> {
    let cfg = ModelConfig {
        n_layers: 1,
        ..run.clone()
    };
    let tables = ModelConfig {
        vocab_size: cfg.vocab_size.min(RUN_TABLE_ROWS),
        ..cfg.clone()
    };
    let shapes = |cfg| Shapes {
        cfg,
        batch: 1,
        seq: seq.clamp(1, most_tokens),
        device,
    };
    crate::train::network::ops::cases::all_with(&shapes(&tables), &shapes(&cfg))
}

/// Runs each case in its dtypes: the kernel, then its twin, on the same inputs; the failures.
pub fn run(cases: &[Case], device: &Device) -> Vec<Failure> {
    let mut failures = Vec::new();
    for case in cases {
        for dtype in check::dtypes(case, device) {
            // The kernel first, on fresh memory: an unwritten output does not read as its twin's.
            let got = (|| -> Result<Vec<f32>> {
                let out = (case.run)(&prepare(case, device, dtype)?)?;
                device.synchronize()?;
                flat_f32(&out)
            })();
            let want = (|| -> Result<Vec<f32>> {
                let out = case.run_twin(&prepare(case, device, dtype)?)?;
                device.synchronize()?;
                flat_f32(&out)
            })();
            let tol = tolerance(case, dtype);
            let fail = |rel_err, why: String| Failure {
                kernel: case.kernel,
                case: case.op,
                shape: Some(case.shape.clone()),
                dtype: Some(dtype),
                rel_err,
                tolerance: tol,
                why,
            };
            let oom = |r: &Result<Vec<f32>>| {
                r.as_ref()
                    .err()
                    .is_some_and(crate::train::network::device::is_out_of_memory)
            };
            if oom(&got) || oom(&want) {
                // The device's memory, not the kernel: it passed the tiny shapes, and is kept.
                eprintln!(
                    "sweep train: note: {} {} at {} not checked: out of the device's memory",
                    case.kernel.name(),
                    case.op,
                    case.shape
                );
                continue;
            }
            match (got, want) {
                (Err(e), _) => failures.push(fail(None, format!("it failed: {e:#}"))),
                (_, Err(e)) => failures.push(fail(
                    None,
                    format!("its composed twin failed, so it could not be checked: {e:#}"),
                )),
                (Ok(got), Ok(want)) => match errors(&got, &want) {
                    Err(e) => failures.push(fail(None, format!("{e:#}"))),
                    Ok((_, rel)) if rel.is_nan() || rel > tol => failures.push(fail(
                        Some(rel),
                        format!("max relative error {rel:.2e} against its composed twin (tolerance {tol:.1e})"),
                    )),
                    Ok(_) => {}
                },
            }
        }
    }
    failures
}

/// The kernels to leave out on this device: each that failed, once — or, under
/// `SWEEP_CUDA_KERNELS=own`, an error naming them.
pub fn decide(policy: CudaKernels, failures: &[Failure]) -> Result<Vec<Kernel>> {
    let mut kernels: Vec<Kernel> = failures.iter().map(|f| f.kernel).collect();
    kernels.sort();
    kernels.dedup();
    if policy == CudaKernels::Own && !kernels.is_empty() {
        let lines: Vec<String> = failures
            .iter()
            .map(|f| format!("  {}", f.describe()))
            .collect();
        bail!(
            "SWEEP_CUDA_KERNELS=own, and {} of the kernels failed the self-check on this GPU:\n{}\n\
             unset SWEEP_CUDA_KERNELS to train with their composed twins instead (the run then records which), \
             and please report it with `sweep bench kernels --device cuda`'s table",
            kernels.len(),
            lines.join("\n")
        );
    }
    Ok(kernels)
}

/// A kernel's and its twin's times at a run's shapes: each case's median of [`REPEATS`],
/// summed over the kernel's cases, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub kernel: Kernel,
    pub own_s: f64,
    pub composed_s: f64,
}

pub const REPEATS: usize = 3;

impl Timing {
    /// Whether the run takes the twin: only where faster (a blind kernel never slows a run).
    pub fn twin_is_faster(&self) -> bool {
        self.composed_s < self.own_s
    }

    pub fn describe(&self) -> String {
        format!(
            "{}: {} ({:.3} ms, its composed twin {:.3} ms)",
            self.kernel.name(),
            if self.twin_is_faster() {
                "composed"
            } else {
                "own"
            },
            self.own_s * 1e3,
            self.composed_s * 1e3
        )
    }
}

/// The kernels whose composed twins were faster.
pub fn slower(timings: &[Timing]) -> Vec<Kernel> {
    timings
        .iter()
        .filter(|t| t.twin_is_faster())
        .map(|t| t.kernel)
        .collect()
}

/// How long a case takes by its kernel (`false`) or twin (`true`); planted in the tests.
pub type Clock<'a> = &'a dyn Fn(&Case, DType, bool) -> Result<f64>;

/// Times each kernel in `cases` but `left_out` against its twin; one failing while timed keeps
/// its path.
pub fn time(
    cases: &[Case],
    dtype_of: &dyn Fn(&Case) -> DType,
    left_out: &[Kernel],
    clock: Clock,
) -> Vec<Timing> {
    let mut timings: Vec<Timing> = Vec::new();
    let mut untimed: Vec<Kernel> = Vec::new();
    for case in cases {
        let k = case.kernel;
        if !k.own() || left_out.contains(&k) || untimed.contains(&k) {
            continue;
        }
        let dtype = dtype_of(case);
        match clock(case, dtype, false).and_then(|own| Ok((own, clock(case, dtype, true)?))) {
            Ok((own_s, composed_s)) => match timings.iter_mut().find(|t| t.kernel == k) {
                Some(t) => {
                    t.own_s += own_s;
                    t.composed_s += composed_s;
                }
                None => timings.push(Timing {
                    kernel: k,
                    own_s,
                    composed_s,
                }),
            },
            Err(e) => {
                eprintln!(
                    "sweep train: note: {} not timed at {} ({e:#}): it keeps its path",
                    k.name(),
                    case.shape
                );
                untimed.push(k);
            }
        }
    }
    timings.retain(|t| !untimed.contains(&t.kernel));
    timings
}

/// What a device's opening found: failed kernels, and under `auto` each other's time against
/// its twin's (the ranks agree on both).
#[derive(Debug, Default)]
pub struct Opened {
    pub failures: Vec<Failure>,
    pub timings: Vec<Timing>,
}

/// The self-check of a device just opened: compiles every module, checks every kernel, makes
/// failures take their twins and under `auto` times the rest in `dtype`. An error under `own`.
pub fn at_open(
    device: &Device,
    policy: CudaKernels,
    run_model: &ModelConfig,
    seq: usize,
    dtype: DType,
) -> Result<Opened> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        super::cuda::load_all(d)?;
    }
    // Made once the checked cases are freed: at 8B shapes each set holds gigabytes.
    let timed = || match policy {
        CudaKernels::Auto => run_cases(device, run_model, seq, TIMED_TOKENS),
        _ => Ok(Vec::new()),
    };
    let clock = |c: &Case, dtype, composed| check::time(c, device, dtype, REPEATS, composed);
    let opened = check_and_time(
        [
            cases(device)?,
            run_cases(device, run_model, seq, RUN_TOKENS)?,
        ],
        timed,
        device,
        policy,
        dtype,
        &clock,
    )?;
    let failed: Vec<Kernel> = opened.failures.iter().map(|f| f.kernel).collect();
    super::fall_back(&failed);
    Ok(opened)
}

/// [`at_open`]'s work on cases made: the checks and the times.
fn check_and_time(
    checked: [Vec<Case>; 2],
    timed: impl FnOnce() -> Result<Vec<Case>>,
    device: &Device,
    policy: CudaKernels,
    dtype: DType,
    clock: Clock,
) -> Result<Opened> {
    let here = |cases: Vec<Case>| -> Vec<Case> {
        cases
            .into_iter()
            .filter(|c| super::on_gpu(c.kernel) || device.is_cpu())
            .collect()
    };
    let started = std::time::Instant::now();
    let failures: Vec<Failure> = checked
        .into_iter()
        .flat_map(|cases| run(&here(cases), device))
        .collect();
    eprintln!(
        "sweep train: kernel self-check at the tiny shapes and the run's own: {} failure(s) in {:.1} s",
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    let kernels = decide(policy, &failures)?;
    for f in &failures {
        eprintln!(
            "sweep train: warning: kernel self-check failed: {}; {} runs its composed twin on this GPU",
            f.describe(),
            f.kernel.name()
        );
    }
    let timed = here(timed()?);
    let started = std::time::Instant::now();
    let timings = time(
        &timed,
        &|c| check::timed_dtype(c, device, dtype),
        &kernels,
        clock,
    );
    if !timings.is_empty() {
        eprintln!(
            "sweep train: {} kernels timed against their composed twins at the run's shapes in {:.1} s",
            timings.len(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(Opened { failures, timings })
}

/// Makes the kernels whose twins were faster (summed over ranks) take them, said on stderr.
pub fn take_faster(timings: &[Timing]) {
    let twins = slower(timings);
    super::fall_back(&twins);
    for t in timings.iter().filter(|t| t.twin_is_faster()) {
        eprintln!(
            "sweep train: note: timed at the run's shapes, {}: its composed twin runs on this GPU",
            t.describe()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::check::random;
    use candle_core::Tensor;
    use strum::VariantArray;

    /// On the CPU every case's kernel (the fused CPU kernels, the host
    /// AdamW, flash attention's reference forward) agrees with its twin.
    #[test]
    fn every_kernel_passes_its_self_check_on_the_cpu() {
        let cases = cases(&Device::Cpu).unwrap();
        let covered: std::collections::BTreeSet<Kernel> = cases.iter().map(|c| c.kernel).collect();
        assert_eq!(
            covered.into_iter().collect::<Vec<_>>(),
            Kernel::VARIANTS.to_vec(),
            "every kernel has a case"
        );
        let failures = run(&cases, &Device::Cpu);
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// A case whose kernel gives other values than its twin, one that
    /// fails, and one that writes a NaN: each is a failure of its kernel,
    /// said with its error.
    #[test]
    fn a_kernel_that_disagrees_fails_or_writes_nan_is_named() {
        let case = |kernel, op, wrong: fn(&Tensor) -> candle_core::Result<Tensor>| {
            Case::new(
                kernel,
                op,
                "[4, 8]".into(),
                32,
                vec![random(&[4, 8], 1, 1.0).unwrap()],
                Box::new(move |t| {
                    // What the op's dispatch asks: the kernel, or the twin.
                    let own = super::super::own_kernel(kernel, &[&t[0]]);
                    Ok(vec![if own { wrong(&t[0])? } else { t[0].clone() }])
                }),
            )
        };
        let cases = [
            case(Kernel::RmsNorm, "scaled", |x| x * 1.5),
            case(Kernel::Rope, "fails", |_| {
                Err(candle_core::Error::Msg("launch failed".into()))
            }),
            case(Kernel::AdamW, "nan", |x| x * f64::NAN),
            case(Kernel::SiluMul, "rounded", |x| {
                x.to_dtype(DType::BF16)?.to_dtype(DType::F32)
            }),
        ];
        let failures = run(&cases, &Device::Cpu);
        let named: Vec<(Kernel, &str)> = failures.iter().map(|f| (f.kernel, f.case)).collect();
        // bf16 rounding of an f32 kernel's output (4e-3) is outside f32's
        // tolerance too.
        assert_eq!(
            named,
            [
                (Kernel::RmsNorm, "scaled"),
                (Kernel::Rope, "fails"),
                (Kernel::AdamW, "nan"),
                (Kernel::SiluMul, "rounded")
            ]
        );
        assert!(failures[0].rel_err.unwrap() > 0.3, "{:?}", failures[0]);
        assert!(
            failures[1].why.contains("launch failed"),
            "{:?}",
            failures[1]
        );
        assert_eq!(failures[2].rel_err, Some(f64::INFINITY));
        assert!(failures[0]
            .describe()
            .starts_with("rms_norm: scaled at [4, 8] in f32: max relative error"));
    }

    /// A run's model for the checks below: width 256, head dimension 128,
    /// a vocabulary past the tables' cap.
    fn a_run() -> ModelConfig {
        let mut cfg = ModelConfig::resolve(
            "tiny",
            &ModelOverrides {
                dim: Some(256),
                n_layers: Some(4),
                n_heads: Some(2),
                n_kv_heads: Some(1),
                multiple_of: Some(32),
                ..Default::default()
            },
        )
        .unwrap();
        cfg.vocab_size = 40_000;
        cfg
    }

    /// A fault: what a kernel gives instead, from its inputs and outputs.
    type Fault = fn(Kernel, &[Tensor], Vec<Tensor>) -> Result<Vec<Tensor>>;

    /// Each case with a fault planted in its kernel (not its twin).
    fn planted(cases: Vec<Case>, fault: Fault) -> Vec<Case> {
        cases
            .into_iter()
            .map(|mut c| {
                let (kernel, run) = (
                    c.kernel,
                    std::mem::replace(&mut c.run, Box::new(|_| Ok(vec![]))),
                );
                c.run = Box::new(move |t| {
                    let out = run(t)?;
                    match super::super::own_kernel(kernel, &[&t[0]]) {
                        true => fault(kernel, t, out),
                        false => Ok(out),
                    }
                });
                c
            })
            .collect()
    }

    /// The run's own shapes are checked: its width, head dimension (flash
    /// attention's template), the loss over its whole vocabulary; a fault
    /// that shows only there is caught there and not on the tiny shapes.
    #[test]
    fn faults_only_at_the_runs_shapes_are_caught_at_them() {
        let model = a_run();
        let at_run = run_cases(&Device::Cpu, &model, 4096, RUN_TOKENS).unwrap();
        let shape = |op: &str| {
            at_run
                .iter()
                .find(|c| c.op == op)
                .map(|c| c.shape.clone())
                .unwrap_or_else(|| panic!("no {op} case"))
        };
        assert_eq!(shape("flash attention forward"), "[1, 128, 2/1, 128]");
        assert_eq!(shape("loss and d logits"), "[128, 40000]");
        assert!(
            shape("rms_norm forward").ends_with(", 256]"),
            "{}",
            shape("rms_norm forward")
        );
        // A kernel wrong only above width 64 (the tiny model's): RMSNorm's
        // width is the model's, 64 on the tiny shapes, 256 at the run's.
        let wider = |_: Kernel, t: &[Tensor], out: Vec<Tensor>| -> Result<Vec<Tensor>> {
            match t[0].dims().last().is_some_and(|&w| w > 64) {
                true => Ok(out
                    .into_iter()
                    .map(|o| o * 1.5)
                    .collect::<candle_core::Result<_>>()?),
                false => Ok(out),
            }
        };
        let rms = |failures: &[Failure]| failures.iter().any(|f| f.kernel == Kernel::RmsNorm);
        assert!(!rms(&run(
            &planted(cases(&Device::Cpu).unwrap(), wider),
            &Device::Cpu
        )));
        let caught = run(
            &planted(
                run_cases(&Device::Cpu, &model, 4096, RUN_TOKENS).unwrap(),
                wider,
            ),
            &Device::Cpu,
        );
        assert!(rms(&caught), "{caught:#?}");
        let said = caught
            .iter()
            .find(|f| f.kernel == Kernel::RmsNorm)
            .unwrap()
            .describe();
        assert!(said.contains(", 256] in f32"), "{said}");
        // A flash launch that fails at head dimension 128, not at 16.
        let head_128 = |kernel: Kernel, t: &[Tensor], out: Vec<Tensor>| -> Result<Vec<Tensor>> {
            match kernel == Kernel::Flash && t[0].dims().last() == Some(&128) {
                true => bail!("launch failed: too many resources requested"),
                false => Ok(out),
            }
        };
        assert!(run(
            &planted(cases(&Device::Cpu).unwrap(), head_128),
            &Device::Cpu
        )
        .is_empty());
        let flash = run(
            &planted(
                run_cases(&Device::Cpu, &model, 4096, RUN_TOKENS).unwrap(),
                head_128,
            ),
            &Device::Cpu,
        );
        assert_eq!(flash.len(), 1, "{flash:#?}");
        assert_eq!(flash[0].kernel, Kernel::Flash);
        assert!(
            flash[0].why.contains("too many resources"),
            "{}",
            flash[0].why
        );
        assert_eq!(decide(CudaKernels::Auto, &flash).unwrap(), [Kernel::Flash]);
    }

    /// What the check at ref-8b's shapes costs on an H100 machine,
    /// estimated from its cases' sizes: making their inputs (4 ns a value
    /// on one core, as here on a quiet allocation, over the machine's 16
    /// cores), sending them (25 GB/s), and each case's kernel and twin, in
    /// bf16 and f32, at 2 TB/s and 400 TFLOP/s. Run by hand (`--ignored`;
    /// ~4 GB of memory): docs/gpu.md states its figures.
    #[test]
    #[ignore = "an estimate for docs/gpu.md: ~4 GB of memory"]
    fn the_check_at_ref_8b_shapes_costs_seconds() {
        let model = ModelConfig::preset("ref-8b").unwrap();
        let made = std::time::Instant::now();
        let cases = run_cases(&Device::Cpu, &model, 4096, RUN_TOKENS).unwrap();
        let made_here = made.elapsed().as_secs_f64();
        let inputs: usize = cases
            .iter()
            .flat_map(|c| &c.inputs)
            .map(|t| t.elem_count())
            .sum();
        let moved: usize = cases.iter().map(|c| c.elements_moved).sum();
        let flops: f64 = cases.iter().map(|c| c.flops).sum();
        let make_s = inputs as f64 * 4e-9 / 16.0;
        // Sent once a dtype (6 bytes: f32 and bf16); kernel and twin (the
        // twin's passes ~3x the kernel's traffic) in both dtypes.
        let send_s = 6.0 * inputs as f64 / 25e9;
        let run_s = 2.0 * (4.0 * 6.0 * moved as f64 / 2e12 + 2.0 * flops / 400e12);
        eprintln!(
            "ref-8b shapes: {} cases, {:.2}G input values (made in {made_here:.1} s on this machine); on an H100 machine: made {make_s:.2} s, sent {send_s:.2} s, run {run_s:.2} s: {:.1} s",
            cases.len(),
            inputs as f64 / 1e9,
            make_s + send_s + run_s
        );
        assert!(make_s + send_s + run_s < 10.0);
    }

    /// `auto` and `composed` leave out each failed kernel once; `own`
    /// refuses, naming every failure and what to do.
    #[test]
    fn own_refuses_a_failed_kernel_and_auto_leaves_it_out() {
        let f = |kernel, case| Failure {
            kernel,
            case,
            shape: None,
            dtype: Some(DType::BF16),
            rel_err: Some(0.5),
            tolerance: 1.6e-2,
            why: "max relative error 5.00e-1".into(),
        };
        let failures = [
            f(Kernel::Softmax, "softmax backward"),
            f(Kernel::RmsNorm, "rms_norm forward"),
            f(Kernel::Softmax, "attention backward"),
        ];
        for policy in [CudaKernels::Auto, CudaKernels::Composed] {
            assert_eq!(
                decide(policy, &failures).unwrap(),
                [Kernel::RmsNorm, Kernel::Softmax]
            );
        }
        assert_eq!(decide(CudaKernels::Own, &[]).unwrap(), []);
        let e = decide(CudaKernels::Own, &failures).unwrap_err().to_string();
        assert!(e.contains("2 of the kernels failed"), "{e}");
        assert!(e.contains("softmax: attention backward in bf16"), "{e}");
        assert!(e.contains("unset SWEEP_CUDA_KERNELS"), "{e}");
    }

    /// A case with a twin of its own (the fused attention backward's: the
    /// tiled backward) is checked and timed against that twin, not against
    /// the op with every kernel composed: a kernel that disagrees with it
    /// fails, and timing its twin runs it.
    #[test]
    fn a_case_with_a_twin_is_held_to_that_twin() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static TWIN_RAN: AtomicUsize = AtomicUsize::new(0);
        let case = |offset: f64| Case {
            twin: Some(Box::new(|t: &[Tensor]| {
                TWIN_RAN.fetch_add(1, Ordering::Relaxed);
                Ok(vec![(&t[0] + 1.0)?])
            })),
            ..Case::new(
                Kernel::AttentionBackward,
                "planted",
                "[4]".into(),
                4,
                vec![random(&[4], 1, 1.0).unwrap()],
                Box::new(move |t| Ok(vec![(&t[0] + offset)?])),
            )
        };
        assert!(run(&[case(1.0)], &Device::Cpu).is_empty());
        let failures = run(&[case(0.0)], &Device::Cpu);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].kernel, Kernel::AttentionBackward);
        let before = TWIN_RAN.load(Ordering::Relaxed);
        check::time(&case(1.0), &Device::Cpu, DType::F32, 1, true).unwrap();
        assert_eq!(
            TWIN_RAN.load(Ordering::Relaxed) - before,
            2,
            "a warm-up and one timed call"
        );
    }

    /// The choice at a device's opening, on planted times: the slower path
    /// is never chosen (a tie keeps the kernel), and a kernel that is wrong
    /// is never timed nor chosen, however fast its planted time; the times
    /// sum over a kernel's cases; a kernel that cannot be timed keeps its
    /// path; `own` and `composed` time nothing.
    #[test]
    fn the_faster_correct_path_is_chosen() {
        let wrong = |k: Kernel, _: &[Tensor], out: Vec<Tensor>| -> Result<Vec<Tensor>> {
            match k {
                Kernel::RmsNorm => Ok(out
                    .into_iter()
                    .map(|o| o * 1.5)
                    .collect::<candle_core::Result<_>>()?),
                _ => Ok(out),
            }
        };
        let made = || planted(cases(&Device::Cpu).unwrap(), wrong);
        let clock = |c: &Case, _: DType, twin: bool| -> Result<f64> {
            Ok(match (c.kernel, twin) {
                (Kernel::RmsNorm, false) => 1e-6,
                (Kernel::Softmax, false) => 2e-3,
                (Kernel::Softmax, true) => 1e-3,
                (Kernel::Rope, _) => 1e-3,
                (Kernel::SiluMul, false) => bail!("out of memory"),
                (_, false) => 1e-3,
                (_, true) => 2e-3,
            })
        };
        let opened = check_and_time(
            [made(), Vec::new()],
            || Ok(made()),
            &Device::Cpu,
            CudaKernels::Auto,
            DType::F32,
            &clock,
        )
        .unwrap();
        let failed: Vec<Kernel> = opened.failures.iter().map(|f| f.kernel).collect();
        assert!(failed.iter().all(|k| *k == Kernel::RmsNorm) && !failed.is_empty());
        let timed: Vec<Kernel> = opened.timings.iter().map(|t| t.kernel).collect();
        assert!(
            !timed.contains(&Kernel::RmsNorm),
            "a wrong kernel is not timed"
        );
        assert!(!timed.contains(&Kernel::SiluMul), "untimed keeps its path");
        assert!(!timed.contains(&Kernel::Flash), "not sweep's");
        assert!(timed.contains(&Kernel::Rope) && timed.contains(&Kernel::AdamW));
        assert_eq!(slower(&opened.timings), [Kernel::Softmax]);
        let softmax = opened
            .timings
            .iter()
            .find(|t| t.kernel == Kernel::Softmax)
            .unwrap();
        let cases = cases(&Device::Cpu)
            .unwrap()
            .iter()
            .filter(|c| c.kernel == Kernel::Softmax)
            .count() as f64;
        assert!((softmax.own_s - 2e-3 * cases).abs() < 1e-12, "{softmax:?}");
        assert!(
            softmax.describe().starts_with("softmax: composed ("),
            "{}",
            softmax.describe()
        );
        for policy in [CudaKernels::Composed, CudaKernels::Own] {
            let forced = check_and_time(
                [Vec::new(), Vec::new()],
                || Ok(Vec::new()),
                &Device::Cpu,
                policy,
                DType::F32,
                &clock,
            )
            .unwrap();
            assert!(forced.timings.is_empty());
        }
    }

    /// The real clock on the CPU: every kernel of sweep's own is timed, in
    /// seconds that are times (no speed asserted).
    #[test]
    fn every_own_kernel_is_timed_on_the_cpu() {
        let clock = |c: &Case, dtype, twin| check::time(c, &Device::Cpu, dtype, 1, twin);
        let timings = time(&cases(&Device::Cpu).unwrap(), &|_| DType::F32, &[], &clock);
        let mut timed: Vec<Kernel> = timings.iter().map(|t| t.kernel).collect();
        timed.sort();
        let own: Vec<Kernel> = Kernel::VARIANTS
            .iter()
            .copied()
            .filter(|k| k.own())
            .collect();
        assert_eq!(timed, own);
        assert!(timings
            .iter()
            .all(|t| t.own_s > 0.0 && t.composed_s > 0.0 && t.own_s.is_finite()));
    }
}
