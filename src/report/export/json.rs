//! JSON, for scripts: a report's table as an array of objects (`sweep
//! report --json`), a check's verdicts (`sweep check --json`).

use super::Exporter;
use crate::report::check::{Check, Outcome};
use crate::report::summary::{param_text, Summary};
use anyhow::Result;
use polars::prelude::*;
use serde_json::{json, Map, Value};

pub struct Json;

/// The table's rows (they are the summary's alone).
impl Exporter<Summary> for Json {
    fn export(&self, s: &Summary) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec_pretty(&rows(s))?)
    }
}

impl Exporter<Check> for Json {
    fn export(&self, c: &Check) -> Result<Vec<u8>> {
        Ok(serde_json::to_vec_pretty(&check(c))?)
    }
}

fn rows(s: &Summary) -> Value {
    let t = &s.table;
    let names: Vec<String> = t.get_column_names().iter().map(|c| c.to_string()).collect();
    let rows = (0..t.height())
        .map(|i| {
            let mut m = Map::new();
            for n in &names {
                let v = match t.column(n).and_then(|c| c.get(i)) {
                    Ok(AnyValue::Null) | Err(_) => Value::Null,
                    Ok(AnyValue::String(text)) if s.params.contains(n) => typed(s, i, n, text),
                    Ok(AnyValue::String(s)) => Value::from(s),
                    Ok(AnyValue::StringOwned(s)) => Value::from(s.as_str()),
                    Ok(AnyValue::Float64(x)) => Value::from(x),
                    Ok(AnyValue::Float32(x)) => Value::from(x as f64),
                    Ok(AnyValue::UInt32(x)) => Value::from(x),
                    Ok(AnyValue::UInt64(x)) => Value::from(x),
                    Ok(AnyValue::Int64(x)) => Value::from(x),
                    Ok(AnyValue::Int32(x)) => Value::from(x),
                    Ok(AnyValue::Boolean(b)) => Value::from(b),
                    Ok(other) => Value::from(other.to_string()),
                };
                m.insert(n.clone(), v);
            }
            Value::Object(m)
        })
        .collect();
    Value::Array(rows)
}

/// A parameter's value in row `row` as its runs' records hold it, so that a
/// number or a boolean of the manifest stays one; the text where no run of
/// the row has it (a grouped row's range, an imported log's).
fn typed(s: &Summary, row: usize, param: &str, text: &str) -> Value {
    s.rows
        .get(row)
        .into_iter()
        .flat_map(|r| &r.runs)
        .filter_map(|&k| s.runs.get(k)?.params.get(param))
        .find(|v| param_text(v) == text)
        .cloned()
        .unwrap_or_else(|| Value::from(text))
}

/// The check: its outcome and each configuration's verdict with its figures.
fn check(c: &Check) -> Value {
    json!({
        "study": c.study,
        "reference": c.reference,
        "threshold_pct": c.threshold_pct,
        "passed": c.passed(),
        "outcome": match c.outcome() {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Inconclusive => "inconclusive",
        },
        "configurations": c.rows.iter().map(|r| json!({
            "configuration": r.configuration,
            "configuration_id": r.configuration_id,
            "system": r.system,
            "verdict": r.verdict,
            "note": r.note,
            "tokens_per_second": r.now_mean,
            "runs": r.now_runs,
            "reference_tokens_per_second": r.reference_mean,
            "reference_runs": r.reference_runs,
            "reference_attempts": r.reference_attempts,
            "ratio": r.ratio.map(|x| x.ratio),
            "ratio_ci95_low": r.ratio.map(|x| x.low),
            "ratio_ci95_high": r.ratio.map(|x| x.high),
            "p_value_holm": r.p_value_holm,
            "runs_to_decide": r.runs_to_decide,
            "differences": r.differences,
            "stragglers": r.stragglers,
        })).collect::<Vec<_>>(),
    })
}
