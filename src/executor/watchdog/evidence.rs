//! What the watchdog gathers before stopping a run, while every process is as it hung: each
//! rank's last report, the run's processes on every node (state, wait channel, stacks: the
//! trainer's on SIGUSR2, Python's by `py-spy dump`), the job log's last lines. Other nodes are
//! asked by `srun --overlap` running `sweep watchdog --probe`.

use super::progress::Progress;
use super::Limit;
use crate::util::heartbeat::{self, Beat};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long another node has to answer, and the most it may say.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE_BYTES: usize = 16 << 20;
/// How long the trainer's ranks have to write their stacks.
const STACKS_WAIT: Duration = Duration::from_secs(3);
const LOG_LINES: usize = 30;

pub struct Evidence {
    /// One line for the run's state.
    pub reason: String,
    pub ranks: Vec<usize>,
    pub nodes: Vec<String>,
    /// All of it, for `watchdog.log`.
    pub text: String,
}

/// One process of the run, as its node saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proc {
    pub host: String,
    pub pid: u32,
    /// Its rank, where its environment names one.
    pub rank: Option<usize>,
    /// `/proc/<pid>/stat`'s state: R, S, D, T (stopped), Z…
    pub state: String,
    /// The kernel function it sleeps in.
    pub wchan: String,
    pub command: String,
    /// A stack dump, where one could be had here (`py-spy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
}

impl Proc {
    /// Stopped or in uninterruptible sleep: a process that cannot go on by itself.
    fn stuck(&self) -> bool {
        matches!(self.state.as_str(), "T" | "t" | "D")
    }
}

/// `quiet`: how long the run had made no progress when the limit ran out.
pub fn gather(
    run_dir: &Path,
    token: &str,
    p: &Progress,
    limit: Limit,
    quiet: Duration,
    running: Duration,
) -> Evidence {
    let procs = processes(run_dir, token);
    let beats = p.beats();
    if beats.is_some() {
        ask_for_stacks(&procs);
    }
    let (ranks, nodes, who) = blame(&procs, beats.as_ref());
    let what = match limit {
        Limit::Startup(s) => format!(
            "no progress {} after it started (startup limit {s} s)",
            match &beats {
                Some(_) => "report from every rank",
                None => "line",
            }
        ),
        Limit::Stall(s) => format!(
            "no progress for {:.0} s (stall limit {s} s) after {}",
            quiet.as_secs_f64(),
            p.so_far().unwrap_or_else(|| "its first record".into())
        ),
    };
    let reason = format!("{what}; {who}");
    let mut text = String::new();
    let _ = writeln!(
        text,
        "sweep watchdog: {} HUNG at {} after {:.0} s: {reason}\n",
        run_dir.display(),
        crate::util::now_rfc3339(),
        running.as_secs_f64()
    );
    if let Some((beats, world)) = &beats {
        write_beats(&mut text, beats, *world);
        write_stacks(&mut text, run_dir, beats);
    }
    if let Some(line) = p.last_line() {
        let _ = writeln!(text, "## The last progress line\n{line}\n");
    }
    write_procs(&mut text, &procs);
    if let Some(log) = p.log() {
        write_log_tail(&mut text, log);
    }
    Evidence {
        reason,
        ranks,
        nodes,
        text,
    }
}

