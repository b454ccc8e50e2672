//! The reference study's isolated data benchmark: dataset load time and
//! time per sample over N samples at seq 2048, for each loader; plus the raw
//! tokenizer's cost on the very documents the on-the-fly loaders consumed.

use crate::timed;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use sweep::config::{DataOrder, DatasetType, PretokenizedFormat};
use sweep::data::pretokenize::{self, PretokenizeArgs};
use sweep::data::{DataSpec, SampleStream, SourceSpec, SpecialTokens, TextTokenizer};
use sweep::report::plot::{bars::StackedBars, save};

pub struct DataBenchArgs {
    pub dataset: PathBuf,
    pub tokenizer: PathBuf,
    pub seq_len: usize,
    pub samples: usize,
    /// Where the pretokenized inputs are cached between runs.
    pub work_dir: PathBuf,
    pub plots: PathBuf,
    /// Only these loaders (names as printed); all when empty.
    pub only: Vec<String>,
    /// Runs per loader (and of the raw tokenizer); the best counts.
    pub repeats: usize,
    /// Where `python-loaders.py` is (the repository's `scripts/`).
    pub scripts: PathBuf,
}

pub struct LoaderRow {
    pub name: &'static str,
    pub load_s: f64,
    pub us_per_sample: f64,
    /// The raw tokenizer's cost for the same documents (on-the-fly loaders).
    pub raw_us_per_sample: Option<f64>,
    /// The Python peer's time for the same samples from the same file
    /// (pretokenized loaders; `scripts/python-loaders.py`).
    pub python_us_per_sample: Option<f64>,
}

pub struct DataBench {
    pub rows: Vec<LoaderRow>,
    pub chart: Vec<PathBuf>,
    /// Why the Python peer did not run, when it did not.
    pub python_missing: Option<String>,
}

pub fn run(a: &DataBenchArgs) -> Result<DataBench> {
    // Inputs first (not measured): both pretokenized formats.
    pretokenize::run(&PretokenizeArgs {
        input: a.dataset.clone(),
        text_column: "text".into(),
        tokenizer: a.tokenizer.clone(),
        specials: SpecialTokens::default(),
        seq_len: a.seq_len,
        formats: vec![PretokenizedFormat::Padded, PretokenizedFormat::TokenList],
        out_dir: a.work_dir.clone(),
        row_group_size: 1000,
        threads: 0,
        force: false,
        progress: false,
    })?;
    let configs: [(&str, DatasetType, Option<PretokenizedFormat>); 4] = [
        ("on-the-fly padded", DatasetType::Padded, None),
        (
            "pretokenized padded",
            DatasetType::Padded,
            Some(PretokenizedFormat::Padded),
        ),
        ("on-the-fly padding-free", DatasetType::PaddingFree, None),
        (
            "pretokenized token-list",
            DatasetType::PaddingFree,
            Some(PretokenizedFormat::TokenList),
        ),
    ];
    let mut rows = Vec::new();
    for (name, kind, format) in configs {
        if !a.only.is_empty() && !a.only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        rows.push(time_loader(a, name, kind, format)?);
    }
    let python_missing = match python_peer(a, &rows) {
        Ok(times) => {
            for r in &mut rows {
                r.python_us_per_sample = times.get(r.name).copied();
            }
            None
        }
        Err(why) => Some(format!("{why:#}")),
    };
    let chart = if a.only.is_empty() {
        chart(a, &rows)?
    } else {
        Vec::new()
    };
    Ok(DataBench {
        rows,
        chart,
        python_missing,
    })
}

/// One loader timed: loading (the best of the repeats), microseconds per
/// sample, and for the on-the-fly loaders the raw tokenizer's cost on the
/// same documents.
fn time_loader(
    a: &DataBenchArgs,
    name: &'static str,
    kind: DatasetType,
    format: Option<PretokenizedFormat>,
) -> Result<LoaderRow> {
    let source = match format {
        None => SourceSpec::Text {
            path: a.dataset.clone(),
            column: "text".into(),
        },
        Some(f) => SourceSpec::Pretokenized {
            path: pretokenize::output_path(&a.work_dir, f),
        },
    };
    let (mut load_s, mut sample_s, mut raw_s) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..a.repeats.max(1) {
        // Load: the tokenizer (every mode needs its ids) and the dataset.
        let (stream, load) = timed(|| -> Result<SampleStream> {
            let tok = Arc::new(TextTokenizer::load(
                &a.tokenizer,
                &SpecialTokens::default(),
            )?);
            SampleStream::open(&DataSpec {
                dataset_type: kind,
                seq_len: a.seq_len,
                source: source.clone(),
                tokenizer: tok,
                rank: 0,
                world_size: 1,
                order: DataOrder::Global,
                holdout: 0,
            })
        });
        let mut stream = stream?;
        let (mut inputs, mut labels) = (vec![0u32; a.seq_len], vec![0i64; a.seq_len]);
        let (r, took) = timed(|| -> Result<()> {
            for _ in 0..a.samples {
                stream.next_into(&mut inputs, &mut labels)?;
            }
            Ok(())
        });
        r?;
        load_s = load_s.min(load.as_secs_f64());
        sample_s = sample_s.min(took.as_secs_f64());
        if format.is_none() {
            // The raw tokenizer on the very documents this loader consumed.
            raw_s = raw_s.min(raw_tokenizer_cost(a, stream.state().next_doc)?);
        }
    }
    let raw = (raw_s < f64::MAX).then(|| raw_s * 1e6 / a.samples as f64);
    Ok(LoaderRow {
        name,
        load_s,
        us_per_sample: sample_s * 1e6 / a.samples as f64,
        raw_us_per_sample: raw,
        python_us_per_sample: None,
    })
}

