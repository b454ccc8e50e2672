//! `sweep pretokenize`: a text dataset -> padded and/or token-list files.
//!
//! Streams row group by row group through three threads (read, tokenize on a
//! pool of `threads`, write), so memory stays flat whatever the input size.
//! Outputs go to temporary files renamed into place at the end. A valid output
//! whose metadata matches the inputs is kept: that is the stage's cache key.

use super::pretokenized::{Meta, PretokFile, PretokWriter, TEMP_PREFIX};
use super::text::TextFile;
use super::tokenizer::{SpecialTokens, TextTokenizer};
use crate::config::PretokenizedFormat;
use crate::util::progress::Progress;
use anyhow::{anyhow, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct PretokenizeArgs {
    pub input: PathBuf,
    pub text_column: String,
    pub tokenizer: PathBuf,
    pub specials: SpecialTokens,
    pub seq_len: usize,
    pub formats: Vec<PretokenizedFormat>,
    pub out_dir: PathBuf,
    pub row_group_size: usize,
    /// Tokenizer threads, as the command line resolved them
    /// ([`crate::config::RuntimeOptions::threads`]); 0: every core.
    pub threads: usize,
    /// Rewrite outputs even when they are current.
    pub force: bool,
    pub progress: bool,
}

#[derive(Debug, Clone, Default)]
pub struct PretokenizeReport {
    /// (output, whether it was already current and kept)
    pub outputs: Vec<(PathBuf, bool)>,
    pub documents: u64,
    pub tokens: u64,
    pub text_bytes: u64,
    /// Null texts, each written as an empty document (its BOS alone).
    pub null_documents: u64,
    pub seconds: f64,
}

impl PretokenizeReport {
    pub fn mb_per_s(&self) -> f64 {
        self.text_bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// Where a format's output goes inside a stage directory.
pub fn output_path(out_dir: &Path, format: PretokenizedFormat) -> PathBuf {
    out_dir.join(format!("{}.parquet", format.as_str()))
}

/// The metadata an output made from these inputs carries.
pub fn expected_meta(
    input: &Path,
    text_column: &str,
    tok: &TextTokenizer,
    seq_len: usize,
    format: PretokenizedFormat,
) -> Result<Meta> {
    Ok(Meta {
        format,
        tokenizer: tok.name.clone(),
        tokenizer_sha256: tok.sha256.clone(),
        sequence_length: seq_len,
        bos_policy: if tok.bos.is_some() {
            "bos-per-document"
        } else {
            "none"
        }
        .into(),
        bos_id: tok.bos,
        pad_id: tok.pad_id(),
        source: input.display().to_string(),
        source_sha256: crate::util::hash::sha256_file(input)?,
        text_column: text_column.to_string(),
        documents: 0,
        tokens: 0,
        sweep_version: env!("CARGO_PKG_VERSION").into(),
        created_at: crate::util::now_rfc3339(),
    })
}

/// Why an existing output cannot be reused (None: it is current).
pub fn stale_reason(path: &Path, want: &Meta) -> Option<String> {
    if !path.exists() {
        return Some("it does not exist".into());
    }
    match PretokFile::open(path) {
        Ok(f) => f.meta.mismatch(want),
        Err(e) => Some(format!("{e:#}")),
    }
}

/// The sizes a pretokenize run allocates by, within their bounds.
fn check_sizes(args: &PretokenizeArgs) -> Result<()> {
    use super::pretokenized::{MAX_ROW_GROUP_SIZE, MAX_ROW_GROUP_TOKENS};
    use crate::config::MAX_SEQUENCE_LENGTH;
    if !(1..=MAX_SEQUENCE_LENGTH).contains(&args.seq_len) {
        anyhow::bail!(
            "the sequence length must be a whole number in 1..={MAX_SEQUENCE_LENGTH}, not {}",
            args.seq_len
        );
    }
    if !(1..=MAX_ROW_GROUP_SIZE).contains(&args.row_group_size) {
        anyhow::bail!(
            "the row group size must be a whole number in 1..={MAX_ROW_GROUP_SIZE}, not {}",
            args.row_group_size
        );
    }
    // A padded row group holds seq + 1 ids per document, built in memory.
    let padded = args.formats.contains(&PretokenizedFormat::Padded);
    if padded && args.row_group_size * (args.seq_len + 1) > MAX_ROW_GROUP_TOKENS {
        anyhow::bail!(
            "a padded row group of {} documents × {} ids is more than {MAX_ROW_GROUP_TOKENS} ids in memory: \
             use a row group size of at most {}",
            args.row_group_size,
            args.seq_len + 1,
            MAX_ROW_GROUP_TOKENS / (args.seq_len + 1)
        );
    }
    Ok(())
}

pub fn run(args: &PretokenizeArgs) -> Result<PretokenizeReport> {
    let started = Instant::now();
    check_sizes(args)?;
    // An output never replaces what it is made from, nor anything else
    // sweep owns but a stage's own files (a stage's job writes them).
    use crate::util::outputs::{self, Output};
    let paths: Vec<PathBuf> = args
        .formats
        .iter()
        .map(|&f| output_path(&args.out_dir, f))
        .collect();
    let outputs: Vec<Output> = paths.iter().map(|p| Output::new("--out", p)).collect();
    outputs::check(
        &outputs,
        &[&args.input, &args.tokenizer],
        outputs::Allow { stage: true },
    )?;
    // What a killed run left behind is removed; a file being written by
    // another process now is not.
    for stale in crate::util::fs::remove_stale_temps(&args.out_dir, TEMP_PREFIX) {
        eprintln!(
            "pretokenize: removed {}, left behind by a run that was killed",
            stale.display()
        );
    }
    let tok = TextTokenizer::load(&args.tokenizer, &args.specials)?;
    if args.formats.contains(&PretokenizedFormat::TokenList) {
        tok.require_bos("padding-free data (the token-list format)")?;
    }
    let text = TextFile::open(&args.input, &args.text_column)?;
    if text.docs() == 0 {
        anyhow::bail!(
            "{} holds no rows: there is nothing to pretokenize",
            args.input.display()
        );
    }
    let mut report = PretokenizeReport::default();
    let todo = outputs_to_write(args, &tok, &mut report)?;
    if todo.is_empty() {
        return Ok(report);
    }
    let writers = todo
        .iter()
        .map(|(_, path, want)| PretokWriter::create(path, want, args.row_group_size))
        .collect::<Result<Vec<_>>>()?;
    let (writers, counts) = stream(args, &text, &tok, writers)
        .with_context(|| format!("pretokenizing {}", args.input.display()))?;
    for w in writers {
        report.outputs.push((w.finish()?, false));
    }
    report.documents = counts.documents;
    report.tokens = counts.tokens;
    report.text_bytes = counts.text_bytes;
    report.null_documents = counts.nulls;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The formats whose output is missing or stale (or all, with `force`);
/// current ones go into the report as kept.
fn outputs_to_write(
    args: &PretokenizeArgs,
    tok: &TextTokenizer,
    report: &mut PretokenizeReport,
) -> Result<Vec<(PretokenizedFormat, PathBuf, Meta)>> {
    let mut todo = Vec::new();
    for &f in &args.formats {
        let path = output_path(&args.out_dir, f);
        let want = expected_meta(&args.input, &args.text_column, tok, args.seq_len, f)?;
        match stale_reason(&path, &want) {
            None if !args.force => {
                eprintln!("pretokenize: {} is current, keeping it", path.display());
                report.outputs.push((path, true));
            }
            why => {
                if let Some(w) = why.filter(|_| path.exists()) {
                    eprintln!("pretokenize: rewriting {}: {w}", path.display());
                }
                todo.push((f, path, want));
            }
        }
    }
    Ok(todo)
}

/// What went through the writers: documents, their tokens, the bytes of
/// text they came from, and the null texts among them.
struct Counts {
    documents: u64,
    tokens: u64,
    text_bytes: u64,
    nulls: u64,
}

/// Reads row groups of text on one thread, tokenizes them on a pool here,
/// and writes every format from the same ids on another thread, in input
/// order. Returns the writers and what went through them.
fn stream(
    args: &PretokenizeArgs,
    text: &TextFile,
    tok: &TextTokenizer,
    writers: Vec<PretokWriter>,
) -> Result<(Vec<PretokWriter>, Counts)> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .thread_name(|i| format!("tokenize-{i}"))
        .build()?;
    let mut progress = Progress::new("pretokenize", text.docs() as u64, args.progress);
    let (text_tx, text_rx) = sync_channel(2);
    let (ids_tx, ids_rx) = sync_channel::<Vec<Vec<u32>>>(2);
    let (mut docs, mut tokens, mut bytes, mut nulls) = (0u64, 0u64, 0u64, 0u64);
    let writers = std::thread::scope(|s| -> Result<Vec<PretokWriter>> {
        let reader = s.spawn(move || -> Result<()> {
            // Owning the sender closes the channel when reading ends.
            for rg in 0..text.file.row_groups() {
                if text_tx.send(text.read(rg)?).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let writer = s.spawn(move || -> Result<Vec<PretokWriter>> {
            let mut writers = writers;
            for chunk in ids_rx {
                for w in writers.iter_mut() {
                    w.write(&chunk)?;
                }
            }
            Ok(writers)
        });
        let mut failed = None;
        // A stop signal (SLURM cancels and preempts with SIGTERM) ends the
        // process at once, its temporary files removed
        // (`util::signals::exit_on_stop`).
        for chunk in text_rx {
            nulls += chunk.nulls() as u64;
            let result = chunk.texts().and_then(|t| {
                let n: u64 = t.iter().map(|s| s.len() as u64).sum();
                pool.install(|| tok.documents_ids(&t)).map(|ids| (ids, n))
            });
            match result {
                Ok((ids, n)) => {
                    docs += ids.len() as u64;
                    tokens += ids.iter().map(|d| d.len() as u64).sum::<u64>();
                    bytes += n;
                    progress.advance(ids.len() as u64, |secs| {
                        format!(
                            "{:.0} docs/s, {:.2} MB/s, {:.0}k tokens/s",
                            docs as f64 / secs,
                            bytes as f64 / 1e6 / secs,
                            tokens as f64 / 1e3 / secs
                        )
                    });
                    if ids_tx.send(ids).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        drop(ids_tx);
        let read = reader
            .join()
            .map_err(|_| anyhow!("the reader thread panicked"))?;
        let writers = writer
            .join()
            .map_err(|_| anyhow!("the writer thread panicked"))??;
        if let Some(e) = failed {
            return Err(e);
        }
        read.map(|()| writers)
    })?;
    progress.finish();
    let counts = Counts {
        documents: docs,
        tokens,
        text_bytes: bytes,
        nulls,
    };
    Ok((writers, counts))
}
