//! Summary -> files. One file per format behind one trait; every file is
//! written to a temporary name and renamed into place.

mod csv;
mod json;
mod markdown;
mod parquet;
pub mod shown;

pub use json::rows as json_rows;
pub use markdown::{cell as markdown_cell, table as markdown_table};

use super::summary::Summary;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

pub trait Exporter {
    /// The file name, e.g. `summary.md`.
    fn file_name(&self) -> &'static str;
    fn write(&self, summary: &Summary, ctx: &TableContext, out: &mut std::fs::File) -> Result<()>;
}

/// What a table needs besides the numbers.
pub struct TableContext {
    pub study: String,
    pub skip_first: usize,
    pub baseline: Option<String>,
}

pub fn all() -> Vec<Box<dyn Exporter>> {
    vec![
        Box::new(markdown::Markdown),
        Box::new(csv::Csv),
        Box::new(parquet::Parquet),
    ]
}

/// The files [`write_all`] writes into `dir`.
pub fn paths(dir: &Path) -> Vec<PathBuf> {
    all().iter().map(|e| dir.join(e.file_name())).collect()
}

pub fn write_all(summary: &Summary, ctx: &TableContext, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Vec::new();
    for e in all() {
        let path = dir.join(e.file_name());
        let tmp = crate::util::fs::temp_beside(&path, ".summary-")?;
        let (mut file, tmp_path) = tmp.into_parts();
        e.write(summary, ctx, &mut file)
            .with_context(|| format!("writing {}", path.display()))?;
        drop(file);
        crate::util::fs::persist(tmp_path, &path)?;
        out.push(path);
    }
    Ok(out)
}
