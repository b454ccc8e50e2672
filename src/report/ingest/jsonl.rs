//! Our trainer's `metrics.jsonl`, read through its one record type
//! ([`crate::train::run::record`]): step records become points, events are not
//! steps (a kernel's fallback or its timing is a note beside the run), lines that do not parse and implausible values are omissions. A
//! last line without its newline is a run still writing (`torn`).

use super::{Omissions, Point};
use crate::train::run::record::{parse_log, EventKind, Record};
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
    /// How the run ran differently from what it was asked (a kernel that
    /// fell back to its composed twin), once each.
    pub notes: Vec<String>,
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
    // Kernel times by kernel: a resumed run's latest.
    let mut timings: Vec<(&str, f64, f64)> = Vec::new();
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
            Record::Event(e) if e.event == EventKind::KernelFallback => {
                let what = e.detail.as_deref().unwrap_or("a kernel");
                let note = format!(
                    "composed ops ran in place of a kernel that failed its self-check on the GPU ({})",
                    crate::util::text::note(what)
                );
                if !out.notes.contains(&note) {
                    out.notes.push(note);
                }
            }
            Record::Event(e) if e.event == EventKind::F32Products => {
                let note = format!(
                    "bf16-mixed multiplied in f32: this CPU's bf16 kernel reached {:.0} GFLOP/s, its f32 GEMM {:.0}",
                    e.value / 1e9,
                    e.threshold / 1e9
                );
                if !out.notes.contains(&note) {
                    out.notes.push(note);
                }
            }
            Record::Event(e) if e.event == EventKind::KernelTiming => {
                use crate::train::network::ops::Kernel;
                let sane = |s: f64| (0.0..=MAX_COMPUTE_S).contains(&s);
                // One of sweep's kernels by name: a note of bounded length.
                let kernel = e.detail.as_deref().and_then(|d| d.parse::<Kernel>().ok());
                match kernel {
                    Some(k) if sane(e.value) && sane(e.threshold) => {
                        timings.retain(|t| t.0 != k.name());
                        timings.push((k.name(), e.value, e.threshold));
                    }
                    _ => out.omitted.bad_line(
                        *line,
                        String::from("a kernel timing of no kernel sweep has, or a time negative, not finite or over a week"),
                    ),
                }
            }
            Record::Event(_) => {}
        }
    }
    if !timings.is_empty() {
        out.notes.push(timings_note(&timings));
    }
    out
}

/// One note of the kernels timed when the GPU opened: which path each ran.
fn timings_note(timings: &[(&str, f64, f64)]) -> String {
    let said = |twin: bool| -> Vec<String> {
        timings
            .iter()
            .filter(|t| (t.2 < t.1) == twin)
            .map(|(k, own, twin)| format!("{k} ({:.3} ms, its twin {:.3})", own * 1e3, twin * 1e3))
            .collect()
    };
    let (own, twins) = (said(false), said(true));
    let mut note =
        "kernels timed against their composed twins at the run's shapes when the GPU opened"
            .to_string();
    if !own.is_empty() {
        note += &format!("; sweep's ran: {}", own.join(", "));
    }
    if !twins.is_empty() {
        note += &format!("; the twins ran, being faster: {}", twins.join(", "));
    }
    note
}

