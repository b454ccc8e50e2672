//! Every thread's stack on request: on [`REQUEST`] (SIGUSR2) a rank writes
//! the stacks of all its threads into `progress/rank-<r>.stacks`, where its
//! run's watchdog gathers them before it stops a run that hangs.
//!
//! A thread's stack can only be walked from that thread, so a thread of
//! its own waits for the request, then asks each thread in turn with a
//! second signal ([`capture_signal`]) whose handler walks its own stack into
//! a fixed buffer (no allocation, no lock: `backtrace`'s unsynchronized
//! trace, as sampling profilers do), and names the frames afterwards,
//! outside any handler. A thread that does not answer in time (blocked with
//! signals masked, or the whole process stopped) is listed with its state.

use crate::util::heartbeat;
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The signal that asks a rank for its stacks.
pub const REQUEST: i32 = libc::SIGUSR2;

const MAX_FRAMES: usize = 48;
static FRAMES: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static DEPTH: AtomicUsize = AtomicUsize::new(0);
/// The thread asked now (0: none); its handler answers by setting [`ANSWERED`].
static WANTED: AtomicI32 = AtomicI32::new(0);
static ANSWERED: AtomicI32 = AtomicI32::new(0);

/// A real-time signal, above those the C library keeps for itself.
fn capture_signal() -> i32 {
    libc::SIGRTMIN() + 5
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

extern "C" fn capture(_: libc::c_int) {
    let me = gettid();
    if WANTED.load(Ordering::Acquire) != me {
        return;
    }
    let mut n = 0;
    // SAFETY: the unsynchronized trace is the one meant for signal
    // handlers; this one runs on a single thread at a time (WANTED).
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            FRAMES[n].store(frame.ip() as usize, Ordering::Relaxed);
            n += 1;
            n < MAX_FRAMES
        });
    }
    DEPTH.store(n, Ordering::Relaxed);
    ANSWERED.store(me, Ordering::Release);
}

/// Answers [`REQUEST`] from now on, where a watchdog watches the run.
pub fn install(run_dir: &Path, rank: usize) -> Result<()> {
    if std::env::var_os(heartbeat::ENV).is_none() {
        return Ok(());
    }
    // SAFETY: a zeroed sigaction with a plain handler and SA_RESTART, so
    // that the system calls the signal interrupts go on.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = capture as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(capture_signal(), &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error()).context("installing the stack handler");
        }
    }
    let mut requests = signal_hook::iterator::Signals::new([REQUEST])
        .context("installing the handler of the stack request")?;
    let path = heartbeat::stacks_path(run_dir, rank);
    std::thread::Builder::new()
        .name("sweep-stacks".into())
        .spawn(move || {
            for _ in requests.forever() {
                let _ = write(&path);
            }
        })
        .context("starting the stack thread")?;
    Ok(())
}

fn write(path: &Path) -> Result<()> {
    let text = dump();
    crate::util::fs::write_atomic(path, text.as_bytes())
}

/// Every thread of this process: its id, name, state and stack.
fn dump() -> String {
    let me = gettid();
    let mut out = String::new();
    let tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for tid in tids {
        let task = format!("/proc/self/task/{tid}");
        let name = std::fs::read_to_string(format!("{task}/comm")).unwrap_or_default();
        let state = std::fs::read_to_string(format!("{task}/stat"))
            .ok()
            .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()?.to_string()))
            .unwrap_or_default();
        let _ = writeln!(out, "thread {tid} ({}) state {state}", name.trim());
        if tid == me {
            let _ = writeln!(out, "    (the thread that writes this)");
            continue;
        }
        match frames_of(tid) {
            Some(frames) => {
                for (i, ip) in frames.into_iter().enumerate() {
                    let _ = writeln!(out, "    #{i:<2} {}", describe(ip));
                }
            }
            None => {
                let _ = writeln!(out, "    (no answer in 200 ms)");
            }
        }
    }
    out
}

/// The return addresses of thread `tid`'s stack, from its own handler.
fn frames_of(tid: i32) -> Option<Vec<usize>> {
    ANSWERED.store(0, Ordering::Release);
    WANTED.store(tid, Ordering::Release);
    // SAFETY: tgkill to a thread of this very process.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, capture_signal()) };
    let asked = Instant::now();
    let answered = sent == 0
        && loop {
            if ANSWERED.load(Ordering::Acquire) == tid {
                break true;
            }
            if asked.elapsed() > Duration::from_millis(200) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
    WANTED.store(0, Ordering::Release);
    answered.then(|| {
        let n = DEPTH.load(Ordering::Relaxed);
        FRAMES[..n]
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .collect()
    })
}

/// `function at file:line`, or the address where the binary names nothing.
fn describe(ip: usize) -> String {
    let mut text = None;
    backtrace::resolve(ip as *mut std::ffi::c_void, |sym| {
        if text.is_some() {
            return;
        }
        let name = sym.name().map(|n| format!("{n:#}"));
        let place = match (sym.filename(), sym.lineno()) {
            (Some(f), Some(l)) => format!(" at {}:{l}", f.display()),
            _ => String::new(),
        };
        text = name.map(|n| format!("{n}{place}"));
    });
    text.unwrap_or_else(|| format!("{ip:#x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_answers_with_its_stack() {
        // A thread parked in a known function, then the dump.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<()>();
        let parked = std::thread::Builder::new()
            .name("parked-here".into())
            .spawn(move || {
                // Named and running before the dump looks for it.
                ready_tx.send(()).unwrap();
                rx.recv().ok()
            })
            .unwrap();
        ready.recv().unwrap();
        // SAFETY: as in `install`.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = capture as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(capture_signal(), &action, std::ptr::null_mut()),
                0
            );
        }
        let text = dump();
        tx.send(()).unwrap();
        parked.join().unwrap();
        let parked_part = text
            .split("thread ")
            .find(|t| t.contains("(parked-here)"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(parked_part.contains("#0"), "{text}");
        assert!(!parked_part.contains("no answer"), "{text}");
        assert!(text.contains("(the thread that writes this)"), "{text}");
    }
}
