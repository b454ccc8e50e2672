//! Any Hugging Face `tokenizer.json`, special tokens from the tokenizer, a
//! `tokenizer_config.json` beside it, or the manifest. A document's ids are always its BOS (if
//! any) then its text's tokens, whatever the post-processor does: pretokenized files and the
//! on-the-fly loaders agree by construction.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

pub use crate::config::SpecialTokens;

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub path: PathBuf,
    /// Short name: the folder of a `tokenizer.json`, else the file's stem.
    pub name: String,
    pub sha256: String,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// The pad token, if the tokenizer has one (padding works without it).
    pub pad: Option<u32>,
}

const BOS_NAMES: &[&str] = &[
    "<s>",
    "<|begin_of_text|>",
    "<|startoftext|>",
    "<bos>",
    "[BOS]",
];
const EOS_NAMES: &[&str] = &["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>", "[EOS]"];
const PAD_NAMES: &[&str] = &["<pad>", "<|pad|>", "[PAD]", "<|finetune_right_pad_id|>"];

/// A tokenizer file's vocabulary size (added tokens included); `None` where it is none.
pub fn vocab_size_of(path: &Path) -> Option<usize> {
    let bytes = crate::util::fs::read_regular(path, MAX_TOKENIZER_BYTES, None).ok()?;
    tokenizers::Tokenizer::from_bytes(bytes)
        .ok()
        .map(|t| t.get_vocab_size(true))
}

/// The largest tokenizer.json read (the largest published ones are tens of MB).
const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

/// A run's model with its vocabulary, as the trainer builds it: a preset without one reads the
/// tokenizer's.
pub fn model_config(cfg: &crate::config::TrainConfig) -> Result<crate::config::ModelConfig> {
    model_config_with(cfg, vocab_size_of)
}

/// [`model_config`] with the tokenizers' sizes from `vocab_size` (once per file when planning).
pub fn model_config_with(
    cfg: &crate::config::TrainConfig,
    mut vocab_size: impl FnMut(&Path) -> Option<usize>,
) -> Result<crate::config::ModelConfig> {
    let model = cfg.model_config()?;
    if model.vocab_size > 0 {
        return Ok(model);
    }
    let tokenizer = vocab_size(&cfg.tokenizer)
        .with_context(|| format!("reading the tokenizer {}", cfg.tokenizer.display()))?;
    model.with_vocabulary(tokenizer)
}

/// Switches off a tokenizer.json's own truncation and padding, saying so: sweep shapes samples
/// itself, and a saved `max_length` would cut every document silently.
fn drop_own_shaping(inner: &mut tokenizers::Tokenizer, path: &Path) {
    let mut dropped = Vec::new();
    if let Some(t) = inner.get_truncation() {
        dropped.push(format!("truncation (max_length {})", t.max_length));
    }
    if inner.get_padding().is_some() {
        dropped.push("padding".to_string());
    }
    if dropped.is_empty() {
        return;
    }
    // Neither call can fail with None.
    let _ = inner.with_truncation(None);
    inner.with_padding(None);
    eprintln!(
        "sweep: {} sets its own {}: not used — sweep cuts and pads samples itself, from whole documents",
        path.display(),
        dropped.join(" and ")
    );
}

