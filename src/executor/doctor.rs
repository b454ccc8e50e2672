//! The launch doctor (`sweep launch-doctor`): in the job script of a run
//! on several nodes, before any rank starts, it makes sure the ranks can
//! meet, and says where they cannot within a minute instead of a job that
//! hangs until its time limit: the tools the script calls exist; the master
//! is the allocation's first node by an address that is not a loopback one
//! (else SLURM's `NodeAddr`); the port, drawn from the job id above
//! `[slurm] master_port`, is free there; and one task per node reaches it
//! within [`CONNECT_TIMEOUT`]. It prints `export MASTER_ADDR=… MASTER_PORT=…`
//! for the script; on a failure it records the node and what failed in
//! `run.json` and exits [`LAUNCH_EXIT`] (docs/running.md).

use crate::config::LAUNCH_EXIT;
use crate::plan::record::{record_stop, Stop, StoppedBy};
use crate::util::slurm;
use crate::util::stdout::outln;
use anyhow::Result;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// How long a node has to connect to the master's port.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long all nodes have to answer (starting a task on each included).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(40);
/// Ports drawn from: `master_port` .. `master_port + PORT_RANGE`.
pub const PORT_RANGE: u32 = 2000;
/// Ports tried from the drawn one on, when it is busy.
const PORT_TRIES: u32 = 64;

pub struct Check {
    pub dir: PathBuf,
    pub job: String,
    pub base_port: u16,
    /// The run's nodes, from the allocation's first (a packed run's step);
    /// all of the allocation's when `None`.
    pub nodes: Option<usize>,
    /// Programs every node must have (the launcher).
    pub need: Vec<String>,
}

/// Why the ranks could not meet: the nodes to blame, and what failed.
#[derive(Debug, PartialEq)]
pub struct Failure {
    pub nodes: Vec<String>,
    pub reason: String,
}

fn fail(node: &str, reason: String) -> Failure {
    Failure {
        nodes: vec![node.to_string()],
        reason,
    }
}

/// Where the ranks meet.
pub struct Meeting {
    pub master: String,
    pub addr: IpAddr,
    pub port: u16,
    pub nodes: usize,
}

pub fn run(c: Check) -> Result<ExitCode> {
    let started = Instant::now();
    match diagnose(&c) {
        Ok(m) => {
            outln!("export MASTER_ADDR={} MASTER_PORT={}", m.addr, m.port);
            eprintln!(
                "sweep: launch doctor: {} nodes reach {} ({}) on port {} ({:.1} s)",
                m.nodes,
                m.master,
                m.addr,
                m.port,
                started.elapsed().as_secs_f64()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(f) => {
            eprintln!("sweep: launch doctor: {}", f.reason);
            let stop = Stop {
                by: StoppedBy::LaunchDoctor,
                reason: f.reason,
                ranks: Vec::new(),
                nodes: f.nodes,
                at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                quiet_s: None,
                limit_s: None,
            };
            if let Err(e) = record_stop(&c.dir, &c.job, stop) {
                eprintln!("sweep: launch doctor: could not record the failure: {e:#}");
            }
            Ok(ExitCode::from(LAUNCH_EXIT as u8))
        }
    }
}

fn diagnose(c: &Check) -> Result<Meeting, Failure> {
    let here = crate::util::process::host_name();
    for tool in ["scontrol", "srun"]
        .iter()
        .copied()
        .chain(c.need.iter().map(String::as_str))
    {
        if crate::util::process::find_in_path(tool).is_none() {
            return Err(fail(&here, format!("{here} has no `{tool}` on PATH (inside a container? without it the ranks cannot find each other)")));
        }
    }
    let mut nodes = job_nodes().map_err(|why| fail(&here, why))?;
    if let Some(k) = c.nodes {
        nodes.truncate(k);
    }
    let master = nodes[0].clone();
    let addr = master_address(&master)?;
    let job: u32 = std::env::var("SLURM_JOB_ID")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(0);
    let (listener, port) = listen(c.base_port, job).map_err(|why| fail(&master, why))?;
    reach_all(&nodes, &master, addr, port, c, listener)?;
    Ok(Meeting {
        master,
        addr,
        port,
        nodes: nodes.len(),
    })
}

/// The allocation's nodes, first the one this script runs on.
fn job_nodes() -> Result<Vec<String>, String> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .map_err(|_| "SLURM_JOB_NODELIST is not set: not inside a SLURM job".to_string())?;
    slurm::hostnames(&list)
}

/// The master's address, never a loopback one.
fn master_address(master: &str) -> Result<IpAddr, Failure> {
    slurm::node_address(master).map_err(|why| fail(master, why))
}

/// The port drawn from the job id, or the next free one after it, with a
/// listener on it.
pub fn listen(base: u16, job: u32) -> Result<(TcpListener, u16), String> {
    let span = PORT_RANGE.min(65535 - base as u32).max(1);
    let first = job % span;
    for k in 0..PORT_TRIES.min(span) {
        let port = (base as u32 + (first + k) % span) as u16;
        if let Ok(l) = TcpListener::bind(("0.0.0.0", port)) {
            return Ok((l, port));
        }
    }
    Err(format!(
        "no free port among {} from {} up (ports {base}–{})",
        PORT_TRIES.min(span),
        base as u32 + first,
        base as u32 + span - 1
    ))
}

/// One task per node connects to `addr:port` (the listener accepts on a
/// thread of its own); the first node that could not, or did not answer,
/// is the failure.
fn reach_all(
    nodes: &[String],
    master: &str,
    addr: IpAddr,
    port: u16,
    c: &Check,
    listener: TcpListener,
) -> Result<(), Failure> {
    listener.set_nonblocking(true).ok();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let accepting = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if listener.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        })
    };
    let answers = ask_nodes(nodes, addr, port, c);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = accepting.join();
    let (answers, srun_said) = answers.map_err(|why| fail(master, why))?;
    for node in nodes {
        match answers.iter().find(|(host, _)| host == node) {
            Some((_, Ok(()))) => {}
            Some((_, Err(why))) => return Err(fail(node, format!("{node} {why}"))),
            None => {
                return Err(fail(
                    node,
                    format!(
                        "{node} did not answer: no task of the check started there ({})",
                        srun_said.as_deref().unwrap_or("srun said nothing")
                    ),
                ))
            }
        }
    }
    Ok(())
}

