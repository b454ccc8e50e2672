//! `sweep-bench`: benchmarks of sweep's own tooling — planning, reports, the
//! history, the data loaders, pretokenization and the local executor — kept
//! out of the `sweep` binary, which keeps the benchmarks of what users train
//! (`sweep bench train|kernels|gemms|ddp|peak|max-batch`). Each prints a
//! table of figures; none asserts a speed (docs/performance.md).

mod data;
mod history;
mod local;
mod plan;
mod pretokenize;
mod report;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use sweep::cli::count;
use sweep::config::{RuntimeOptions, DEFAULT_TOKENIZER};
use sweep::util::stdout::outln;

// The allocator the `sweep` binary runs with, so the figures are its.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MAX_SEQ: u64 = sweep::config::MAX_SEQUENCE_LENGTH as u64;
const MAX_THREADS: u64 = sweep::config::MAX_THREADS as u64;
const MAX_REPEATS: u64 = 1000;
/// Runs of the synthetic studies `plan` and `report` write.
const MAX_RUNS: u64 = 100_000;
const MAX_LINES: u64 = 1_000_000;

#[derive(Parser, Debug)]
#[command(
    name = "sweep-bench",
    about = "Benchmarks of sweep's own tooling: plan, report, history, data loaders, pretokenization, the local executor",
    after_help = "Examples:\n  sweep-bench plan --runs 10000\n  sweep-bench report --runs 1000 --lines 1000\n  (from a checkout: cargo run --release --bin sweep-bench -- plan)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The text both data cases read, and how it is cut.
