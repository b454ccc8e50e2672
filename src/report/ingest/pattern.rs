//! Any program's log lines, matched by the manifest's `[report] line_pattern`:
//! a regex whose named groups name the fields (`step`, `loss`,
//! `tokens_per_second`, `training_tokens_pct`, `mfu_pct`, `tflops`,
//! `step_time_s`, `elapsed_s`). Unnamed fields are left empty.

use super::Point;
use regex::Regex;

pub fn parse(re: &Regex, text: &str) -> Vec<Point> {
    let mut points = Vec::new();
    for line in text.lines() {
        let Some(c) = re.captures(line) else { continue };
        let num = |k: &str| c.name(k).and_then(|m| m.as_str().parse::<f64>().ok());
        points.push(Point {
            step: num("step").unwrap_or(points.len() as f64 + 1.0),
            loss: num("loss"),
            tokens_per_second: num("tokens_per_second"),
            training_tokens_pct: num("training_tokens_pct"),
            mfu_pct: num("mfu_pct"),
            tflops: num("tflops"),
            step_time_s: num("step_time_s"),
            elapsed_s: num("elapsed_s"),
            global_tokens_per_second: None,
            world_size: None,
            batch_size: None,
        });
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_groups_become_fields() {
        let re = Regex::new(r"it (?P<step>\d+): (?P<tokens_per_second>[\d.]+) tok/s").unwrap();
        let p = parse(&re, "start\nit 1: 10.5 tok/s\nnoise\nit 2: 11 tok/s\n");
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[1].step, p[1].tokens_per_second, p[1].loss),
            (2.0, Some(11.0), None)
        );
    }
}
