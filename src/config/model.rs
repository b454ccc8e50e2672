//! Model architecture: presets, manifest overrides, and the arithmetic that
//! MFU depends on (parameter count and FLOPs per token).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// A LLaMA-style decoder's shape. `vocab_size = 0` means "take it from the tokenizer".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub vocab_size: usize,
    pub ffn_dim_multiplier: Option<f64>,
    pub multiple_of: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
}

/// Per-field overrides of a preset, from `[defaults.architecture]` or an axis
/// such as `architecture.n_layers = [2, 4]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_layers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_heads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_kv_heads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ffn_dim_multiplier: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiple_of: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm_eps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
}

/// The names accepted by `model = "..."`.
pub const PRESETS: &[&str] = &["tiny", "small", "ref-1b", "ref-8b"];

impl ModelConfig {
    /// The model with the vocabulary of a tokenizer of `tokenizer` ids: a
    /// preset without a vocabulary of its own takes the tokenizer's; one
    /// smaller than the tokenizer's is an error (its ids would fall outside
    /// the embedding).
    pub fn with_vocabulary(mut self, tokenizer: usize) -> anyhow::Result<ModelConfig> {
        if self.vocab_size == 0 {
            self.vocab_size = tokenizer;
        }
        if self.vocab_size < tokenizer {
            anyhow::bail!(
                "the model's vocabulary ({}) is smaller than the tokenizer's ({tokenizer})",
                self.vocab_size
            );
        }
        Ok(self)
    }

    /// A named preset. `ref-8b` and `ref-1b` are the reference study's two
    /// models (its pretokenization and DDP studies); `small` is the model the
    /// CPU speed goal is measured on; `tiny` trains in seconds on a laptop.
    pub fn preset(name: &str) -> Option<ModelConfig> {
        let base = ModelConfig {
            dim: 0,
            n_layers: 0,
            n_heads: 0,
            n_kv_heads: 0,
            vocab_size: 0,
            ffn_dim_multiplier: None,
            multiple_of: 256,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
        };
        Some(match name {
            "tiny" => ModelConfig {
                dim: 128,
                n_layers: 4,
                n_heads: 4,
                n_kv_heads: 2,
                multiple_of: 64,
                ..base
            },
            "small" => ModelConfig {
                dim: 384,
                n_layers: 6,
                n_heads: 6,
                n_kv_heads: 2,
                ..base
            },
            "ref-1b" => ModelConfig {
                dim: 2048,
                n_layers: 16,
                n_heads: 16,
                n_kv_heads: 4,
                vocab_size: 131_072,
                rope_theta: 500_000.0,
                ..base
            },
            "ref-8b" => ModelConfig {
                dim: 4096,
                n_layers: 32,
                n_heads: 32,
                n_kv_heads: 8,
                vocab_size: 131_072,
                ffn_dim_multiplier: Some(1.3),
                multiple_of: 1024,
                rope_theta: 500_000.0,
                ..base
            },
            _ => return None,
        })
    }