#[derive(clap::Args, Debug)]
struct Text {
    /// Text dataset (default: assets/data/corpus.parquet when fetched, else the bundled one).
    #[arg(long)]
    dataset: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_TOKENIZER)]
    tokenizer: PathBuf,
    #[arg(long, alias = "sequence-length", default_value_t = 2048, value_parser = count(1, MAX_SEQ))]
    seq_len: usize,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Dataset load time and time per sample for the four loaders; writes plots/bench/data-loading.{png,svg}.
    #[command(
        after_help = "Example:\n  scripts/fetch-assets.sh && sweep-bench data --samples 1000 --seq-len 2048"
    )]
    Data {
        #[command(flatten)]
        text: Text,
        #[arg(long, default_value_t = 1000, value_parser = count(1, 10_000_000))]
        samples: usize,
        /// Only the loaders whose name contains this (repeatable), e.g. `--loader pretokenized`.
        #[arg(long = "loader")]
        only: Vec<String>,
        /// Runs of each loader and of the raw tokenizer; the best counts.
        #[arg(long, default_value_t = 3, value_parser = count(1, MAX_REPEATS))]
        repeats: usize,
    },
    /// Pretokenization throughput against the raw tokenizer, and its peak memory at 1x and 5x the corpus.
    #[command(
        after_help = "Example:\n  scripts/fetch-assets.sh --5x && sweep-bench pretokenize --threads 2"
    )]
    Pretokenize {
        #[command(flatten)]
        text: Text,
        #[arg(long, default_value_t = 2, value_parser = count(1, MAX_THREADS))]
        threads: usize,
        /// Alternating runs of raw and ours; the best of each counts.
        #[arg(long, default_value_t = 3, value_parser = count(1, MAX_REPEATS))]
        repeats: usize,
    },
    /// Aggregating a large sweep: read, summarise and write the tables of N runs x M log lines.
    #[command(after_help = "Example:\n  sweep-bench report --runs 1000 --lines 1000")]
    Report {
        #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_RUNS))]
        runs: usize,
        /// Log lines per run (runs × lines at most 10 million: ~3 GB of logs).
        #[arg(long, default_value_t = 1000, value_parser = count(1, MAX_LINES))]
        lines: usize,
        /// Where the synthetic study is written.
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
    /// The performance history at scale: `sweep history` and `sweep check --history` over a results/history.sqlite of N measurements.
    #[command(after_help = "Example:\n  sweep-bench history --rows 1000000")]
    History {
        /// At least one study's: 20 configurations × 5 repeats × 100 attempts.
        #[arg(long, default_value_t = 1_000_000, value_parser = count(history::PER_STUDY as u64, 100_000_000))]
        rows: usize,
        /// Where the synthetic history is written.
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
    /// The local executor with many short runs: a study of N command runs of S seconds, P at a time, timed whole beside the floor its runs set.
    #[command(after_help = "Example:\n  sweep-bench local --runs 200 --parallel 32 --seconds 1")]
    Local {
        #[arg(long, default_value_t = 200, value_parser = count(1, 10_000))]
        runs: usize,
        #[arg(long, default_value_t = 32, value_parser = count(1, 1024))]
        parallel: usize,
        /// Each run's time (it sleeps).
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Where the temporary project is written.
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
    /// Plan + render of a large sweep, phase by phase.
    #[command(after_help = "Example:\n  sweep-bench plan --runs 10000")]
    Plan {
        #[arg(long, default_value_t = 10_000, value_parser = count(1, MAX_RUNS))]
        runs: usize,
        /// Where the temporary project is written (its file system is measured too).
        #[arg(long, default_value = "results")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    sweep::util::crash::install();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return sweep::cli::said_by_clap(&e),
    };
    // SAFETY: restoring a signal's default disposition at start-up, before
    // any thread is spawned: a closed pipe ends the program quietly.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // As `sweep bench` measures: the figures in docs/performance.md are so.
    sweep::cli::keep_freed_memory();
    let outcome = RuntimeOptions::from_env()
        .map(RuntimeOptions::install)
        .and_then(|rt| {
            // Every case writes only through temporaries: a stop removes them.
            sweep::util::signals::exit_on_stop()?;
            dispatch(cli.command, rt)
        });
    sweep::util::signals::yield_to_stop();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cmd: Cmd, rt: &RuntimeOptions) -> Result<()> {
    let root = std::env::current_dir().context("finding the working directory")?;
    match cmd {
        Cmd::Data {
            text,
            samples,
            only,
            repeats,
        } => data(data::DataBenchArgs {
            dataset: text.dataset.unwrap_or_else(|| data::default_dataset(&root)),
            tokenizer: text.tokenizer,
            seq_len: text.seq_len,
            samples,
            work_dir: root.join("results/bench/data"),
            plots: root.join("plots/bench"),
            only,
            repeats,
            scripts: sweep::layout::repository(&root, "scripts/python-loaders.py").join("scripts"),
        }),
        Cmd::Pretokenize {
            text,
            threads,
            repeats,
        } => pretokenize(text, threads, repeats, &root),
        Cmd::Report { runs, lines, dir } => {
            sweep::util::outputs::check_dir("--dir", &dir)?;
            report(runs, lines, dir)
        }
        Cmd::History { rows, dir } => {
            sweep::util::outputs::check_dir("--dir", &dir)?;
            history(rows, dir)
        }
        Cmd::Plan { runs, dir } => {
            sweep::util::outputs::check_dir("--dir", &dir)?;
            plan(runs, dir, rt)
        }
        Cmd::Local {
            runs,
            parallel,
            seconds,
            dir,
        } => {
            sweep::util::outputs::check_dir("--dir", &dir)?;
            local(runs, parallel, seconds, &dir)
        }
    }
}

/// The `sweep` binary built beside this one, which the local and pretokenize
/// cases run as a child.
fn sweep_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let sweep = exe.with_file_name("sweep");
    anyhow::ensure!(
        sweep.is_file(),
        "{} not found: build it (cargo build --release)",
        sweep.display()
    );
    Ok(sweep)
}

/// Runs `f` once and returns its result with the wall time it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// CPU time of this process so far: (user, kernel) seconds.
fn cpu_times() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
            (s(u.user_time()), s(u.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}

/// `sweep-bench report`: summarising a large synthetic sweep.
fn report(runs: usize, lines: usize, dir: PathBuf) -> Result<()> {
    // Each line is ~300 bytes on disk: 10 million of them are 3 GB.
    const MAX_LINES: usize = 10_000_000;
    if runs.saturating_mul(lines) > MAX_LINES {
        anyhow::bail!(
            "--runs × --lines is {runs} × {lines}, more than {MAX_LINES} log lines (~3 GB of logs): use fewer"
        );
    }
    sweep::util::fs::make_dir(&dir)?;
    let b = report::run(runs, lines, &dir)?;
    outln!(
        "report over {} runs x {} log lines ({} points; writing them took {:.1} s)",
        b.runs,
        b.lines,
        b.runs * b.lines,
        b.setup_s
    );
    outln!("  read + summarise + write tables  {:8.3} s", b.report_s);
    Ok(())
}

fn history(rows: usize, dir: PathBuf) -> Result<()> {
    sweep::util::fs::make_dir(&dir)?;
    let b = history::run(rows, &dir)?;
    outln!(
        "history of {} measurements ({} studies; writing them took {:.1} s)",
        b.rows,
        b.studies,
        b.setup_s
    );
    outln!(
        "  sweep history <study>     {:8.3} s  ({} attempts, as a table)",
        b.one_study_s,
        b.one_study_lines
    );
    outln!(
        "  sweep check --history     {:8.3} s  (20 configurations' last 5 attempts)",
        b.check_s
    );
    outln!(
        "  sweep history (all)       {:8.3} s  ({} attempts)",
        b.everything_s,
        b.everything_lines
    );
    Ok(())
}

/// `sweep-bench data`: the four loaders against the raw tokenizer.
fn data(args: data::DataBenchArgs) -> Result<()> {
    let b = data::run(&args)?;
    outln!(
        "data loading: {} samples of seq {} from {} (one consumer thread, no prefetch; best of {})",
        args.samples,
        args.seq_len,
        args.dataset.display(),
        args.repeats
    );
    outln!(
        "{:<26} {:>10} {:>14} {:>16} {:>8} {:>14} {:>10}",
        "loader",
        "load (s)",
        "us/sample",
        "raw tokenizer",
        "ratio",
        "python peer",
        "speedup"
    );
    for r in &b.rows {
        let (raw, ratio) = match r.raw_us_per_sample {
            Some(raw) => (
                format!("{raw:.1} us"),
                format!("{:.3}", r.us_per_sample / raw),
            ),
            None => ("-".into(), "-".into()),
        };
        let (python, speedup) = match r.python_us_per_sample {
            Some(p) => (format!("{p:.1} us"), format!("{:.0}x", p / r.us_per_sample)),
            None => ("-".into(), "-".into()),
        };
        outln!(
            "{:<26} {:>10.3} {:>14.2} {:>16} {:>8} {:>14} {:>10}",
            r.name,
            r.load_s,
            r.us_per_sample,
            raw,
            ratio,
            python,
            speedup
        );
    }
    if let Some(why) = &b.python_missing {
        outln!("python peer (scripts/python-loaders.py) not run: {why}");
    }
    outln!(
        "chart: {}",
        b.chart
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// `sweep-bench pretokenize`: pretokenization throughput and peak memory.
fn pretokenize(text: Text, threads: usize, repeats: usize, root: &Path) -> Result<()> {
    let Text {
        dataset,
        tokenizer,
        seq_len,
    } = text;
    let dataset = dataset.unwrap_or_else(|| data::default_dataset(root));
    let five = root.join("assets/data/corpus-5x.parquet");
    let rss_inputs: Vec<_> = [dataset.clone(), five]
        .into_iter()
        .filter(|p| p.exists())
        .collect();
    let b = pretokenize::run(&dataset, &tokenizer, seq_len, threads, repeats, &rss_inputs)?;
    outln!(
        "pretokenize {:.1} MB of text ({} documents, {} tokens) from {} on {} threads; best of {repeats}",
        b.mb,
        b.docs,
        b.tokens,
        dataset.display(),
        b.threads
    );
    outln!(
        "  raw encode_batch (texts in memory)  {:8.2} MB/s",
        b.raw_mb_s
    );
    for (name, mb_s) in &b.ours {
        outln!(
            "  sweep pretokenize --format {:<10} {:6.2} MB/s  ({:.0}% of raw)",
            name,
            mb_s,
            100.0 * mb_s / b.raw_mb_s
        );
    }
    for (input, mb, rss) in &b.rss {
        outln!(
            "  peak RSS {:8.0} MB on {} ({:.0} MB of Parquet)",
            rss,
            input.display(),
            mb
        );
    }
    Ok(())
}

/// `sweep-bench plan`: plan + render of a large sweep, phase by phase.
fn plan(runs: usize, dir: PathBuf, rt: &RuntimeOptions) -> Result<()> {
    sweep::util::fs::make_dir(&dir)?;
    let b = plan::run(runs, &dir, &sweep::plan::PlanOptions::new(false, rt))?;
    outln!(
        "plan + render of a {}-run sweep into {} ({} threads)",
        b.runs,
        dir.display(),
        rayon::current_num_threads()
    );
    outln!("  load + validate manifest  {:8.3} s", b.load_s);
    outln!("  expand into runs          {:8.3} s", b.plan_s);
    outln!("  render in memory          {:8.3} s", b.render_s);
    outln!(
        "  write run directories     {:8.3} s  ({} files; CPU {:.2} s user, {:.2} s kernel)",
        b.write_s,
        3 * b.runs,
        b.write_user_s,
        b.write_kernel_s
    );
    outln!(
        "  total plan + render       {:8.3} s",
        b.load_s + b.plan_s + b.render_s + b.write_s
    );
    outln!("  re-render (all unchanged) {:8.3} s", b.rerender_s);
    Ok(())
}

/// `sweep-bench local`: many short runs through the local executor.
fn local(runs: usize, parallel: usize, seconds: f64, dir: &Path) -> Result<()> {
    sweep::util::fs::make_dir(dir)?;
    let b = local::run(runs, parallel, seconds, dir)?;
    outln!(
        "{} command runs of {} s, {} at a time, through the local executor (`sweep submit`)",
        b.runs,
        b.seconds,
        b.parallel
    );
    outln!("  total        {:8.2} s", b.total_s);
    outln!(
        "  runs' floor  {:8.2} s  (⌈runs / parallel⌉ × seconds)",
        b.floor_s
    );
    outln!("  overhead     {:8.2} s", b.total_s - b.floor_s);
    Ok(())
}
