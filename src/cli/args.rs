//! The command line as typed structs (clap): every command, its flags and
//! their ranges, parsed once.

// The doc comments here are the commands' help text, where `<study>` and
// `[local]` are the usual notation, not HTML or links.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;

use crate::manifest::ExecutorKind;

/// `sweep --version`: the version and the optional engines built in, which
/// decide what runs this binary can train.
pub(super) fn version() -> &'static str {
    let names = crate::config::Features::BUILT.names();
    let list = if names.is_empty() {
        "none; CPU only, one rank".to_string()
    } else {
        names.join(", ")
    };
    Box::leak(format!("{} (features: {list})", env!("CARGO_PKG_VERSION")).into_boxed_str())
}

#[derive(Parser, Debug)]
#[command(
    name = "sweep",
    version = version(),
    about = "Declarative LLM-training throughput studies: manifest -> runs -> SLURM jobs -> report",
    long_about = None,
    after_help = "Examples:\n  sweep plan experiments/quickstart.toml\n  sweep submit experiments/pretokenization.toml --executor slurm --dry-run\n  sweep status experiments/pretokenization.toml"
)]
pub struct Cli {
    /// Project root, as `git -C`: sweep starts there, so the manifest argument, relative paths in manifests, `results/` and a command's working directory resolve there.
    #[arg(short = 'C', long = "root", global = true, value_name = "DIR")]
    pub root: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Validate a manifest and show its runs, without writing anything.
    #[command(
        after_help = "Examples:\n  sweep plan experiments/pretokenization.toml\n  sweep plan experiments/quickstart.toml --json | jq '.[].name'"
    )]
    Plan {
        manifest: PathBuf,
        /// Print `[{"id", "name", "params"}, ...]` instead of the table.
        #[arg(long)]
        json: bool,
        /// Plan runs estimated not to fit their GPU's memory, with a warning.
        #[arg(long)]
        allow_oom: bool,
    },
    /// Write every run's directory: config.toml, job.sbatch, run.json.
    #[command(
        after_help = "Examples:\n  sweep render experiments/pretokenization.toml\n  sbatch --test-only results/pretokenization/<run>/job.sbatch"
    )]
    Render {
        manifest: PathBuf,
        /// Render runs estimated not to fit their GPU's memory, with a warning.
        #[arg(long)]
        allow_oom: bool,
        /// Move aside (to results/<study>/replaced/<time>/) the directories of runs the manifest now makes different, and start them afresh.
        #[arg(long)]
        replace_changed: bool,
    },
    /// Plan, render, submit, watch until done, then report: the whole study in one command.
    #[command(
        after_help = "Examples:\n  sweep run experiments/quickstart.toml\n  sweep run experiments/quickstart.toml --executor slurm"
    )]
    Run(SubmitArgs),
    /// Submit the sweep's jobs (skipping what is completed, pending or running).
    #[command(
        after_help = "Examples:\n  sweep submit experiments/quickstart.toml --executor local\n  sweep submit experiments/pretokenization.toml --executor slurm\n  sweep submit experiments/pretokenization.toml --retry-failed\n\nExit 75: SLURM took no more of your jobs for now (a MaxSubmitJobs limit); the runs not submitted go out with `sweep submit` again later, or as jobs end with `sweep run`."
    )]
    Submit(SubmitArgs),
    /// Show the state of every run of a sweep.
    #[command(
        after_help = "Examples:\n  sweep status experiments/pretokenization.toml\n  sweep status experiments/pretokenization.toml --json"
    )]
    Status {
        manifest: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Train one run (what the job scripts call).
    #[command(
        after_help = "Example:\n  sweep train --config results/quickstart/baseline-padded-bs1/config.toml"
    )]
    Train {
        /// The run's config.toml (written by `sweep render`); outputs go beside it.
        #[arg(long)]
        config: PathBuf,
    },
    /// Write what this machine is (environment.json) into a run directory (what job scripts call first).
    #[command(hide = true)]
    Fingerprint {
        /// The run directory (its run.json says what to probe).
        #[arg(long)]
        dir: PathBuf,
        /// As the job ends: add the host's load to its environment.json.
        #[arg(long)]
        end: bool,
    },
    /// Start a run's launcher and stop the run when it stops making progress (what job scripts call).
    #[command(hide = true)]
    Watchdog(WatchdogCli),
    /// Check that a run's nodes can meet before its ranks start (what job scripts of several nodes call).
    #[command(hide = true, name = "launch-doctor")]
    LaunchDoctor(LaunchDoctorCli),
    /// Tokenize a text dataset once into padded and/or token-list Parquet files.
    #[command(
        after_help = "Examples:\n  sweep pretokenize --input assets/data/quickstart.parquet --sequence-length 2048 --out data/pretok\n  sweep pretokenize --input corpus.parquet --format token-list --threads 8 --out data/pretok"
    )]
    Pretokenize(PretokenizeCli),
    /// Prepare, inspect and check data.
    #[command(subcommand)]
    Data(DataCmd),
    /// Tables and charts of a sweep's runs (or of imported logs).
    #[command(
        after_help = "Examples:\n  sweep report experiments/quickstart.toml\n  sweep report results/quickstart --group-by dataset_type,pretokenized --json\n  sweep report --import 'tests/fixtures/reference-torch-logs/lsai_*.out' --log-format reference --name reference"
    )]
    Report(ReportCli),
    /// Two studies configuration by configuration: tokens/s with 95% intervals, B's speedup over A, a verdict.
    #[command(
        after_help = "Examples:\n  sweep compare results/quickstart-before results/quickstart\n  sweep compare experiments/quickstart.toml results/other-machine/quickstart"
    )]
    Compare {
        /// A manifest or a results/<study> directory (the reference side).
        a: PathBuf,
        /// A manifest or a results/<study> directory (the side measured against A).
        b: PathBuf,
        /// Log points skipped at the start of every run (default: each side's manifest's, else 5).
        #[arg(long, value_parser = count(0, MAX_STEPS))]
        skip_first: Option<usize>,
        /// The change (percent) that matters: smaller and within the interval is `unchanged`.
        #[arg(long, value_name = "PCT", default_value_t = crate::report::check::DEFAULT_THRESHOLD_PCT, value_parser = percent)]
        threshold: f64,
        #[arg(long)]
        no_plots: bool,
    },
    /// Did it get slower? Each configuration's latest attempt against the history (or another study): regressed, improved, unchanged, inconclusive, failed or new. Exit 0: nothing regressed, failed or was inconclusive; 1: something regressed or failed; 2: the check could not be made; 3: nothing regressed or failed but something was inconclusive.
    #[command(
        after_help = "Examples:\n  sweep check experiments/nightly.toml --history --junit results/nightly-check.xml\n  sweep check results/quickstart --against results/quickstart-before --threshold 5"
    )]
    Check(CheckCli),
    /// The history of a project's measurements (results/history.sqlite): tokens/s per configuration and attempt, with 95% intervals.
    #[command(
        after_help = "Examples:\n  sweep history experiments/quickstart.toml\n  sweep history --config baseline-bs8 --since 2026-11-01 --json\n  sweep history --import results/quickstart"
    )]
    History(HistoryCli),
    /// Benchmarks of the hot paths (release build).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Cancel every pending or running job of a sweep.
    #[command(after_help = "Example:\n  sweep cancel experiments/pretokenization.toml")]
    Cancel { manifest: PathBuf },
}

