//! The reference study's log lines:
//! `<date> <time>,<ms> - root - INFO - Step: 5 | Loss: 11.92 | Tokens per second: 7687.13 |
//! Training tokens per second (%): 42.29 | MFU (%): 37.56 | TFLOPs: 371.44`
//! with `| Global batch size: .. | Global tokens/sec: .. | Global MFU (%): .. |
//! Global TFLOPs: .. |` on DDP runs, the run's arguments on an
//! `Experiment args: Namespace(...)` line, and the world size in DDP logs.

use super::{text_lines, Omissions, Point, RunLog};
use crate::executor::{State, Status};
use regex::Regex;
use serde_json::Value;
use std::sync::LazyLock;

static STEP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"Step: (?P<step>\d+) \| Loss: (?P<loss>[-\d.eE+naif]+) \| Tokens per second: (?P<tps>[\d.]+) \| Training tokens per second \(%\): (?P<train>[\d.]+) \| MFU \(%\): (?P<mfu>[\d.]+) \| TFLOPs: (?P<tflops>[\d.]+)(?: \| Global batch size: (?P<gbs>\d+) \| Global tokens/sec: (?P<gtps>[\d.]+))?",
    )
    .expect("a valid regex")
});
static TIME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(\d{3})").expect("a valid regex")
});

/// The line's timestamp in milliseconds (integers keep differences exact).
fn millis(line: &str) -> Option<i64> {
    let c = TIME.captures(line)?;
    let t = chrono::NaiveDateTime::parse_from_str(&c[1], "%Y-%m-%d %H:%M:%S").ok()?;
    Some(t.and_utc().timestamp() * 1000 + c[2].parse::<i64>().ok()?)
}

/// Python's `Namespace(a='x', b=2, c=False)` as key -> JSON value.
fn namespace(s: &str) -> Vec<(String, Value)> {
    let Some(start) = s.find("Namespace(") else {
        return vec![];
    };
    let body = s[start + 10..].trim_end().trim_end_matches(')');
    let mut out = Vec::new();
    let (mut key, mut cur, mut quote) = (String::new(), String::new(), None::<char>);
    let mut push = |key: &mut String, cur: &mut String| {
        let v = cur.trim();
        let value = if (v.starts_with('\'') && v.ends_with('\''))
            || (v.starts_with('"') && v.ends_with('"'))
        {
            Value::String(v[1..v.len() - 1].to_string())
        } else if v == "True" || v == "False" {
            Value::Bool(v == "True")
        } else if let Ok(i) = v.parse::<i64>() {
            Value::from(i)
        } else if let Ok(f) = v.parse::<f64>() {
            Value::from(f)
        } else {
            Value::String(v.to_string())
        };
        if !key.trim().is_empty() {
            out.push((key.trim().to_string(), value));
        }
        key.clear();
        cur.clear();
    };
    for c in body.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                cur.push(c);
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                cur.push(c);
            }
            (None, '=') if key.is_empty() => key = std::mem::take(&mut cur),
            (None, ',') => push(&mut key, &mut cur),
            (None, c) => cur.push(c),
        }
    }
    push(&mut key, &mut cur);
    out
}

