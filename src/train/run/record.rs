//! `metrics.jsonl`, a run's log: one JSON [`Record`] per line, a step or an event. Every reader
//! parses lines with [`Record::parse`] or [`parse_log`], so steps and events are told apart in
//! one place.

use crate::util::fs::ReadError;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

pub const METRICS_FILE: &str = crate::layout::METRICS_JSONL;

/// One logged step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Tokens per second per device, padding included (as the reference).
    pub tokens_per_second: f64,
    /// Ranks training together (data parallelism); 1 for a single process.
    #[serde(default = "one")]
    pub world_size: usize,
    /// Sequences per device and micro-batch (what `batch_size = "max"` became).
    #[serde(default)]
    pub batch_size: usize,
    /// Tokens per second of all ranks together (the global batch per step time).
    #[serde(default)]
    pub global_tokens_per_second: f64,
    /// Share of tokens with a training label (not padding or a document start).
    pub training_tokens_pct: f64,
    pub mfu_pct: f64,
    pub tflops: f64,
    pub step_time_s: f64,
    pub elapsed_s: f64,
    pub peak_memory_mb: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub val_loss: Option<f64>,
    /// The main rank's GPU watts over the interval, and watts per token/s ([`super::energy`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub watts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub joules_per_token: Option<f64>,
    /// Each rank's seconds per step outside the gradient sum's waits, by rank: what finds a straggler.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub rank_compute_s: Vec<f64>,
}

/// Where each rank trains from a step on: logged at start and after a resume (which may land
/// elsewhere), so later `rank_compute_s` name their hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The first step trained there.
    pub step: usize,
    /// Host names, by rank.
    pub hosts: Vec<String>,
}

fn one() -> usize {
    1
}

/// What `metrics.jsonl` records besides steps: an event at a step, with the value that crossed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub step: usize,
    pub event: EventKind,
    pub value: f64,
    pub threshold: f64,
    /// What the numbers are about, where the kind alone does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The loss jumped above a multiple of its rolling mean.
    LossSpike,
    /// The gradient norm exceeded a multiple of the clipping norm.
    GradientExplosion,
    /// The loss stopped improving.
    Plateau,
    /// The measured MFU exceeds 100%: the peak is too low for this device.
    MfuAbovePeak,
    /// A kernel failed its self-check and its ops ran their twins (`value`: its relative error,
    /// −1 where it failed to run or wrote a NaN; `threshold`: the tolerance).
    KernelFallback,
    /// A kernel timed against its twin at device open (`value`: its seconds; `threshold`: the
    /// twin's); the faster ran.
    KernelTiming,
    /// A bf16-mixed CPU run multiplied in f32 (`value`: bf16's peak; `threshold`: f32's).
    F32Products,
}

impl EventKind {
    pub fn describe(self) -> &'static str {
        match self {
            EventKind::LossSpike => "loss spike",
            EventKind::GradientExplosion => "gradient explosion",
            EventKind::Plateau => "plateau",
            EventKind::MfuAbovePeak => "MFU above 100% of the peak",
            EventKind::KernelFallback => "a kernel failed its self-check: its composed twin ran",
            EventKind::KernelTiming => "a kernel timed against its composed twin: the faster ran",
            EventKind::F32Products => {
                "bf16-mixed multiplied in f32: the bf16 kernel is slower here"
            }
        }
    }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Record {
    Step(StepMetrics),
    Event(Event),
    Placement(Placement),
}

impl From<Placement> for Record {
    fn from(p: Placement) -> Record {
        Record::Placement(p)
    }
}

impl From<StepMetrics> for Record {
    fn from(m: StepMetrics) -> Record {
        Record::Step(m)
    }
}

impl From<Event> for Record {
    fn from(e: Event) -> Record {
        Record::Event(e)
    }
}

impl Record {
    /// The training step the record belongs to.
    pub fn step(&self) -> usize {
        match self {
            Record::Step(m) => m.step,
            Record::Event(e) => e.step,
            Record::Placement(p) => p.step,
        }
    }

