//! Pretokenized Parquet files: the two formats, their metadata, a writer that
//! produces one row group per call and renames into place when done, and a
//! reader that gives documents back as token ids.
//!
//! - padded: `input_ids` and `attention_mask`, seq+1 per document: BOS, the
//!   document's first tokens, then padding on the right;
//! - token-list: `tokens`, every token of the document (BOS first), never truncated.

use super::text::ParquetFile;
use crate::config::PretokenizedFormat;
use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int8Type};
use arrow_array::{Array, ArrayRef, Int32Array, Int8Array, ListArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a pretokenized file was made from; stored as Parquet key-value
/// metadata (readable by pyarrow and polars) and compared before reuse.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub format: PretokenizedFormat,
    pub tokenizer: String,
    pub tokenizer_sha256: String,
    pub sequence_length: usize,
    /// `bos-per-document`: every document starts with the BOS id; `none`.
    pub bos_policy: String,
    pub bos_id: Option<u32>,
    pub pad_id: u32,
    pub source: String,
    pub source_sha256: String,
    pub text_column: String,
    pub documents: u64,
    pub tokens: u64,
    pub sweep_version: String,
    pub created_at: String,
}

impl Meta {
    fn to_kv(&self) -> Vec<(String, String)> {
        let mut kv = vec![
            ("format", self.format.as_str().to_string()),
            ("tokenizer", self.tokenizer.clone()),
            ("tokenizer_sha256", self.tokenizer_sha256.clone()),
            ("sequence_length", self.sequence_length.to_string()),
            ("bos_policy", self.bos_policy.clone()),
            ("pad_id", self.pad_id.to_string()),
            ("source", self.source.clone()),
            ("source_sha256", self.source_sha256.clone()),
            ("text_column", self.text_column.clone()),
            ("documents", self.documents.to_string()),
            ("tokens", self.tokens.to_string()),
            ("sweep_version", self.sweep_version.clone()),
            ("created_at", self.created_at.clone()),
        ];
        if let Some(b) = self.bos_id {
            kv.push(("bos_id", b.to_string()));
        }
        kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    fn from_kv(path: &Path, kv: &[(String, String)]) -> Result<Meta> {
        let get = |k: &str| -> Result<String> {
            kv.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| anyhow!("{} is not a sweep pretokenized file (no `{k}` in its metadata); make one with `sweep pretokenize`", path.display()))
        };
        let num = |k: &str| -> Result<u64> {
            get(k)?
                .parse()
                .map_err(|_| anyhow!("bad `{k}` in the metadata of {}", path.display()))
        };
        let format = get("format")?;
        Ok(Meta {
            format: PretokenizedFormat::parse(&format)
                .ok_or_else(|| anyhow!("unknown format `{format}` in {}", path.display()))?,
            tokenizer: get("tokenizer")?,
            tokenizer_sha256: get("tokenizer_sha256")?,
            sequence_length: num("sequence_length")? as usize,
            bos_policy: get("bos_policy")?,
            bos_id: get("bos_id").ok().and_then(|v| v.parse().ok()),
            pad_id: num("pad_id")? as u32,
            source: get("source")?,
            source_sha256: get("source_sha256")?,
            text_column: get("text_column")?,
            documents: num("documents")?,
            tokens: num("tokens")?,
            sweep_version: get("sweep_version")?,
            created_at: get("created_at")?,
        })
    }

    /// Why a file with this metadata cannot stand in for `want` (None: it can).
    /// Counts, versions and times do not matter; inputs and layout do.
    pub fn mismatch(&self, want: &Meta) -> Option<String> {
        let checks: [(&str, String, String); 7] = [
            (
                "format",
                self.format.as_str().into(),
                want.format.as_str().into(),
            ),
            (
                "tokenizer sha256",
                self.tokenizer_sha256.clone(),
                want.tokenizer_sha256.clone(),
            ),
            (
                "source sha256",
                self.source_sha256.clone(),
                want.source_sha256.clone(),
            ),
            (
                "text column",
                self.text_column.clone(),
                want.text_column.clone(),
            ),
            (
                "BOS policy",
                format!("{} {:?}", self.bos_policy, self.bos_id),
                format!("{} {:?}", want.bos_policy, want.bos_id),
            ),
            ("pad id", self.pad_id.to_string(), want.pad_id.to_string()),
            (
                "sequence length",
                self.layout_length().to_string(),
                want.layout_length().to_string(),
            ),
        ];
        checks
            .into_iter()
            .find(|(_, a, b)| a != b)
            .map(|(what, a, b)| format!("{what} is {a}, want {b}"))
    }

    /// The sequence length shapes only the padded layout.
    fn layout_length(&self) -> usize {
        match self.format {
            PretokenizedFormat::Padded => self.sequence_length,
            PretokenizedFormat::TokenList => 0,
        }
    }
}