/// `scripts/python-loaders.py` on the same pretokenized files and samples:
/// microseconds per sample by loader name.
fn python_peer(
    a: &DataBenchArgs,
    rows: &[LoaderRow],
) -> Result<std::collections::HashMap<String, f64>> {
    let script = a.scripts.join("python-loaders.py");
    let tok = TextTokenizer::load(&a.tokenizer, &SpecialTokens::default())?;
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script)
        .args(["--seq-len", &a.seq_len.to_string()])
        .args(["--samples", &a.samples.to_string()])
        .args(["--bos", &tok.bos.unwrap_or(1).to_string()]);
    let ran = |name: &str| rows.iter().any(|r| r.name == name);
    if ran("pretokenized padded") {
        cmd.arg("--padded").arg(pretokenize::output_path(
            &a.work_dir,
            PretokenizedFormat::Padded,
        ));
    }
    if ran("pretokenized token-list") {
        cmd.arg("--token-list").arg(pretokenize::output_path(
            &a.work_dir,
            PretokenizedFormat::TokenList,
        ));
    }
    let out = sweep::util::process::output_stoppable(&mut cmd)
        .map_err(|e| anyhow::anyhow!("python3 does not start ({e})"))?;
    if !out.status.success() {
        anyhow::bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Seconds the tokenizer alone needs for the first `docs` documents.
fn raw_tokenizer_cost(a: &DataBenchArgs, docs: usize) -> Result<f64> {
    let tok = TextTokenizer::load(&a.tokenizer, &SpecialTokens::default())?;
    let text = sweep::data::text::TextFile::open(&a.dataset, "text")?;
    let mut texts = Vec::new();
    for rg in 0..text.file.row_groups() {
        let chunk = text.read(rg)?;
        for i in 0..chunk.len() {
            if texts.len() < docs {
                texts.push(chunk.get(i)?.to_string());
            }
        }
    }
    let (r, took) = timed(|| -> Result<()> {
        for t in &texts {
            tok.raw()
                .encode(t.as_str(), false)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(())
    });
    r?;
    Ok(took.as_secs_f64())
}

/// Load and processing time of N samples, stacked, with the speedup over
/// on-the-fly padded data on top (the reference study's chart).
fn chart(a: &DataBenchArgs, rows: &[LoaderRow]) -> Result<Vec<PathBuf>> {
    let total = |r: &LoaderRow| r.load_s + r.us_per_sample * a.samples as f64 / 1e6;
    let base = total(&rows[0]);
    let fig = StackedBars {
        title: format!(
            "Data loading: {} samples of {} tokens (seconds)",
            a.samples, a.seq_len
        ),
        y_label: "seconds".into(),
        categories: rows.iter().map(|r| r.name.replace(' ', "-")).collect(),
        layers: vec![
            (
                "dataset load".into(),
                rows.iter().map(|r| r.load_s).collect(),
            ),
            (
                format!("{} samples", a.samples),
                rows.iter()
                    .map(|r| r.us_per_sample * a.samples as f64 / 1e6)
                    .collect(),
            ),
        ],
        notes: rows
            .iter()
            .map(|r| Some(format!("{:.1}x faster", base / total(r))))
            .collect(),
    };
    Ok(save(&fig, &a.plots, "data-loading")?.files)
}

/// The default dataset: the full corpus when fetched, else the bundled one.
pub fn default_dataset(root: &Path) -> PathBuf {
    let full = root.join("assets/data/corpus.parquet");
    if full.exists() {
        full
    } else {
        root.join("assets/data/quickstart.parquet")
    }
}
