//! Stragglers: in a data-parallel run every rank waits for the slowest at
//! each gradient sum, so one slow rank (a throttled GPU, a busy node, a
//! slow disk) slows them all while its peers' logs only show waiting. The
//! trainer logs each rank's compute time per logging interval (the step
//! without the collectives' waits, [`crate::train::run::record::StepMetrics::rank_compute_s`])
//! and where each rank ran; this module names the rank, and its node,
//! whose compute time stands above its peers'.

use super::ingest::RunLog;
use super::stats::median;

/// How far above its peers' median a rank's compute time per step must be,
/// in percent, to be a straggler. Ranks of one run do the same work on
/// batches of one size, so on healthy nodes their times agree within a few
/// percent (rounding of the data's padding, the OS); 10% is beyond that.
pub const THRESHOLD_PCT: f64 = 10.0;

/// A rank whose compute time per step is more than [`THRESHOLD_PCT`] above
/// its peers' median, over a run's intervals.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    pub run: String,
    pub rank: usize,
    pub world_size: usize,
    /// The host(s) it ran on in the intervals it was slow in (several
    /// after a resume elsewhere); empty when the log does not say.
    pub hosts: Vec<String>,
    /// Its median compute seconds per step over the intervals.
    pub compute_s: f64,
    /// The median over the intervals of its peers' median.
    pub peers_s: f64,
    /// The median over the intervals of its time over its peers', in percent above.
    pub excess_pct: f64,
    /// Intervals in which it was over the threshold, of `intervals`.
    pub slow_intervals: usize,
    pub intervals: usize,
}

impl Straggler {
    /// One line for a report or a check.
    pub fn describe(&self) -> String {
        use crate::util::text::cell;
        let node = match self.hosts.as_slice() {
            [] => "an unnamed node".to_string(),
            [one] => format!("node {}", cell(one)),
            many => format!(
                "nodes {}",
                many.iter().map(|h| cell(h)).collect::<Vec<_>>().join(", ")
            ),
        };
        // The excess is the median of the per-interval ratios (what flags a
        // rank); the two times are each one's median over the run, which on
        // a noisy machine need not stand in the same order.
        format!(
            "{}: rank {} of {} on {node} computes +{:.0}% per step over its peers' median \
             (the median over its logging intervals, threshold {THRESHOLD_PCT:.0}%; slow in {} of {}; \
             over the run {:.4} s against their {:.4} s)",
            cell(&self.run),
            self.rank,
            self.world_size,
            self.excess_pct,
            self.slow_intervals,
            self.intervals,
            self.compute_s,
            self.peers_s,
        )
    }
}

/// The stragglers of one run (none for one rank or no rank times), its
/// first interval (the warm-up) left out when there are others.
pub fn find(run: &RunLog) -> Vec<Straggler> {
    let intervals: &[_] = match run.ranks.len() {
        0 => return Vec::new(),
        1 => &run.ranks,
        _ => &run.ranks[1..],
    };
    // One world size: the last one (a resume on fewer ranks starts a new one).
    let world = intervals.last().map_or(0, |i| i.compute_s.len());
    let intervals: Vec<_> = intervals
        .iter()
        .filter(|i| i.compute_s.len() == world)
        .collect();
    if world < 2 {
        return Vec::new();
    }
    let limit = 1.0 + THRESHOLD_PCT / 100.0;
    // Per rank: its compute times, its peers' medians, their ratios, and
    // the hosts it was slow on, interval by interval.
    #[derive(Default)]
    struct Seen {
        mine: Vec<f64>,
        peers: Vec<f64>,
        ratios: Vec<f64>,
        hosts: Vec<String>,
    }
    let mut seen: Vec<Seen> = (0..world).map(|_| Seen::default()).collect();
    for i in &intervals {
        for (rank, peer) in peer_medians(&i.compute_s).into_iter().enumerate() {
            if peer <= 0.0 {
                continue;
            }
            let s = &mut seen[rank];
            let ratio = i.compute_s[rank] / peer;
            if ratio > limit {
                if let Some(h) = i.hosts.as_ref().map(|h| &h[rank]) {
                    if !s.hosts.contains(h) {
                        s.hosts.push(h.clone());
                    }
                }
            }
            s.mine.push(i.compute_s[rank]);
            s.peers.push(peer);
            s.ratios.push(ratio);
        }
    }
    seen.into_iter()
        .enumerate()
        .filter_map(|(rank, s)| {
            let excess = median(&s.ratios)?;
            (excess > limit).then(|| Straggler {
                run: run.name.clone(),
                rank,
                world_size: world,
                compute_s: median(&s.mine).unwrap_or(f64::NAN),
                peers_s: median(&s.peers).unwrap_or(f64::NAN),
                excess_pct: 100.0 * (excess - 1.0),
                slow_intervals: s.ratios.iter().filter(|&&r| r > limit).count(),
                intervals: s.ratios.len(),
                hosts: s.hosts,
            })
        })
        .collect()
}

