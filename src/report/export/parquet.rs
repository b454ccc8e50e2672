//! `summary.parquet`: the table with its types.

use super::{Exporter, TableContext};
use crate::report::summary::Summary;
use anyhow::Result;
use polars::prelude::*;

pub struct Parquet;

impl Exporter for Parquet {
    fn file_name(&self) -> &'static str {
        "summary.parquet"
    }

    fn write(&self, s: &Summary, _: &TableContext, out: &mut std::fs::File) -> Result<()> {
        let mut df = s.table.clone();
        ParquetWriter::new(out).finish(&mut df)?;
        Ok(())
    }
}
