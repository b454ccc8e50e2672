//! What SLURM says about an allocation's nodes (names, and the address another node reaches
//! each by) and the cluster's limits; its queries without the user's own defaults.

use std::net::{IpAddr, ToSocketAddrs};
use std::process::Command;

/// A SLURM command without the user's `SQUEUE_*`, `SINFO_*`, `SCANCEL_*` defaults (a
/// profile's partition filter would hide a study's jobs).
pub fn query(tool: &str) -> Command {
    let prefix = format!("{}_", tool.to_ascii_uppercase());
    let mut cmd = Command::new(tool);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with(&prefix)) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// The program reading an option: an `#SBATCH` line's sbatch, or the run's `srun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Sbatch,
    Srun,
}

/// Whether an option takes a value: next word or glued (`-t 10`, `-t10`), only glued
/// (`-K1`, `--exclusive=user`), or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    Required,
    Optional,
    No,
}

use Takes::{No, Optional, Required};

/// Which program has a one-letter option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Of {
    Both,
    Sbatch,
    Srun,
}

/// sbatch's and srun's one-letter options (22.05's man pages): their long names, values, and
/// whose (`-W` is both's, meaning different things).
const SHORT: [(char, &str, Takes, Of); 44] = [
    ('A', "account", Required, Of::Both),
    ('B', "extra-node-info", Required, Of::Both),
    ('b', "begin", Required, Of::Both),
    ('C', "constraint", Required, Of::Both),
    ('c', "cpus-per-task", Required, Of::Both),
    ('D', "chdir", Required, Of::Both),
    ('d', "dependency", Required, Of::Both),
    ('e', "error", Required, Of::Both),
    ('G', "gpus", Required, Of::Both),
    ('H', "hold", No, Of::Both),
    ('h', "help", No, Of::Both),
    ('i', "input", Required, Of::Both),
    ('J', "job-name", Required, Of::Both),
    ('k', "no-kill", Optional, Of::Both),
    ('L', "licenses", Required, Of::Both),
    ('M', "clusters", Required, Of::Both),
    ('m', "distribution", Required, Of::Both),
    ('N', "nodes", Required, Of::Both),
    ('n', "ntasks", Required, Of::Both),
    ('O', "overcommit", No, Of::Both),
    ('o', "output", Required, Of::Both),
    ('p', "partition", Required, Of::Both),
    ('Q', "quiet", No, Of::Both),
    ('q', "qos", Required, Of::Both),
    ('S', "core-spec", Required, Of::Both),
    ('s', "oversubscribe", No, Of::Both),
    ('t', "time", Required, Of::Both),
    ('V', "version", No, Of::Both),
    ('v', "verbose", No, Of::Both),
    ('w', "nodelist", Required, Of::Both),
    ('x', "exclude", Required, Of::Both),
    ('a', "array", Required, Of::Sbatch),
    ('F', "nodefile", Required, Of::Sbatch),
    ('W', "wait", No, Of::Sbatch),
    ('E', "preserve-env", No, Of::Srun),
    ('I', "immediate", Optional, Of::Srun),
    ('K', "kill-on-bad-exit", Optional, Of::Srun),
    ('l', "label", No, Of::Srun),
    ('r', "relative", Required, Of::Srun),
    ('T', "threads", Required, Of::Srun),
    ('u', "unbuffered", No, Of::Srun),
    ('W', "wait", Required, Of::Srun),
    ('X', "disable-status", No, Of::Srun),
    ('Z', "no-allocate", No, Of::Srun),
];

/// Long options taking no value in the next word: a word after one is the next option or the
/// program.
const LONG_WITHOUT_VALUE: [&str; 19] = [
    "contiguous",
    "exclusive",
    "exact",
    "get-user-env",
    "ignore-pmi",
    "multi-prog",
    "no-requeue",
    "overlap",
    "parsable",
    "pty",
    "reboot",
    "requeue",
    "send-libs",
    "spread-job",
    "test-only",
    "usage",
    "use-min-nodes",
    "whole",
    "x11",
];

/// `tool`'s one-letter options: each letter, its long name and what it takes.
fn short_options(tool: Tool) -> impl Iterator<Item = (char, &'static str, Takes)> {
    SHORT.into_iter().filter_map(move |(c, long, takes, of)| {
        let its = matches!(
            (of, tool),
            (Of::Both, _) | (Of::Sbatch, Tool::Sbatch) | (Of::Srun, Tool::Srun)
        );
        its.then_some((c, long, takes))
    })
}