/// For each of `xs` (two or more), the median of all the others — from one
/// sort for every value at once: a log of thousands of ranks costs
/// n log n per interval, not n² log n.
fn peer_medians(xs: &[f64]) -> Vec<f64> {
    let n = xs.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| xs[a].total_cmp(&xs[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| xs[i]).collect();
    let mut place = vec![0; n];
    for (k, &i) in order.iter().enumerate() {
        place[i] = k;
    }
    // The k-th smallest of the others, with the value at sorted place `gone` left out.
    let kth = |gone: usize, k: usize| sorted[if k < gone { k } else { k + 1 }];
    let m = n - 1;
    (0..n)
        .map(|i| match m % 2 {
            1 => kth(place[i], m / 2),
            _ => (kth(place[i], m / 2 - 1) + kth(place[i], m / 2)) / 2.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{State, Status};
    use crate::report::ingest::jsonl::RankInterval;

    fn run(times: &[&[f64]], hosts: &[&str]) -> RunLog {
        let hosts: std::sync::Arc<[String]> = hosts.iter().map(|h| h.to_string()).collect();
        RunLog {
            ranks: times
                .iter()
                .enumerate()
                .map(|(i, t)| RankInterval {
                    step: 10 * (i + 1),
                    compute_s: t.to_vec(),
                    hosts: Some(hosts.clone()),
                })
                .collect(),
            ..RunLog::new("ddp-4", Status::new(State::Completed))
        }
    }

    #[test]
    fn a_slow_rank_is_named_with_its_node_and_figures() {
        let r = run(
            &[
                // The warm-up interval: rank 0 slow there only; left out.
                &[2.0, 0.5, 0.5, 0.5],
                &[0.50, 0.51, 0.66, 0.49],
                &[0.50, 0.50, 0.64, 0.51],
                &[0.52, 0.49, 0.50, 0.50],
            ],
            &["nid1", "nid1", "nid2", "nid2"],
        );
        let s = find(&r);
        assert_eq!(s.len(), 1, "{s:?}");
        let s = &s[0];
        assert_eq!(
            (s.rank, s.world_size, s.intervals, s.slow_intervals),
            (2, 4, 3, 2)
        );
        assert_eq!(s.hosts, ["nid2"]);
        assert!((s.compute_s - 0.64).abs() < 1e-12);
        assert!((s.peers_s - 0.50).abs() < 1e-12);
        assert!((s.excess_pct - 28.0).abs() < 1e-9, "{}", s.excess_pct);
        let text = s.describe();
        assert!(
            text.contains("rank 2 of 4 on node nid2")
                && text.contains("computes +28% per step over its peers' median")
                && text.contains("slow in 2 of 3")
                && text.contains("0.6400 s against their 0.5000 s"),
            "{text}"
        );
    }

    #[test]
    fn balanced_ranks_one_rank_and_a_single_slow_interval_name_nobody() {
        let even = run(&[&[0.5, 0.5], &[0.51, 0.5], &[0.5, 0.53]], &["a", "b"]);
        assert!(find(&even).is_empty());
        let one = run(&[&[0.5], &[0.9]], &["a"]);
        assert!(find(&one).is_empty());
        // A hiccup in one interval of five is not a straggler.
        let hiccup = run(
            &[
                &[0.5, 0.5],
                &[0.5, 0.5],
                &[0.5, 0.9],
                &[0.5, 0.5],
                &[0.5, 0.5],
            ],
            &["a", "b"],
        );
        assert!(find(&hiccup).is_empty());
        // Zero peers (a log that says so) divide nothing.
        let zero = run(&[&[0.0, 0.0], &[0.0, 0.4], &[0.0, 0.4]], &["a", "b"]);
        assert!(find(&zero).is_empty());
    }

    #[test]
    fn peer_medians_are_the_medians_of_the_others() {
        for xs in [
            vec![1.0, 2.0],
            vec![3.0, 1.0, 2.0],
            vec![0.5, 0.5, 0.9, 0.4],
            vec![5.0, 1.0, 4.0, 2.0, 3.0, 3.0, 9.0],
        ] {
            let naive: Vec<f64> = (0..xs.len())
                .map(|i| {
                    let others: Vec<f64> = xs
                        .iter()
                        .enumerate()
                        .filter(|&(j, _)| j != i)
                        .map(|(_, &x)| x)
                        .collect();
                    median(&others).unwrap()
                })
                .collect();
            assert_eq!(peer_medians(&xs), naive, "{xs:?}");
        }
    }
}
