//! The `sweep` command line: options are parsed once into typed structs here
//! and handed to the module that does the work.

mod args;
mod bench_cmds;
mod data_cmds;
mod live;
mod report_cmds;
mod run_cmd;
mod sweep_cmds;

pub use args::*;
use clap::Parser;
use report_cmds::{check_cmd, compare_cmd, history_cmd, report_cmd};
use std::process::ExitCode;

use crate::config::RuntimeOptions;
use crate::manifest::Diagnostics;
use crate::util::stdout::outln;

/// What clap has to say instead of a command: help or version on stdout
/// (exit 0), a usage error on stderr (exit 2); unlike clap's own `exit`, a
/// write that fails is an error (a closed pipe ends it quietly).
pub fn said_by_clap(e: &clap::Error) -> ExitCode {
    use std::io::Write;
    let code = ExitCode::from(e.exit_code().clamp(0, 255) as u8);
    let written = e.print().and_then(|()| std::io::stdout().flush());
    match written {
        Err(w) if !e.use_stderr() && w.kind() != std::io::ErrorKind::BrokenPipe => {
            let _ = writeln!(std::io::stderr(), "error: writing to standard output: {w}");
            ExitCode::FAILURE
        }
        _ => code,
    }
}

pub fn main() -> ExitCode {
    // A fault in any command (a rank's, above all) says where on stderr.
    crate::util::crash::install();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return said_by_clap(&e),
    };
    if !matches!(
        cli.command,
        Cmd::Train { .. } | Cmd::Bench(BenchCmd::DdpRank { .. })
    ) {
        // A closed pipe (`sweep plan … | head -1`) ends the program quietly,
        // as it ends any Unix filter: Rust ignores SIGPIPE, which turns the
        // closed pipe into a panic at the next `outln!`. Training processes
        // keep ignoring it (their sockets and MPI's report their own errors).
        // SAFETY: restoring a signal's default disposition at start-up,
        // before any thread is spawned.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let rt = match RuntimeOptions::from_env() {
        Ok(rt) => rt.install(),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // `-C DIR` as `git -C DIR`: sweep starts in DIR, so the manifest
    // argument, every relative path in it, `results/` and a command's
    // working directory are all the project root's.
    if let Some(dir) = &cli.root {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!("error: -C {}: {e}", dir.display());
            return ExitCode::FAILURE;
        }
    }
    let root = match std::env::current_dir() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot find the working directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Commands that write only through temporaries stop at once on Ctrl-C
    // or SIGTERM, their temporaries removed; the rest (run, submit, train,
    // cancel, and the watchdog, which waits for its launcher to end) stop
    // their jobs or checkpoint first, each its own way.
    let stops_at_once = !matches!(
        cli.command,
        Cmd::Run(_)
            | Cmd::Submit(_)
            | Cmd::Train { .. }
            | Cmd::Cancel { .. }
            | Cmd::Watchdog(_)
            | Cmd::Bench(BenchCmd::DdpRank { .. })
    );
    if stops_at_once {
        if let Err(e) = crate::util::signals::exit_on_stop() {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let outcome = dispatch(cli.command, &root, rt);
    crate::util::signals::yield_to_stop();
    match outcome {
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

fn dispatch(cmd: Cmd, root: &std::path::Path, rt: &RuntimeOptions) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Plan {
            manifest,
            json,
            allow_oom,
        } => sweep_cmds::plan(root, &manifest, json, allow_oom, rt),
        Cmd::Render {
            manifest,
            allow_oom,
            replace_changed,
        } => sweep_cmds::render(root, &manifest, allow_oom, replace_changed, rt),
        Cmd::Submit(args) => sweep_cmds::submit(root, &args, rt),
        Cmd::Run(args) => run_cmd::run(root, &args, rt),
        Cmd::Status { manifest, json } => sweep_cmds::status(root, &manifest, json, rt),
        Cmd::Cancel { manifest } => sweep_cmds::cancel(root, &manifest, rt),
        Cmd::Bench(b) => {
            keep_freed_memory();
            bench_cmds::run(b, root, rt)
        }
        Cmd::Pretokenize(p) => data_cmds::pretokenize(&p, rt),
        Cmd::Train { config } => {
            keep_freed_memory();
            crate::train::run(&config, rt)
        }
        Cmd::Report(r) => report_cmd(root, r, rt),
        Cmd::Check(c) => Ok(check_cmd(root, &c, rt).unwrap_or_else(|e| {
            crate::util::signals::yield_to_stop();
            // 2, not 1: a CI job tells "could not check" from "regressed".
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        })),
        Cmd::History(h) => history_cmd(root, &h, rt),
        Cmd::Watchdog(w) => watchdog_cmd(w),
        Cmd::LaunchDoctor(d) => match (d.reach, d.dir) {
            (Some(target), _) => crate::executor::doctor::reach(&target, &d.need),
            (None, dir) => crate::executor::doctor::run(crate::executor::doctor::Check {
                dir: dir.expect("clap requires --dir without --reach"),
                job: d.job,
                base_port: d.port,
                nodes: d.nodes,
                need: d.need,
            }),
        },
        Cmd::Fingerprint { dir, end: true } => {
            crate::executor::fingerprint::write_end(&dir)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Fingerprint { dir, end: false } => {
            let f = crate::executor::fingerprint::write(&dir)?;
            outln!(
                "sweep: environment of {} on {} ({} GPUs) in {}",
                f.system,
                f.host,
                f.gpus.len(),
                dir.join(crate::layout::ENVIRONMENT_JSON).display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Compare {
            a,
            b,
            skip_first,
            threshold,
            no_plots,
        } => compare_cmd(root, &a, &b, skip_first, threshold, !no_plots, rt),
        Cmd::Data(d) => data_cmds::run(d),
    }
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (mimalloc.h).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Training never hands freed memory back to the OS: each step allocates
/// the same large buffers again, and purged pages come back as zeroed page
/// faults (docs/performance.md); streaming commands keep mimalloc's default.
pub fn keep_freed_memory() {
    // SAFETY: setting an option is thread-safe and valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

fn watchdog_cmd(w: args::WatchdogCli) -> anyhow::Result<ExitCode> {
    use crate::executor::watchdog;
    if let Some(token) = &w.probe {
        let procs = watchdog::probe(token);
        for p in &procs {
            outln!("{}", serde_json::to_string(p)?);
        }
        watchdog::ask_for_stacks(&procs);
        return Ok(ExitCode::SUCCESS);
    }
    let startup = match w.startup.as_str() {
        "off" => None,
        s => Some(crate::manifest::parse_watch_duration(s)?),
    };
    let pattern = w
        .pattern
        .as_deref()
        .map(|p| crate::util::text::regex(p).map_err(|e| anyhow::anyhow!("--pattern: {e}")))
        .transpose()?;
    watchdog::run(watchdog::WatchOptions {
        dir: w.dir,
        job: w.job,
        stall: crate::manifest::Stall::parse(&w.stall)?,
        startup,
        pattern,
        argv: w.argv,
    })
}