#[derive(clap::Args, Debug, Clone)]
pub struct TokenizerArgs {
    /// A Hugging Face tokenizer.json.
    #[arg(long, default_value = crate::config::DEFAULT_TOKENIZER)]
    pub tokenizer: PathBuf,
    /// Special tokens, when the tokenizer's own are missing or wrong.
    #[arg(long)]
    pub bos_token: Option<String>,
    #[arg(long)]
    pub eos_token: Option<String>,
    #[arg(long)]
    pub pad_token: Option<String>,
}

impl TokenizerArgs {
    pub fn specials(&self) -> crate::config::SpecialTokens {
        crate::config::SpecialTokens {
            bos: self.bos_token.clone(),
            eos: self.eos_token.clone(),
            pad: self.pad_token.clone(),
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatArg {
    Padded,
    TokenList,
    Both,
}

#[derive(clap::Args, Debug, Clone)]
pub struct PretokenizeCli {
    /// Parquet dataset with a text column.
    #[arg(long)]
    pub input: PathBuf,
    #[arg(long, default_value = "text")]
    pub text_column: String,
    #[command(flatten)]
    pub tokenizer: TokenizerArgs,
    /// Padded files hold seq+1 ids per document.
    #[arg(long, alias = "seq-len", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
    pub sequence_length: usize,
    #[arg(long, value_enum, default_value = "both")]
    pub format: FormatArg,
    /// Output directory: <out>/padded.parquet, <out>/token-list.parquet.
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_ROW_GROUP))]
    pub row_group_size: usize,
    /// Tokenizer threads (0: all cores, or SLURM_CPUS_PER_TASK).
    #[arg(long, default_value_t = 0, value_parser = count(0, MAX_THREADS))]
    pub threads: usize,
    /// Rewrite outputs even when their metadata says they are current.
    #[arg(long)]
    pub force: bool,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum DataCmd {
    /// Text files (or folders of .txt files) -> a Parquet dataset with a `text` column.
    #[command(
        after_help = "Example:\n  sweep data import-text assets/corpus/gutenberg assets/corpus/sotu --out assets/data/corpus.parquet"
    )]
    ImportText(ImportTextCli),
    /// Print samples as JSON lines: {"inputs": [...], "labels": [...]} (labels -100 where ignored).
    #[command(
        after_help = "Examples:\n  sweep data dump --dataset assets/data/quickstart.parquet --dataset-type padding-free --seq-len 16 --samples 3\n  sweep data dump --dataset results/quickstart/stages/<stage>/token-list.parquet --pretokenized --dataset-type padding-free --seq-len 512 --samples 10"
    )]
    Dump(DumpCli),
    /// Prove that a pretokenized file equals on-the-fly tokenization of its source.
    #[command(
        after_help = "Examples:\n  sweep data verify results/quickstart/stages/<stage>/padded.parquet\n  sweep data verify big/token-list.parquet --sample 1000"
    )]
    Verify(VerifyCli),
}

