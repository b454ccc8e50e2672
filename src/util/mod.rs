//! Small helpers shared by every stage of the pipeline.

pub mod fs;
pub mod hash;
pub mod lock;
pub mod name;
pub mod process;
pub mod progress;
pub mod signals;
pub mod text;

/// Seconds since the Unix epoch, as an RFC 3339 timestamp in UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Threads for CPU work: `configured` if positive, else SWEEP_THREADS (set by
/// the local executor), else SLURM_CPUS_PER_TASK, else every core.
pub fn threads(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    ["SWEEP_THREADS", "SLURM_CPUS_PER_TASK"]
        .iter()
        .find_map(|v| {
            std::env::var(v)
                .ok()?
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0)
        })
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        // What the environment says is bounded like a configured count.
        .min(crate::config::MAX_THREADS)
}
