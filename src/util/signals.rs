//! Stop signals caught as flags, for loops that check them between units of
//! work (a training step, a micro-batch, a row group, a poll of the jobs),
//! so that whatever is half done is finished or cleaned up before exiting.

use anyhow::{Context, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};

/// The signals that end an interactive command: Ctrl-C, `kill` (SLURM's
/// cancel and preemption too), the terminal closing.
pub const INTERRUPTS: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// The last of the installed signals to arrive, until taken.
#[derive(Debug, Clone)]
pub struct StopSignals(Arc<AtomicUsize>);

impl StopSignals {
    /// Catches `signals` from now on: they no longer end the process (a
    /// trainer writing its checkpoint must not die of SLURM's second signal).
    pub fn install(signals: &[i32]) -> Result<StopSignals> {
        Self::with(signals, false)
    }

    /// Catches the first of `signals`; a second one ends the process as it
    /// would have without a handler (an impatient second Ctrl-C).
    pub fn install_interactive(signals: &[i32]) -> Result<StopSignals> {
        Self::with(signals, true)
    }

    fn with(signals: &[i32], second_ends: bool) -> Result<StopSignals> {
        let flag = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for &sig in signals {
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

/// For a command that writes only through temporaries renamed into place
/// (reports, checks, pretokenizing, imports, benchmarks): from now on, the
/// first of [`INTERRUPTS`] stops the processes it started, removes its
/// temporaries and exits the process at once with 128 + the signal (130 for
/// Ctrl-C, 143 for SIGTERM), whatever its threads are doing — a loop deep
/// in a library need not look at a flag. What was renamed into place stays
/// whole; a history transaction not yet committed is rolled back by SQLite.
pub fn exit_on_stop() -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new(INTERRUPTS)
        .context("installing the stop signals' handler")?;
    std::thread::Builder::new()
        .name("stop-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                STOPPING.store(true, Ordering::SeqCst);
                super::process::stop_children();
                let removed = super::fs::remove_temporaries();
                // The terminal may be gone (SIGHUP): a failed write is no
                // reason not to exit.
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "sweep: stopped by {}{}",
                    name(sig),
                    match removed {
                        0 => String::new(),
                        n => format!("; {n} temporary file(s) removed"),
                    }
                );
                // SAFETY: ends the process without running destructors,
                // which other threads may be using.
                unsafe { libc::_exit(128 + sig) };
            }
        })
        .context("starting the stop signals' thread")?;
    Ok(())
}

/// Set once [`exit_on_stop`]'s thread is stopping the process.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Waits for the process's end where a stop signal is ending it: the work
/// its removal of temporaries broke (a file that vanished) must not end the
/// process first, with another status and a confusing error.
pub fn yield_to_stop() {
    if STOPPING.load(Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
}

/// `SIGTERM` for 15, and so on for the signals sweep handles.
pub fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP (the terminal closed)",
        SIGUSR1 => "SIGUSR1",
        _ => "a stop signal",
    }
}

/// Points standard output and error at /dev/null: after SIGHUP the terminal
/// is gone, and a write to it would fail (Rust's `eprintln!` panics on that)
/// in the middle of stopping jobs cleanly.
pub fn detach_from_terminal() {
    // SAFETY: open/dup2/close on descriptors this process owns; a failure
    // leaves the descriptors as they were.
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