/// `sweep data import-text`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ImportTextCli {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[arg(long)]
    pub out: PathBuf,
    /// One document per file instead of paragraph groups.
    #[arg(long)]
    pub no_split: bool,
    /// Median document length in KB.
    #[arg(long, default_value_t = 2.2, value_parser = median_kb)]
    pub median_kb: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_ROW_GROUP))]
    pub row_group_size: usize,
}

/// `sweep data dump`'s arguments.
#[derive(clap::Args, Debug)]
pub struct DumpCli {
    #[arg(long)]
    pub dataset: PathBuf,
    #[arg(long, value_enum)]
    pub dataset_type: crate::config::DatasetType,
    /// The dataset is a file written by `sweep pretokenize`.
    #[arg(long)]
    pub pretokenized: bool,
    #[arg(long, default_value = "text")]
    pub text_column: String,
    #[command(flatten)]
    pub tokenizer: TokenizerArgs,
    #[arg(long, alias = "sequence-length", value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    /// How many of this rank's samples to print.
    #[arg(long, default_value_t = 10, value_parser = count(0, 1 << 32))]
    pub samples: usize,
    /// The rank whose samples to print, of `--world-size`.
    #[arg(long, default_value_t = 0, value_parser = count(0, MAX_RANKS - 1))]
    pub rank: usize,
    #[arg(long, default_value_t = 1, value_parser = count(1, MAX_RANKS))]
    pub world_size: usize,
    /// The per-rank batch size (in the global order, a rank's slice of
    /// each global batch).
    #[arg(long, default_value_t = 1, value_parser = count(1, MAX_BATCH))]
    pub batch_size: usize,
    #[arg(long, value_enum, default_value = "global")]
    pub data_order: crate::config::DataOrder,
}