    /// One line: an `event` key makes an event, `hosts` a placement, else a step — told by bytes,
    /// so each line is parsed once.
    pub fn parse(line: &[u8]) -> Result<Record, String> {
        std::str::from_utf8(line)
            .map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
        let has = |key: &str| memchr::memmem::find(line, key.as_bytes()).is_some();
        let why = |kind: &str, e: serde_json::Error| match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("not JSON ({e})")
            }
            _ if line.trim_ascii_start().first() != Some(&b'{') => "not a JSON object".into(),
            _ => format!("not {kind} record ({e})"),
        };
        if has("\"event\"") {
            serde_json::from_slice(line)
                .map(Record::Event)
                .map_err(|e| why("an event", e))
        } else if has("\"hosts\"") {
            serde_json::from_slice(line)
                .map(Record::Placement)
                .map_err(|e| why("a placement", e))
        } else {
            serde_json::from_slice(line)
                .map(Record::Step)
                .map_err(|e| why("a step", e))
        }
    }
}

/// A log's records with line numbers, lines that do not parse and why, and a torn last line.
#[derive(Debug, Default)]
pub struct ParsedLog {
    pub records: Vec<(usize, Record)>,
    pub bad_lines: Vec<(usize, String)>,
    pub torn: bool,
}

impl ParsedLog {
    /// The step records, in file order.
    pub fn steps(&self) -> impl Iterator<Item = &StepMetrics> {
        self.records.iter().filter_map(|(_, r)| match r {
            Record::Step(m) => Some(m),
            _ => None,
        })
    }
}

pub fn parse_log(bytes: &[u8]) -> ParsedLog {
    let (complete, tail) = split_torn(bytes);
    let mut log = ParsedLog {
        torn: !tail.iter().all(u8::is_ascii_whitespace),
        ..ParsedLog::default()
    };
    for (i, line) in complete.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Record::parse(line) {
            Ok(r) => log.records.push((i + 1, r)),
            Err(why) => log.bad_lines.push((i + 1, why)),
        }
    }
    log
}

/// The complete lines (without the last newline) and what follows them.
fn split_torn(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().rposition(|&b| b == b'\n') {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (&[], bytes),
    }
}

/// `metrics.jsonl`: one JSON object per step or event, flushed as written.
pub struct MetricsLog {
    file: std::fs::File,
    pub path: PathBuf,
}

impl MetricsLog {
    pub fn open(run_dir: &Path) -> Result<MetricsLog> {
        let path = run_dir.join(METRICS_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(MetricsLog { file, path })
    }

    pub fn write(&mut self, record: impl Into<Record>) -> Result<()> {
        let mut line = serde_json::to_vec(&record.into())?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        Ok(())
    }

    /// After a resume: drops steps after `step` and a torn last line; all else stays byte for byte.
    pub fn truncate_after(&mut self, step: usize) -> Result<()> {
        // A log of a gigabyte is millions of steps: more is not a log.
        let bytes = match crate::util::fs::read_regular(&self.path, 1 << 30, None) {
            Ok(b) => b,
            Err(ReadError::NotFound) => return Ok(()),
            Err(e) => bail!(
                "{} {e}: it cannot be read to resume after step {step} (left unchanged)",
                self.path.display()
            ),
        };
        let kept = kept_through(&bytes, step);
        if kept.len() == bytes.len() {
            return Ok(());
        }
        crate::util::fs::write_atomic(&self.path, &kept)?;
        *self = MetricsLog::open(crate::util::fs::parent_dir(&self.path))?;
        Ok(())
    }
}

/// The lines to keep when resuming after `step`.
fn kept_through(bytes: &[u8], step: usize) -> Vec<u8> {
    let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
        return Vec::new();
    };
    bytes[..=end]
        .split_inclusive(|&b| b == b'\n')
        .filter(|line| {
            let later = Record::parse(&line[..line.len() - 1]).is_ok_and(|r| r.step() > step);
            !later
        })
        .flatten()
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_written_with_their_kind() {
        let e = Event {
            step: 7,
            event: EventKind::MfuAbovePeak,
            value: 103.5,
            threshold: 100.0,
            detail: None,
        };
        let line = serde_json::to_string(&e).unwrap();
        assert_eq!(
            line,
            r#"{"step":7,"event":"mfu_above_peak","value":103.5,"threshold":100.0}"#
        );
    }

