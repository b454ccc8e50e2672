//! The accelerators sweep knows, in one table: dense bf16 peak FLOP/s (what
//! MFU is measured against) and memory per device (what `sweep plan` checks
//! runs against). A `gpu` name matches the first row whose words it all
//! contains, case aside: "NVIDIA A100-SXM4-40GB" is the 40 GB A100.

pub struct Accelerator {
    /// What a name must contain (every word) to be this accelerator.
    pub matches: &'static [&'static str],
    pub peak_flops: f64,
    /// Memory per device, in GB (10⁹ bytes), as sold.
    pub memory_gb: f64,
}

const fn acc(matches: &'static [&'static str], peak_flops: f64, memory_gb: f64) -> Accelerator {
    Accelerator {
        matches,
        peak_flops,
        memory_gb,
    }
}

/// GH200 before H200 before H100: a name containing "GH200" contains "H200".
pub const ACCELERATORS: &[Accelerator] = &[
    // 96 GB of HBM3 (144 GB HBM3e parts exist; the reference study's nodes
    // report 120 GB usable): set `gpu_memory_gb` for yours.
    acc(&["GH200"], 989e12, 96.0),
    acc(&["H200"], 989e12, 141.0),
    acc(&["H100"], 989e12, 80.0),
    acc(&["B200"], 2250e12, 180.0),
    acc(&["A100", "40G"], 312e12, 40.0),
    acc(&["A100"], 312e12, 80.0),
    acc(&["L40S"], 362e12, 48.0),
    acc(&["A10"], 125e12, 24.0),
    acc(&["V100"], 125e12, 32.0),
    acc(&["MI300X"], 1307e12, 192.0),
    acc(&["MI250X"], 383e12, 128.0),
];

/// The row a name (`gpu = "H100"`, or the CUDA driver's "NVIDIA H100 80GB HBM3") names.
pub fn lookup(name: &str) -> Option<&'static Accelerator> {
    let name = name.to_ascii_uppercase();
    ACCELERATORS
        .iter()
        .find(|a| a.matches.iter().all(|m| name.contains(m)))
}

/// The names of the table's rows, for error messages.
pub fn known() -> String {
    ACCELERATORS
        .iter()
        .map(|a| a.matches.join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_find_their_rows() {
        assert_eq!(lookup("gh200").unwrap().memory_gb, 96.0);
        assert_eq!(lookup("NVIDIA H100 80GB HBM3").unwrap().memory_gb, 80.0);
        assert_eq!(lookup("NVIDIA H200").unwrap().memory_gb, 141.0);
        assert_eq!(lookup("NVIDIA A100-SXM4-40GB").unwrap().memory_gb, 40.0);
        assert_eq!(lookup("NVIDIA A100-SXM4-80GB").unwrap().memory_gb, 80.0);
        assert_eq!(lookup("A100").unwrap().peak_flops, 312e12);
        assert!(lookup("TPU v5").is_none());
    }
}
