//! The accelerators sweep knows, in one table: dense bf16 peak FLOP/s (what
//! MFU is measured against), memory per device (what `sweep plan` checks
//! runs against) and the bandwidth of a device's links to its peers (what
//! the scaling forecast sums gradients over). A `gpu` name matches the first row whose words it all
//! contains, case aside: "NVIDIA A100-SXM4-40GB" is the 40 GB A100.

pub struct Accelerator {
    /// What a name must contain (every word) to be this accelerator.
    pub matches: &'static [&'static str],
    pub peak_flops: f64,
    /// Memory per device, in GB (10⁹ bytes), as sold.
    pub memory_gb: f64,
    /// All-reduce bus bandwidth per device within a node (NVLink, Infinity
    /// Fabric, PCIe), in GB/s: what NCCL's tests report as "busbw" on such a
    /// node, typically 75-85% of the links' nominal rate.
    pub intra_node_gbps: f64,
    /// Per device between nodes: the device's share of its node's network
    /// (one 200 or 400 Gb/s NIC per GPU on today's GPU nodes), in GB/s.
    pub inter_node_gbps: f64,
}

const fn acc(
    matches: &'static [&'static str],
    peak_flops: f64,
    memory_gb: f64,
    (intra_node_gbps, inter_node_gbps): (f64, f64),
) -> Accelerator {
    Accelerator {
        matches,
        peak_flops,
        memory_gb,
        intra_node_gbps,
        inter_node_gbps,
    }
}

/// GH200 before H200 before H100: a name containing "GH200" contains "H200".
/// Links: NVLink 4 (H100/H200: 18 links, 900 GB/s; GH200 nodes of 4: 150 GB/s
/// between each pair), NVLink 5 for B200, NVLink 3 for A100, PCIe for
/// L40S/A10; networks of one NIC per GPU (Slingshot 200 Gb/s on GH200 nodes,
/// InfiniBand NDR 400 Gb/s on H100/H200/B200 nodes, HDR 200 Gb/s on A100).
/// Typical values: set `intra_node_gbps` / `inter_node_gbps` for yours.
pub const ACCELERATORS: &[Accelerator] = &[
    // 96 GB of HBM3 (144 GB HBM3e parts exist; the reference study's nodes
    // report 120 GB usable): set `gpu_memory_gb` for yours.
    acc(&["GH200"], 989e12, 96.0, (150.0, 25.0)),
    acc(&["H200"], 989e12, 141.0, (360.0, 50.0)),
    acc(&["H100"], 989e12, 80.0, (360.0, 50.0)),
    acc(&["B200"], 2250e12, 180.0, (720.0, 50.0)),
    acc(&["A100", "40G"], 312e12, 40.0, (230.0, 25.0)),
    acc(&["A100"], 312e12, 80.0, (230.0, 25.0)),
    acc(&["L40S"], 362e12, 48.0, (20.0, 12.5)),
    acc(&["A10"], 125e12, 24.0, (20.0, 12.5)),
    acc(&["V100"], 125e12, 32.0, (130.0, 12.5)),
    acc(&["MI300X"], 1307e12, 192.0, (300.0, 50.0)),
    acc(&["MI250X"], 383e12, 128.0, (100.0, 25.0)),
];

/// The row a name (`gpu = "H100"`, or the CUDA driver's "NVIDIA H100 80GB HBM3") names.
pub fn lookup(name: &str) -> Option<&'static Accelerator> {
    let name = name.to_ascii_uppercase();
    ACCELERATORS
        .iter()
        .find(|a| a.matches.iter().all(|m| says(&name, m)))
}

/// Whether `name` says `part` as a word of its own, or one a letter or a
/// sign ends (`40GB`, `A100-SXM4`): not inside a longer model number, so
/// that a typo (`H1000`) names no device rather than the H100's peak.
fn says(name: &str, part: &str) -> bool {
    name.match_indices(part).any(|(i, _)| {
        let before = name[..i].chars().next_back();
        let after = name[i + part.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_digit())
    })
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
        assert_eq!(lookup("NVIDIA A10").unwrap().peak_flops, 125e12);
        assert_eq!(lookup("NVIDIA A100-PCIE-40GB").unwrap().memory_gb, 40.0);
        assert_eq!(lookup("NVIDIA GH200 480GB").unwrap().memory_gb, 96.0);
        assert_eq!(lookup("AMD Instinct MI300X").unwrap().memory_gb, 192.0);
        // A longer model number is another device, not the one it begins with.
        for typo in ["H1000", "A1000", "XH100", "GH2000"] {
            assert!(lookup(typo).is_none(), "{typo}");
        }
    }
}
