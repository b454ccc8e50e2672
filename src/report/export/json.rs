//! `--json`: the table as an array of objects, for scripts.

use crate::report::summary::{param_text, Summary};
use polars::prelude::*;
use serde_json::{Map, Value};

pub fn rows(s: &Summary) -> Value {
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
