//! `sweep data verify`: proves that a pretokenized file holds exactly what
//! tokenizing its source on the fly gives, document by document, and reports
//! the first difference (document index and token position).

use super::pretokenized::PretokFile;
use super::text::TextFile;
use super::tokenizer::{SpecialTokens, TextTokenizer};
use crate::config::PretokenizedFormat;
use anyhow::{bail, Result};
use rand::seq::index::sample;
use rand::SeedableRng;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct VerifyArgs {
    pub pretokenized: PathBuf,
    /// The source dataset; by default the one named in the file's metadata.
    pub source: Option<PathBuf>,
    pub tokenizer: PathBuf,
    pub specials: SpecialTokens,
    /// Check a random sample of this many documents instead of all.
    pub sample: Option<usize>,
    pub seed: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub document: usize,
    pub position: usize,
    pub expected: Vec<u32>,
    pub found: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct VerifyReport {
    pub format: PretokenizedFormat,
    pub documents_checked: usize,
    pub documents_total: usize,
    pub tokens_checked: u64,
    pub mismatch: Option<Mismatch>,
}

pub fn verify(args: &VerifyArgs) -> Result<VerifyReport> {
    let pre = PretokFile::open(&args.pretokenized)?;
    let meta = pre.meta.clone();
    let tok = TextTokenizer::load(&args.tokenizer, &args.specials)?;
    if tok.sha256 != meta.tokenizer_sha256 {
        bail!(
            "{} was made with tokenizer {} ({}), not {}",
            args.pretokenized.display(),
            meta.tokenizer,
            meta.tokenizer_sha256,
            args.tokenizer.display()
        );
    }
    let source = args
        .source
        .clone()
        .unwrap_or_else(|| PathBuf::from(&meta.source));
    let sha = crate::util::hash::sha256_file(&source)?;
    if sha != meta.source_sha256 {
        bail!(
            "{} has changed since it was pretokenized (sha256 {sha}, the file says {})",
            source.display(),
            meta.source_sha256
        );
    }
    let text = TextFile::open(&source, &meta.text_column)?;
    let total = pre.docs();
    if text.docs() != total {
        bail!(
            "{} has {} documents, the pretokenized file {total}",
            source.display(),
            text.docs()
        );
    }
    let wanted: Option<Vec<bool>> = args.sample.filter(|&k| k < total).map(|k| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        let mut pick = vec![false; total];
        for i in sample(&mut rng, total, k) {
            pick[i] = true;
        }
        pick
    });

    let keep = |d: &[u32]| -> Vec<u32> {
        match meta.format {
            PretokenizedFormat::TokenList => d.to_vec(),
            PretokenizedFormat::Padded => d[..d.len().min(meta.sequence_length + 1)].to_vec(),
        }
    };
    let mut report = VerifyReport {
        format: meta.format,
        documents_checked: 0,
        documents_total: total,
        tokens_checked: 0,
        mismatch: None,
    };
    for rg in 0..pre.file.row_groups() {
        let stored = pre.read(rg)?;
        let rows = pre.file.row_group_rows(rg);
        let indices: Vec<usize> = rows
            .clone()
            .filter(|&i| wanted.as_ref().is_none_or(|w| w[i]))
            .collect();
        if indices.is_empty() {
            continue;
        }
        let texts = texts_of(&text, &indices)?;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let fresh = tok.documents_ids(&refs)?;
        for (k, &i) in indices.iter().enumerate() {
            let expected = keep(&fresh[k]);
            let found = stored.doc(i - rows.start);
            report.documents_checked += 1;
            report.tokens_checked += found.len() as u64;
            if expected != found {
                let position = expected
                    .iter()
                    .zip(found)
                    .position(|(a, b)| a != b)
                    .unwrap_or(expected.len().min(found.len()));
                let window =
                    |v: &[u32]| v[position.saturating_sub(3)..(position + 4).min(v.len())].to_vec();
                report.mismatch = Some(Mismatch {
                    document: i,
                    position,
                    expected: window(&expected),
                    found: window(found),
                });
                return Ok(report);
            }
        }
    }
    Ok(report)
}

/// The texts of these documents (sorted indices), reading each row group once.
fn texts_of(text: &TextFile, indices: &[usize]) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(indices.len());
    let mut cached: Option<(usize, super::text::TextChunk)> = None;
    for &i in indices {
        let rg = text.file.row_group_of(i);
        if cached.as_ref().is_none_or(|(r, _)| *r != rg) {
            cached = Some((rg, text.read(rg)?));
        }
        let (_, chunk) = cached.as_ref().unwrap();
        out.push(chunk.get(i - chunk.first_doc)?.to_string());
    }
    Ok(out)
}

/// A report as the command prints it.
pub fn describe(r: &VerifyReport, path: &Path) -> String {
    match &r.mismatch {
        None => format!(
            "OK: {} ({}) equals on-the-fly tokenization of its source: {} of {} documents, {} tokens checked",
            path.display(),
            r.format.as_str(),
            r.documents_checked,
            r.documents_total,
            r.tokens_checked
        ),
        Some(m) => format!(
            "MISMATCH in {}: document {} differs at token {}: expected ...{:?}..., found ...{:?}...",
            path.display(),
            m.document,
            m.position,
            m.expected,
            m.found
        ),
    }
}