/// `sweep data verify`'s arguments.
#[derive(clap::Args, Debug)]
pub struct VerifyCli {
    pub pretokenized: PathBuf,
    /// The source dataset (default: the one recorded in the file).
    #[arg(long)]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub tokenizer: TokenizerArgs,
    /// Check this many random documents instead of all.
    #[arg(long, value_parser = count(1, 1 << 32))]
    pub sample: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Dataset load time and time per sample for the four loaders; writes plots/bench/data-loading.{png,svg}.
    #[command(
        after_help = "Example:\n  scripts/fetch-assets.sh && sweep bench data --samples 1000 --seq-len 2048"
    )]
    Data(DataBenchCli),
    /// Pretokenization throughput against the raw tokenizer, and its peak memory at 1x and 5x the corpus.
    #[command(
        after_help = "Example:\n  scripts/fetch-assets.sh --5x && sweep bench pretokenize --threads 2"
    )]
    Pretokenize {
        #[arg(long)]
        dataset: Option<PathBuf>,
        #[arg(long, default_value = crate::config::DEFAULT_TOKENIZER)]
        tokenizer: PathBuf,
        #[arg(long, alias = "sequence-length", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
        seq_len: usize,
        #[arg(long, default_value_t = 2, value_parser = count(1, MAX_THREADS))]
        threads: usize,
        /// Alternating runs of raw and ours; the best of each counts.
        #[arg(long, default_value_t = 3, value_parser = count(1, MAX_REPEATS))]
        repeats: usize,
    },
    /// The train step of the CPU presets in f32 and bf16-mixed: tokens/s, GFLOP/s, share of the matmul peak.
    #[command(
        after_help = "Examples:\n  sweep bench train --threads 1\n  sweep bench train --threads 2 --steps 10\n  sweep bench train --device cuda --layers 8      (a GPU build on a GPU machine)"
    )]
    Train(TrainBenchCli),
    /// The floor of a training step: each matrix product of the linear layers and the head timed alone, times its count.
    #[command(
        after_help = "Examples:\n  sweep bench gemms                                   (small, batch 2 x 256, f32 on the CPU)\n  sweep bench gemms --device cuda --model ref-1b --batch 8 --seq-len 2048   (a GPU build: bf16, cuBLAS)"
    )]
    Gemms(GemmsBenchCli),
    /// Data-parallel scaling of the trainer on this machine: 1 and N ranks (MPI) with the same work per rank.
    #[command(
        after_help = "Example:\n  sweep bench ddp --ranks 1,2 --threads 1      (a build with --features mpi)\n  sweep bench ddp --device cuda --ranks 1 --engine-at-one --model ref-1b --batch 8 --seq-len 2048   (NCCL at world size 1)"
    )]
    Ddp(DdpBenchCli),
    /// The largest batch size a run's configuration trains at: real steps at
    /// each size tried, starting from the plan's memory estimate.
    #[command(
        after_help = "Examples:\n  sweep bench max-batch --config results/quickstart/baseline-padded-bs1-r0/config.toml --memory-limit 2G\n  sweep bench max-batch --config results/gpu-quickstart/baseline-padded-bs1/config.toml   (a GPU build: until CUDA runs out of memory)"
    )]
    MaxBatch {
        /// A run's config.toml (`sweep render` writes one per run).
        #[arg(long)]
        config: PathBuf,
        /// Resident memory a trial may use, e.g. 2G or 1500M (CPU runs; default 80% of what is available).
        #[arg(long)]
        memory_limit: Option<String>,
        /// Training steps per trial; the first is not timed.
        #[arg(long, default_value_t = 3, value_parser = count(2, MAX_BENCH_STEPS))]
        steps: usize,
        /// The largest batch size to try.
        #[arg(long, default_value_t = 1024, value_parser = count(1, MAX_BATCH))]
        max: usize,
    },
    /// One rank of `sweep bench ddp` (started by it).
    #[command(hide = true)]
    DdpRank {
        #[arg(long)]
        work: String,
    },
    /// Aggregating a large sweep: read, summarise and write the tables of N runs x M log lines.
    #[command(after_help = "Example:\n  sweep bench report --runs 1000 --lines 1000")]
    Report {
        #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_BENCH_RUNS))]
        runs: usize,
        /// Log lines per run (runs × lines at most 10 million: ~3 GB of logs).
        #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_BENCH_LINES))]
        lines: usize,
        /// Where the synthetic study is written.
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
    /// The performance history at scale: `sweep history` and `sweep check --history` over a results/history.sqlite of N measurements.
    #[command(after_help = "Example:\n  sweep bench history --rows 1000000")]
    History {
        #[arg(long, default_value_t = 1_000_000, value_parser = count(1, 100_000_000))]
        rows: usize,
        /// Where the synthetic history is written.
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
    /// sweep's own kernels (RMSNorm, SwiGLU, RoPE, the loss, the embedding's gradient) against their references: error, time, GB/s, and the composed ops they replace.
    #[command(after_help = "Examples:
  sweep bench kernels
  sweep bench kernels --device cuda --json results/kernels.json   (a GPU build on a GPU machine)")]
    Kernels(KernelsBenchCli),
    /// Matmul throughput on this CPU, f32 (candle) and bf16 (sweep's kernel): what CPU MFU is measured against.
    #[command(after_help = "Example:\n  sweep bench peak")]
    Peak,
    /// Plan + render of a large sweep, phase by phase.
    #[command(after_help = "Example:\n  sweep bench plan --runs 10000")]
    Plan {
        #[arg(long, default_value_t = 10_000, value_parser = count(1, MAX_BENCH_RUNS))]
        runs: usize,
        /// Where the temporary project is written (its file system is measured too).
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct ReportCli {
    /// A manifest, or a results/<study> directory.
    pub target: Option<PathBuf>,
    /// Where summary.{md,csv,parquet}, report.html and the charts (DIR/plots) go (default: results/<study>, charts in plots/<study>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Log points skipped at the start of every run (default: the manifest's, else 5).
    #[arg(long, value_parser = count(0, MAX_STEPS))]
    pub skip_first: Option<usize>,
    /// The run speedups are measured against (default: the manifest's `baseline`).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Group runs by these parameters (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Read these log files instead (one run each), e.g. another program's logs.
    #[arg(long, value_name = "GLOB")]
    pub import: Option<String>,
    /// How the imported logs are written (default: `pattern` with --pattern, else `reference`).
    #[arg(long, value_enum)]
    pub log_format: Option<crate::report::LogFormat>,
    /// A regex with named groups (step, loss, tokens_per_second, mfu_pct, tflops, ...) that matches the imported logs' lines (implies --log-format pattern).
    #[arg(long)]
    pub pattern: Option<String>,
    /// With --import: the study name (results/<name>, plots/<name>).
    #[arg(long, default_value = "imported", value_parser = study_name)]
    pub name: String,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the charts.
    #[arg(long)]
    pub no_plots: bool,
}

// The bounds of the flags: each count is checked as it is parsed, and the
// error names the flag and its range.
const MAX_SEQ: u64 = crate::config::MAX_SEQUENCE_LENGTH as u64;
const MAX_BATCH: u64 = crate::config::MAX_BATCH_SIZE as u64;
const MAX_THREADS: u64 = crate::config::MAX_THREADS as u64;
const MAX_STEPS: u64 = crate::config::MAX_STEPS as u64;
const MAX_ROW_GROUP: u64 = crate::data::pretokenized::MAX_ROW_GROUP_SIZE as u64;
const MAX_RANKS: u64 = 1 << 20;
const MAX_REPEATS: u64 = 1000;
const MAX_TOKENS: u64 = 1 << 24;
/// Steps of a benchmark (each a real training step).
const MAX_BENCH_STEPS: u64 = 100_000;
/// Ranks `sweep bench ddp` starts on this machine.
const MAX_BENCH_RANKS: u64 = 256;
/// Runs of the synthetic studies `sweep bench plan` and `bench report` write.
const MAX_BENCH_RUNS: u64 = 100_000;
const MAX_BENCH_LINES: u64 = 1_000_000;

/// A whole number in `least..=most` for a flag.
fn count(least: u64, most: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(least..=most)
}

/// `--threshold`: a change in percent, from 0 up to (not including) 100.
fn percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..100.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not in [0, 100) percent")),
    }
}

/// A bandwidth in GB/s within the range `[plan]` accepts.
fn gbps(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(0.01..=1e5).contains(&v) {
        return Err(format!("`{s}` GB/s is not in [0.01, 100000]"));
    }
    Ok(v)
}

/// `--median-kb`: a document length in KB, from 0.2 (the shortest document
/// cut) to 10 MB.
fn median_kb(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(0.2..=10_000.0).contains(&v) {
        return Err(format!("`{s}` KB is not in [0.2, 10000]"));
    }
    Ok(v)
}

/// A study name from the command line: it becomes `results/<name>` and
/// `plots/<name>`, so it must stay one plain directory name.
fn study_name(s: &str) -> Result<String, String> {
    crate::util::name::check(s).map(|()| s.to_string())
}

#[derive(clap::Args, Debug, Clone)]
pub struct DataBenchCli {
    /// Text dataset (default: assets/data/corpus.parquet when fetched, else the bundled one).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    #[arg(long, default_value = crate::config::DEFAULT_TOKENIZER)]
    pub tokenizer: PathBuf,
    #[arg(long, alias = "sequence-length", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    #[arg(long, default_value_t = 1000, value_parser = count(1, 10_000_000))]
    pub samples: usize,
    /// Only the loaders whose name contains this (repeatable), e.g. `--loader pretokenized`.
    #[arg(long = "loader")]
    pub only: Vec<String>,
    /// Runs of each loader and of the raw tokenizer; the best counts.
    #[arg(long, default_value_t = 3, value_parser = count(1, MAX_REPEATS))]
    pub repeats: usize,
}

#[derive(clap::Args, Debug, Clone)]
pub struct CheckCli {
    /// The study checked: a manifest or a results/<study> directory (its latest attempt).
    pub target: PathBuf,
    /// Check against another study (a manifest or a results/<study> directory) instead of the history.
    #[arg(long, value_name = "STUDY", conflicts_with = "history")]
    pub against: Option<PathBuf>,
    /// Check against the history: the same configuration on the same system, its last N attempts pooled (the default).
    #[arg(long)]
    pub history: bool,
    /// Attempts of the history pooled as the reference.
    #[arg(long, value_name = "N", default_value_t = crate::report::check::DEFAULT_LAST, value_parser = count(1, 10_000))]
    pub last: usize,
    /// The change (percent) that matters: `regressed`/`improved` need a significant change at least this large, `unchanged` an interval within it.
    #[arg(long, value_name = "PCT", default_value_t = crate::report::check::DEFAULT_THRESHOLD_PCT, value_parser = percent)]
    pub threshold: f64,
    /// Also write the verdicts as JUnit XML (one test case per configuration).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write the verdicts, what differs and each configuration's history as a page (self-contained HTML).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print the verdicts as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Log points skipped at the start of every run (default: the manifest's, else 5).
    #[arg(long, value_parser = count(0, MAX_STEPS))]
    pub skip_first: Option<usize>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct HistoryCli {
    /// Only this study: a manifest or a results/<study> directory (default: every study).
    #[arg(conflicts_with = "import")]
    pub target: Option<PathBuf>,
    /// Only the configuration of this name.
    #[arg(long = "config", value_name = "NAME")]
    pub configuration: Option<String>,
    /// Only this system (as `sweep history` lists them: `<cluster>/<partition>`, `local/<host>`).
    #[arg(long)]
    pub system: Option<String>,
    /// Only what ran on or after this date (`2026-11-01`, or RFC 3339).
    #[arg(long, value_name = "DATE", value_parser = since)]
    pub since: Option<String>,
    #[arg(long)]
    pub json: bool,
    /// Record a study reported before the history existed (a results/<study> directory).
    #[arg(long, value_name = "DIR")]
    pub import: Option<PathBuf>,
}

/// `--since`: a date or an RFC 3339 time, as the history's UTC times compare.
fn since(s: &str) -> Result<String, String> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.format("%Y-%m-%d").to_string());
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .map_err(|_| format!("`{s}` is neither a date (2026-11-01) nor an RFC 3339 time"))
}

