//! Our trainer's `metrics.jsonl`: one object per logged step; monitor events
//! (objects with an `event` key) are not steps. A last line without its
//! newline is a run still writing, and is left for next time.

use super::Point;
use crate::train::metrics::EventKind;
use serde::Deserialize;

#[derive(Deserialize)]
struct Line {
    step: f64,
    loss: Option<f64>,
    tokens_per_second: Option<f64>,
    training_tokens_pct: Option<f64>,
    mfu_pct: Option<f64>,
    tflops: Option<f64>,
    step_time_s: Option<f64>,
    elapsed_s: Option<f64>,
    global_tokens_per_second: Option<f64>,
    world_size: Option<f64>,
    batch_size: Option<f64>,
    /// Set on event records (the trainer's [`EventKind`]); steps have none.
    event: Option<EventKind>,
}

/// The points of a metrics file's text, and how many lines were unreadable.
pub fn parse(text: &str) -> (Vec<Point>, usize) {
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let torn = usize::from(complete.len() < text.trim_end().len());
    let mut skipped = torn;
    let mut points = Vec::new();
    for line in complete.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Line>(line) {
            Ok(l) if l.event.is_none() => points.push(Point {
                step: l.step,
                loss: l.loss,
                tokens_per_second: l.tokens_per_second,
                training_tokens_pct: l.training_tokens_pct,
                mfu_pct: l.mfu_pct,
                tflops: l.tflops,
                step_time_s: l.step_time_s,
                elapsed_s: l.elapsed_s,
                global_tokens_per_second: l.global_tokens_per_second,
                world_size: l.world_size,
                batch_size: l.batch_size.filter(|&b| b > 0.0),
            }),
            Ok(_) => {}
            Err(_) => skipped += 1,
        }
    }
    (points, skipped)
}

/// The latest point of a metrics file, reading only its tail (for live views).
pub fn last_point(path: &std::path::Path) -> Option<Point> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(8192))).ok()?;
    let mut tail = String::new();
    f.read_to_string(&mut tail).ok()?;
    // The first line of the tail may be cut; parse drops what does not read.
    let start = if len > 8192 {
        tail.find('\n').map_or(tail.len(), |i| i + 1)
    } else {
        0
    };
    parse(&tail[start..]).0.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_torn_lines_and_garbage_are_not_points() {
        let text = "{\"step\":1,\"loss\":10.0,\"tokens_per_second\":5.0}\n{\"step\":2,\"event\":\"loss_spike\",\"value\":9,\"threshold\":1}\nnot json\n{\"step\":3,\"loss\":9.0}\n{\"step\":4,\"lo";
        let (p, skipped) = parse(text);
        assert_eq!(p.iter().map(|p| p.step).collect::<Vec<_>>(), vec![1.0, 3.0]);
        assert_eq!(p[0].tokens_per_second, Some(5.0));
        assert_eq!(skipped, 2, "the garbage line and the torn last line");
    }
}
