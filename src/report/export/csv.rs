//! CSV: `summary.csv` (every column of the table) and `comparison.csv`.

use super::{Exporter, Tables};
use crate::report::columns as c;
use crate::report::judge::{Comparison, Row};
use anyhow::Result;
use polars::prelude::*;
use polars_io::csv::write::CsvWriter;
use polars_io::SerWriter;

pub struct Csv;

impl Exporter<Tables<'_>> for Csv {
    fn export(&self, t: &Tables<'_>) -> Result<Vec<u8>> {
        frame(&mut t.summary.table.clone())
    }
}

/// Each configuration: A's and B's tokens/s with their intervals, B's
/// speedup over A with its interval and p-values, and the verdict.
impl Exporter<Comparison> for Csv {
    fn export(&self, cmp: &Comparison) -> Result<Vec<u8>> {
        let col = |name: &str, f: &dyn Fn(&Row) -> Option<f64>| {
            Column::new(name.into(), cmp.rows.iter().map(f).collect::<Vec<_>>())
        };
        let text = |name: &str, f: &dyn Fn(&Row) -> String| {
            Column::new(name.into(), cmp.rows.iter().map(f).collect::<Vec<_>>())
        };
        frame(&mut DataFrame::new_infer_height(vec![
            text("configuration", &|r| r.judged.configuration.clone()),
            col("a_tokens_per_second_mean", &|r| r.a_mean),
            col("a_tokens_per_second_ci95_low", &|r| r.a.map(|c| c.low)),
            col("a_tokens_per_second_ci95_high", &|r| r.a.map(|c| c.high)),
            col("b_tokens_per_second_mean", &|r| r.b_mean),
            col("b_tokens_per_second_ci95_low", &|r| r.b.map(|c| c.low)),
            col("b_tokens_per_second_ci95_high", &|r| r.b.map(|c| c.high)),
            col(c::SPEEDUP, &|r| r.judged.ratio.map(|s| s.ratio)),
            col(c::SPEEDUP_CI95_LOW, &|r| r.judged.ratio.map(|s| s.low)),
            col(c::SPEEDUP_CI95_HIGH, &|r| r.judged.ratio.map(|s| s.high)),
            col(c::SPEEDUP_P_VALUE, &|r| r.judged.ratio.map(|s| s.p_value)),
            col(c::SPEEDUP_P_VALUE_HOLM, &|r| r.judged.p_value_holm),
            Column::new(
                c::SIGNIFICANT.into(),
                cmp.rows
                    .iter()
                    .map(|r| r.judged.ratio.map(|s| s.significant))
                    .collect::<Vec<_>>(),
            ),
            text("verdict", &|r| r.judged.verdict.as_str().to_string()),
        ])?)
    }
}

fn frame(df: &mut DataFrame) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    CsvWriter::new(&mut out).include_header(true).finish(df)?;
    Ok(out)
}
