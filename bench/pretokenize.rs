//! Pretokenization throughput against the raw tokenizer, and its peak memory
//! on inputs of growing size.

use crate::timed;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use sweep::config::PretokenizedFormat;
use sweep::data::pretokenize::{self, PretokenizeArgs};
use sweep::data::{SpecialTokens, TextTokenizer};

pub struct PretokBench {
    pub threads: usize,
    pub mb: f64,
    pub raw_mb_s: f64,
    /// (formats written, best MB/s)
    pub ours: Vec<(&'static str, f64)>,
    pub docs: u64,
    pub tokens: u64,
    /// (input, its size in MB, peak RSS of `sweep pretokenize` in MB)
    pub rss: Vec<(PathBuf, f64, f64)>,
}

/// Raw and ours alternate `repeats` times; the best of each counts (the
/// machine is shared, so the fastest run is the least disturbed).
pub fn run(
    dataset: &Path,
    tokenizer: &Path,
    seq_len: usize,
    threads: usize,
    repeats: usize,
    rss_inputs: &[PathBuf],
) -> Result<PretokBench> {
    let tok = TextTokenizer::load(tokenizer, &SpecialTokens::default())?;
    let text = sweep::data::text::TextFile::open(dataset, "text")?;
    let chunks: Vec<_> = (0..text.file.row_groups())
        .map(|rg| text.read(rg))
        .collect::<Result<_>>()?;
    let bytes: usize = chunks
        .iter()
        .map(|c| c.texts().map(|t| t.iter().map(|s| s.len()).sum::<usize>()))
        .sum::<Result<usize>>()?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let out = sweep::util::fs::scratch_dir_in(&std::env::temp_dir())?;
    let args = |formats: Vec<PretokenizedFormat>| PretokenizeArgs {
        input: dataset.to_path_buf(),
        text_column: "text".into(),
        tokenizer: tokenizer.to_path_buf(),
        specials: SpecialTokens::default(),
        seq_len,
        formats,
        out_dir: out.path().to_path_buf(),
        row_group_size: 1000,
        threads,
        force: true,
        progress: false,
    };
    let configs: [(&'static str, Vec<PretokenizedFormat>); 3] = [
        ("token-list", vec![PretokenizedFormat::TokenList]),
        ("padded", vec![PretokenizedFormat::Padded]),
        (
            "both",
            vec![PretokenizedFormat::Padded, PretokenizedFormat::TokenList],
        ),
    ];
    let mut raw = f64::MAX;
    let mut ours = vec![f64::MAX; configs.len()];
    let mut report = None;
    for _ in 0..repeats.max(1) {
        // The raw tokenizer: encode_batch over texts already in memory, row group by row group.
        let (r, t) = timed(|| -> Result<()> {
            for c in &chunks {
                let t = c.texts()?;
                pool.install(|| tok.documents_ids(&t))?;
            }
            Ok(())
        });
        r?;
        raw = raw.min(t.as_secs_f64());
        for (k, (_, formats)) in configs.iter().enumerate() {
            let r = pretokenize::run(&args(formats.clone()))?;
            ours[k] = ours[k].min(r.seconds);
            report = Some(r);
        }
    }
    let report = report.expect("at least one run");
    let mb = bytes as f64 / 1e6;
    let mut rss = Vec::new();
    for input in rss_inputs {
        rss.push((
            input.clone(),
            std::fs::metadata(input)?.len() as f64 / 1e6,
            peak_rss_mb(input, tokenizer, seq_len, threads)?,
        ));
    }
    Ok(PretokBench {
        threads,
        mb,
        raw_mb_s: mb / raw,
        ours: configs
            .iter()
            .zip(&ours)
            .map(|((name, _), t)| (*name, mb / t))
            .collect(),
        docs: report.documents,
        tokens: report.tokens,
        rss,
    })
}

/// Runs `sweep pretokenize` on `input` as a child and returns its peak RSS.
fn peak_rss_mb(input: &Path, tokenizer: &Path, seq_len: usize, threads: usize) -> Result<f64> {
    let out = sweep::util::fs::scratch_dir_in(&std::env::temp_dir())?;
    let mut cmd = std::process::Command::new(crate::sweep_binary()?);
    cmd.arg("pretokenize")
        .arg("--input")
        .arg(input)
        .arg("--tokenizer")
        .arg(tokenizer)
        .args([
            "--sequence-length",
            &seq_len.to_string(),
            "--threads",
            &threads.to_string(),
            "--quiet",
            "--out",
        ])
        .arg(out.path())
        .stdout(std::process::Stdio::null());
    let child = sweep::util::process::spawn_stoppable(&mut cmd)?;
    // The child's own high-water mark (VmHWM), polled until it exits: the
    // rusage of a child counts the parent's pages it was forked with, which
    // are this benchmark's.
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let mut child = child;
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            if let Some(kb) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    sweep::util::process::forget_child(child.id());
    if !status.success() {
        bail!("sweep pretokenize {} failed ({status})", input.display());
    }
    Ok(peak_kb as f64 / 1024.0)
}
