//! What follows from a command's log (any-command sweeps): tokens/s from
//! each step's time and the run's `tokens_per_step` where the log has no
//! tokens/s; TFLOP/s and MFU from tokens/s, the FLOPs per token the manifest
//! gives (`[report] flops_per_token`, or a built-in `model` preset at a
//! `sequence_length`) and the device's peak (`gpu`, or `peak_flops`), each
//! overridable by a run parameter of the same name. A log's own figures
//! always win.

use super::ingest::{Field, RunLog};
use crate::manifest::{ReportSpec, TOKENS_PER_STEP};
use serde_json::Value;

/// What a run's FLOPs and MFU are computed from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Basis {
    /// The model's training FLOPs per token, when they are known.
    flops_per_token: Option<f64>,
    /// The device's peak FLOP/s, when it is known.
    peak_flops: Option<f64>,
}

/// Fills each point's missing tokens/s (from its step time), TFLOP/s (from
/// its tokens/s) and MFU (from its TFLOP/s, its own or so computed), where
/// the manifest or the run's parameters say how; a parameter that names no
/// preset or device is an issue of the run. A figure so derived is held to
/// the bounds of a logged one ([`Field::plausible`]): one outside (from a
/// step time of `1e-300ms`) is left out and said, never recorded.
pub fn derive(run: &mut RunLog, spec: &ReportSpec) {
    let mut out = LeftOut::default();
    if let Some(tokens) = tokens_per_step(&run.params) {
        for p in &mut run.points {
            out.note(Field::TokensPerSecond, tokens_from_step_time(p, tokens));
        }
    }
    match basis(run, spec) {
        Err(why) => run.issues.push(why),
        Ok(basis) => {
            for p in &mut run.points {
                // A log's own figures win: Megatron's, for one, logs TFLOP/s
                // per GPU and no MFU.
                if let (None, Some(tps), Some(f)) =
                    (p.tflops, p.tokens_per_second, basis.flops_per_token)
                {
                    p.tflops = out.keep(Field::Tflops, crate::estimate::flops(tps, f, None).0);
                }
                if let (None, Some(tflops), Some(peak)) = (p.mfu_pct, p.tflops, basis.peak_flops) {
                    p.mfu_pct =
                        out.keep(Field::MfuPct, crate::estimate::mfu_pct(tflops * 1e12, peak));
                }
            }
        }
    }
    run.issues.extend(out.describe());
}

/// The derived figures left out, by field: how many, and the first.
#[derive(Default)]
struct LeftOut(Vec<(Field, usize, f64)>);

impl LeftOut {
    /// `v`, where a run could log it; else `None`, counted.
    fn keep(&mut self, field: Field, v: f64) -> Option<f64> {
        if field.plausible().contains(&v) {
            return Some(v);
        }
        self.note(field, Some(v));
        None
    }

    fn note(&mut self, field: Field, left_out: Option<f64>) {
        let Some(v) = left_out else { return };
        match self.0.iter_mut().find(|(f, ..)| *f == field) {
            Some((_, n, _)) => *n += 1,
            None => self.0.push((field, 1, v)),
        }
    }

    fn describe(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|(field, n, v)| {
                format!(
                    "`{}` computed from its log left out on {n} point(s), not a value a run can have (first: {v:e}; a step time or rate the log got wrong)",
                    field.name()
                )
            })
            .collect()
    }
}

/// A run's `tokens_per_step` parameter (a command study's, from `[report]
/// tokens_per_step`).
pub fn tokens_per_step(params: &indexmap::IndexMap<String, Value>) -> Option<f64> {
    params.get(TOKENS_PER_STEP).and_then(number_of)
}

/// tokens/s = `tokens` / the step's time, where `p` logs a time and no
/// tokens/s, and the figure is one a run can have ([`Field::plausible`]);
/// returns the figure left out, if one was.
pub fn tokens_from_step_time(p: &mut super::ingest::Point, tokens: f64) -> Option<f64> {
    let (None, Some(t)) = (p.tokens_per_second, p.step_time_s.filter(|t| *t > 0.0)) else {
        return None;
    };
    let tps = tokens / t;
    if !Field::TokensPerSecond.plausible().contains(&tps) {
        return Some(tps);
    }
    p.tokens_per_second = Some(tps);
    None
}