#[derive(clap::Args, Debug, Clone)]
pub struct SubmitArgs {
    pub manifest: PathBuf,
    /// Where jobs run; the manifest's `executor`, else slurm.
    #[arg(long, value_enum)]
    pub executor: Option<ExecutorKind>,
    /// Resubmit runs that failed, were cancelled, timed out or ran out of memory.
    #[arg(long)]
    pub retry_failed: bool,
    /// Print what would be submitted; submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Local executor: runs at a time (default: the manifest's [local] parallel).
    #[arg(long, value_parser = count(1, crate::manifest::MAX_PARALLEL as u64))]
    pub parallel: Option<usize>,
    /// Submit runs estimated not to fit their GPU's memory, with a warning.
    #[arg(long)]
    pub allow_oom: bool,
    /// Move aside (to results/<study>/replaced/<time>/) the directories of runs the manifest now makes different, and run them afresh.
    #[arg(long)]
    pub replace_changed: bool,
    /// Measure the study again as a new attempt: every run anew; the finished attempt is recorded in the history and its run directories kept under results/<study>/attempts/<attempt>/.
    #[arg(long, conflicts_with_all = ["retry_failed", "dry_run"])]
    pub again: bool,
}

/// `sweep bench train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainBenchCli {
    /// CPU threads (1 gives tokens per CPU-second; 0: every core).
    #[arg(long, default_value_t = 1, value_parser = count(0, MAX_THREADS))]
    pub threads: usize,
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_BENCH_STEPS))]
    pub steps: usize,
    /// Only the cases whose "label precision" contains this (e.g. `8192`, `bf16-mixed`).
    #[arg(long)]
    pub only: Option<String>,
    /// Only the cases of this batch size.
    #[arg(long, value_parser = count(1, 1 << 20))]
    pub batch: Option<usize>,
    /// After the timed steps, one more step recorded op by op: where its time
    /// goes (linear layers, attention, norms, ... by forward, backward and optimizer).
    #[arg(long)]
    pub parts: bool,
    /// `cpu`: the CPU presets; `cuda`: ref-1b and an 8B-shaped model on GPU 0.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// Layers of the 8B-shaped GPU model (ref-8b's shapes; 32 is the full model).
    #[arg(long, default_value_t = 8, value_parser = count(1, 1024))]
    pub layers: usize,
    /// The accelerator's name in the peak-FLOPs table (default: the driver's name).
    #[arg(long)]
    pub gpu: Option<String>,
    /// Activation recomputation for every case (`blocks`: less memory, more compute).
    #[arg(long, value_enum, default_value = "none")]
    pub recompute: crate::config::Recompute,
    /// Also write every case (tokens/s, MFU, peak memory, or its error) to this JSON file
    /// (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench gemms`.
