//! `sweep bench ...`: run a benchmark and print its figures.

use super::BenchCmd;
use anyhow::Result;
use std::process::ExitCode;

pub fn run(cmd: BenchCmd) -> Result<ExitCode> {
    match cmd {
        BenchCmd::Plan { runs, dir } => {
            std::fs::create_dir_all(&dir)?;
            let b = crate::bench::plan::run(runs, &dir)?;
            println!(
                "plan + render of a {}-run sweep into {} ({} threads)",
                b.runs,
                dir.display(),
                rayon::current_num_threads()
            );
            println!("  load + validate manifest  {:8.3} s", b.load_s);
            println!("  expand into runs          {:8.3} s", b.plan_s);
            println!("  render in memory          {:8.3} s", b.render_s);
            println!(
                "  write run directories     {:8.3} s  ({} files; CPU {:.2} s user, {:.2} s kernel)",
                b.write_s,
                3 * b.runs,
                b.write_user_s,
                b.write_kernel_s
            );
            println!(
                "  total plan + render       {:8.3} s  (goal < 2 s)",
                b.load_s + b.plan_s + b.render_s + b.write_s
            );
            println!("  re-render (all unchanged) {:8.3} s", b.rerender_s);
        }
    }
    Ok(ExitCode::SUCCESS)
}
