//! Stop signals caught as flags, for loops that check them between units of work, so that what
//! is half done is finished or cleaned up before exiting.

use anyhow::{Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};

/// The signals that end an interactive command: Ctrl-C, `kill` (SLURM's too), a closed terminal.
pub const INTERRUPTS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// `signals` less SIGHUP where the process began ignoring it (`nohup`).
fn wanted(signals: &[i32]) -> Vec<i32> {
    static IGNORED: std::sync::OnceLock<Vec<i32>> = std::sync::OnceLock::new();
    let ignored = IGNORED.get_or_init(|| {
        [SIGHUP]
            .into_iter()
            .filter(|&sig| {
                // SAFETY: reads the signal's disposition into a zeroed struct.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                        && old.sa_sigaction == libc::SIG_IGN
                }
            })
            .collect()
    });
    signals
        .iter()
        .copied()
        .filter(|s| !ignored.contains(s))
        .collect()
}

/// The last of the installed signals to arrive, until taken.
#[derive(Debug, Clone)]
pub struct StopSignals(Arc<AtomicUsize>);

impl StopSignals {
    /// Catches `signals`: they no longer end the process (a checkpoint must survive SLURM's second).
    pub fn install(signals: &[i32]) -> Result<StopSignals> {
        Self::with(signals, false)
    }

    /// Catches the first of `signals`; a second ends the process (an impatient second Ctrl-C).
    pub fn install_interactive(signals: &[i32]) -> Result<StopSignals> {
        Self::with(signals, true)
    }

    fn with(signals: &[i32], second_ends: bool) -> Result<StopSignals> {
        let flag = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for sig in wanted(signals) {
            let installed = if second_ends {
                // Actions run in order: the default action if one came already, then the flags.
                signal_hook::flag::register_conditional_default(sig, Arc::clone(&seen))
                    .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&seen)))
                    .map(|_| ())
            } else {
                Ok(())
            };
            installed
                .and_then(|()| {
                    signal_hook::flag::register_usize(sig, Arc::clone(&flag), sig as usize)
                })
                .with_context(|| format!("installing a handler for {}", name(sig)))?;
        }
        Ok(StopSignals(flag))
    }

    /// The signal received, if any, left in place.
    pub fn received(&self) -> Option<i32> {
        match self.0.load(Ordering::SeqCst) as i32 {
            0 => None,
            s => Some(s),
        }
    }

    /// The signal received since the last call, if any.
    pub fn take(&self) -> Option<i32> {
        match self.0.swap(0, Ordering::SeqCst) as i32 {
            0 => None,
            s => Some(s),
        }
    }
}

/// For a command that writes only through temporaries: the first of [`INTERRUPTS`] stops its
/// children, parks its threads, removes its temporaries and exits with 128 + the signal.
pub fn exit_on_stop() -> Result<()> {
    install_parking()?;
    let mut signals = signal_hook::iterator::Signals::new(wanted(&INTERRUPTS))
        .context("installing the stop signals' handler")?;
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                end_process(format!("sweep: stopped by {}", name(sig)), 128 + sig);
            }
        })
        .context("starting the stop signals' thread")?;
    Ok(())
}

/// Until dropped, the first of some signals ends the process as [`exit_on_stop`] does, with its
/// own words and status (a trainer starting).
pub struct ExitUntilDropped {
    handle: signal_hook::iterator::Handle,
    armed: Arc<std::sync::Mutex<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ExitUntilDropped {
    /// `said` words the ending for the signal received; `code` is the exit status.
    pub fn install(
        signals: &[i32],
        code: i32,
        said: impl Fn(i32) -> String + Send + 'static,
    ) -> Result<ExitUntilDropped> {
        install_parking()?;
        let mut delivered = signal_hook::iterator::Signals::new(wanted(signals))
            .context("installing the stop signals' handler")?;
        let handle = delivered.handle();
        let armed = Arc::new(std::sync::Mutex::new(true));
        let still = Arc::clone(&armed);
        let thread = std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                if let Some(sig) = delivered.forever().next() {
                    // Held while the process ends: a drop waits for the end.
                    let armed = still.lock().unwrap_or_else(|e| e.into_inner());
                    if *armed {
                        end_process(said(sig), code);
                    }
                }
            })
            .context("starting the stop signals' thread")?;
        Ok(ExitUntilDropped {
            handle,
            armed,
            thread: Some(thread),
        })
    }
}