    /// The preset with the manifest's overrides applied.
    pub fn resolve(preset: &str, o: &ModelOverrides) -> Result<ModelConfig> {
        let Some(mut m) = Self::preset(preset) else {
            bail!(
                "unknown model preset `{preset}` (known: {})",
                PRESETS.join(", ")
            );
        };
        macro_rules! apply {
            ($($f:ident),*) => { $( if let Some(v) = o.$f { m.$f = v; } )* };
        }
        apply!(
            dim,
            n_layers,
            n_heads,
            n_kv_heads,
            vocab_size,
            multiple_of,
            norm_eps,
            rope_theta
        );
        if o.ffn_dim_multiplier.is_some() {
            m.ffn_dim_multiplier = o.ffn_dim_multiplier;
        }
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<()> {
        if self.dim == 0 || self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 {
            bail!("dim, n_layers, n_heads and n_kv_heads must be positive");
        }
        // Far beyond any model trained: a typo, and products of such shapes
        // overflow the parameter count.
        for (name, v, most) in [
            ("dim", self.dim, 1 << 16),
            ("n_layers", self.n_layers, 1024),
            ("n_heads", self.n_heads, 1024),
            ("n_kv_heads", self.n_kv_heads, 1024),
            ("vocab_size", self.vocab_size, 1 << 24),
            ("multiple_of", self.multiple_of, 1 << 16),
        ] {
            if v > most {
                bail!("{name} must be at most {most}, not {v}");
            }
        }
        if let Some(m) = self
            .ffn_dim_multiplier
            .filter(|m| !(*m > 0.0 && *m <= 64.0))
        {
            bail!("ffn_dim_multiplier must lie in (0, 64], not {m}");
        }
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            bail!("norm_eps must lie in (0, 1), not {}", self.norm_eps);
        }
        if !(self.rope_theta >= 1.0 && self.rope_theta <= 1e12) {
            bail!("rope_theta must lie in [1, 1e12], not {}", self.rope_theta);
        }
        if !self.dim.is_multiple_of(self.n_heads) {
            bail!(
                "dim ({}) must be a multiple of n_heads ({})",
                self.dim,
                self.n_heads
            );
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            bail!(
                "n_heads ({}) must be a multiple of n_kv_heads ({})",
                self.n_heads,
                self.n_kv_heads
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!(
                "the head dimension ({}) must be even for rotary embeddings",
                self.head_dim()
            );
        }
        if self.multiple_of == 0 {
            bail!("multiple_of must be positive");
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// The LLaMA/torchtitan FFN rule: 4·dim, two thirds of it, times the
    /// multiplier, rounded up to a multiple of `multiple_of`.
    pub fn ffn_hidden(&self) -> usize {
        let mut h = 4 * self.dim;
        h = 2 * h / 3;
        if let Some(mult) = self.ffn_dim_multiplier {
            h = (mult * h as f64) as usize;
        }
        h.div_ceil(self.multiple_of) * self.multiple_of
    }

    /// Parameters excluding the token embedding (the output head counts), as in
    /// the reference study's FLOPs formula.
    pub fn non_embedding_params(&self) -> u64 {
        let d = self.dim as u64;
        self.n_layers as u64 * self.block_params() + d + d * self.vocab_size as u64
    }

    /// Parameters of one block (attention, MLP and their two norms).
    pub fn block_params(&self) -> u64 {
        let d = self.dim as u64;
        let kv = (self.n_kv_heads * self.head_dim()) as u64;
        let h = self.ffn_hidden() as u64;
        2 * d * d + 2 * d * kv + 3 * d * h + 2 * d
    }

    pub fn total_params(&self) -> u64 {
        self.non_embedding_params() + (self.dim * self.vocab_size) as u64
    }

    /// Training FLOPs per token: 6·N + 12·L·H·Q·T.
    pub fn flops_per_token(&self, seq_len: usize) -> f64 {
        6.0 * self.non_embedding_params() as f64
            + 12.0 * (self.n_layers * self.n_heads * self.head_dim() * seq_len) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ffn_rule_matches_llama() {
        // LLaMA-3 8B: dim 4096, multiplier 1.3, multiple_of 1024 -> 14336.
        assert_eq!(ModelConfig::preset("ref-8b").unwrap().ffn_hidden(), 14336);
        assert_eq!(ModelConfig::preset("ref-1b").unwrap().ffn_hidden(), 5632);
        assert_eq!(ModelConfig::preset("small").unwrap().ffn_hidden(), 1024);
    }

    #[test]
    fn overrides_apply_and_are_validated() {
        let o = ModelOverrides {
            n_layers: Some(2),
            ..Default::default()
        };
        assert_eq!(ModelConfig::resolve("tiny", &o).unwrap().n_layers, 2);
        let bad = ModelOverrides {
            n_kv_heads: Some(3),
            ..Default::default()
        };
        assert!(ModelConfig::resolve("tiny", &bad).is_err());
        assert!(ModelConfig::resolve("huge", &ModelOverrides::default()).is_err());
    }
}