/// Documents as token ids: one flat buffer with offsets.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Docs {
    pub first: usize,
    pub offsets: Vec<usize>,
    pub ids: Vec<u32>,
}

impl Docs {
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn doc(&self, i: usize) -> &[u32] {
        &self.ids[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// An open pretokenized file.
pub struct PretokFile {
    pub file: ParquetFile,
    pub meta: Meta,
}

impl PretokFile {
    pub fn open(path: &Path) -> Result<PretokFile> {
        let file = ParquetFile::open(path)?;
        let meta = Meta::from_kv(path, &file.key_value())?;
        if file.rows() as u64 != meta.documents {
            bail!(
                "{} says it holds {} documents but has {} rows: it is incomplete or corrupt",
                path.display(),
                meta.documents,
                file.rows()
            );
        }
        Ok(PretokFile { file, meta })
    }

    pub fn docs(&self) -> usize {
        self.file.rows()
    }

    /// The documents of one row group as ids: everything for token-list, the
    /// unpadded part (attention mask = 1) for padded.
    pub fn read(&self, rg: usize) -> Result<Docs> {
        let first = self.file.row_group_rows(rg).start;
        match self.meta.format {
            PretokenizedFormat::TokenList => {
                let cols = self.file.read_columns(rg, &["tokens"])?;
                let list = cols[0]
                    .as_list_opt::<i32>()
                    .ok_or_else(|| anyhow!("`tokens` is not a list column"))?;
                let values = list
                    .values()
                    .as_primitive_opt::<Int32Type>()
                    .ok_or_else(|| anyhow!("`tokens` does not hold int32"))?;
                let base = list.value_offsets()[0] as usize;
                let offsets = list
                    .value_offsets()
                    .iter()
                    .map(|&o| o as usize - base)
                    .collect();
                let end = *list.value_offsets().last().unwrap() as usize;
                let ids = values.values()[base..end]
                    .iter()
                    .map(|&v| v as u32)
                    .collect();
                Ok(Docs {
                    first,
                    offsets,
                    ids,
                })
            }
            PretokenizedFormat::Padded => {
                let cols = self
                    .file
                    .read_columns(rg, &["input_ids", "attention_mask"])?;
                let ids_list = cols[0]
                    .as_list_opt::<i32>()
                    .ok_or_else(|| anyhow!("`input_ids` is not a list column"))?;
                let mask_list = cols[1]
                    .as_list_opt::<i32>()
                    .ok_or_else(|| anyhow!("`attention_mask` is not a list column"))?;
                let ids = ids_list
                    .values()
                    .as_primitive_opt::<Int32Type>()
                    .ok_or_else(|| anyhow!("`input_ids` does not hold int32"))?
                    .values();
                let mask = mask_list
                    .values()
                    .as_primitive_opt::<Int8Type>()
                    .ok_or_else(|| anyhow!("`attention_mask` does not hold int8"))?
                    .values();
                let mut docs = Docs {
                    first,
                    offsets: Vec::with_capacity(ids_list.len() + 1),
                    ids: Vec::with_capacity(ids.len()),
                };
                docs.offsets.push(0);
                let width = self.meta.sequence_length + 1;
                for row in 0..ids_list.len() {
                    let (a, b) = (
                        ids_list.value_offsets()[row] as usize,
                        ids_list.value_offsets()[row + 1] as usize,
                    );
                    let ma = mask_list.value_offsets()[row] as usize;
                    let mb = mask_list.value_offsets()[row + 1] as usize;
                    if b - a != width || mb - ma != width {
                        bail!(
                            "row {} of {} has {} ids and {} mask values, not seq+1 = {width}",
                            first + row,
                            self.file.path.display(),
                            b - a,
                            mb - ma
                        );
                    }
                    // Right padding: the real tokens are the leading run of ones.
                    let row_mask = &mask[ma..mb];
                    let n = row_mask.iter().take_while(|&&m| m == 1).count();
                    if row_mask[n..].iter().any(|&m| m != 0) {
                        bail!(
                            "row {} of {} is not right-padded (its attention mask is not ones then zeros): it would train on padding",
                            first + row,
                            self.file.path.display()
                        );
                    }
                    docs.ids.extend(ids[a..a + n].iter().map(|&v| v as u32));
                    docs.offsets.push(docs.ids.len());
                }
                Ok(docs)
            }
        }
    }
}

/// Writes a pretokenized file row group by row group into a temporary file
/// beside the target, which `finish` renames into place.
pub struct PretokWriter {
    format: PretokenizedFormat,
    seq_plus_one: usize,
    pad_id: u32,
    writer: ArrowWriter<std::fs::File>,
    tmp: tempfile::TempPath,
    target: PathBuf,
    schema: Arc<Schema>,
    pub documents: u64,
    pub tokens: u64,
}

fn list_field(t: DataType) -> Arc<Field> {
    Arc::new(Field::new_list_field(t, false))
}

impl PretokWriter {
    /// `meta` describes the inputs; its counts are filled in by `finish`.
    pub fn create(target: &Path, meta: &Meta, row_group_size: usize) -> Result<PretokWriter> {
        let (format, seq_len, pad_id) = (meta.format, meta.sequence_length, meta.pad_id);
        let dir = crate::util::fs::parent_dir(target);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (file, tmp) = crate::util::fs::temp_beside(target, ".pretokenize-")?.into_parts();
        // Everything but the counts goes into the Arrow schema, so that
        // pyarrow's and polars' schema metadata show it ...
        let schema_meta = meta
            .to_kv()
            .into_iter()
            .filter(|(k, _)| k != "documents" && k != "tokens")
            .collect::<std::collections::HashMap<_, _>>();
        let schema = Arc::new(
            match format {
                PretokenizedFormat::Padded => Schema::new(vec![
                    Field::new(
                        "input_ids",
                        DataType::List(list_field(DataType::Int32)),
                        false,
                    ),
                    Field::new(
                        "attention_mask",
                        DataType::List(list_field(DataType::Int8)),
                        false,
                    ),
                ]),
                PretokenizedFormat::TokenList => Schema::new(vec![Field::new(
                    "tokens",
                    DataType::List(list_field(DataType::Int32)),
                    false,
                )]),
            }
            .with_metadata(schema_meta),
        );
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(row_group_size.max(1)))
            .build();
        let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
        // ... and into the footer's key-value metadata, which every Parquet reader sees.
        for (k, v) in schema.metadata() {
            writer.append_key_value_metadata(KeyValue::new(k.clone(), v.clone()));
        }
        Ok(PretokWriter {
            format,
            seq_plus_one: seq_len + 1,
            pad_id,
            writer,
            tmp,
            target: target.to_path_buf(),
            schema,
            documents: 0,
            tokens: 0,
        })
    }

    /// Writes documents (ids with BOS) as one row group.
    pub fn write(&mut self, docs: &[Vec<u32>]) -> Result<()> {
        let columns: Vec<ArrayRef> = match self.format {
            PretokenizedFormat::TokenList => {
                let mut offsets = Vec::with_capacity(docs.len() + 1);
                offsets.push(0i32);
                let total: usize = docs.iter().map(Vec::len).sum();
                let mut values = Vec::with_capacity(total);
                for d in docs {
                    values.extend(d.iter().map(|&v| v as i32));
                    offsets.push(values.len() as i32);
                }
                vec![Arc::new(ListArray::try_new(
                    list_field(DataType::Int32),
                    arrow_buffer::OffsetBuffer::new(offsets.into()),
                    Arc::new(Int32Array::from(values)),
                    None,
                )?)]
            }
            PretokenizedFormat::Padded => {
                let n = self.seq_plus_one;
                let mut ids = Vec::with_capacity(docs.len() * n);
                let mut mask = Vec::with_capacity(docs.len() * n);
                for d in docs {
                    let k = d.len().min(n);
                    ids.extend(d[..k].iter().map(|&v| v as i32));
                    ids.extend(std::iter::repeat_n(self.pad_id as i32, n - k));
                    mask.extend(std::iter::repeat_n(1i8, k));
                    mask.extend(std::iter::repeat_n(0i8, n - k));
                }
                let offsets = || {
                    arrow_buffer::OffsetBuffer::<i32>::from_lengths(std::iter::repeat_n(
                        n,
                        docs.len(),
                    ))
                };
                vec![
                    Arc::new(ListArray::try_new(
                        list_field(DataType::Int32),
                        offsets(),
                        Arc::new(Int32Array::from(ids)),
                        None,
                    )?),
                    Arc::new(ListArray::try_new(
                        list_field(DataType::Int8),
                        offsets(),
                        Arc::new(Int8Array::from(mask)),
                        None,
                    )?),
                ]
            }
        };
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.writer.write(&batch)?;
        self.writer.flush()?;
        self.documents += docs.len() as u64;
        self.tokens += docs.iter().map(|d| d.len() as u64).sum::<u64>();
        Ok(())
    }

    /// Stores the counts, closes the file and renames it into place.
    pub fn finish(mut self) -> Result<PathBuf> {
        for (k, v) in [("documents", self.documents), ("tokens", self.tokens)] {
            self.writer
                .append_key_value_metadata(KeyValue::new(k.to_string(), v.to_string()));
        }
        self.writer.close().context("finishing the Parquet file")?;
        self.tmp
            .persist(&self.target)
            .with_context(|| format!("renaming into {}", self.target.display()))?;
        Ok(self.target)
    }
}