/// A reference log file (`file`, for the problems it may have) as a run.
pub fn parse(name: &str, bytes: &[u8], file: &std::path::Path) -> RunLog {
    let mut run = RunLog::new(name, Status::new(State::Unknown));
    run.reason = Some("the log does not say `Training completed`".into());
    let mut t0 = None;
    let mut last_time: Option<(i64, f64)> = None;
    let mut world = None;
    let mut omitted = Omissions::default();
    for (n, line, valid) in text_lines(bytes) {
        if line.contains("Experiment args:") {
            for (k, v) in namespace(&line) {
                run.params.insert(k, v);
            }
        } else if let Some(ws) = line.split("World size: ").nth(1) {
            if let Ok(w) = ws.trim().parse::<f64>() {
                world = Some((n, w));
            }
        } else if let Some(nodes) = line.split("SLURM_NNODES: ").nth(1) {
            if let Ok(nodes) = nodes.trim().parse::<u64>() {
                run.params.insert("nodes".into(), Value::from(nodes));
            }
        } else if line.contains("Training completed") {
            run.status = Status::new(State::Completed);
            run.reason = None;
        }
        let Some(c) = STEP.captures(&line) else {
            continue;
        };
        if !valid {
            omitted.bad_line(n, "a step line with bytes that are not UTF-8");
            continue;
        }
        let num = |k: &str| c.name(k).and_then(|m| m.as_str().parse::<f64>().ok());
        let time = millis(&line);
        if t0.is_none() {
            t0 = time;
        }
        let elapsed = match (time, t0) {
            (Some(t), Some(s)) => Some((t - s) as f64 / 1000.0),
            _ => None,
        };
        let step_time = match (time, last_time) {
            (Some(t), Some((lt, ls))) => {
                num("step").map(|s| (t - lt) as f64 / 1000.0 / (s - ls).max(1.0))
            }
            _ => None,
        };
        if let (Some(t), Some(s)) = (time, num("step")) {
            last_time = Some((t, s));
        }
        if let Some(gbs) = num("gbs") {
            run.params
                .insert("global_batch_size".into(), Value::from(gbs as u64));
        }
        let point = Point {
            step: num("step").unwrap_or(f64::NAN),
            loss: num("loss"),
            tokens_per_second: num("tps"),
            training_tokens_pct: num("train"),
            mfu_pct: num("mfu"),
            tflops: num("tflops"),
            step_time_s: step_time,
            elapsed_s: elapsed,
            global_tokens_per_second: num("gtps"),
            ..Point::default()
        };
        run.points.extend(omitted.screen(n, point));
    }
    // The world size is said once, anywhere in the log: every point's.
    if let Some((n, w)) = world {
        for p in &mut run.points {
            p.world_size = Some(w);
            if let Some(kept) = omitted.screen(n, std::mem::take(p)) {
                *p = kept;
            }
        }
    }
    run.issues.extend(omitted.describe(file));
    if run.points.is_empty() {
        run.reason = Some("no step lines in the log".into());
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_parse() {
        let v = namespace("INFO - Experiment args: Namespace(dataset='/a,b.parquet', dataset_type='padded', pretokenized=False, batch_size=2, learning_rate=5e-05)");
        assert_eq!(v[0], ("dataset".into(), Value::from("/a,b.parquet")));
        assert_eq!(v[2], ("pretokenized".into(), Value::Bool(false)));
        assert_eq!(v[3], ("batch_size".into(), Value::from(2)));
        assert_eq!(v[4], ("learning_rate".into(), Value::from(5e-5)));
    }

    #[test]
    fn single_and_ddp_lines_parse() {
        let text = "2025-05-03 20:36:17,889 - root - INFO - Step: 1 | Loss: 11.95 | Tokens per second: 2694.62 | Training tokens per second (%): 24.68 | MFU (%): 13.17 | TFLOPs: 130.20\n\
                    2025-05-03 20:36:20,407 - root - INFO - Step: 5 | Loss: 11.94 | Tokens per second: 6508.22 | Training tokens per second (%): 42.24 | MFU (%): 31.80 | TFLOPs: 314.48 | Global batch size: 64 | Global tokens/sec: 92230.22 | Global MFU (%): 10.80 | Global TFLOPs: 854.18 | \n\
                    2025-05-03 20:45:05,179 - root - INFO - Training completed\n";
        let text = format!("2025-05-03 20:36:10,000 - root - INFO - World size: 16\n{text}");
        let r = parse("x", text.as_bytes(), std::path::Path::new("x.out"));
        assert_eq!(r.status.state, State::Completed);
        assert_eq!(r.points.len(), 2);
        assert_eq!(r.points[1].tokens_per_second, Some(6508.22));
        assert_eq!(r.points[1].global_tokens_per_second, Some(92230.22));
        assert!((r.points[1].elapsed_s.unwrap() - 2.518).abs() < 1e-9);
        assert!((r.points[1].step_time_s.unwrap() - 2.518 / 4.0).abs() < 1e-9);
        assert_eq!(r.params["global_batch_size"], Value::from(64));
        assert_eq!(r.points[0].world_size, Some(16.0));
    }
}