type Answers = Vec<(String, Result<(), String>)>;

/// `srun` one task per node of `sweep launch-doctor --reach`; what each
/// node said, and srun's last error line.
fn ask_nodes(
    nodes: &[String],
    addr: IpAddr,
    port: u16,
    c: &Check,
) -> Result<(Answers, Option<String>), String> {
    let me = std::env::current_exe().map_err(|e| format!("finding the sweep binary: {e}"))?;
    let n = nodes.len().to_string();
    let mut cmd = Command::new("srun");
    cmd.args([
        "--nodes",
        &n,
        "--ntasks",
        &n,
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
    ]);
    if c.nodes.is_some() {
        cmd.arg("--relative=0");
    }
    cmd.arg(me)
        .args(["launch-doctor", "--reach"])
        .arg(SocketAddr::new(addr, port).to_string());
    for tool in &c.need {
        cmd.args(["--need", tool]);
    }
    let out = crate::util::process::output_within(&mut cmd, ANSWER_TIMEOUT, 1 << 20)
        .map_err(|e| format!("checking the nodes: {e:#}"))?;
    let answers = out.text.lines().filter_map(parse_answer).collect();
    let srun_said = out
        .text
        .lines()
        .rev()
        .find(|l| l.contains("error"))
        .map(|l| l.trim().chars().take(200).collect());
    let srun_said = match out.timed_out {
        true => Some(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs())),
        false => srun_said,
    };
    Ok((answers, srun_said))
}

/// `ok <host>` or `fail <host> <what it could not do>`.
fn parse_answer(line: &str) -> Option<(String, Result<(), String>)> {
    let mut parts = line.splitn(3, ' ');
    match (parts.next()?, parts.next()?) {
        ("ok", host) => Some((host.to_string(), Ok(()))),
        ("fail", host) => Some((
            host.to_string(),
            Err(parts.next().unwrap_or("").to_string()),
        )),
        _ => None,
    }
}

/// On each node (`--reach`): the tools it needs, then one connection to the
/// master's port; one answer line.
pub fn reach(target: &str, need: &[String]) -> anyhow::Result<ExitCode> {
    let host = crate::util::process::host_name();
    let answer = reach_answer(target, need);
    match answer {
        Ok(()) => outln!("ok {host}"),
        Err(why) => outln!("fail {host} {why}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn reach_answer(target: &str, need: &[String]) -> Result<(), String> {
    for tool in need {
        if crate::util::process::find_in_path(tool).is_none() {
            return Err(format!("has no `{tool}` on PATH"));
        }
    }
    let addr: SocketAddr = target
        .parse()
        .map_err(|_| format!("was given `{target}`, which is no address and port"))?;
    TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map(drop)
        .map_err(|e| {
            format!(
                "could not reach {target} in {} s ({e})",
                CONNECT_TIMEOUT.as_secs()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_comes_from_the_job_id_and_passes_over_a_busy_one() {
        // Below Linux's ephemeral ports, which other tests' connections take.
        let (first, port) = listen(20000, 1_000_007).unwrap();
        assert_eq!(port, 20000 + (1_000_007 % PORT_RANGE) as u16);
        // The same job again: its port is busy (held above), the next is taken.
        let (_second, next) = listen(20000, 1_000_007).unwrap();
        assert_eq!(next, port + 1);
        drop(first);
        // Another job draws another port.
        let (_, other) = listen(20000, 1_000_012).unwrap();
        assert_ne!(other, port);
        // At the top of the port space the range shrinks instead of overflowing.
        assert!(listen(65530, 123).is_ok());
    }

    #[test]
    fn each_node_answers_with_what_it_could_not_do() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = l.local_addr().unwrap().to_string();
        assert_eq!(reach_answer(&open, &[]), Ok(()));
        drop(l);
        let closed = reach_answer(&open, &[]).unwrap_err();
        assert!(
            closed.starts_with(&format!("could not reach {open} in 10 s")),
            "{closed}"
        );
        let missing = reach_answer(&open, &["no-such-launcher-here".into()]).unwrap_err();
        assert_eq!(missing, "has no `no-such-launcher-here` on PATH");
        assert_eq!(
            parse_answer("fail node2 could not reach 10.0.0.1:29512 in 10 s (refused)"),
            Some((
                "node2".into(),
                Err("could not reach 10.0.0.1:29512 in 10 s (refused)".into())
            ))
        );
        assert_eq!(parse_answer("ok node1"), Some(("node1".into(), Ok(()))));
        assert_eq!(parse_answer("srun: warning"), None);
    }
}