/// The ranks that stopped first and their nodes, in words: stuck processes' ranks; else the
/// trainer's ranks with the oldest report; else the nodes with the run's processes.
fn blame(
    procs: &[Proc],
    beats: Option<&(Vec<Beat>, Option<usize>)>,
) -> (Vec<usize>, Vec<String>, String) {
    let stuck: Vec<&Proc> = procs.iter().filter(|p| p.stuck()).collect();
    let mut ranks: Vec<usize>;
    let mut nodes: Vec<String>;
    let who;
    if !stuck.is_empty() {
        ranks = stuck.iter().filter_map(|p| p.rank).collect();
        nodes = stuck.iter().map(|p| p.host.clone()).collect();
        who = stuck
            .iter()
            .map(|p| {
                let rank = p.rank.map(|r| format!("rank {r} ")).unwrap_or_default();
                format!(
                    "{rank}on {} is {} ({}, pid {})",
                    p.host,
                    state_words(&p.state),
                    program_name(&p.command),
                    p.pid
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
    } else if let Some((beats, world)) = beats.filter(|(b, w)| !b.is_empty() || w.is_some()) {
        let world = world.unwrap_or(beats.len());
        let missing: Vec<usize> = (0..world)
            .filter(|r| !beats.iter().any(|b| b.rank == *r))
            .collect();
        if !missing.is_empty() {
            ranks = missing;
            nodes = Vec::new();
            who = format!(
                "rank{} {} never reported",
                if ranks.len() > 1 { "s" } else { "" },
                list(&ranks)
            );
        } else {
            let oldest = beats
                .iter()
                .map(|b| (b.step, b.at_ms))
                .min()
                .unwrap_or_default();
            let first: Vec<&Beat> = beats.iter().filter(|b| b.step == oldest.0).collect();
            ranks = first.iter().map(|b| b.rank).collect();
            nodes = first.iter().map(|b| b.host.clone()).collect();
            who = if first.len() == beats.len() && beats.len() > 1 {
                format!(
                    "every rank stopped after step {} (on {})",
                    oldest.0,
                    list_str(&nodes)
                )
            } else {
                first
                    .iter()
                    .map(|b| {
                        format!(
                            "rank {} on {} stopped first, after step {}",
                            b.rank, b.host, b.step
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
        }
    } else {
        ranks = Vec::new();
        nodes = procs.iter().map(|p| p.host.clone()).collect();
        who = match nodes.is_empty() {
            true => "no process of the run was found".into(),
            false => format!(
                "its processes on {} still run",
                list_str(&dedup(nodes.clone()))
            ),
        };
    }
    ranks.sort_unstable();
    ranks.dedup();
    nodes = dedup(nodes);
    (ranks, nodes, who)
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_str(v: &[String]) -> String {
    v.join(", ")
}

/// The program's file name, without its directory.
fn program_name(command: &str) -> &str {
    let program = command.split_whitespace().next().unwrap_or("");
    program.rsplit('/').next().unwrap_or(program)
}

fn state_words(state: &str) -> &'static str {
    match state {
        "T" => "stopped (SIGSTOP)",
        "t" => "stopped by a debugger",
        "D" => "in uninterruptible sleep (waiting on a device or a file system)",
        "R" => "running",
        "S" => "sleeping",
        "Z" => "a zombie",
        _ => "in an unknown state",
    }
}

/// The run's processes on every node: this one directly, the others through `srun`.
fn processes(run_dir: &Path, token: &str) -> Vec<Proc> {
    let mut procs = probe(token);
    let here = crate::util::process::host_name();
    let others: Vec<String> = job_nodes().into_iter().filter(|n| *n != here).collect();
    if !others.is_empty() {
        procs.extend(probe_nodes(run_dir, token, &others));
    }
    procs.sort_by(|a, b| (&a.host, a.pid).cmp(&(&b.host, b.pid)));
    procs.dedup_by(|a, b| a.host == b.host && a.pid == b.pid);
    procs
}

/// The nodes of this SLURM job (none outside one).
fn job_nodes() -> Vec<String> {
    let Ok(list) = std::env::var("SLURM_JOB_NODELIST") else {
        return Vec::new();
    };
    Command::new("scontrol")
        .args(["show", "hostnames", &list])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `sweep watchdog --probe` on each of `nodes` beside the run's step; a silent node is named.
fn probe_nodes(run_dir: &Path, token: &str, nodes: &[String]) -> Vec<Proc> {
    let Ok(job) = std::env::var("SLURM_JOB_ID") else {
        return Vec::new();
    };
    let Ok(me) = std::env::current_exe() else {
        return Vec::new();
    };
    let n = nodes.len().to_string();
    let mut srun = Command::new("srun");
    srun.args(["--overlap", "--jobid", &job, "--nodes", &n, "--ntasks", &n])
        .args(["--ntasks-per-node=1", "--kill-on-bad-exit=0", "--nodelist"])
        .arg(nodes.join(","))
        .arg(me)
        .args(["watchdog", "--probe", token, "--dir"])
        .arg(run_dir);
    let out = match crate::util::process::output_within(&mut srun, PROBE_TIMEOUT, PROBE_BYTES) {
        Ok(out) => out,
        Err(e) => {
            eprintln!(
                "sweep watchdog: could not look at {}: {e:#}",
                nodes.join(", ")
            );
            return Vec::new();
        }
    };
    // srun's own lines (stderr) are no process: they do not parse.
    let procs: Vec<Proc> = out
        .text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for node in nodes {
        if !procs.iter().any(|p| &p.host == node) {
            eprintln!(
                "sweep watchdog: {node} showed no process of the run (or did not answer in {} s)",
                PROBE_TIMEOUT.as_secs()
            );
        }
    }
    procs
}

/// The processes here whose environment carries `token` (every process of the run).
fn carrying(token: &str) -> Vec<(u32, Vec<u8>)> {
    let needle = format!("{}={token}", heartbeat::ENV);
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let carries = environ.split(|&b| b == 0).any(|v| v == needle.as_bytes());
            (pid != me && carries).then_some((pid, environ))
        })
        .collect()
}

/// The pids of this machine's processes of the watchdog `token`'s run.
pub fn probe_pids(token: &str) -> Vec<u32> {
    carrying(token).into_iter().map(|(pid, _)| pid).collect()
}

/// This node's processes of `token`'s run, with `py-spy` stacks where it can: what `sweep
/// watchdog --probe` prints, a JSON line each.
pub fn probe(token: &str) -> Vec<Proc> {
    let host = crate::util::process::host_name();
    let mut procs = Vec::new();
    for (pid, environ) in carrying(token) {
        let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
        let text = |key: &str| {
            let prefix = format!("{key}=");
            vars.iter()
                .find_map(|v| v.strip_prefix(prefix.as_bytes()))
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        let rank = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|k| text(k)?.parse::<usize>().ok());
        // The node SLURM started it on: a test cluster of namespaces shares one process table.
        let host = text("SLURMD_NODENAME").map_or_else(|| host.clone(), str::to_string);
        let read =
            |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
        let state = crate::util::process::stat_fields(pid)
            .and_then(|f| f.into_iter().next())
            .unwrap_or_else(|| "?".to_string());
        let command: String = read("cmdline")
            .replace(|c: char| c == '\0' || c.is_control(), " ")
            .trim()
            .chars()
            .take(200)
            .collect();
        let mut p = Proc {
            host,
            pid,
            rank,
            state,
            wchan: read("wchan"),
            command,
            stack: None,
        };
        p.stack = python_stack(&p);
        procs.push(p);
    }
    procs.sort_by_key(|p| p.pid);
    procs
}

/// `py-spy dump` of a running Python process, where py-spy is installed.
fn python_stack(p: &Proc) -> Option<String> {
    let program = p.command.split_whitespace().next()?;
    let python = Path::new(program)
        .file_name()?
        .to_str()?
        .starts_with("python");
    if !python || p.stuck() {
        return None;
    }
    let spy = crate::util::process::find_in_path("py-spy")?;
    let out = Command::new("timeout")
        .args([
            "10",
            &spy.display().to_string(),
            "dump",
            "--pid",
            &p.pid.to_string(),
        ])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (!text.trim().is_empty()).then_some(text)
}

/// SIGUSR2 to the trainer's ranks on this node, then a short wait for their stacks.
pub fn ask_for_stacks(procs: &[Proc]) {
    let here = crate::util::process::host_name();
    let mut asked = false;
    for p in procs
        .iter()
        .filter(|p| p.host == here && is_trainer(p) && !p.stuck())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p.pid as i32),
            nix::sys::signal::Signal::SIGUSR2,
        );
        asked = true;
    }
    if asked {
        std::thread::sleep(STACKS_WAIT);
    }
}

fn is_trainer(p: &Proc) -> bool {
    let mut words = p.command.split_whitespace();
    let program = words.next().unwrap_or("");
    program.ends_with("sweep") && words.next() == Some("train")
}

fn write_beats(text: &mut String, beats: &[Beat], world: Option<usize>) {
    let now = heartbeat::now_ms();
    let _ = writeln!(
        text,
        "## Each rank's last report ({} of {} ranks reported)",
        beats.len(),
        world.map_or("?".to_string(), |w| w.to_string())
    );
    for b in beats {
        let _ = writeln!(
            text,
            "rank {:>4}  host {:<24} pid {:>8}  step {:>8}  {:.1} s ago",
            b.rank,
            b.host,
            b.pid,
            b.step,
            now.saturating_sub(b.at_ms) as f64 / 1000.0
        );
    }
    text.push('\n');
}

fn write_stacks(text: &mut String, run_dir: &Path, beats: &[Beat]) {
    for b in beats {
        let path = heartbeat::stacks_path(run_dir, b.rank);
        if let Ok(bytes) = crate::util::fs::read_regular(&path, 4 << 20, None) {
            let _ = writeln!(
                text,
                "## Stacks of rank {} ({} pid {})",
                b.rank, b.host, b.pid
            );
            text.push_str(&String::from_utf8_lossy(&bytes));
            text.push('\n');
        }
    }
}

fn write_procs(text: &mut String, procs: &[Proc]) {
    let _ = writeln!(text, "## The run's processes");
    for p in procs {
        let rank = p.rank.map_or("-".to_string(), |r| r.to_string());
        let _ = writeln!(
            text,
            "{:<24} pid {:>8}  rank {:>4}  state {} ({})  waits in {}  {}",
            p.host,
            p.pid,
            rank,
            p.state,
            state_words(&p.state),
            if p.wchan.is_empty() || p.wchan == "0" {
                "-"
            } else {
                &p.wchan
            },
            p.command
        );
        if let Some(stack) = &p.stack {
            let _ = writeln!(text, "  py-spy dump:\n{stack}");
        }
    }
    text.push('\n');
}

fn write_log_tail(text: &mut String, log: &Path) {
    let Ok(bytes) = crate::util::fs::read_tail(log, 64 << 10) else {
        return;
    };
    let tail = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = tail.lines().collect();
    let _ = writeln!(text, "## The last lines of {}", log.display());
    for l in &lines[lines.len().saturating_sub(LOG_LINES)..] {
        let _ = writeln!(text, "{l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(host: &str, rank: Option<usize>, state: &str) -> Proc {
        Proc {
            host: host.into(),
            pid: 7,
            rank,
            state: state.into(),
            wchan: String::new(),
            command: "/x/sweep train --config c".into(),
            stack: None,
        }
    }

    fn beat(rank: usize, step: u64, host: &str) -> Beat {
        Beat {
            rank,
            step,
            at_ms: 0,
            host: host.into(),
            pid: 1,
        }
    }

    #[test]
    fn a_stopped_process_is_named_first_with_its_rank_and_node() {
        let procs = [proc("node1", Some(0), "R"), proc("node2", Some(1), "T")];
        let beats = (vec![beat(0, 4, "node1"), beat(1, 4, "node2")], Some(2));
        let (ranks, nodes, who) = blame(&procs, Some(&beats));
        assert_eq!((ranks, nodes), (vec![1], vec!["node2".to_string()]));
        assert!(
            who.contains("rank 1 on node2 is stopped (SIGSTOP)"),
            "{who}"
        );
    }

    #[test]
    fn else_the_rank_with_the_oldest_report_or_none_at_all() {
        let procs = [proc("node1", Some(0), "S"), proc("node2", Some(1), "S")];
        let beats = (vec![beat(0, 9, "node1"), beat(1, 7, "node2")], Some(2));
        let (ranks, nodes, who) = blame(&procs, Some(&beats));
        assert_eq!((ranks, nodes), (vec![1], vec!["node2".to_string()]));
        assert!(
            who.contains("rank 1 on node2 stopped first, after step 7"),
            "{who}"
        );

        let beats = (vec![beat(0, 0, "node1")], Some(3));
        let (ranks, _, who) = blame(&procs, Some(&beats));
        assert_eq!(ranks, vec![1, 2]);
        assert!(who.contains("ranks 1, 2 never reported"), "{who}");

        let beats = (vec![beat(0, 5, "a"), beat(1, 5, "b")], Some(2));
        let (_, nodes, who) = blame(&procs, Some(&beats));
        assert_eq!(nodes, vec!["a".to_string(), "b".to_string()]);
        assert!(who.contains("every rank stopped after step 5"), "{who}");
    }

    #[test]
    fn a_command_names_the_nodes_its_processes_run_on() {
        let procs = [proc("node1", None, "S"), proc("node1", Some(0), "S")];
        let (ranks, nodes, who) = blame(&procs, None);
        assert!(ranks.is_empty());
        assert_eq!(nodes, vec!["node1".to_string()]);
        assert!(who.contains("its processes on node1 still run"), "{who}");
    }

    #[test]
    fn this_nodes_processes_are_found_by_the_token_they_inherit() {
        let token = format!("test-{}", std::process::id());
        let mut child = Command::new("sleep")
            .arg("30")
            .env(heartbeat::ENV, &token)
            .spawn()
            .unwrap();
        // Its environment is the test's until it has exec'd `sleep`.
        let asked = std::time::Instant::now();
        let mut found = probe(&token);
        while found.is_empty() && asked.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            found = probe(&token);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, child.id());
        assert!(found[0].command.starts_with("sleep 30"), "{found:?}");
        assert!(probe("no-such-token").is_empty());
    }
}