impl TextTokenizer {
    pub fn load(path: &Path, overrides: &SpecialTokens) -> Result<TextTokenizer> {
        let bytes = crate::util::fs::read_input("the tokenizer", path, MAX_TOKENIZER_BYTES)?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| anyhow!("{} is not a valid tokenizer.json: {e}", path.display()))?;
        drop_own_shaping(&mut inner, path);
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let config = read_config(path);
        let name = match path.file_name().and_then(|f| f.to_str()) {
            Some("tokenizer.json") => path
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|f| f.to_str())
                .unwrap_or("tokenizer"),
            _ => path
                .file_stem()
                .and_then(|f| f.to_str())
                .unwrap_or("tokenizer"),
        }
        .to_string();
        let mut t = TextTokenizer {
            inner,
            path: path.to_path_buf(),
            name,
            sha256: crate::util::hash::sha256_bytes(&bytes),
            bos: None,
            eos: None,
            pad: None,
        };
        t.bos = t.special(
            "bos",
            overrides.bos.as_deref(),
            config.as_ref(),
            BOS_NAMES,
            template_bos(&json).as_deref(),
        )?;
        t.eos = t.special(
            "eos",
            overrides.eos.as_deref(),
            config.as_ref(),
            EOS_NAMES,
            None,
        )?;
        t.pad = t.special(
            "pad",
            overrides.pad.as_deref(),
            config.as_ref(),
            PAD_NAMES,
            None,
        )?;
        Ok(t)
    }

    /// One special token's id: the override, tokenizer_config.json, the template, a known name.
    fn special(
        &self,
        kind: &str,
        over: Option<&str>,
        config: Option<&serde_json::Value>,
        names: &[&str],
        template: Option<&str>,
    ) -> Result<Option<u32>> {
        if let Some(tok) = over {
            return match self.inner.token_to_id(tok) {
                Some(id) => Ok(Some(id)),
                None => bail!(
                    "`{kind}_token = \"{tok}\"` is not in the vocabulary of {}",
                    self.path.display()
                ),
            };
        }
        if let Some(cfg) = config {
            match cfg.get(format!("{kind}_token")) {
                // An explicit null says the tokenizer has no such token.
                Some(serde_json::Value::Null) => return Ok(None),
                Some(v) => {
                    let tok = v
                        .as_str()
                        .or_else(|| v.get("content").and_then(|c| c.as_str()));
                    if let Some(id) = tok.and_then(|t| self.inner.token_to_id(t)) {
                        return Ok(Some(id));
                    }
                }
                None => {}
            }
        }
        if let Some(id) = template.and_then(|t| self.inner.token_to_id(t)) {
            return Ok(Some(id));
        }
        let added = self.inner.get_added_tokens_decoder();
        Ok(names.iter().find_map(|n| {
            added
                .iter()
                .find(|(_, t)| t.content == *n)
                .map(|(id, _)| *id)
        }))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id at padding positions: pad, else EOS, else 0 (padding is masked by position).
    pub fn pad_id(&self) -> u32 {
        self.pad.or(self.eos).unwrap_or(0)
    }

    /// BOS, or an error that names the setting to fix.
    pub fn require_bos(&self, why: &str) -> Result<u32> {
        self.bos.ok_or_else(|| {
            anyhow!(
                "the tokenizer {} has no BOS token, which {why} needs to mark where documents begin: \
                 set `bos_token` in the manifest's [defaults] (or --bos-token) to a token of its vocabulary, e.g. `<|endoftext|>`",
                self.path.display()
            )
        })
    }

    /// A document's ids: BOS (if any), then the text's tokens.
    pub fn document_ids(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(self.with_bos(enc.get_ids()))
    }

    /// Many documents at once, in parallel on the current rayon pool.
    pub fn documents_ids(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        // An `Encoding` is ~50 times its ids: small batches bound the memory, enough for the threads.
        const DOCS_PER_BATCH: usize = 64;
        let mut out = Vec::with_capacity(texts.len());
        for batch in texts.chunks(DOCS_PER_BATCH) {
            let encs = self
                .inner
                .encode_batch(batch.to_vec(), false)
                .map_err(|e| anyhow!("tokenizing: {e}"))?;
            out.extend(encs.iter().map(|e| self.with_bos(e.get_ids())));
        }
        Ok(out)
    }

    fn with_bos(&self, ids: &[u32]) -> Vec<u32> {
        let mut v = Vec::with_capacity(ids.len() + 1);
        v.extend(self.bos);
        v.extend_from_slice(ids);
        v
    }

    /// The raw tokenizer, for benchmarks that measure it alone.
    pub fn raw(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn read_config(path: &Path) -> Option<serde_json::Value> {
    let cfg = path.parent()?.join("tokenizer_config.json");
    serde_json::from_slice(&crate::util::fs::read_regular(&cfg, MAX_TOKENIZER_BYTES, None).ok()?)
        .ok()
}

/// The first special token of a TemplateProcessing's single template (Mistral's `<s> $A`).
fn template_bos(json: &serde_json::Value) -> Option<String> {
    let pp = json.get("post_processor")?;
    let pp = if pp.get("type")?.as_str()? == "Sequence" {
        pp.get("processors")?
            .as_array()?
            .iter()
            .find(|p| p.get("type").and_then(|t| t.as_str()) == Some("TemplateProcessing"))?
    } else {
        pp
    };
    let first = pp.get("single")?.as_array()?.first()?;
    first
        .get("SpecialToken")?
        .get("id")?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The bundled default tokenizer (Mistral-7B).
    pub fn mistral() -> TextTokenizer {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::config::DEFAULT_TOKENIZER);
        TextTokenizer::load(&p, &SpecialTokens::default()).unwrap()
    }

    #[test]
    fn mistral_special_tokens_come_from_its_config() {
        let t = mistral();
        assert_eq!((t.bos, t.eos, t.pad), (Some(1), Some(2), None));
        assert_eq!(t.pad_id(), 2);
        assert_eq!(t.name, "mistral-7b");
        assert_eq!(t.vocab_size(), 32000);
        // "Hello world!" -> [1, 22557, 1526, 28808] (assets.md)
        assert_eq!(
            t.document_ids("Hello world!").unwrap(),
            vec![1, 22557, 1526, 28808]
        );
        assert_eq!(t.document_ids("").unwrap(), vec![1]);
    }

    #[test]
    fn overrides_must_be_in_the_vocabulary() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::config::DEFAULT_TOKENIZER);
        let o = SpecialTokens {
            pad: Some("</s>".into()),
            ..Default::default()
        };
        assert_eq!(TextTokenizer::load(&p, &o).unwrap().pad, Some(2));
        let bad = SpecialTokens {
            bos: Some("<nope>".into()),
            ..Default::default()
        };
        let e = TextTokenizer::load(&p, &bad).err().unwrap().to_string();
        assert!(
            e.contains("`bos_token = \"<nope>\"` is not in the vocabulary"),
            "{e}"
        );
    }

    #[test]
    fn a_tokenizers_own_truncation_and_padding_are_not_used() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::config::DEFAULT_TOKENIZER);
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        json["truncation"] = serde_json::json!({
            "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0
        });
        json["padding"] = serde_json::json!({
            "strategy": "BatchLongest", "direction": "Right", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "<unk>"
        });
        let dir = tempfile::tempdir().unwrap();
        let shaped = dir.path().join("tokenizer.json");
        std::fs::write(&shaped, serde_json::to_vec(&json).unwrap()).unwrap();
        let t = TextTokenizer::load(&shaped, &SpecialTokens::default()).unwrap();
        let plain = mistral();
        let (long, short) = (
            "Hello world! This sentence has more than four tokens.",
            "Hi",
        );
        let whole = plain.document_ids(long).unwrap();
        assert!(whole.len() > 8);
        // Not cut at 4 (the file's truncation), alone or in a batch, and a
        // short document beside a long one is not padded to its length.
        assert_eq!(t.document_ids(long).unwrap(), whole);
        assert_eq!(
            t.documents_ids(&[long, short]).unwrap(),
            vec![whole, plain.document_ids(short).unwrap()]
        );
    }
}
