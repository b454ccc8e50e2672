//! `[plan]`: what `sweep plan` assumes of the hardware for its memory check
//! and scaling forecast. A hint changes no run — not what it trains, not what
//! it measures — so hints are never part of a run's identity nor of its
//! `config.toml`: changing one re-plans the study and re-runs nothing.

use super::ConfigError;
use serde::{Deserialize, Serialize};

/// The hint keys, which manifests before `[plan]` wrote in `[defaults]`
/// (refused there now, with the fix: move it to `[plan]`).
pub const KEYS: [&str; 4] = [
    "gpu_memory_gb",
    "expected_mfu_pct",
    "intra_node_gbps",
    "inter_node_gbps",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlanHints {
    /// Memory per GPU in GB; overrides the device table (what `sweep plan`
    /// checks runs against).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_memory_gb: Option<f64>,
    /// The MFU one device is expected to reach, in percent: the compute time
    /// of the scaling forecast (default 40; set what one node of the study
    /// measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_mfu_pct: Option<f64>,
    /// All-reduce bandwidth per device within a node and between nodes, in
    /// GB/s; override the device table for the scaling forecast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intra_node_gbps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inter_node_gbps: Option<f64>,
}

impl PlanHints {
    /// Each hint within a physical range: outside it a value is a typo (a
    /// unit off by 10^9), and the forecast would print NaN% or 300 digits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v, least, most, unit) in [
            ("gpu_memory_gb", self.gpu_memory_gb, 0.1, 1e5, "GB"),
            // From 80 Mbit/s: a shaped test link, an old Ethernet.
            ("intra_node_gbps", self.intra_node_gbps, 0.01, 1e5, "GB/s"),
            ("inter_node_gbps", self.inter_node_gbps, 0.01, 1e5, "GB/s"),
            // From a hundredth of a percent: below it the forecast's times
            // run to dozens of digits.
            ("expected_mfu_pct", self.expected_mfu_pct, 0.01, 100.0, "%"),
        ] {
            super::check_range(name, v, least, most, unit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_out_of_its_range_names_its_key() {
        let e = PlanHints {
            inter_node_gbps: Some(1e-300),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "inter_node_gbps");
        assert!(e.message.contains("not 1e-300"), "{e}");
    }
}
