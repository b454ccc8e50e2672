//! The `sweep` command line: options are parsed once into typed structs here
//! and handed to the module that does the work.

mod bench_cmds;
mod sweep_cmds;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::manifest::{Diagnostics, ExecutorKind};

#[derive(Parser, Debug)]
#[command(
    name = "sweep",
    version,
    about = "Declarative LLM-training throughput studies: manifest -> runs -> SLURM jobs -> report",
    long_about = None,
    after_help = "Examples:\n  sweep plan experiments/quickstart.toml\n  sweep submit experiments/pretokenization.toml --executor slurm --dry-run\n  sweep status experiments/pretokenization.toml"
)]
pub struct Cli {
    /// Project root: relative paths in manifests and `results/` resolve here.
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
    },
    /// Write every run's directory: config.toml, job.sbatch, run.json.
    #[command(
        after_help = "Examples:\n  sweep render experiments/pretokenization.toml\n  sbatch --test-only results/pretokenization/<run>/job.sbatch"
    )]
    Render { manifest: PathBuf },
    /// Submit the sweep's jobs (skipping what is completed, pending or running).
    #[command(
        after_help = "Examples:\n  sweep submit experiments/quickstart.toml --executor local\n  sweep submit experiments/pretokenization.toml --executor slurm\n  sweep submit experiments/pretokenization.toml --retry-failed"
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
    /// Benchmarks of the hot paths (release build).
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Cancel every pending or running job of a sweep.
    #[command(after_help = "Example:\n  sweep cancel experiments/pretokenization.toml")]
    Cancel { manifest: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Plan + render of a large sweep (goal: 10,000 runs in under 2 s).
    #[command(after_help = "Example:\n  sweep bench plan --runs 10000")]
    Plan {
        #[arg(long, default_value_t = 10_000)]
        runs: usize,
        /// Where the temporary project is written (its file system is measured too).
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
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
    #[arg(long)]
    pub parallel: Option<usize>,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = match cli
        .root
        .clone()
        .map(Ok)
        .unwrap_or_else(std::env::current_dir)
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot find the working directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match dispatch(cli.command, &root) {
        Ok(code) => code,
        Err(e) => {
            match e.downcast_ref::<Diagnostics>() {
                Some(d) => eprintln!("{d}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd, root: &std::path::Path) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Plan { manifest, json } => sweep_cmds::plan(root, &manifest, json),
        Cmd::Render { manifest } => sweep_cmds::render(root, &manifest),
        Cmd::Submit(args) => sweep_cmds::submit(root, &args),
        Cmd::Status { manifest, json } => sweep_cmds::status(root, &manifest, json),
        Cmd::Cancel { manifest } => sweep_cmds::cancel(root, &manifest),
        Cmd::Bench(b) => bench_cmds::run(b),
    }
}
