//! Stragglers: in a data-parallel run every rank waits for the slowest at
//! each gradient sum, so one slow rank (a throttled GPU, a busy node, a
//! slow disk) slows them all while its peers' logs only show waiting. The
//! trainer logs each rank's compute time per logging interval (the step
//! without the collectives' waits, [`crate::train::record::StepMetrics::rank_compute_s`])
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
        use crate::util::text::printable;
        let node = match self.hosts.as_slice() {
            [] => "an unnamed node".to_string(),
            [one] => format!("node {}", printable(one)),
            many => format!(
                "nodes {}",
                many.iter()
                    .map(|h| printable(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!(
            "{}: rank {} of {} on {node} computes {:.4} s per step against its peers' median {:.4} s \
             (+{:.0}%, threshold {THRESHOLD_PCT:.0}%; slow in {} of {} logging intervals)",
            printable(&self.run),
            self.rank,
            self.world_size,
            self.compute_s,
            self.peers_s,
            self.excess_pct,
            self.slow_intervals,
            self.intervals,
        )
    }
}

/// The stragglers of one run (none for a single rank or a log without rank
/// times). The first interval is left out when there are others: it holds
/// the warm-up, which ranks go through at their own pace.
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
    (0..world)
        .filter_map(|rank| {
            let (mut mine, mut peers, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let mut hosts: Vec<String> = Vec::new();
            for i in &intervals {
                let others: Vec<f64> = i
                    .compute_s
                    .iter()
                    .enumerate()
                    .filter(|&(r, _)| r != rank)
                    .map(|(_, &x)| x)
                    .collect();
                let peer = median(&others)?;
                if peer <= 0.0 {
                    continue;
                }
                let ratio = i.compute_s[rank] / peer;
                if ratio > limit {
                    if let Some(h) = i.hosts.as_ref().map(|h| &h[rank]) {
                        if !hosts.contains(h) {
                            hosts.push(h.clone());
                        }
                    }
                }
                mine.push(i.compute_s[rank]);
                peers.push(peer);
                ratios.push(ratio);
            }
            let excess = median(&ratios)?;
            (excess > limit).then(|| Straggler {
                run: run.name.clone(),
                rank,
                world_size: world,
                hosts,
                compute_s: median(&mine).unwrap_or(f64::NAN),
                peers_s: median(&peers).unwrap_or(f64::NAN),
                excess_pct: 100.0 * (excess - 1.0),
                slow_intervals: ratios.iter().filter(|&&r| r > limit).count(),
                intervals: ratios.len(),
            })
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
                && text.contains("+28%, threshold 10%")
                && text.contains("2 of 3 logging intervals"),
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
}
