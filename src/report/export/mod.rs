//! Results -> bytes. Every output of `report`, `compare` and `check` is one
//! format of one result behind one trait, [`Exporter`] (as hyperfine's
//! exporters are): a report's [`Tables`] as markdown, CSV, Parquet and
//! JSON; a [`Comparison`](crate::report::judge::Comparison) as markdown and
//! CSV; a [`Check`](crate::report::check::Check) as text, JSON and JUnit;
//! each of the three as a page ([`crate::report::page::Html`]). Where the
//! bytes go — a study's file, a file named on the command line, the
//! terminal — is the caller's; files are written by [`write()`].

mod csv;
mod json;
mod junit;
mod markdown;
mod parquet;
pub mod shown;
mod text;

pub use csv::Csv;
pub use json::Json;
pub use junit::JUnit;
pub use markdown::{table as markdown_table, Markdown};
pub use parquet::Parquet;
pub use text::Text;

use super::summary::Summary;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// One format of results of type `R`.
pub trait Exporter<R: ?Sized> {
    /// `r` in this format.
    fn export(&self, r: &R) -> Result<Vec<u8>>;
}

/// A report's tables: the summary and what the text around it names.
pub struct Tables<'a> {
    pub summary: &'a Summary,
    pub study: &'a str,
    pub skip_first: usize,
    pub baseline: Option<&'a str>,
}

/// A format and the file it goes to.
pub type Output<'e, R> = (&'e dyn Exporter<R>, PathBuf);

/// A report's table files in `dir`: summary.md, summary.csv and
/// summary.parquet.
pub fn table_files<'a>(dir: &Path) -> Vec<Output<'a, Tables<'a>>> {
    vec![
        (&Markdown, dir.join("summary.md")),
        (&Csv, dir.join("summary.csv")),
        (&Parquet, dir.join("summary.parquet")),
    ]
}

/// Each output's bytes to its file: made whole first, then written under a
/// temporary name and renamed into place (a file is never half-written).
pub fn write<R: ?Sized>(r: &R, outputs: &[Output<'_, R>]) -> Result<()> {
    for (format, path) in outputs {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::util::fs::make_dir(dir)?;
        }
        let bytes = format
            .export(r)
            .with_context(|| format!("writing {}", path.display()))?;
        crate::util::fs::write_atomic(path, &bytes)?;
    }
    Ok(())
}
