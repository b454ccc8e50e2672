//! What a blocked design lets the report say beyond its paired speedups: where each block ran,
//! and whether a configuration's speed depends on its place in the block (warm caches, a GPU
//! heating, a neighbour's job), which a random order per block turns from bias into noise.
//! Per configuration: each run's log mean tokens/s less its block's other runs' mean log,
//! regressed on its place; the slope in percent per place with its t-interval and Holm-adjusted
//! p-value, flagged where significant at 5% with a first-to-last effect of [`FLAG_PCT`] or more.

use super::ingest::RunLog;
use super::stats::{holm, t975, two_sided_p, ALPHA};
use std::collections::BTreeMap;

/// The first-to-last effect below which a significant slope is not flagged (a cluster's noise).
pub const FLAG_PCT: f64 = 1.0;

/// Where one block ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Place {
    pub block: u32,
    /// Its runs' nodes, each once, in the order first seen.
    pub nodes: Vec<String>,
    pub runs: usize,
}

/// How a configuration's speed moves with its place in the block.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionEffect {
    pub configuration: String,
    /// Tokens/s change per place later in the block, in percent.
    pub pct_per_place: f64,
    /// Its 95% interval.
    pub ci95: (f64, f64),
    /// From the first place to the last (`pct_per_place` × (places − 1)).
    pub first_to_last_pct: f64,
    /// Holm-adjusted over the configurations checked.
    pub p_adjusted: f64,
    pub blocks: usize,
    pub flagged: bool,
}

impl PositionEffect {
    pub fn describe(&self) -> String {
        format!(
            "{}: {:+.2}% tokens/s per place later in the block (95% CI {:+.2} to {:+.2}; first to last place {:+.1}%), Holm-adjusted p = {:.3}, over {} blocks",
            self.configuration,
            self.pct_per_place,
            self.ci95.0,
            self.ci95.1,
            self.first_to_last_pct,
            self.p_adjusted,
            self.blocks
        )
    }
}

/// A blocked design's places and position effects.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Design {
    pub places: Vec<Place>,
    /// One per configuration with three blocks at two or more places, in first-seen order.
    pub effects: Vec<PositionEffect>,
}

impl Design {
    /// The flagged configurations.
    pub fn flagged(&self) -> impl Iterator<Item = &PositionEffect> {
        self.effects.iter().filter(|e| e.flagged)
    }

