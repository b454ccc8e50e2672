//! Our trainer's `metrics.jsonl`, read through its one record type
//! ([`crate::train::record`]): step records become points, events are not
//! steps, lines that do not parse and implausible values are omissions. A
//! last line without its newline is a run still writing (`torn`).

use super::{Omissions, Point};
use crate::train::record::{parse_log, Record};

/// The points of a metrics file, what was left out, and whether its last
/// line is torn.
pub fn parse(bytes: &[u8]) -> (Vec<Point>, Omissions, bool) {
    let log = parse_log(bytes);
    let mut omitted = Omissions::default();
    for (line, why) in &log.bad_lines {
        omitted.bad_line(*line, why.clone());
    }
    let points = log
        .records
        .iter()
        .filter_map(|(line, r)| match r {
            Record::Step(m) => omitted.screen(*line, Point::from(m)),
            Record::Event(_) => None,
        })
        .collect();
    (points, omitted, log.torn)
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
    parse(&tail[start..]).0.pop()
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
        let (p, omitted, torn) = parse(text.as_bytes());
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
}
