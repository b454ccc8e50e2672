//! What SLURM says about an allocation's nodes — their names and the
//! address another node reaches each by (the launch doctor's master; where
//! the ranks of a step meet once out of `MPI_Init`) — and about the
//! cluster's limits (how large a job array may be); its queries without
//! the user's own defaults for them.

use std::net::{IpAddr, ToSocketAddrs};
use std::process::Command;

/// A SLURM command (`squeue`, `sinfo`, `sacct`, `scancel`) without the
/// user's own defaults for it: an `SQUEUE_PARTITION`, `SQUEUE_ACCOUNT` or
/// `SINFO_PARTITION` in a login profile filters what it lists (a study's jobs
/// in another partition would read as gone, their runs as ended), an
/// `SCANCEL_PARTITION` what it cancels, `SCANCEL_INTERACTIVE` asks about
/// each job.
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

/// sbatch's one-letter options and the long ones they stand for.
const SHORT_OPTIONS: [(char, &str); 17] = [
    ('A', "account"),
    ('a', "array"),
    ('C', "constraint"),
    ('c', "cpus-per-task"),
    ('d', "dependency"),
    ('e', "error"),
    ('G', "gpus"),
    ('h', "help"),
    ('J', "job-name"),
    ('N', "nodes"),
    ('n', "ntasks"),
    ('o', "output"),
    ('p', "partition"),
    ('q', "qos"),
    ('t', "time"),
    ('V', "version"),
    ('W', "wait"),
];

/// Whether `name` is the whole name of one of sbatch's long options that
/// [`SHORT_OPTIONS`] knows, rather than the start of a longer one
/// (`gpus` against `gpus-per-node`).
pub fn is_long_option(name: &str) -> bool {
    SHORT_OPTIONS.iter().any(|(_, long)| *long == name)
}

/// The long name of the sbatch option an `#SBATCH` line's text (after
/// `#SBATCH`) starts with, however it is written: `--time=10`, `--time 10`,
/// `-t 10` and `-t10` are all `time`. `None` for text that is no option,
/// or a one-letter option not among [`SHORT_OPTIONS`]. A long name is as
/// written: sbatch's reading of an abbreviation (`--part`) is the caller's.
pub fn sbatch_option(text: &str) -> Option<&str> {
    let rest = text.trim_start().strip_prefix('-')?;
    match rest.strip_prefix('-') {
        Some(long) => long
            .split(['=', ' ', '\t'])
            .next()
            .filter(|n| !n.is_empty()),
        None => {
            let letter = rest.chars().next()?;
            SHORT_OPTIONS
                .iter()
                .find(|(c, _)| *c == letter)
                .map(|(_, long)| *long)
        }
    }
}

/// SLURM's own default MaxArraySize: an array's indices run below it.
pub const DEFAULT_MAX_ARRAY_SIZE: usize = 1001;

/// The most tasks one job array may have on this cluster (its
/// `MaxArraySize`; SLURM's default where `scontrol show config` cannot say).
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

/// The address other nodes reach `node` by, never a loopback one: its
/// name's, else SLURM's `NodeAddr` for it (a name that resolves to
/// 127.0.1.1 on its own node, as many images write `/etc/hosts`).
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
