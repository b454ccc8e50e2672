//! `summary.csv`: every column of the table.

use super::{Exporter, TableContext};
use crate::report::summary::Summary;
use anyhow::Result;
use polars::prelude::*;

pub struct Csv;

impl Exporter for Csv {
    fn file_name(&self) -> &'static str {
        "summary.csv"
    }

    fn write(&self, s: &Summary, _: &TableContext, out: &mut std::fs::File) -> Result<()> {
        let mut df = s.table.clone();
        CsvWriter::new(out).include_header(true).finish(&mut df)?;
        Ok(())
    }
}