    /// "Block 1: nid001 (4 runs); block 2: nid002, nid003 (4 runs)".
    pub fn places_line(&self) -> String {
        self.places
            .iter()
            .map(|p| {
                let nodes = match p.nodes.is_empty() {
                    true => "node not recorded".to_string(),
                    false => p.nodes.join(", "),
                };
                format!("block {}: {nodes} ({} runs)", p.block, p.runs)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The position check in a sentence: the flagged configurations, or none (the largest effect).
    pub fn effects_line(&self) -> Option<String> {
        let flagged: Vec<String> = self.flagged().map(PositionEffect::describe).collect();
        if !flagged.is_empty() {
            return Some(format!(
                "speed depends on the place in the block — {}",
                flagged.join("; ")
            ));
        }
        let largest = self.effects.iter().max_by(|a, b| {
            a.first_to_last_pct
                .abs()
                .total_cmp(&b.first_to_last_pct.abs())
        })?;
        Some(format!(
            "no configuration's speed depends on its place in the block by {FLAG_PCT}% or more, significantly \
             (the largest effect: {}'s, {:+.1}% from the first place to the last)",
            largest.configuration, largest.first_to_last_pct
        ))
    }
}

/// The design of `runs` (`means[i]`: run i's mean tokens/s); `None` where no run has a block.
pub fn design(runs: &[RunLog], means: &[Option<f64>]) -> Option<Design> {
    let mut places: BTreeMap<u32, Place> = BTreeMap::new();
    for r in runs {
        let Some(b) = r.block else { continue };
        let p = places.entry(b.block).or_insert(Place {
            block: b.block,
            nodes: Vec::new(),
            runs: 0,
        });
        p.runs += 1;
        for n in &r.nodes {
            if !p.nodes.contains(n) {
                p.nodes.push(n.clone());
            }
        }
    }
    if places.is_empty() {
        return None;
    }
    // Each run's log-mean, and its block's sum of them.
    let logs: Vec<Option<(u32, u32, f64)>> = runs
        .iter()
        .zip(means)
        .map(|(r, m)| {
            let b = r.block?;
            let m = m.filter(|m| *m > 0.0 && m.is_finite())?;
            Some((b.block, b.position, m.ln()))
        })
        .collect();
    let mut block_sum: BTreeMap<u32, (f64, usize)> = BTreeMap::new();
    for &(b, _, y) in logs.iter().flatten() {
        let e = block_sum.entry(b).or_default();
        e.0 += y;
        e.1 += 1;
    }
    let places_max = logs.iter().flatten().map(|l| l.1).max().unwrap_or(1);
    let mut by_config: indexmap::IndexMap<String, Vec<(f64, f64)>> = Default::default();
    for (r, l) in runs.iter().zip(&logs) {
        let (Some((b, pos, y)), Some(c)) = (l, &r.configuration) else {
            continue;
        };
        // Against the block's other runs: its own shift left out (else a quarter of it would hide in
        // a block of four's mean).
        let (sum, n) = block_sum[b];
        if n < 2 {
            continue;
        }
        by_config
            .entry(c.name.clone())
            .or_default()
            .push((f64::from(*pos), 100.0 * (y - (sum - y) / (n - 1) as f64)));
    }
    let fits: Vec<(String, usize, Option<Fit>)> = by_config
        .into_iter()
        .map(|(name, pts)| (name, pts.len(), slope(&pts)))
        .collect();
    let p: Vec<Option<f64>> = fits.iter().map(|f| f.2.map(|s| s.2)).collect();
    let adjusted = holm(&p);
    let effects = fits
        .into_iter()
        .zip(adjusted)
        .filter_map(|((configuration, blocks, fit), adj)| {
            let (b, half, _) = fit?;
            let p_adjusted = adj?;
            let first_to_last_pct = b * f64::from(places_max.saturating_sub(1));
            Some(PositionEffect {
                configuration,
                pct_per_place: b,
                ci95: (b - half, b + half),
                first_to_last_pct,
                p_adjusted,
                blocks,
                flagged: p_adjusted < ALPHA && first_to_last_pct.abs() >= FLAG_PCT,
            })
        })
        .collect();
    Some(Design {
        places: places.into_values().collect(),
        effects,
    })
}

/// A slope, its 95% half-width and the p-value of "no slope".
type Fit = (f64, f64, f64);

/// Least squares of y on x; `None` below three points or with one x.
fn slope(pts: &[(f64, f64)]) -> Option<Fit> {
    let n = pts.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let sse: f64 = pts.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let df = nf - 2.0;
    let se = (sse / df / sxx).sqrt();
    if !se.is_finite() {
        return None;
    }
    // A perfect fit: the slope is exact (in percent, a millionth is rounding).
    let p = match (sse / nf).sqrt() > 1e-6 {
        true => two_sided_p(b / se, df),
        false if b.abs() < 1e-6 => 1.0,
        false => 0.0,
    };
    Some((b, t975(df) * se, p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{State, Status};
    use crate::plan::record::{Configuration, DesignSlot};

    /// `blocks` blocks of configurations a..d, each block on its own node
    /// with a speed of its own, and `drift` percent slower per place for
    /// configuration `d` alone.
    fn study(blocks: u32, drift: f64) -> (Vec<RunLog>, Vec<Option<f64>>) {
        let mut runs = Vec::new();
        let mut means = Vec::new();
        for b in 1..=blocks {
            let node_speed = 1.0 + 0.2 * ((b * 7 % 5) as f64 - 2.0) / 2.0;
            // The order rotates from block to block.
            for k in 0..4u32 {
                let c = ((k + b) % 4) as u8;
                let name = ((b'a' + c) as char).to_string();
                let mut r = RunLog::new(format!("{name}-r{b}"), Status::new(State::Completed));
                r.block = Some(DesignSlot {
                    block: b,
                    position: k + 1,
                });
                r.nodes = vec![format!("nid{b:03}")];
                r.configuration = Some(Configuration {
                    name: name.clone(),
                    id: name.clone(),
                });
                let base = 1000.0 * (1.0 + 0.05 * c as f64) * node_speed;
                // A little noise that is not the position's.
                let noise = 1.0 + 0.002 * (((b * 13 + c as u32 * 7) % 5) as f64 - 2.0);
                let effect = match c {
                    3 => 1.0 + drift / 100.0 * k as f64,
                    _ => 1.0,
                };
                means.push(Some(base * noise * effect));
                runs.push(r);
            }
        }
        (runs, means)
    }

    #[test]
    fn a_configuration_slower_later_in_its_block_is_flagged_with_its_figures() {
        let (runs, means) = study(6, -2.0);
        let d = design(&runs, &means).unwrap();
        assert_eq!(d.places.len(), 6);
        assert_eq!(d.places[0].nodes, ["nid001"]);
        assert!(d
            .places_line()
            .starts_with("block 1: nid001 (4 runs); block 2: nid002"));
        let flagged: Vec<&PositionEffect> = d.flagged().collect();
        assert_eq!(flagged.len(), 1, "{:?}", d.effects);
        let e = flagged[0];
        assert_eq!(e.configuration, "d");
        // −2% per place for d.
        assert!((e.pct_per_place + 2.0).abs() < 0.3, "{e:?}");
        assert!(e.ci95.0 < e.pct_per_place && e.pct_per_place < e.ci95.1);
        assert!(
            d.effects_line().unwrap().contains("depends on the place"),
            "{:?}",
            d.effects_line()
        );
    }

    #[test]
    fn no_position_effect_flags_nobody_and_says_the_largest() {
        let (runs, means) = study(6, 0.0);
        let d = design(&runs, &means).unwrap();
        assert_eq!(d.effects.len(), 4);
        assert_eq!(d.flagged().count(), 0, "{:?}", d.effects);
        let line = d.effects_line().unwrap();
        assert!(
            line.starts_with("no configuration's speed depends"),
            "{line}"
        );
        // Two blocks: too few to check a slope; places are still said.
        let (runs, means) = study(2, -5.0);
        let d = design(&runs, &means).unwrap();
        assert!(d.effects.is_empty() && d.effects_line().is_none());
        assert_eq!(d.places.len(), 2);
        // No blocks, no design.
        let mut plain = runs.clone();
        plain.iter_mut().for_each(|r| r.block = None);
        assert_eq!(design(&plain, &means), None);
    }
}
