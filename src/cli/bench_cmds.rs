//! `sweep bench ...`: run a benchmark and print its figures.

use super::{BenchCmd, DdpBenchCli, GemmsBenchCli, KernelsBenchCli, TrainBenchCli};
use crate::bench::ddp::DdpRow;
use crate::config::{DeviceKind, RuntimeOptions};
use crate::util::stdout::outln;
use anyhow::Result;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use strum::VariantArray;

pub fn run(cmd: BenchCmd, root: &Path, rt: &RuntimeOptions) -> Result<ExitCode> {
    check_outputs(&cmd)?;
    match cmd {
        BenchCmd::Train(t) => train(&t, rt, root)?,
        BenchCmd::Peak => peak()?,
        BenchCmd::Kernels(k) => return kernels(&k, rt),
        BenchCmd::Gemms(g) => gemms(&g, rt)?,
        BenchCmd::MaxBatch {
            config,
            memory_limit,
            steps,
            max,
        } => max_batch(config, memory_limit, steps, max)?,
        BenchCmd::Ddp(d) => ddp(&d, root)?,
        BenchCmd::DdpRank { work } => crate::bench::ddp::rank(&serde_json::from_str(&work)?, rt)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `sweep bench train`: train-step throughput of the CPU presets, or of the
/// reference's models on a GPU.
/// `sweep bench train`; `(layers, gpu)`: the 8B-shaped GPU model's layers
/// and the accelerator's name for the peak-FLOPs table.
fn train(args: &TrainBenchCli, rt: &RuntimeOptions, root: &Path) -> Result<()> {
    let TrainBenchCli {
        threads,
        steps,
        only,
        batch,
        parts,
        device,
        layers,
        gpu,
        recompute,
        json,
    } = args.clone();
    if device == DeviceKind::Cuda && !crate::config::Features::BUILT.cuda {
        anyhow::bail!(
            "`--device cuda` needs a GPU build of sweep (scripts/build-gpu.sh; docs/gpu.md)"
        );
    }
    let mut human = human_out(json.as_deref());
    let threads = crate::train::init_threads(threads, rt);
    let cases = match device {
        DeviceKind::Cpu => crate::bench::train::default_cases(),
        DeviceKind::Cuda => crate::bench::train::gpu_cases(layers),
    };
    let cases = cases
        .into_iter()
        .filter(|c| {
            only.as_deref()
                .is_none_or(|o| format!("{} {}", c.label, c.precision()).contains(o))
                && batch.is_none_or(|b| c.batch == b)
        })
        .collect::<Vec<_>>();
    if cases.is_empty() {
        anyhow::bail!("no case of `sweep bench train` matches `--only` and `--batch`");
    }
    let settings = crate::bench::train::Settings {
        steps,
        threads,
        gpu,
        recompute,
        parts,
    };
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for outcome in crate::bench::train::run(
        cases,
        &settings,
        &crate::layout::repository(root, crate::config::DEFAULT_TOKENIZER)
            .join(crate::config::DEFAULT_TOKENIZER),
        rt,
    ) {
        match outcome {
            Ok(row) => rows.push(row),
            Err(f) => failed.push(f),
        }
    }
    let on = match (device, rows.first()) {
        (DeviceKind::Cuda, Some(r)) => r.device_name.clone(),
        _ => format!("{threads} CPU thread(s)"),
    };
    let recomputing = match recompute {
        crate::config::Recompute::None => "",
        crate::config::Recompute::Blocks => ", recomputing blocks",
    };
    writeln!(
        human,
        "train step on {on}, {steps} timed steps after 2 warm-up steps{recomputing}"
    )?;
    train_table(&mut *human, &rows, &failed)?;
    parts_table(&mut *human, &rows)?;
    if let Some(path) = json {
        use crate::bench::train::JsonRow;
        let all: Vec<JsonRow> = rows
            .iter()
            .map(|r| JsonRow::timed(r, &on))
            .chain(failed.iter().map(|f| JsonRow::failed(f, &on)))
            .collect();
        write_json(&path, &serde_json::to_vec_pretty(&all)?)?;
    }
    if rows.is_empty() && !failed.is_empty() {
        anyhow::bail!("no case could be timed");
    }
    Ok(())
}

/// With `--parts`: each case's recorded step by pass and op, the largest
/// parts first, each with its share of the step.
fn parts_table(out: &mut dyn Write, rows: &[crate::bench::train::TrainRow]) -> Result<()> {
    for r in rows {
        let Some(parts) = &r.parts else { continue };
        let step: f64 = parts.iter().map(|p| p.seconds).sum();
        writeln!(
            out,
            "\n{} {} b{}: one more step, {:.1} ms, by part",
            r.case.label,
            r.case.precision(),
            r.case.batch,
            step * 1e3
        )?;
        let mut parts = parts.clone();
        parts.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        for p in parts {
            writeln!(
                out,
                "  {:<10} {:<10} {:>10.2} ms {:>6.1}%",
                p.pass.name(),
                p.op.name(),
                p.seconds * 1e3,
                100.0 * p.seconds / step.max(f64::MIN_POSITIVE)
            )?;
        }
    }
    Ok(())
}

/// The timed cases of `sweep bench train`, one line each, and the failed.
fn train_table(
    out: &mut dyn Write,
    rows: &[crate::bench::train::TrainRow],
    failed: &[Box<crate::bench::train::Failed>],
) -> Result<()> {
    writeln!(
        out,
        "{:<24} {:<10} {:>5} {:>9} {:>11} {:>10} {:>10} {:>7} {:>9} {:>10}  forward / backward / optimizer",
        "model", "precision", "batch", "params", "MFLOP/tok", "tokens/s", "TFLOP/s", "MFU", "s/step", "peak MB",
    )?;
    for r in rows {
        let step = r.forward_s + r.backward_s + r.optimizer_s;
        writeln!(
            out,
            "{:<24} {:<10} {:>5} {:>8.1}M {:>11.1} {:>10.0} {:>10.3} {:>6.1}% {:>9.3} {:>10.0}  {:.0}% / {:.0}% / {:.0}%",
            r.case.label,
            r.case.precision(),
            r.case.batch,
            r.params as f64 / 1e6,
            r.flops_per_token / 1e6,
            r.tokens_per_s,
            r.gflops / 1e3,
            crate::estimate::mfu_pct(r.gflops, r.peak_gflops),
            step,
            r.peak_memory_mb,
            100.0 * r.forward_s / step,
            100.0 * r.backward_s / step,
            100.0 * r.optimizer_s / step
        )?;
    }
    for f in failed {
        writeln!(
            out,
            "{:<24} {:<10} {:>5}  failed: {:#}",
            f.case.label,
            f.case.precision(),
            f.case.batch,
            f.error
        )?;
    }
    Ok(())
}

/// `sweep bench max-batch`: the largest batch that trains, and tokens/s at
/// every size tried.
fn max_batch(
    config: PathBuf,
    memory_limit: Option<String>,
    steps: usize,
    max: usize,
) -> Result<()> {
    use crate::train::run::max_batch::{parse_size, run, Outcome, SearchOptions, MB};
    let opts = SearchOptions {
        config,
        memory_limit: memory_limit.as_deref().map(parse_size).transpose()?,
        steps,
        max,
    };
    let s = run(&opts)?;
    let budget = s.limit.map_or_else(
        || "until the device runs out".into(),
        |l| format!("under {:.0} MB", l as f64 / MB),
    );
    outln!("batch sizes tried ({budget}), {steps} steps each:");
    outln!(
        "{:>6} {:>12} {:>10} {:>12}  outcome",
        "batch",
        "tokens/s",
        "peak MB",
        "estimate MB"
    );
    for t in &s.trials {
        let est = t
            .estimate_mb
            .map_or_else(|| "-".into(), |e| format!("{e:.0}"));
        match &t.outcome {
            Outcome::Trains {
                tokens_per_s,
                peak_mb,
            } => outln!(
                "{:>6} {tokens_per_s:>12.0} {peak_mb:>10.0} {est:>12}  trains",
                t.batch
            ),
            Outcome::OutOfMemory(why) => {
                outln!(
                    "{:>6} {:>12} {:>10} {est:>12}  out of memory: {why}",
                    t.batch,
                    "-",
                    "-"
                )
            }
        }
    }
    match s.largest {
        Some(b) => outln!("largest batch size that trains: {b}"),
        None => anyhow::bail!("not even batch size 1 trains within the budget"),
    }
    Ok(())
}

/// `sweep bench peak`: matmul peak of this CPU (what CPU MFU is measured against).
/// `sweep bench kernels`: fails when a kernel is outside its tolerance.
fn kernels(k: &KernelsBenchCli, rt: &RuntimeOptions) -> Result<ExitCode> {
    let gpu = k.device == DeviceKind::Cuda;
    let work = &crate::bench::kernels::KernelWork {
        device: k.device,
        model: k
            .model
            .clone()
            .unwrap_or_else(|| if gpu { "ref-1b" } else { "small" }.into()),
        tokens: k.tokens.unwrap_or(if gpu { 16_384 } else { 2048 }),
        seq_len: k.seq_len,
        repeats: k.repeats,
        vocab: k.vocab,
    };
    let json = k.json.clone();
    if work.device == DeviceKind::Cuda && !crate::config::Features::BUILT.cuda {
        anyhow::bail!(
            "`--device cuda` needs a GPU build of sweep (scripts/build-gpu.sh; docs/gpu.md)"
        );
    }
    let mut human = human_out(json.as_deref());
    let report = crate::bench::kernels::run(work, rt)?;
    write!(human, "{}", crate::bench::kernels::table(&report))?;
    if let Some(path) = json {
        write_json(&path, &serde_json::to_vec_pretty(&report)?)?;
        if path != Path::new("-") {
            writeln!(human, "wrote {}", path.display())?;
        }
    }
    let wrong: Vec<_> = report.rows.iter().filter(|r| !r.ok).collect();
    if !wrong.is_empty() {
        for r in &wrong {
            eprintln!(
                "sweep bench kernels: {} ({}, {}) is off by {:.2e} relative (tolerance {:.0e})",
                r.op, r.shape, r.dtype, r.max_rel_err, r.tolerance
            );
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `sweep bench gemms`: a step's matrix products, timed alone.
fn gemms(g: &GemmsBenchCli, rt: &RuntimeOptions) -> Result<()> {
    let gpu = g.device == DeviceKind::Cuda;
    if gpu && !crate::config::Features::BUILT.cuda {
        anyhow::bail!(
            "`--device cuda` needs a GPU build of sweep (scripts/build-gpu.sh; docs/gpu.md)"
        );
    }
    let work = crate::bench::gemms::GemmWork {
        model: g
            .model
            .clone()
            .unwrap_or_else(|| if gpu { "ref-1b" } else { "small" }.into()),
        batch: g.batch.unwrap_or(if gpu { 8 } else { 2 }),
        seq_len: g.seq_len.unwrap_or(if gpu { 2048 } else { 256 }),
        repeats: g.repeats,
    };
    let (device, name) = match g.device {
        DeviceKind::Cpu => (candle_core::Device::Cpu, "cpu".to_string()),
        DeviceKind::Cuda => {
            let d = crate::train::network::device::cuda(0, rt.cuda_pool)?;
            let name = crate::train::network::device::name(&d)?;
            (d, name)
        }
    };
    let mut human = human_out(g.json.as_deref());
    let report = crate::bench::gemms::run(&work, &device, &name)?;
    write!(human, "{}", crate::bench::gemms::table(&report))?;
    if let Some(path) = &g.json {
        write_json(path, &serde_json::to_vec_pretty(&report)?)?;
        if path != Path::new("-") {
            writeln!(human, "wrote {}", path.display())?;
        }
    }
    Ok(())
}

fn peak() -> Result<()> {
    let cores = crate::config::runtime::cores();
    use crate::train::network::ops::linear::bf16_gemm::Bf16Kernel;
    use crate::train::run::peak::{refresh, Kernel};
    let bf16 = Bf16Kernel::VARIANTS
        .iter()
        .copied()
        .filter(|k| k.available());
    let kernels: Vec<Kernel> = [Kernel::F32]
        .into_iter()
        .chain(bf16.map(Kernel::Bf16))
        .collect();
    outln!("matmul peak (best of 256/512/1024 square products), cached for MFU:");
    for kernel in kernels {
        for threads in 1..=cores {
            // candle reads the variable (as the trainer sets it); the
            // measurement runs on a pool of `threads`.
            std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
            let p = refresh(kernel, threads)?;
            outln!(
                "  {:<32} {threads} thread(s): {:8.1} GFLOP/s",
                kernel.describe(),
                p / 1e9
            );
        }
    }
    Ok(())
}

/// `sweep bench ddp`: weak scaling from the first world size to the others,
/// over `repeats` rounds of every world size in turn (medians; each round's
/// efficiency against its own base, so a drifting machine moves both alike),
/// each beside the plan's forecast for it where the link is given.
fn ddp(d: &DdpBenchCli, root: &Path) -> Result<()> {
    use crate::bench::ddp::{DdpWork, Launch, Links};
    let work = &DdpWork {
        model: d.model.clone(),
        batch: d.batch,
        seq: d.seq_len,
        steps: d.steps,
        threads: d.threads,
        device: d.device,
        root: crate::layout::repository(root, crate::config::DEFAULT_TOKENIZER),
        zero: 0,
    };
    let launch = d.nodes.map_or(Launch::Local, Launch::Nodes);
    let links = Links {
        intra_node_gbps: d.intra_node_gbps,
        inter_node_gbps: d.inter_node_gbps,
    };
    let (ranks, engine_at_one, repeats, json) = (
        d.ranks.as_slice(),
        d.engine_at_one,
        d.repeats as usize,
        d.json.as_deref(),
    );
    // Each round: every world size plain, then sharded at each stage asked.
    let sharded: Vec<usize> = ranks.iter().copied().filter(|&n| n > 1).collect();
    let round = || -> Result<Vec<DdpRow>> {
        let mut rows = crate::bench::ddp::run(work, ranks, engine_at_one, launch)?;
        for &zero in &d.zero {
            let w = DdpWork {
                zero,
                ..work.clone()
            };
            rows.extend(crate::bench::ddp::run(&w, &sharded, false, launch)?);
        }
        Ok(rows)
    };
    let rounds = (0..repeats).map(|_| round()).collect::<Result<Vec<_>>>()?;
    let Some(base) = rounds.first().and_then(|r| r.first()) else {
        return Ok(());
    };
    let mut out = human_out(json);
    let placed = match launch {
        Launch::Local => "this machine (mpirun)".to_string(),
        Launch::Nodes(n) => format!("{n} SLURM node(s) (srun)"),
    };
    writeln!(
        out,
        "data parallelism: {} ({:.1}M parameters), batch {} x {} tokens per rank, {} thread(s) per rank, {} timed steps{}; engine {}; ranks on {placed}",
        work.model,
        base.parameters as f64 / 1e6,
        work.batch,
        work.seq,
        work.threads,
        work.steps,
        if repeats > 1 { format!(", median of {repeats} rounds") } else { String::new() },
        rounds[0].last().map_or("-", |r| r.engine.as_str()),
    )?;
    writeln!(
        out,
        "{:>10} {:>16} {:>14} {:>9} {:>12} {:>10}",
        "ranks", "tokens/s/rank", "tokens/s all", "s/step", "all-reduce", "efficiency"
    )?;
    let rows = ddp_rows(&mut out, work, &rounds, launch, links, repeats)?;
    if let Some(path) = json {
        let doc = serde_json::json!({
            "work": work,
            "nodes": match launch { Launch::Local => None, Launch::Nodes(n) => Some(n) },
            "intra_node_gbps": links.intra_node_gbps,
            "inter_node_gbps": links.inter_node_gbps,
            "parameters": base.parameters,
            "engine": rounds[0].last().map(|r| r.engine.clone()),
            "rows": rows,
            "rounds": rounds,
        });
        write_json(path, &serde_json::to_vec_pretty(&doc)?)?;
    }
    Ok(())
}

/// Each world size's row of `sweep bench ddp`, printed and as JSON: the
/// medians over the rounds, each round's figures, and the forecast.
fn ddp_rows(
    out: &mut dyn Write,
    work: &crate::bench::ddp::DdpWork,
    rounds: &[Vec<DdpRow>],
    launch: crate::bench::ddp::Launch,
    links: crate::bench::ddp::Links,
    repeats: usize,
) -> Result<Vec<serde_json::Value>> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        (v[(n - 1) / 2] + v[n / 2]) / 2.0
    };
    // The forecasts' compute: the base at its median step, the same compute
    // every round's row is compared with.
    let base = &rounds[0][0];
    let mut base_median = base.clone();
    base_median.step_s = median(rounds.iter().map(|round| round[0].step_s).collect());
    let mut rows = Vec::new();
    for (i, r) in rounds[0].iter().enumerate() {
        // This row's figure in every round, given the row and its round's base.
        let each = |f: &dyn Fn(&DdpRow, &DdpRow) -> f64| -> Vec<f64> {
            rounds.iter().map(|round| f(&round[i], &round[0])).collect()
        };
        let efficiency = each(&|r, base| r.tokens_per_s_per_rank / base.tokens_per_s_per_rank);
        let share = each(&|r, _| r.comm_s / r.step_s);
        let per_rank = median(each(&|r, _| r.tokens_per_s_per_rank));
        let step_s = median(each(&|r, _| r.step_s));
        let forecast = crate::bench::ddp::forecast(work, &base_median, r, launch, links)?;
        let rounds_note = if repeats > 1 && i > 0 {
            let each: Vec<String> = efficiency
                .iter()
                .zip(&share)
                .map(|(e, s)| format!("{:.1}/{:.1}", 100.0 * e, 100.0 * s))
                .collect();
            format!("   rounds (efficiency/all-reduce %): {}", each.join(", "))
        } else {
            String::new()
        };
        let forecast_note = forecast.map_or_else(String::new, |f| {
            format!(
                "   forecast: {:.1}% all-reduce, {:.1}% efficiency",
                100.0 * f.exposed_s / (f.compute_s + f.exposed_s),
                f.efficiency_pct
            )
        });
        let row = serde_json::json!({
            "ranks": r.ranks,
            "label": r.label(),
            "ranks_per_node": launch.ranks_per_node(r.ranks),
            "tokens_per_s_per_rank": per_rank,
            "step_s": step_s,
            "comm_s": median(each(&|r, _| r.comm_s)),
            "comm_share_pct": 100.0 * median(share.clone()),
            "efficiency_pct": 100.0 * median(efficiency.clone()),
            "forecast": forecast,
        });
        writeln!(
            out,
            "{:>10} {:>16.0} {:>14.0} {:>9.3} {:>11.1}% {:>9.1}%{rounds_note}{forecast_note}",
            r.label(),
            per_rank,
            per_rank * r.ranks as f64,
            step_s,
            100.0 * median(share),
            100.0 * median(efficiency),
        )?;
        rows.push(row);
    }
    Ok(rows)
}

/// Where a benchmark writes (`--json FILE`, `--dir`), checked before it
/// runs, against the rule every output follows: a long benchmark never
/// ends in "cannot write", nor writes over a file sweep owns.
fn check_outputs(cmd: &BenchCmd) -> Result<()> {
    use crate::util::outputs::{self, Output};
    match cmd {
        BenchCmd::Train(TrainBenchCli { json: Some(p), .. })
        | BenchCmd::Ddp(DdpBenchCli { json: Some(p), .. })
        | BenchCmd::Kernels(KernelsBenchCli { json: Some(p), .. })
        | BenchCmd::Gemms(GemmsBenchCli { json: Some(p), .. })
            if p != Path::new("-") =>
        {
            outputs::check(&[Output::new("--json", p)], &[], outputs::Allow::default())?
        }
        _ => {}
    }
    Ok(())
}

/// Where a benchmark's table goes: standard output, or standard error when
/// its JSON takes standard output (`--json -`).
fn human_out(json: Option<&Path>) -> Box<dyn std::io::Write> {
    match json {
        Some(p) if p == Path::new("-") => Box::new(std::io::stderr()),
        _ => Box::new(std::io::stdout()),
    }
}

/// A benchmark's JSON: to standard output for `-`, else to a regular file
/// (or a new path), never over a device or other special file.
fn write_json(path: &Path, bytes: &[u8]) -> Result<()> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        out.write_all(b"\n")?;
        return Ok(out.flush()?);
    }
    crate::util::outputs::write("--json", path, bytes, &[])
}
