//! Running external programs (git, sbatch, squeue, ...) with errors that say what ran.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// This machine's host name (empty when the kernel does not say).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// The CPU's model name: `/proc/cpuinfo`'s on x86-64, `lscpu`'s on aarch64 ("Neoverse-V2");
/// found once per process.
pub fn cpu_model() -> Option<String> {
    static MODEL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    MODEL.get_or_init(find_cpu_model).clone()
}

fn find_cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let named = |text: &str, key: &str| {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let name = line.split_once(':')?.1.trim();
        (!name.is_empty() && name != "-").then(|| name.to_string())
    };
    named(&info, "model name").or_else(|| {
        let out = Command::new("lscpu").env("LC_ALL", "C").output().ok()?;
        named(&String::from_utf8_lossy(&out.stdout), "Model name")
    })
}

/// Runs a command and returns its stdout; a non-zero exit is an error with its line and stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("could not run {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The process groups of the programs a command waits for: what a stop signal stops first.
static CHILDREN: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn children() -> std::sync::MutexGuard<'static, Vec<i32>> {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `cmd` in its own process group, which a stop signal to sweep stops too; call
/// [`forget_child`] once it has ended.
pub fn spawn_stoppable(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let mut list = children();
    let child = cmd.process_group(0).spawn()?;
    list.push(child.id() as i32);
    Ok(child)
}

/// A child started by [`spawn_stoppable`] has ended.
pub fn forget_child(pid: u32) {
    children().retain(|&p| p != pid as i32);
}

/// [`std::process::Command::output`] in a group a stop signal to sweep stops too.
pub fn output_stoppable(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    let child = spawn_stoppable(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))?;
    let pid = child.id();
    let out = child.wait_with_output();
    forget_child(pid);
    out
}

/// SIGTERM to every running child's process group (the process is about to exit).
pub fn stop_children() {
    let list = children();
    for &pid in list.iter() {
        // SAFETY: a signal to a process group this process made.
        unsafe { libc::kill(-pid, libc::SIGTERM) };
    }
    std::mem::forget(list);
}

/// A "Name:   1234 kB" field of a /proc file, in kB; None when absent.
pub fn proc_kb(file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The commit of the checkout holding `dir` (`-dirty` with changes); None without one or git.
pub fn git_commit(dir: &Path) -> Option<String> {
    let head = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()?;
    if !head.status.success() {
        return None;
    }
    let mut commit = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let dirty = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        commit.push_str("-dirty");
    }
    Some(commit)
}

/// The first executable called `name` on PATH.
pub fn find_in_path(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Whether one process may read another's memory (`process_vm_readv` on a forked child); Yama's
/// scope other than 0 counts as no (MPI's ranks are siblings).
pub fn cross_memory_attach() -> bool {
    if std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").is_ok_and(|s| s.trim() != "0")
    {
        return false;
    }
    static PROBE: u64 = 0x5eed_c0de_cafe_f00d;
    let mut read = 0u64;
    // SAFETY: the child calls only async-signal-safe functions (pause, _exit), as a child forked
    // from a threaded process must; the iovecs point at 8 live bytes each.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return false;
        }
        if pid == 0 {
            libc::pause();
            libc::_exit(0);
        }
        let local = libc::iovec {
            iov_base: std::ptr::addr_of_mut!(read).cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: std::ptr::addr_of!(PROBE).cast_mut().cast(),
            iov_len: 8,
        };
        let n = libc::process_vm_readv(pid, &local, 1, &remote, 1, 0);
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        n == 8 && read == PROBE
    }
}

/// The fields of `/proc/<pid>/stat` after the command name (state first).
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// The live processes of process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            stat_fields(pid).is_some_and(|f| {
                live(&f) && f.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid)
            })
        })
        .collect()
}

/// What [`stop_group`] stopped, and whether SIGTERM was not enough.
pub struct Stopped {
    pub pids: Vec<u32>,
    pub killed: bool,
}

/// Stops process group `pgid`: SIGTERM, SIGKILL 2 s later. `None` when empty (one call).
pub fn stop_group(pgid: u32) -> Option<Stopped> {
    use nix::sys::signal::{killpg, Signal};
    let group = nix::unistd::Pid::from_raw(pgid as i32);
    killpg(group, None).ok()?;
    let pids = group_members(pgid);
    if pids.is_empty() {
        return None;
    }
    let _ = killpg(group, Signal::SIGTERM);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !group_members(pgid).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = !group_members(pgid).is_empty();
    if killed {
        let _ = killpg(group, Signal::SIGKILL);
    }
    Some(Stopped { pids, killed })
}

/// Present and not a zombie.
pub fn alive(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| live(&f))
}

/// A process's [`stat_fields`] say it runs: not a zombie, not dead.
fn live(fields: &[String]) -> bool {
    fields
        .first()
        .is_some_and(|state| state != "Z" && state != "X")
}

/// When a process started, in clock ticks after boot (field 22 of its stat).
pub fn process_start(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// `pid` is alive and is the process that started at `start` (when known).
pub fn same_process(pid: u32, start: Option<u64>) -> bool {
    alive(pid) && start.is_none_or(|t| process_start(pid) == Some(t))
}

#[cfg(test)]
mod tests {
    use super::proc_kb;

    #[test]
    fn proc_fields_read_in_kb() {
        let rss = proc_kb("/proc/self/status", "VmRSS").unwrap();
        let peak = proc_kb("/proc/self/status", "VmHWM").unwrap();
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
        assert!(proc_kb("/proc/meminfo", "MemAvailable").is_some());
        // A field is matched whole: "VmRSS" is not "VmRS".
        assert_eq!(proc_kb("/proc/self/status", "VmRS"), None);
        assert_eq!(proc_kb("/proc/no-such-file", "VmRSS"), None);
    }
}

/// What a program printed before it exited or was stopped at `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded {
    /// stdout then stderr, at most `max_bytes` of each, lossy UTF-8.
    pub text: String,
    /// The exit code; `None` when a signal (or the time limit) ended it.
    pub code: Option<i32>,
    pub timed_out: bool,
}

/// Runs `cmd` (in a process group of its own, so that a shell's children go
/// with it) for at most `limit`, keeping at most `max_bytes` of its stdout
/// and of its stderr: a probe of the environment never hangs or floods the
/// job that runs it.
pub fn output_within(
    cmd: &mut Command,
    limit: std::time::Duration,
    max_bytes: usize,
) -> Result<Bounded> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("could not run {shown}"))?;
    // Read in threads: a full pipe would stop the child before it exits.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            if let Some(mut p) = pipe {
                let mut buf = [0u8; 8192];
                while let Ok(n @ 1..) = p.read(&mut buf) {
                    let room = max_bytes.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
            kept
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + limit;
    let (status, timed_out) = loop {
        if let Some(s) = child.try_wait()? {
            break (s, false);
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: signalling the process group this function created.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            break (child.wait()?, true);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    // Whatever it left running in its group (`cmd &`) would hold the pipes
    // open: it goes too.
    // SAFETY: signalling the process group this function created.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let mut text = String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned();
    let err = err.join().unwrap_or_default();
    if !err.is_empty() {
        text.push_str(&String::from_utf8_lossy(&err));
    }
    Ok(Bounded {
        text,
        code: status.code(),
        timed_out,
    })
}