#[derive(clap::Args, Debug, Clone)]
pub struct GemmsBenchCli {
    /// `cpu` (f32, candle's and the `gemm` crate's products) or `cuda` (bf16, cuBLAS) on GPU 0.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// The model preset whose shapes are used (default: `small` on the CPU, `ref-1b` on a GPU).
    #[arg(long)]
    pub model: Option<String>,
    /// Sequences per step (default: 2 on the CPU, 8 on a GPU).
    #[arg(long, value_parser = count(1, MAX_BATCH))]
    pub batch: Option<usize>,
    /// Tokens per sequence (default: 256 on the CPU, 2048 on a GPU).
    #[arg(long, alias = "sequence-length", value_parser = count(1, MAX_SEQ))]
    pub seq_len: Option<usize>,
    /// Timed calls per shape (the median counts).
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_REPEATS))]
    pub repeats: usize,
    /// Also write the figures as JSON to this file (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench ddp`.
#[derive(clap::Args, Debug, Clone)]
pub struct DdpBenchCli {
    /// World sizes to run, the first being the base of the efficiency.
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = count(1, MAX_BENCH_RANKS))]
    pub ranks: Vec<usize>,
    /// CPU threads per rank.
    #[arg(long, default_value_t = 1, value_parser = count(1, MAX_THREADS))]
    pub threads: usize,
    #[arg(long, default_value_t = 10, value_parser = count(1, MAX_BENCH_STEPS))]
    pub steps: usize,
    /// A model preset (the tokenizer's vocabulary).
    #[arg(long, default_value = "small")]
    pub model: String,
    /// Sequences per rank and step.
    #[arg(long, default_value_t = 4, value_parser = count(1, MAX_BATCH))]
    pub batch: usize,
    #[arg(long, default_value_t = 256, value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// Also run one rank through the engine (MPI or NCCL) to see its cost without peers.
    #[arg(long)]
    pub engine_at_one: bool,
    /// Rounds of every world size in turn; the medians count (a shared
    /// machine's noise moves one run by several percent).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Start the ranks on this many SLURM nodes with `srun --mpi=pmix`
    /// (in an allocation, or one of their own), a world size spread
    /// evenly over them; the one-rank base on one node. Default: `mpirun`
    /// on this machine.
    #[arg(long, value_parser = count(1, MAX_BENCH_RANKS))]
    pub nodes: Option<usize>,
    /// All-reduce bandwidth per device within a node, in GB/s (as `[plan]
    /// intra_node_gbps`): adds the plan's scaling forecast of each world size
    /// that fits on one node, its compute calibrated by the one-rank base.
    #[arg(long, value_parser = gbps)]
    pub intra_node_gbps: Option<f64>,
    /// All-reduce bandwidth per device between nodes, in GB/s (as `[plan]
    /// inter_node_gbps`; 1 Gbit/s is 0.125): adds the forecast of each world
    /// size that spans nodes.
    #[arg(long, value_parser = gbps)]
    pub inter_node_gbps: Option<f64>,
    /// Also write the rows, every round and the forecasts to this JSON file (`-`: standard output).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep bench kernels`.