    fn step(step: usize) -> StepMetrics {
        StepMetrics {
            step,
            loss: 10.0,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_second: 100.0,
            world_size: 1,
            batch_size: 2,
            global_tokens_per_second: 100.0,
            training_tokens_pct: 90.0,
            mfu_pct: 10.0,
            tflops: 0.1,
            step_time_s: 0.5,
            elapsed_s: step as f64 * 0.5,
            peak_memory_mb: 100.0,
            val_loss: None,
            rank_compute_s: Vec::new(),
            watts: None,
            joules_per_token: None,
        }
    }

    #[test]
    fn steps_and_events_round_trip_and_bad_lines_are_named() {
        let e = Event {
            step: 2,
            event: EventKind::LossSpike,
            value: 9.0,
            threshold: 3.0,
            detail: None,
        };
        let mut text = Vec::new();
        for r in [Record::from(step(1)), Record::from(e.clone())] {
            text.extend(serde_json::to_vec(&r).unwrap());
            text.push(b'\n');
        }
        text.extend(b"{\"step\":3,\"loss\":\xff}\n[1]\n{\"step\":4}\n{\"step\":5,\"lo");
        let log = parse_log(&text);
        assert_eq!(
            log.records,
            vec![(1, Record::Step(step(1))), (2, Record::Event(e))]
        );
        assert_eq!(log.steps().count(), 1);
        let bad: Vec<(usize, &str)> = log
            .bad_lines
            .iter()
            .map(|(n, why)| (*n, why.split(' ').next().unwrap()))
            .collect();
        assert_eq!(bad, vec![(3, "invalid"), (4, "not"), (5, "not")]);
        assert!(
            log.bad_lines[2].1.contains("missing field"),
            "{:?}",
            log.bad_lines
        );
        assert!(log.torn);
    }

    #[test]
    fn resuming_truncates_the_log_after_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(dir.path()).unwrap();
        for s in [1, 10, 20, 30] {
            log.write(step(s)).unwrap();
        }
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log.path)
            .unwrap()
            .write_all(b"{\"step\": 4")
            .unwrap();
        log.truncate_after(20).unwrap();
        log.write(step(30)).unwrap();
        let steps: Vec<usize> = parse_log(&std::fs::read(&log.path).unwrap())
            .records
            .iter()
            .map(|(_, r)| r.step())
            .collect();
        assert_eq!(steps, vec![1, 10, 20, 30]);
    }

    #[test]
    fn resuming_keeps_lines_it_cannot_read_and_never_empties_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = MetricsLog::open(dir.path()).unwrap();
        log.write(step(1)).unwrap();
        // One invalid byte in a line, and a line of garbage.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log.path)
            .unwrap()
            .write_all(b"{\"step\":2,\"loss\":\xff\xfe}\nnot json\n")
            .unwrap();
        log.write(step(3)).unwrap();
        log.write(step(4)).unwrap();
        let before = std::fs::read(&log.path).unwrap();
        log.truncate_after(3).unwrap();
        let after = std::fs::read(&log.path).unwrap();
        let cut = before.len() - serde_json::to_vec(&Record::from(step(4))).unwrap().len() - 1;
        assert_eq!(after, before[..cut], "only step 4 goes");

        // A log that cannot be read is an error, and stays as it is.
        std::fs::remove_file(&log.path).unwrap();
        std::fs::create_dir(&log.path).unwrap();
        let err = log.truncate_after(1).unwrap_err();
        assert!(format!("{err:#}").contains("left unchanged"), "{err:#}");
        assert!(log.path.is_dir());
    }
}
