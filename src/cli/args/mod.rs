//! The command line as typed structs (clap): every command, its flags and
//! their ranges, parsed once.

// The doc comments here are the commands' help text, where `<study>` and
// `[local]` are the usual notation, not HTML or links.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;

use crate::manifest::ExecutorKind;

mod bench;
mod report;

pub use bench::*;
pub use report::*;

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
        after_help = "Examples:\n  sweep report experiments/quickstart.toml\n  sweep report results/quickstart --group-by dataset_type,pretokenized --json\n  sweep report --import 'tests/fixtures/reference-torch-logs/lsai_*.out' --log-format reference --name reference\n  sweep report --import 'logs/nanogpt-*.log' --name nanogpt --pattern 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+), time (?P<time_ms>[\\d.]+)ms' --step-time time_ms --tokens-per-step 491520 --flops-per-token 8.55e8 --gpu A100"
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

/// A whole number in `least..=most` for a flag.
pub fn count(least: u64, most: u64) -> clap::builder::RangedU64ValueParser<usize> {
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