fn basis(run: &RunLog, spec: &ReportSpec) -> Result<Basis, String> {
    let param = |key: &str| run.params.get(key).filter(|v| !v.is_null());
    let number = |key: &str, fallback: Option<f64>| -> Result<Option<f64>, String> {
        match param(key) {
            None => Ok(fallback),
            Some(v) => number_of(v).map(Some).ok_or_else(|| {
                format!("its parameter `{key}` = {v} is not a number: no TFLOP/s or MFU")
            }),
        }
    };
    let text = |key: &str, fallback: &Option<String>| match param(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => Some(v.to_string()),
        None => fallback.clone(),
    };
    let spec_number = |f: &Option<crate::manifest::PerRun>| f.as_ref().and_then(|f| f.number());
    let flops_per_token = match number("flops_per_token", spec_number(&spec.flops_per_token))? {
        Some(f) => Some(f),
        None => match text("model", &spec.model) {
            None => None,
            Some(m) => {
                let model = crate::config::ModelConfig::preset(&m).ok_or_else(|| {
                    format!(
                        "model `{m}` is no preset ({}): no TFLOP/s or MFU",
                        crate::config::PRESETS.join(", ")
                    )
                })?;
                let t = number("sequence_length", spec.sequence_length.map(|t| t as f64))?
                    .ok_or("`model` without `sequence_length`: no TFLOP/s or MFU")?;
                Some(model.flops_per_token(t as usize))
            }
        },
    };
    let flops_per_token = flops_per_token.filter(|f| f.is_finite() && *f > 0.0);
    let peak_flops = match (
        number("peak_flops", spec_number(&spec.peak_flops))?,
        text("gpu", &spec.gpu),
    ) {
        (Some(p), _) if p.is_finite() && p > 0.0 => Some(p),
        (Some(p), _) => return Err(format!("its `peak_flops` = {p} is no peak: no MFU")),
        (None, None) => None,
        (None, Some(g)) => Some(
            crate::estimate::devices::lookup(&g)
                .ok_or_else(|| format!("the device table does not know gpu `{g}`: no MFU"))?
                .peak_flops,
        ),
    };
    Ok(Basis {
        flops_per_token,
        peak_flops,
    })
}