/// Whether `name` is a whole long option name of `tool`'s, not the start of a longer one.
pub fn is_long_option(tool: Tool, name: &str) -> bool {
    short_options(tool).any(|(_, long, _)| long == name)
}

/// The long name of every option `text` gives `tool`, read as getopt reads them: values glued
/// or in the next word, clusters of one-letter options whose last may take the rest (`-lN2`
/// sets `nodes`). Abbreviations are the caller's; options end at the first word that is none.
/// `Err`: no shell words (an open quote), or a one-letter option `tool` lacks.
pub fn options(tool: Tool, text: &str) -> Result<Vec<String>, String> {
    let words = shlex::split(text)
        .ok_or_else(|| format!("`{text}` cannot be read as words (an open quote)"))?;
    read(tool, &words).map(|r| r.names)
}

/// The index of the first word `tool` takes for no option or value: its program, or `--`.
pub fn first_operand(tool: Tool, words: &[String]) -> Option<usize> {
    read(tool, words).ok()?.operand
}

struct Read {
    names: Vec<String>,
    operand: Option<usize>,
}

fn read(tool: Tool, words: &[String]) -> Result<Read, String> {
    let mut names = Vec::new();
    let mut words = words.iter().enumerate().peekable();
    while let Some((i, word)) = words.next() {
        let value_next = if let Some(long) = word.strip_prefix("--") {
            let (name, glued) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            if name.is_empty() {
                // `--`: what follows is the program's.
                return Ok(Read {
                    names,
                    operand: Some(i),
                });
            }
            names.push(name.to_string());
            let flag = LONG_WITHOUT_VALUE.contains(&name)
                || short_options(tool).any(|(_, l, t)| l == name && t != Required);
            !glued && !flag
        } else if let Some(cluster) = word
            .strip_prefix('-')
            .filter(|c| c.starts_with(|c: char| c.is_ascii_alphabetic()))
        {
            let mut value_next = false;
            for (at, letter) in cluster.char_indices() {
                let Some((_, long, takes)) = short_options(tool).find(|(c, ..)| *c == letter)
                else {
                    return Err(format!(
                        "`-{letter}` (in `{word}`) is no option of {}",
                        name(tool)
                    ));
                };
                names.push(long.to_string());
                if takes != No {
                    // The rest of the word is its value.
                    value_next = takes == Required && at + 1 == cluster.len();
                    break;
                }
            }
            value_next
        } else if word.starts_with('-') && word.len() > 1 {
            false // a negative number: an option's value
        } else {
            return Ok(Read {
                names,
                operand: Some(i),
            });
        };
        // A value that looks like an option is read as one: never a miss.
        if value_next && words.peek().is_some_and(|(_, w)| !w.starts_with('-')) {
            words.next();
        }
    }
    Ok(Read {
        names,
        operand: None,
    })
}

fn name(tool: Tool) -> &'static str {
    match tool {
        Tool::Sbatch => "sbatch",
        Tool::Srun => "srun",
    }
}

/// SLURM's own default MaxArraySize: an array's indices run below it.
pub const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;

/// The most tasks a job array may have here (`MaxArraySize`, else SLURM's default).
pub fn max_array_size() -> usize {
    Command::new("scontrol")
        .args(["show", "config"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| parse_max_array_size(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or(DEFAULT_MAX_ARRAY_SIZE)
}

/// `MaxArraySize = N` of `scontrol show config`'s output, where N > 0.
fn parse_max_array_size(config: &str) -> Option<usize> {
    config.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key.trim() == "MaxArraySize")
            .then(|| value.trim().parse().ok())
            .flatten()
            .filter(|&n: &usize| n > 0)
    })
}