impl Drop for ExitUntilDropped {
    fn drop(&mut self) {
        *self.armed.lock().unwrap_or_else(|e| e.into_inner()) = false;
        // The thread's iterator ends and unregisters its handlers.
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends the process for a stop signal: stops its children, parks other threads, removes its
/// temporaries, says `said` on stderr and exits with `code`.
fn end_process(said: String, code: i32) -> ! {
    STOPPING.store(true, Ordering::SeqCst);
    super::process::stop_children();
    // The parked threads may hold any lock: should the removal wait on one, the alarm ends the
    // process rather than hang.
    // SAFETY: arming the alarm; SIGALRM's default action ends the process.
    unsafe { libc::alarm(STOP_LIMIT_S) };
    let removed = super::fs::remove_temporaries(park_other_threads);
    let mut out = super::raw_stderr::RawStderr::default();
    {
        use std::fmt::Write;
        let _ = write!(out, "{said}");
        if removed > 0 {
            let _ = write!(out, "; {removed} temporary file(s) removed");
        }
        let _ = writeln!(out);
    }
    // Not through stderr's lock, which a parked thread may hold.
    out.flush();
    // SAFETY: ends the process without running destructors, which parked threads hold.
    unsafe { libc::_exit(code) };
}

/// How long a stop may take before the alarm ends the process (SLURM's KillWait is 30 s).
const STOP_LIMIT_S: u32 = 20;

/// The real-time signal that parks a thread for good.
fn parking_signal() -> i32 {
    libc::SIGRTMIN() + 3
}

/// Threads parked by [`parking_signal`].
static PARKED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn park(_: libc::c_int) {
    PARKED.fetch_add(1, Ordering::SeqCst);
    loop {
        // SAFETY: pause is async-signal-safe; every signal is blocked here, so it never returns.
        unsafe { libc::pause() };
    }
}

/// Installs [`park`] for [`parking_signal`], every signal blocked while it runs.
fn install_parking() -> Result<()> {
    // SAFETY: a zeroed sigaction for a real-time signal nothing else in sweep uses.
    let r = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = park as *const () as usize;
        libc::sigfillset(&mut action.sa_mask);
        libc::sigaction(parking_signal(), &action, std::ptr::null_mut())
    };
    anyhow::ensure!(
        r == 0,
        "installing the stop's parking handler: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Stops every other thread where it is, so none remakes what the stop removes (a second each).
fn park_other_threads() {
    // SAFETY: plain system calls without arguments.
    let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut signalled: Vec<libc::pid_t> = Vec::new();
    loop {
        let mut new = 0;
        let tasks = std::fs::read_dir("/proc/self/task").into_iter().flatten();
        for tid in tasks
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
        {
            if tid == me || signalled.contains(&tid) {
                continue;
            }
            // SAFETY: a signal to a thread of this process; one ended since is refused (ESRCH).
            if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, parking_signal()) } == 0 {
                signalled.push(tid);
                new += 1;
            }
        }
        // Every thread signalled has parked, and none started since.
        let all = new == 0 && PARKED.load(Ordering::SeqCst) >= signalled.len();
        if all || std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Set once [`exit_on_stop`]'s thread is stopping the process.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Waits for the process's end where a stop signal is ending it, so the work the stop broke
/// does not end it first with another status.
pub fn yield_to_stop() {
    if STOPPING.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// `SIGTERM` for 15, and so on for the signals sweep handles; allocates nothing (handlers call it).
pub fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP (the terminal closed)",
        SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "a signal",
    }
}

/// Points stdout and stderr at /dev/null: after SIGHUP a write to the terminal fails (and
/// `eprintln!` panics) in the middle of stopping jobs.
pub fn detach_from_terminal() {
    // SAFETY: open/dup2/close on this process's descriptors; a failure leaves them as they were.
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
        if fd >= 0 {
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
            if fd > 2 {
                libc::close(fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker making a folder over and over is parked: the folder,
    /// removed after, stays removed (without parking the worker makes it
    /// again within microseconds). In a forked child, whose other threads
    /// are its own.
    #[test]
    fn parked_threads_make_nothing_again() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("scratch");
        // SAFETY: fork's child runs this test's code alone and ends with
        // _exit; its status says what it saw.
        let status = unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                // A child stuck on a lock a parent thread held at the fork
                // dies of the alarm: the test fails, never hangs.
                libc::alarm(10);
                let code = (|| {
                    install_parking().ok()?;
                    let again = made.join("run/logs");
                    std::thread::spawn(move || loop {
                        let _ = std::fs::create_dir_all(&again);
                    });
                    while !made.exists() {
                        std::thread::yield_now();
                    }
                    park_other_threads();
                    std::fs::remove_dir_all(&made).ok()?;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    (!made.exists() && PARKED.load(Ordering::SeqCst) == 1).then_some(0)
                })();
                libc::_exit(code.unwrap_or(1));
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            status
        };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child ended with status {status:#x} (exit 1: the folder came back)"
        );
    }

    #[test]
    fn a_caught_signal_is_kept_until_taken() {
        let s = StopSignals::install(&[SIGUSR1]).unwrap();
        assert_eq!(s.received(), None);
        // SAFETY: raising a signal this process now catches.
        unsafe { libc::raise(SIGUSR1) };
        assert_eq!(s.received(), Some(SIGUSR1));
        assert_eq!(s.take(), Some(SIGUSR1));
        assert_eq!(s.take(), None);
        assert_eq!(name(SIGUSR1), "SIGUSR1");
    }
}
