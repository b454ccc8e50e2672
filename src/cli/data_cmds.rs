//! pretokenize, data import-text, data dump, data verify.

use super::{DataCmd, DumpCli, FormatArg, ImportTextCli, PretokenizeCli, VerifyCli};
use crate::config::PretokenizedFormat;
use crate::data::{import, pretokenize, verify, DataSpec, SampleStream, SourceSpec, TextTokenizer};
use crate::util::stdout::outln;
use anyhow::Result;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

pub fn pretokenize(p: &PretokenizeCli, rt: &crate::config::RuntimeOptions) -> Result<ExitCode> {
    let formats = match p.format {
        FormatArg::Padded => vec![PretokenizedFormat::Padded],
        FormatArg::TokenList => vec![PretokenizedFormat::TokenList],
        FormatArg::Both => vec![PretokenizedFormat::Padded, PretokenizedFormat::TokenList],
    };
    let args = pretokenize::PretokenizeArgs {
        input: p.input.clone(),
        text_column: p.text_column.clone(),
        tokenizer: p.tokenizer.tokenizer.clone(),
        specials: p.tokenizer.specials(),
        seq_len: p.sequence_length,
        formats,
        out_dir: p.out.clone(),
        row_group_size: p.row_group_size,
        threads: rt.threads(p.threads),
        force: p.force,
        progress: !p.quiet,
    };
    let r = pretokenize::run(&args)?;
    if r.null_documents > 0 {
        eprintln!(
            "note: {} of {} documents in `{}` are null: each became an empty document (its BOS token alone)",
            r.null_documents, r.documents, args.text_column
        );
    }
    for (path, kept) in &r.outputs {
        outln!(
            "{} {}",
            if *kept { "kept   " } else { "wrote  " },
            path.display()
        );
    }
    if r.documents > 0 {
        outln!(
            "{} documents, {} tokens, {:.1} MB of text in {:.1} s on {} threads: {:.0} docs/s, {:.2} MB/s, {:.0}k tokens/s",
            r.documents,
            r.tokens,
            r.text_bytes as f64 / 1e6,
            r.seconds,
            args.threads,
            r.documents as f64 / r.seconds,
            r.mb_per_s(),
            r.tokens as f64 / 1e3 / r.seconds
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(cmd: DataCmd) -> Result<ExitCode> {
    match cmd {
        DataCmd::ImportText(args) => import_text(args),
        DataCmd::Dump(args) => dump(args),
        DataCmd::Verify(args) => verify_file(args),
    }
}

/// `sweep data import-text`: text files into a Parquet dataset.
fn import_text(a: ImportTextCli) -> Result<ExitCode> {
    let opts = import::ImportOptions {
        split: !a.no_split,
        median_bytes: a.median_kb * 1000.0,
        seed: a.seed,
        row_group_size: a.row_group_size,
        ..Default::default()
    };
    let r = import::import_text(&a.files, &a.out, &opts)?;
    for f in &r.latin1 {
        eprintln!("note: {f} is not UTF-8; read it as Latin-1");
    }
    outln!(
        "{} files -> {} documents ({:.1} MB, mean {:.1} KB) in {}",
        r.files,
        r.documents,
        r.bytes as f64 / 1e6,
        r.bytes as f64 / 1e3 / r.documents.max(1) as f64,
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `sweep data dump`: a rank's samples as JSON lines.
fn dump(a: DumpCli) -> Result<ExitCode> {
    anyhow::ensure!(a.rank < a.world_size, "--rank must be below --world-size");
    anyhow::ensure!(a.batch_size > 0, "--batch-size must be at least 1");
    // One batch is held in memory (12 bytes a token).
    const MAX_TOKENS: usize = 1 << 24;
    anyhow::ensure!(
        a.batch_size
            .checked_mul(a.seq_len)
            .is_some_and(|t| t <= MAX_TOKENS),
        "--batch-size × --seq-len is more than {MAX_TOKENS} tokens"
    );
    let spec = DataSpec {
        dataset_type: a.dataset_type,
        seq_len: a.seq_len,
        source: if a.pretokenized {
            SourceSpec::Pretokenized { path: a.dataset }
        } else {
            SourceSpec::Text {
                path: a.dataset,
                column: a.text_column,
            }
        },
        tokenizer: Arc::new(TextTokenizer::load(
            &a.tokenizer.tokenizer,
            &a.tokenizer.specials(),
        )?),
        rank: a.rank,
        world_size: a.world_size,
        order: a.data_order,
        holdout: 0,
    };
    let mut stream = SampleStream::open(&spec)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut left = a.samples;
    while left > 0 {
        let b = crate::data::loader::next_batch(&mut stream, a.batch_size)?;
        let rows = b.inputs.chunks(a.seq_len).zip(b.labels.chunks(a.seq_len));
        for (inputs, labels) in rows.take(left) {
            serde_json::to_writer(
                &mut out,
                &serde_json::json!({ "inputs": inputs, "labels": labels }),
            )?;
            out.write_all(b"\n")?;
        }
        left = left.saturating_sub(a.batch_size);
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `sweep data verify`: a pretokenized file against its source.
fn verify_file(a: VerifyCli) -> Result<ExitCode> {
    let args = verify::VerifyArgs {
        pretokenized: a.pretokenized.clone(),
        source: a.source,
        tokenizer: a.tokenizer.tokenizer.clone(),
        specials: a.tokenizer.specials(),
        sample: a.sample,
        seed: a.seed,
    };
    let r = verify::verify(&args)?;
    outln!("{}", verify::describe(&r, &a.pretokenized));
    if r.mismatch.is_some() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