#[derive(clap::Args, Debug, Clone)]
pub struct KernelsBenchCli {
    /// `cpu`: the CPU kernels against the composed ops; `cuda`: the CUDA kernels against the CPU kernels, in bf16 and f32.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: crate::config::DeviceKind,
    /// The model preset whose shapes are used (default: `small` on the CPU, `ref-1b` on a GPU).
    #[arg(long)]
    pub model: Option<String>,
    /// Tokens per call (batch x sequence; default 2048 on the CPU, 16384 on a GPU).
    #[arg(long, value_parser = count(1, MAX_TOKENS))]
    pub tokens: Option<usize>,
    #[arg(long, alias = "sequence-length", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
    pub seq_len: usize,
    /// Timed calls per case (the median counts).
    #[arg(long, default_value_t = 5, value_parser = count(1, MAX_REPEATS))]
    pub repeats: usize,
    /// The vocabulary (default: the preset's, else 32000).
    #[arg(long, value_parser = count(1, 1 << 24))]
    pub vocab: Option<usize>,
    /// Also write the figures as JSON to this file (`-`: standard output, and the table to standard error).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `sweep watchdog` (docs/running.md, "When a run hangs").
#[derive(clap::Args, Debug)]
pub struct WatchdogCli {
    /// The run directory.
    #[arg(long)]
    pub dir: PathBuf,
    /// The job, as the run's exit_code names it.
    #[arg(long, default_value = "none")]
    pub job: String,
    /// `auto`, `off` or a duration ("90s", "5m").
    #[arg(long, default_value = "auto")]
    pub stall: String,
    /// A duration, or `off`.
    #[arg(long, default_value = "off")]
    pub startup: String,
    /// A command's progress lines (its `[report] line_pattern`); without
    /// it, the built-in trainer's ranks report their steps.
    #[arg(long)]
    pub pattern: Option<String>,
    /// Print this node's processes of the watchdog TOKEN as JSON lines (what
    /// the watchdog runs on the job's other nodes).
    #[arg(long, value_name = "TOKEN")]
    pub probe: Option<String>,
    /// The launcher and its arguments.
    #[arg(last = true)]
    pub argv: Vec<std::ffi::OsString>,
}

/// `sweep launch-doctor` (docs/running.md, "When a run hangs").
#[derive(clap::Args, Debug)]
pub struct LaunchDoctorCli {
    /// The run directory (where a failure is recorded).
    #[arg(long, required_unless_present = "reach")]
    pub dir: Option<PathBuf>,
    /// The job, as the run's exit_code names it.
    #[arg(long, default_value = "none")]
    pub job: String,
    /// `[slurm] master_port`: the ports drawn from start there.
    #[arg(long, default_value_t = 29500)]
    pub port: u16,
    /// The run's nodes from the allocation's first (a packed run's step).
    #[arg(long)]
    pub nodes: Option<usize>,
    /// A program every node must have (the launcher).
    #[arg(long)]
    pub need: Vec<String>,
    /// On each node: connect to ADDR:PORT and say whether it could.
    #[arg(long, value_name = "ADDR:PORT")]
    pub reach: Option<String>,
}
