//! `sweep bench ...`: the benchmarks of the hot paths. Each prints a table of
//! figures; none is a test (speed goals are checked here, not in `cargo test`).

pub mod data;
pub mod ddp;
pub mod gemms;
pub mod history;
pub mod kernels;
pub mod plan;
pub mod pretokenize;
pub mod report;
pub mod train;

use std::time::{Duration, Instant};

/// Runs `f` once and returns its result with the wall time it took.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}

/// CPU time of this process so far: (user, kernel) seconds.
pub fn cpu_times() -> (f64, f64) {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let s = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
            (s(u.user_time()), s(u.system_time()))
        }
        Err(_) => (0.0, 0.0),
    }
}
