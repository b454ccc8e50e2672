//! The self-check a CUDA device gets when it opens, before the run's first
//! step: every kernel an op may use there (sweep's own, cuBLAS's in-place
//! weight gradient, candle-flash-attn's forward) against its composed twin
//! on the same device, on tiny shapes, in bf16 and f32 (well under a second
//! once the modules are compiled). A kernel that fails it — outputs outside
//! [`check::tolerance`], a NaN, or an error from its launch or from the
//! synchronisation after it (candle-flash-attn does not check its launches:
//! a failed one leaves its output uninitialised) — is not used on that
//! device: its ops take their composed twins, which `sweep train` says on
//! stderr and records in the run's metrics, and the report shows beside the
//! run. `SWEEP_CUDA_KERNELS=own` makes such a failure stop the run instead;
//! `composed` leaves sweep's kernels out, so only flash attention is checked.
//!
//! The same code runs on the CPU in the tests, where the own kernels are
//! the fused CPU ones.

use super::check::{self, dtype_name, errors, flat_f32, prepare, tolerance, Case, Shapes};
use super::{composed_here, Kernel};
use crate::config::runtime::CudaKernels;
use crate::config::{ModelConfig, ModelOverrides};
use anyhow::{bail, Result};
use candle_core::{DType, Device};

/// A kernel that disagreed with its twin, or failed to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kernel: Kernel,
    /// The case (`rms_norm forward`, ...) and its dtype (none: the kernel
    /// failed on another rank's GPU: the ranks' agreement, `run::dist::agree`).
    pub case: &'static str,
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
        format!("{}: {}{dtype}: {}", self.kernel.name(), self.case, self.why)
    }
}

/// The shapes of the self-check: a model of width 64 (4 heads of 16, 2 KV
/// heads), 2 sequences of 32 tokens, a vocabulary of 320 — every kernel's
/// tails and partial blocks, in a few hundred kilobytes.
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

/// Runs each case in its dtypes on `device`: the kernel, then its composed
/// twin, on the same inputs. The failures, in the cases' order.
pub fn run(cases: &[Case], device: &Device) -> Vec<Failure> {
    let mut failures = Vec::new();
    for case in cases {
        for dtype in check::dtypes(case, device) {
            // The kernel first, on memory nothing else wrote yet this pass:
            // an output left unwritten does not read as its twin's.
            let got = (|| -> Result<Vec<f32>> {
                let out = (case.run)(&prepare(case, device, dtype)?)?;
                device.synchronize()?;
                flat_f32(&out)
            })();
            let want = composed_here(|| -> Result<Vec<f32>> {
                let out = (case.run)(&prepare(case, device, dtype)?)?;
                device.synchronize()?;
                flat_f32(&out)
            });
            let tol = tolerance(case, dtype);
            let fail = |rel_err, why: String| Failure {
                kernel: case.kernel,
                case: case.op,
                dtype: Some(dtype),
                rel_err,
                tolerance: tol,
                why,
            };
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

/// The kernels to leave out on this device, from the self-check's
/// failures: each that failed, once, in [`Kernel`]'s order — or, under
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

/// The self-check of a device just opened: compiles every module, checks
/// every kernel this process may use there, and makes those that fail take
/// their composed twins (said on stderr). The failures, for the run's
/// metrics; an error under `SWEEP_CUDA_KERNELS=own` when there are some.
pub fn at_open(device: &Device, policy: CudaKernels) -> Result<Vec<Failure>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        super::cuda::load_all(d)?;
    }
    let cases: Vec<Case> = cases(device)?
        .into_iter()
        .filter(|c| super::on_gpu(c.kernel) || device.is_cpu())
        .collect();
    let failures = run(&cases, device);
    let kernels = decide(policy, &failures)?;
    super::fall_back(&kernels);
    for f in &failures {
        eprintln!(
            "sweep train: warning: kernel self-check failed: {}; {} runs its composed twin on this GPU",
            f.describe(),
            f.kernel.name()
        );
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::check::random;
    use candle_core::Tensor;

    /// On the CPU every case's kernel (the fused CPU kernels, the host
    /// AdamW, flash attention's reference forward) agrees with its twin.
    #[test]
    fn every_kernel_passes_its_self_check_on_the_cpu() {
        let cases = cases(&Device::Cpu).unwrap();
        let covered: std::collections::BTreeSet<Kernel> = cases.iter().map(|c| c.kernel).collect();
        assert_eq!(
            covered.into_iter().collect::<Vec<_>>(),
            Kernel::ALL.to_vec(),
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
            .starts_with("rms_norm: scaled in f32: max relative error"));
    }

    /// `auto` and `composed` leave out each failed kernel once; `own`
    /// refuses, naming every failure and what to do.
    #[test]
    fn own_refuses_a_failed_kernel_and_auto_leaves_it_out() {
        let f = |kernel, case| Failure {
            kernel,
            case,
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
}
