//! `summary.parquet`: the table with its types.

use super::{Exporter, Tables};
use anyhow::Result;
use polars_io::parquet::write::ParquetWriter;

pub struct Parquet;

impl Exporter<Tables<'_>> for Parquet {
    fn export(&self, t: &Tables<'_>) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        ParquetWriter::new(&mut out).finish(&mut t.summary.table.clone())?;
        Ok(out)
    }
}
