//! Our trainer's `metrics.jsonl`, read through its one record type
//! ([`crate::train::record`]): step records become points, events are not
//! steps, lines that do not parse and implausible values are omissions. A
//! last line without its newline is a run still writing (`torn`).

use super::{Omissions, Point};
use crate::train::record::{parse_log, Record};
use std::sync::Arc;

/// One logging interval of a data-parallel run: each rank's compute
/// seconds per step, and where the ranks ran.
#[derive(Debug, Clone, PartialEq)]
pub struct RankInterval {
    pub step: usize,
    /// By rank.
    pub compute_s: Vec<f64>,
    /// Host names by rank, from the latest placement record at or before
    /// `step` that names as many ranks; none when the log has none.
    pub hosts: Option<Arc<[String]>>,
}

/// What a metrics file holds for the report.
#[derive(Debug, Default)]
pub struct Parsed {
    pub points: Vec<Point>,
    /// Data-parallel runs: the ranks' compute times, interval by interval.
    pub ranks: Vec<RankInterval>,
    pub omitted: Omissions,
    /// The last line is still being written.
    pub torn: bool,
}

/// The most seconds per step a rank's compute time can be in a log a run
/// wrote (a week); beyond it, or negative, the interval is left out.
const MAX_COMPUTE_S: f64 = 7.0 * 86400.0;
/// The most one rank's compute time per step can be a multiple of
/// another's in one interval: ranks do the same work, so a thousandfold gap
/// is an error in the log, not a slow node (it would print a percentage of
/// hundreds of digits).
const MAX_RANK_SPREAD: f64 = 1000.0;

/// The points of a metrics file, the ranks' intervals, what was left out,
/// and whether its last line is torn.
pub fn parse(bytes: &[u8]) -> Parsed {
    let log = parse_log(bytes);
    let mut out = Parsed {
        torn: log.torn,
        ..Parsed::default()
    };
    for (line, why) in &log.bad_lines {
        out.omitted.bad_line(*line, why.clone());
    }
    let mut hosts: Option<Arc<[String]>> = None;
    for (line, r) in &log.records {
        match r {
            Record::Step(m) => {
                if !m.rank_compute_s.is_empty() {
                    let (low, high) = m
                        .rank_compute_s
                        .iter()
                        .fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
                    let sane = m.rank_compute_s.len() == m.world_size
                        && m.rank_compute_s
                            .iter()
                            .all(|x| x.is_finite() && (0.0..=MAX_COMPUTE_S).contains(x))
                        && (high == 0.0 || high <= low * MAX_RANK_SPREAD);
                    match sane {
                        true => out.ranks.push(RankInterval {
                            step: m.step,
                            compute_s: m.rank_compute_s.clone(),
                            hosts: hosts.clone().filter(|h| h.len() == m.world_size),
                        }),
                        false => out.omitted.bad_line(
                            *line,
                            format!(
                                "rank_compute_s left out: {} value(s) for world size {}, or one negative, not finite, over a week, or a thousand times another",
                                m.rank_compute_s.len(),
                                m.world_size
                            ),
                        ),
                    }
                }
                if let Some(p) = out.omitted.screen(*line, Point::from(m)) {
                    out.points.push(p);
                }
            }
            Record::Placement(p) => hosts = Some(p.hosts.clone().into()),
            Record::Event(_) => {}
        }
    }
    out
}

/// The latest point of a metrics file, reading only its tail (for live views).
pub fn last_point(path: &std::path::Path) -> Option<Point> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(8192))).ok()?;
    let mut tail = Vec::new();
    f.take(8192).read_to_end(&mut tail).ok()?;
    // The first line of the tail may be cut; parse drops what does not read.
    let start = if len > 8192 {
        tail.iter()
            .position(|&b| b == b'\n')
            .map_or(tail.len(), |i| i + 1)
    } else {
        0
    };
    parse(&tail[start..]).points.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_torn_lines_and_garbage_are_not_points() {
        let text = "{\"step\":1,\"loss\":10.0,\"lr\":0.1,\"grad_norm\":1,\"tokens_per_second\":5.0,\"training_tokens_pct\":50,\"mfu_pct\":1,\"tflops\":0.1,\"step_time_s\":1,\"elapsed_s\":1,\"peak_memory_mb\":1}\n\
            {\"step\":2,\"event\":\"loss_spike\",\"value\":9,\"threshold\":1}\n\
            not json\n\
            {\"step\":3,\"loss\":9.0,\"lr\":0.1,\"grad_norm\":1,\"tokens_per_second\":1e308,\"training_tokens_pct\":50,\"mfu_pct\":1,\"tflops\":0.1,\"step_time_s\":1,\"elapsed_s\":2,\"peak_memory_mb\":1}\n\
            {\"step\":4,\"lo";
        let Parsed {
            points: p,
            omitted,
            torn,
            ..
        } = parse(text.as_bytes());
        assert_eq!(p.iter().map(|p| p.step).collect::<Vec<_>>(), vec![1.0, 3.0]);
        assert_eq!(p[0].tokens_per_second, Some(5.0));
        assert_eq!(p[1].tokens_per_second, None, "1e308 tokens/s is left out");
        assert!(torn);
        let text = omitted.describe(std::path::Path::new("m")).join("\n");
        assert!(
            text.contains("1 line(s) left out (line 3: not JSON"),
            "{text}"
        );
        assert!(
            text.contains("`tokens_per_second` left out on 1 line(s)"),
            "{text}"
        );
    }

    #[test]
    fn rank_times_carry_the_hosts_of_the_latest_placement() {
        let step = |n: usize, ws: usize, times: &str| {
            format!("{{\"step\":{n},\"loss\":9.0,\"lr\":0.1,\"grad_norm\":1,\"tokens_per_second\":5.0,\"world_size\":{ws},\"training_tokens_pct\":50,\"mfu_pct\":1,\"tflops\":0.1,\"step_time_s\":1,\"elapsed_s\":1,\"peak_memory_mb\":1,\"rank_compute_s\":{times}}}\n")
        };
        let text = [
            step(1, 2, "[0.5,0.6]"),
            "{\"step\":2,\"hosts\":[\"nid1\",\"nid2\"]}\n".to_string(),
            step(2, 2, "[0.5,0.7]"),
            step(3, 2, "[0.5]"),
            step(4, 2, "[0.5,-1]"),
            "{\"step\":5,\"hosts\":[\"nid3\"]}\n".to_string(),
            step(5, 2, "[0.5,0.8]"),
            // Absurd: a rank 10^300 times faster than its peer.
            step(6, 2, "[1e-300,0.8]"),
        ]
        .concat();
        let log = parse(text.as_bytes());
        assert_eq!(log.points.len(), 6, "the steps stay points");
        let seen: Vec<(usize, Option<Vec<String>>)> = log
            .ranks
            .iter()
            .map(|r| (r.step, r.hosts.as_ref().map(|h| h.to_vec())))
            .collect();
        let hosts = Some(vec!["nid1".to_string(), "nid2".to_string()]);
        // Before any placement no hosts; a placement naming another number of ranks names none.
        assert_eq!(seen, vec![(1, None), (2, hosts), (5, None)]);
        let said = log.omitted.describe(std::path::Path::new("m")).join("\n");
        assert!(
            said.contains("rank_compute_s left out: 1 value(s) for world size 2"),
            "{said}"
        );
    }
}