/// A parameter's number, written as a number or as text.
fn number_of(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|f: &f64| f.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{State, Status};
    use crate::report::ingest::Point;

    fn run(params: &[(&str, Value)]) -> RunLog {
        let mut r = RunLog::new("r", Status::new(State::Completed));
        r.params = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        r.points = vec![Point {
            step: 1.0,
            tokens_per_second: Some(1000.0),
            ..Point::default()
        }];
        r
    }

    #[test]
    fn flops_come_from_the_manifest_or_the_runs_own_parameters() {
        let spec = ReportSpec {
            flops_per_token: Some(crate::manifest::PerRun::Number(6e9)),
            gpu: Some("H100".into()),
            ..ReportSpec::default()
        };
        let mut r = run(&[]);
        derive(&mut r, &spec);
        let p = &r.points[0];
        assert_eq!(p.tflops, Some(6.0));
        assert!((p.mfu_pct.unwrap() - 100.0 * 6e12 / 989e12).abs() < 1e-9);
        // A run's parameters win; a preset at a sequence length works too.
        let mut r = run(&[
            ("model", Value::from("tiny")),
            ("sequence_length", Value::from(128)),
            ("gpu", Value::from("A100")),
        ]);
        derive(&mut r, &ReportSpec::default());
        let fpt = crate::config::ModelConfig::preset("tiny")
            .unwrap()
            .flops_per_token(128);
        assert_eq!(r.points[0].tflops, Some(1000.0 * fpt / 1e12));
        assert!(r.points[0].mfu_pct.is_some());
        // Nothing to go on: nothing invented.
        let mut r = run(&[]);
        derive(&mut r, &ReportSpec::default());
        assert_eq!((r.points[0].tflops, r.points[0].mfu_pct), (None, None));
        // A device nobody knows is said, not guessed.
        let mut r = run(&[("gpu", Value::from("Z9000"))]);
        derive(&mut r, &spec);
        assert!(
            r.issues[0].contains("does not know gpu `Z9000`"),
            "{:?}",
            r.issues
        );
        assert_eq!(r.points[0].mfu_pct, None);
    }

    /// nanoGPT's batch 12 × block 1024 at 5.33 ms a step, on a CPU whose
    /// peak is given: tokens/s, TFLOP/s and MFU follow, by hand.
    #[test]
    fn tokens_per_second_come_from_a_step_time_and_the_tokens_per_step() {
        let mut r = run(&[(TOKENS_PER_STEP, Value::from(12.0 * 1024.0))]);
        r.points[0].tokens_per_second = None;
        r.points[0].step_time_s = Some(0.00533);
        r.points.push(Point {
            step: 2.0,
            tokens_per_second: Some(7.0),
            step_time_s: Some(0.005),
            ..Point::default()
        });
        let spec = ReportSpec {
            flops_per_token: Some(crate::manifest::PerRun::Number(1e6)),
            peak_flops: Some(crate::manifest::PerRun::Number(2e12)),
            ..ReportSpec::default()
        };
        derive(&mut r, &spec);
        let tps = 12.0 * 1024.0 / 0.00533;
        let p = &r.points[0];
        assert!((p.tokens_per_second.unwrap() / tps - 1.0).abs() < 1e-12);
        assert!((p.tflops.unwrap() - tps * 1e6 / 1e12).abs() < 1e-12);
        assert!((p.mfu_pct.unwrap() - 100.0 * tps * 1e6 / 2e12).abs() < 1e-9);
        assert_eq!(
            r.points[1].tokens_per_second,
            Some(7.0),
            "a logged figure wins"
        );
        // A run's own peak wins; one that is no peak is said.
        let mut r = run(&[("peak_flops", Value::from(-1))]);
        derive(&mut r, &spec);
        assert!(r.issues[0].contains("no peak"), "{:?}", r.issues);
    }

    /// A derived figure is held to a logged one's bounds: a step time of
    /// 1e-300 ms, a pace of 1e300 it/s, FLOPs per token past any model.
    #[test]
    fn a_derived_figure_no_run_can_have_is_left_out_and_said() {
        let mut r = run(&[(TOKENS_PER_STEP, Value::from(8192))]);
        r.points[0].tokens_per_second = None;
        r.points[0].step_time_s = Some(1e-303);
        r.points.push(Point {
            step: 2.0,
            step_time_s: Some(0.5),
            ..Point::default()
        });
        let spec = ReportSpec {
            flops_per_token: Some(crate::manifest::PerRun::Number(1e300)),
            peak_flops: Some(crate::manifest::PerRun::Number(1e15)),
            ..ReportSpec::default()
        };
        derive(&mut r, &spec);
        assert_eq!(r.points[0].tokens_per_second, None);
        assert_eq!(r.points[1].tokens_per_second, Some(16384.0));
        assert_eq!((r.points[1].tflops, r.points[1].mfu_pct), (None, None));
        let said = r.issues.join("\n");
        assert!(
            said.contains("`tokens_per_second` computed from its log left out on 1 point(s)")
                && said.contains("first: 8.192e306")
                && said.contains("`tflops` computed from its log left out on 1 point(s)"),
            "{said}"
        );
    }

    /// Megatron logs TFLOP/s per GPU and no MFU: its device's peak alone
    /// gives MFU from the log's own figure, with no FLOPs per token.
    #[test]
    fn a_logs_own_tflops_and_a_device_give_mfu() {
        let mut r = run(&[]);
        r.points[0].tflops = Some(402.1);
        let spec = ReportSpec {
            gpu: Some("H100".into()),
            ..ReportSpec::default()
        };
        derive(&mut r, &spec);
        let p = &r.points[0];
        assert_eq!(p.tflops, Some(402.1), "the log's figure stays");
        assert!((p.mfu_pct.unwrap() - 100.0 * 402.1e12 / 989e12).abs() < 1e-9);
        assert!(r.issues.is_empty(), "{:?}", r.issues);
    }
}
