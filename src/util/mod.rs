//! Small helpers shared by every stage of the pipeline.

pub mod fs;
pub mod hash;
pub mod lock;
pub mod name;
pub mod outputs;
pub mod process;
pub mod progress;
pub mod signals;
pub mod text;

/// Seconds since the Unix epoch, as an RFC 3339 timestamp in UTC.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
