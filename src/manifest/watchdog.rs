//! `[watchdog]`: the limits of a run's watchdog (docs/running.md, "When a
//! run hangs"), parsed and checked where they are written.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// `[watchdog]`: when a run that stops making progress is stopped and
/// recorded HUNG (docs/running.md, "When a run hangs"). It watches built-in
/// trainer runs and command runs with a `[report] line_pattern`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchdogSpec {
    /// No new progress record for this long, once the first one came.
    pub stall: Stall,
    /// No first progress record (from every rank, where ranks report apart)
    /// this long after the run started; `None`: "off".
    #[serde(with = "off_or_duration")]
    pub startup: Option<u64>,
}

impl Default for WatchdogSpec {
    fn default() -> Self {
        WatchdogSpec {
            stall: Stall::Auto,
            startup: Some(30 * 60),
        }
    }
}

/// `[watchdog] stall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// The larger of [`Stall::AUTO_FACTOR`] × the median interval between
    /// progress records so far and [`Stall::AUTO_FLOOR_S`].
    Auto,
    /// Seconds.
    After(u64),
    Off,
}

impl Stall {
    pub const AUTO_FACTOR: f64 = 10.0;
    pub const AUTO_FLOOR_S: u64 = 5 * 60;

    /// As the watchdog's `--stall` and the manifest write it.
    pub fn as_arg(self) -> String {
        match self {
            Stall::Auto => "auto".into(),
            Stall::Off => "off".into(),
            Stall::After(s) => format!("{s}s"),
        }
    }

    pub fn parse(s: &str) -> Result<Stall> {
        Ok(match s {
            "auto" => Stall::Auto,
            "off" => Stall::Off,
            _ => Stall::After(
                parse_watch_duration(s)
                    .map_err(|e| anyhow::anyhow!("{e}; or write \"auto\" or \"off\""))?,
            ),
        })
    }
}

impl Serialize for Stall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.as_arg())
    }
}

impl<'de> Deserialize<'de> for Stall {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        Stall::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

mod off_or_duration {
    pub fn serialize<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(secs) => s.serialize_str(&format!("{secs}s")),
            None => s.serialize_str("off"),
        }
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        match text.as_str() {
            "off" => Ok(None),
            t => super::parse_watch_duration(t)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("{e}; or write \"off\""))),
        }
    }
}

/// The longest watchdog limit: a month (beyond it a value is a typo, and
/// no cluster lets a job run that long).
const MAX_WATCH_SECONDS: u64 = 31 * 86400;

/// A watchdog limit in whole seconds: `"90s"`, `"5m"`, `"2h 30m"`, `"1day"`
/// (humantime's forms). Zero, negative, under a second (the watchdog looks
/// once a second), over a month and unparsable values are refused.
pub fn parse_watch_duration(s: &str) -> Result<u64> {
    let t = s.trim();
    if t.starts_with('-') {
        bail!(
            "`{}` is negative: a watchdog limit is a duration such as \"90s\", \"5m\" or \"2h\"",
            s.escape_debug()
        );
    }
    let d = humantime::parse_duration(t).map_err(|e| {
        anyhow::anyhow!(
            "`{}` is not a duration ({e}): write e.g. \"90s\", \"5m\" or \"2h\"",
            s.escape_debug()
        )
    })?;
    if d.is_zero() {
        bail!(
            "`{}` is zero: a run would be stopped at once",
            s.escape_debug()
        );
    }
    if d.as_secs() == 0 {
        bail!(
            "`{}` is under a second: the watchdog looks once a second",
            s.escape_debug()
        );
    }
    if d.as_secs() > MAX_WATCH_SECONDS {
        bail!(
            "`{}` is more than a month: longer than any job runs",
            s.escape_debug()
        );
    }
    Ok(d.as_secs())
}