/// The nodes of a SLURM node list (`node[1-2]`), in its order.
pub fn hostnames(list: &str) -> Result<Vec<String>, String> {
    let out = Command::new("scontrol")
        .args(["show", "hostnames", list])
        .output()
        .map_err(|e| format!("scontrol show hostnames failed: {e}"))?;
    let nodes: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if !out.status.success() || nodes.is_empty() {
        return Err(format!(
            "scontrol show hostnames {list} named no node: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(nodes)
}

/// The address other nodes reach `node` by, never a loopback: its name's, else SLURM's
/// `NodeAddr` (images often map a node's name to 127.0.1.1).
pub fn node_address(node: &str) -> Result<IpAddr, String> {
    let resolved: Vec<IpAddr> = (node, 0)
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default();
    if let Some(ip) = usable(&resolved) {
        return Ok(ip);
    }
    let node_addr = Command::new("scontrol")
        .args(["show", "node", node])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find_map(|f| f.strip_prefix("NodeAddr="))
                .map(str::to_string)
        });
    let from_slurm: Vec<IpAddr> = node_addr
        .as_deref()
        .and_then(|a| (a, 0).to_socket_addrs().ok())
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default();
    usable(&from_slurm).ok_or_else(|| {
        let seen: Vec<String> = resolved.iter().chain(&from_slurm).map(|a| a.to_string()).collect();
        format!(
            "{node}, the master, resolves only to {} (a loopback address, or none): the other nodes could not reach it; fix its /etc/hosts or SLURM's NodeAddr",
            if seen.is_empty() { "nothing".to_string() } else { seen.join(", ") }
        )
    })
}

/// The first IPv4 address that is not a loopback one, else such an IPv6 one.
fn usable(addrs: &[IpAddr]) -> Option<IpAddr> {
    let ok = |a: &&IpAddr| !a.is_loopback() && !a.is_unspecified();
    addrs
        .iter()
        .filter(ok)
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.iter().find(ok))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_of_an_entry_is_read_as_getopt_reads_it() {
        let read = |tool, text| options(tool, text).unwrap();
        assert_eq!(
            read(Tool::Sbatch, "-vo /x/%j.out --time=5"),
            ["verbose", "output", "time"]
        );
        assert_eq!(
            read(Tool::Sbatch, "--comment x -t5 -J y"),
            ["comment", "time", "job-name"]
        );
        // `-W` waits in sbatch, takes seconds in srun (`-W5 -l`: no label lost).
        assert_eq!(read(Tool::Sbatch, "-vW"), ["verbose", "wait"]);
        assert_eq!(read(Tool::Srun, "-W 5 -l"), ["wait", "label"]);
        assert_eq!(
            read(Tool::Srun, "-lN2 -lo/x"),
            ["label", "nodes", "label", "output"]
        );
        // An optional value only glued on: the next word is an option again.
        assert_eq!(read(Tool::Srun, "-K -n4"), ["kill-on-bad-exit", "ntasks"]);
        assert_eq!(
            read(Tool::Sbatch, "--exclusive --array=1"),
            ["exclusive", "array"]
        );
        // Quoted values, negative numbers and `--` are no options.
        assert_eq!(
            read(Tool::Sbatch, "--comment='-t 5' --nice -5"),
            ["comment", "nice"]
        );
        assert_eq!(read(Tool::Srun, "--label -- -n 4"), ["label"]);
        // Where the options end: srun would run that word as its program.
        let words = |ws: &[&str]| ws.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(
            first_operand(Tool::Srun, &words(&["--mpi", "pmi2", "-l"])),
            None
        );
        assert_eq!(
            first_operand(Tool::Srun, &words(&["-l", "hostname"])),
            Some(1)
        );
        assert_eq!(
            first_operand(Tool::Srun, &words(&["--label", "--", "-n4"])),
            Some(1)
        );
        assert!(options(Tool::Srun, "-Y")
            .unwrap_err()
            .contains("no option of srun"));
        assert!(options(Tool::Sbatch, "--comment='x")
            .unwrap_err()
            .contains("open quote"));
    }

    #[test]
    fn a_loopback_address_is_never_the_masters() {
        let lo: IpAddr = "127.0.1.1".parse().unwrap();
        let v6lo: IpAddr = "::1".parse().unwrap();
        let real: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(usable(&[lo, v6lo]), None);
        assert_eq!(usable(&[lo, real]), Some(real));
    }

    #[test]
    fn max_array_size_is_read_from_the_clusters_config() {
        let config = "Configuration data as of 2026-11-29T00:00:00\nMaxArraySize            = 5\nMaxJobCount             = 10000\n";
        assert_eq!(parse_max_array_size(config), Some(5));
        assert_eq!(parse_max_array_size("MaxArraySize = 0\n"), None);
        assert_eq!(parse_max_array_size("MaxJobCount = 10\n"), None);
    }
}
