//! Small helpers shared by every stage of the pipeline.

pub mod crash;
pub mod fs;
pub mod hash;
pub mod heartbeat;
pub mod lock;
pub mod name;
pub mod outputs;
pub mod process;
pub mod progress;
pub mod raw_stderr;
pub mod signals;
pub mod slurm;
pub mod stdout;
pub mod text;

/// Seconds since the Unix epoch, as an RFC 3339 timestamp in UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The median of `xs` (the mean of the middle two for an even count);
/// none for no values. NaN sorts last, as `f64::total_cmp` orders it.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}
