//! `sweep data import-text`: text files -> a Parquet dataset (`text`, `source`).
//!
//! Books are far longer than training documents, so each file is cut into
//! documents of consecutive paragraphs whose target lengths follow a
//! log-normal distribution (median ~2.2 KB, long tail, capped), like web text.
//! Files that are not UTF-8 are read as Latin-1; line endings become `\n`.
//! The output is deterministic for the same inputs and seed.

use anyhow::{bail, Context, Result};
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Cut files into paragraph groups (else one document per file).
    pub split: bool,
    pub median_bytes: f64,
    /// Log-normal sigma; 1.25 puts the mean near 2.2x the median (~4.8 KB).
    pub sigma: f64,
    pub max_bytes: usize,
    pub seed: u64,
    pub row_group_size: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            split: true,
            median_bytes: 2200.0,
            sigma: 1.25,
            max_bytes: 50_000,
            seed: 0,
            row_group_size: 1000,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImportReport {
    pub files: usize,
    pub documents: usize,
    pub bytes: usize,
    /// Files that were not UTF-8 and were read as Latin-1.
    pub latin1: Vec<String>,
}

/// Text files, and the `*.txt` files of directories, in a stable order.
pub fn expand_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in inputs {
        if p.is_dir() {
            let mut inner: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("listing {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                // Regular files only: a FIFO named *.txt would block the read.
                .filter(|f| f.extension().is_some_and(|e| e == "txt") && f.is_file())
                .collect();
            inner.sort();
            files.extend(inner);
        } else if p.is_file() {
            files.push(p.clone());
        } else if p.exists() {
            bail!("{} is not a regular file or a directory", p.display());
        } else {
            bail!("{} does not exist", p.display());
        }
    }
    if files.is_empty() {
        bail!("no text files among the inputs");
    }
    Ok(files)
}

/// Bytes to text: UTF-8 when valid, else Latin-1 (every byte is a character);
/// CRLF and lone CR become LF. Returns the text and whether it was Latin-1.
pub fn decode(bytes: &[u8]) -> (String, bool) {
    let (text, latin1) = match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_string(), false),
        Err(_) => (bytes.iter().map(|&b| b as char).collect(), true),
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text).to_string();
    (text.replace("\r\n", "\n").replace('\r', "\n"), latin1)
}

/// Paragraphs: runs of lines separated by blank lines, trimmed.
fn paragraphs(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut end = 0;
    let mut pos = 0;
    for line in text.split_inclusive('\n') {
        let blank = line.trim().is_empty();
        if blank {
            if let Some(s) = start.take() {
                out.push(text[s..end].trim_end());
            }
        } else {
            if start.is_none() {
                start = Some(pos);
            }
            end = pos + line.len();
        }
        pos += line.len();
    }
    if let Some(s) = start {
        out.push(text[s..end].trim_end());
    }
    out
}

/// Pieces of text to group into documents, with the separator that joins
/// each to the one before: paragraphs (`\n\n`), and for paragraphs too long
/// to be units (whole speeches on one line), runs of sentences (` `).
fn units(text: &str, max_unit: usize) -> Vec<(&'static str, &str)> {
    let mut out = Vec::new();
    for p in paragraphs(text) {
        if p.len() <= max_unit {
            out.push(("\n\n", p));
            continue;
        }
        let mut sep = "\n\n";
        let mut start = 0;
        for end in sentence_ends(p) {
            if end - start >= max_unit / 4 {
                out.push((sep, p[start..end].trim()));
                sep = " ";
                start = end;
            }
        }
        if start < p.len() {
            out.push((sep, p[start..].trim()));
        }
    }
    out.retain(|(_, t)| !t.is_empty());
    out
}

/// Byte offsets just after a sentence's end (`.`, `?` or `!`, then a space
/// and a capital letter).
fn sentence_ends(p: &str) -> impl Iterator<Item = usize> + '_ {
    let b = p.as_bytes();
    (1..b.len().saturating_sub(1)).filter(move |&i| {
        matches!(b[i - 1], b'.' | b'?' | b'!') && b[i] == b' ' && b[i + 1].is_ascii_uppercase()
    })
}

