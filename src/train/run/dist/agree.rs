//! The ranks agree on the kernels they run: a kernel whose self-check
//! failed on any rank's GPU is left out on every rank, and a kernel's path
//! is chosen by the ranks' summed times.

use super::Collective;
use crate::train::network::ops::selfcheck::{Failure, Timing};
use crate::train::network::ops::{self, Kernel};
use anyhow::Result;
use candle_core::{DType, Device};
use strum::VariantArray;

/// The kernels another rank left out, left out here too, so that every
/// rank runs the same code: ranks whose kernels differ round differently,
/// and their replicas of the parameters would drift apart. Returns them as
/// failures of this rank (said on stderr; the main rank records them).
pub fn on_kernels(
    comm: &dyn Collective,
    device: &Device,
    failures: &[Failure],
) -> Result<Vec<Failure>> {
    if comm.is_single() {
        return Ok(Vec::new());
    }
    let mine: Vec<f32> = Kernel::VARIANTS
        .iter()
        .map(|k| failures.iter().any(|f| f.kernel == *k) as u8 as f32)
        .collect();
    let all = comm
        .all_reduce_sum(&candle_core::Tensor::from_vec(
            mine.clone(),
            mine.len(),
            device,
        )?)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let others: Vec<Failure> = Kernel::VARIANTS
        .iter()
        .zip(all.iter().zip(&mine))
        .filter(|(_, (all, mine))| **all > 0.0 && **mine == 0.0)
        .map(|(&kernel, _)| Failure {
            kernel,
            case: "its self-check on another rank's GPU",
            shape: None,
            dtype: None,
            rel_err: None,
            tolerance: 0.0,
            why: "failed there, so every rank runs its composed twin".into(),
        })
        .collect();
    ops::fall_back(&others.iter().map(|f| f.kernel).collect::<Vec<_>>());
    for f in &others {
        eprintln!("sweep train: warning: {}", f.describe());
    }
    Ok(others)
}

/// Every rank's times of the kernels, summed over the ranks, for the kernels every rank timed and none left out:
/// the same times on every rank, so every rank makes the same choice.
pub fn on_timings(
    comm: &dyn Collective,
    device: &Device,
    timings: &[Timing],
    left_out: &[Failure],
) -> Result<Vec<Timing>> {
    if comm.is_single() {
        return Ok(timings.to_vec());
    }
    let n = Kernel::VARIANTS.len();
    // Per kernel: timed here (1), its seconds, its twin's.
    let mut mine = vec![0f32; 3 * n];
    for t in timings {
        let i = t.kernel as usize;
        mine[i] = 1.0;
        mine[n + i] = t.own_s as f32;
        mine[2 * n + i] = t.composed_s as f32;
    }
    let all = comm
        .all_reduce_sum(&candle_core::Tensor::from_vec(mine, 3 * n, device)?)?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let ranks = comm.ranks().world_size as f32;
    Ok(Kernel::VARIANTS
        .iter()
        .filter(|k| all[**k as usize] == ranks && !left_out.iter().any(|f| f.kernel == **k))
        .map(|&kernel| Timing {
            kernel,
            own_s: all[n + kernel as usize] as f64,
            composed_s: all[2 * n + kernel as usize] as f64,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::run::dist::Single;
    use candle_core::Tensor;

    /// Rank 0 of two, whose sums add the other rank's values given.
    fn peer(theirs: Vec<f32>) -> crate::train::run::dist::tests::Peer {
        crate::train::run::dist::tests::Peer::new(move |t| {
            t + Tensor::new(theirs.as_slice(), t.device())?
        })
    }

    /// A peer's failures become this rank's, said as the other rank's;
    /// its own are not repeated; one rank alone exchanges nothing.
    #[test]
    fn every_rank_leaves_out_what_any_rank_left_out() {
        let mine = Failure {
            kernel: Kernel::RmsNorm,
            case: "rms_norm forward",
            shape: None,
            dtype: Some(DType::BF16),
            rel_err: Some(0.5),
            tolerance: 1.6e-2,
            why: "max relative error 5.00e-1".into(),
        };
        let mut theirs = vec![0f32; Kernel::VARIANTS.len()];
        theirs[Kernel::RmsNorm as usize] = 1.0;
        theirs[Kernel::GradNorm as usize] = 1.0;
        let others = on_kernels(&peer(theirs), &Device::Cpu, std::slice::from_ref(&mine)).unwrap();
        assert_eq!(
            others.iter().map(|f| f.kernel).collect::<Vec<_>>(),
            [Kernel::GradNorm]
        );
        assert_eq!(
            others[0].describe(),
            "grad_norm: its self-check on another rank's GPU: failed there, so every rank runs its composed twin"
        );
        assert!(on_kernels(&Single, &Device::Cpu, &[mine])
            .unwrap()
            .is_empty());
    }

    /// The ranks' times summed; a kernel another rank did not time (it
    /// failed there), or that failed, is not chosen by time.
    #[test]
    fn every_rank_chooses_by_the_summed_times() {
        let t = |kernel, own_s, composed_s| Timing {
            kernel,
            own_s,
            composed_s,
        };
        let mine = [
            t(Kernel::Softmax, 1.0, 2.0),
            t(Kernel::Rope, 1.0, 1.0),
            t(Kernel::AdamW, 1.0, 3.0),
        ];
        let n = Kernel::VARIANTS.len();
        let mut theirs = vec![0f32; 3 * n];
        // The peer timed softmax (its twin much faster there) and rope.
        for (k, own, twin) in [(Kernel::Softmax, 1.0, 0.5), (Kernel::Rope, 1.0, 1.0)] {
            theirs[k as usize] = 1.0;
            theirs[n + k as usize] = own;
            theirs[2 * n + k as usize] = twin;
        }
        let agreed = on_timings(&peer(theirs), &Device::Cpu, &mine, &[]).unwrap();
        assert_eq!(
            agreed,
            [t(Kernel::Rope, 2.0, 2.0), t(Kernel::Softmax, 2.0, 2.5)]
        );
        let rope_failed = Failure {
            kernel: Kernel::Rope,
            case: "rope",
            shape: None,
            dtype: None,
            rel_err: None,
            tolerance: 0.0,
            why: String::new(),
        };
        let mut theirs = vec![0f32; 3 * n];
        theirs[Kernel::Rope as usize] = 1.0;
        let agreed = on_timings(&peer(theirs), &Device::Cpu, &mine, &[rope_failed]).unwrap();
        assert!(agreed.is_empty(), "{agreed:?}");
        assert_eq!(on_timings(&Single, &Device::Cpu, &mine, &[]).unwrap(), mine);
    }
}