/// The latest point of a metrics file, reading only its tail (for live views).
pub fn last_point(path: &std::path::Path) -> Option<Point> {
    const TAIL: usize = 8192;
    // Opened as a file only (a FIFO put there would block the live view);
    // one byte more than the tail says whether its first line was cut.
    let read = crate::util::fs::read_tail(path, TAIL as u64 + 1).ok()?;
    let tail = match read.len() > TAIL {
        true => {
            let tail = &read[1..];
            &tail[tail
                .iter()
                .position(|&b| b == b'\n')
                .map_or(tail.len(), |i| i + 1)..]
        }
        false => &read[..],
    };
    parse(tail).points.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live view's read of a run's metrics: a FIFO in the file's place
    /// is not opened to block it (it blocked until a writer came).
    #[test]
    fn the_last_point_of_a_fifo_is_none_at_once() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("metrics.jsonl");
        crate::util::fs::tests::mkfifo(&path);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(last_point(&path).is_none()));
        let answered = rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(answered, Ok(true), "it blocked on the FIFO");
    }

    /// A kernel that fell back is a note, once however often the run (and
    /// its resumes) recorded it; a hostile detail is cut and printable.
    #[test]
    fn a_kernels_fallback_is_a_note_beside_the_run() {
        use crate::train::network::ops::selfcheck::Failure;
        use crate::train::network::ops::Kernel;
        let dir = tempfile::tempdir().unwrap();
        let f = Failure {
            kernel: Kernel::RmsNorm,
            case: "rms_norm forward",
            shape: None,
            dtype: Some(candle_core::DType::BF16),
            rel_err: Some(0.5),
            tolerance: 1.6e-2,
            why: "max relative error 5.00e-1 against its composed twin (tolerance 1.6e-2)".into(),
        };
        let nan = Failure {
            rel_err: Some(f64::INFINITY),
            ..f.clone()
        };
        let mut log = crate::train::run::record::MetricsLog::open(dir.path()).unwrap();
        for step in [1, 5] {
            for f in [&f, &nan] {
                log.write(crate::train::run::record::Event {
                    step,
                    event: EventKind::KernelFallback,
                    value: f.rel_err.filter(|e| e.is_finite()).unwrap_or(-1.0),
                    threshold: f.tolerance,
                    detail: Some(f.describe()),
                })
                .unwrap();
            }
        }
        drop(log);
        let mut bytes =
            std::fs::read(dir.path().join(crate::train::run::record::METRICS_FILE)).unwrap();
        let long = format!(
            "{{\"step\":9,\"event\":\"kernel_fallback\",\"value\":-1,\"threshold\":0.01,\"detail\":\"x\\u001b[31m{}\"}}\n",
            "y".repeat(5000)
        );
        bytes.extend_from_slice(long.as_bytes());
        let parsed = parse(&bytes);
        assert!(parsed
            .omitted
            .describe(std::path::Path::new("m"))
            .is_empty());
        assert_eq!(parsed.notes.len(), 2, "{:?}", parsed.notes);
        assert_eq!(
            parsed.notes[0],
            "composed ops ran in place of a kernel that failed its self-check on the GPU \
             (rms_norm: rms_norm forward in bf16: max relative error 5.00e-1 against its composed twin (tolerance 1.6e-2))"
        );
        assert!(parsed.notes[1].chars().count() < 600, "{}", parsed.notes[1]);
        assert!(!parsed.notes[1].contains('\u{1b}'), "{}", parsed.notes[1]);
    }

    /// The kernels' times at the GPU's opening, as the trainer writes
    /// them: one note saying which path each ran, a resumed run's latest
    /// times; a time no run can have is an omission, not a note.
    #[test]
    fn the_kernels_times_are_one_note() {
        use crate::train::network::ops::{selfcheck::Timing, Kernel};
        let dir = tempfile::tempdir().unwrap();
        let log = crate::train::run::record::MetricsLog::open(dir.path()).unwrap();
        let cfg = crate::config::TrainConfig::default();
        let mut reporter =
            crate::train::run::metrics::Reporter::new(Some(log), &cfg, 1, 1.0, 1.0, String::new());
        let t = |kernel, own_s, composed_s| Timing {
            kernel,
            own_s,
            composed_s,
        };
        let first = [
            t(Kernel::RmsNorm, 1e-3, 3e-3),
            t(Kernel::Softmax, 2e-3, 1e-3),
        ];
        reporter.device_opened(0, &[], &first).unwrap();
        let again = [t(Kernel::RmsNorm, 1e-3, 2e-3)];
        reporter.device_opened(7, &[], &again).unwrap();
        drop(reporter);
        let mut bytes =
            std::fs::read(dir.path().join(crate::train::run::record::METRICS_FILE)).unwrap();
        bytes.extend_from_slice(
            b"{\"step\":9,\"event\":\"kernel_timing\",\"value\":-1,\"threshold\":1e308,\"detail\":\"rope\"}\n\
              {\"step\":9,\"event\":\"kernel_timing\",\"value\":1,\"threshold\":2,\"detail\":\"x\\u001b[31m\"}\n",
        );
        let parsed = parse(&bytes);
        assert_eq!(
            parsed.notes,
            ["kernels timed against their composed twins at the run's shapes when the GPU opened; \
              sweep's ran: rms_norm (1.000 ms, its twin 2.000); \
              the twins ran, being faster: softmax (2.000 ms, its twin 1.000)"]
        );
        let omitted = parsed.omitted.describe(std::path::Path::new("m")).join(" ");
        assert!(
            omitted.contains("no kernel sweep has") && omitted.contains("2 line"),
            "{omitted}"
        );
    }

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