/// Cuts a text into documents of consecutive paragraphs (or sentence runs).
pub fn split_documents(text: &str, opts: &ImportOptions, seed: u64) -> Vec<String> {
    let units = units(text, 4000);
    if !opts.split {
        let mut doc = String::new();
        for (sep, u) in units {
            if !doc.is_empty() {
                doc.push_str(sep);
            }
            doc.push_str(u);
        }
        return if doc.is_empty() { vec![] } else { vec![doc] };
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dist =
        LogNormal::new(opts.median_bytes.ln(), opts.sigma).expect("valid log-normal parameters");
    let mut target = || (dist.sample(&mut rng) as usize).clamp(200, opts.max_bytes);
    let mut docs = Vec::new();
    let mut cur = String::new();
    let mut want = target();
    for (sep, u) in units {
        if !cur.is_empty() && cur.len() + u.len() > opts.max_bytes {
            docs.push(std::mem::take(&mut cur));
            want = target();
        }
        if !cur.is_empty() {
            cur.push_str(sep);
        }
        cur.push_str(u);
        if cur.len() >= want {
            docs.push(std::mem::take(&mut cur));
            want = target();
        }
    }
    if !cur.is_empty() {
        docs.push(cur);
    }
    docs
}

/// What the output is called while it is written, beside its target.
const TEMP_PREFIX: &str = ".import-";

/// Text files -> one Parquet file at `out`, which must be none of them.
pub fn import_text(inputs: &[PathBuf], out: &Path, opts: &ImportOptions) -> Result<ImportReport> {
    let files = expand_inputs(inputs)?;
    let read: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    use crate::util::outputs::{self, Output};
    outputs::check(
        &[Output::new("--out", out)],
        &read,
        outputs::Allow::default(),
    )?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("text", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
    ]));
    let dir = crate::util::fs::parent_dir(out);
    crate::util::fs::make_dir(dir)?;
    for stale in crate::util::fs::remove_stale_temps(dir, TEMP_PREFIX) {
        eprintln!(
            "import-text: removed {}, left behind by a run that was killed",
            stale.display()
        );
    }
    let (file, tmp, _lock) = crate::util::fs::locked_temp_beside(out, TEMP_PREFIX)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(opts.row_group_size))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
    let mut report = ImportReport::default();
    let mut texts: Vec<String> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    let mut flush = |texts: &mut Vec<String>, sources: &mut Vec<String>, all: bool| -> Result<()> {
        while texts.len() >= opts.row_group_size || (all && !texts.is_empty()) {
            let n = texts.len().min(opts.row_group_size);
            let t: Vec<String> = texts.drain(..n).collect();
            let s: Vec<String> = sources.drain(..n).collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from(t)),
                    Arc::new(StringArray::from(s)),
                ],
            )?;
            writer.write(&batch)?;
            writer.flush()?;
        }
        Ok(())
    };
    for f in &files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let (text, latin1) = decode(&bytes);
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if latin1 {
            report.latin1.push(name.clone());
        }
        // A per-file seed keeps each file's cut independent of the others.
        let seed = opts.seed
            ^ u64::from_str_radix(&crate::util::hash::sha256_bytes(name.as_bytes())[..16], 16)
                .unwrap_or(0);
        for d in split_documents(&text, opts, seed) {
            report.bytes += d.len();
            report.documents += 1;
            texts.push(d);
            sources.push(name.clone());
        }
        report.files += 1;
        flush(&mut texts, &mut sources, false)?;
    }
    flush(&mut texts, &mut sources, true)?;
    writer.close()?;
    crate::util::fs::persist(tmp, out)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latin1_and_crlf_are_normalised() {
        let (t, latin1) = decode(b"caf\xe9\r\nline\rend");
        assert!(latin1);
        assert_eq!(t, "café\nline\nend");
        let (t, latin1) = decode("naïve\r\n".as_bytes());
        assert!(!latin1);
        assert_eq!(t, "naïve\n");
    }

    #[test]
    fn paragraphs_group_into_documents_of_bounded_size() {
        let para = "word ".repeat(100); // 500 bytes
        let text = vec![para.trim(); 400].join("\n\n");
        let opts = ImportOptions::default();
        let docs = split_documents(&text, &opts, 7);
        assert!(docs.len() > 10, "{} documents", docs.len());
        assert!(docs.iter().all(|d| d.len() <= opts.max_bytes));
        // Nothing is lost or reordered.
        assert_eq!(docs.join("\n\n"), text);
        assert_eq!(docs, split_documents(&text, &opts, 7), "deterministic");
    }

    #[test]
    fn one_line_speeches_are_cut_at_sentence_ends() {
        let speech =
            "It was a fine year. The harvest was good! Were we glad? We were. ".repeat(400);
        let opts = ImportOptions {
            max_bytes: 3000,
            ..Default::default()
        };
        let docs = split_documents(speech.trim(), &opts, 1);
        assert!(docs.len() >= 9, "{} documents", docs.len());
        assert!(
            docs.iter().all(|d| d.len() <= 3000),
            "the cap holds: sentence runs are small units"
        );
        assert!(
            docs.iter().all(|d| d.starts_with("It was")
                || d.starts_with("The")
                || d.starts_with("Were")
                || d.starts_with("We")),
            "cuts fall between sentences"
        );
        assert_eq!(docs.join(" "), speech.trim(), "nothing is lost");
    }

    #[test]
    fn blank_lines_separate_paragraphs() {
        assert_eq!(paragraphs("a\nb\n\n  \nc\n"), vec!["a\nb", "c"]);
        assert!(paragraphs("\n\n").is_empty());
    }
}
