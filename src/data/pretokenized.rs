//! Pretokenized Parquet files: the two formats, their metadata, a writer (a row group per call,
//! renamed into place when done) and a reader giving documents back as ids. Padded: `input_ids`
//! and `attention_mask`, seq+1 per document, BOS first, right-padded; token-list: `tokens`,
//! every token (BOS first), never truncated.

use super::text::ParquetFile;
use crate::config::PretokenizedFormat;
use anyhow::{anyhow, bail, Context, Result};
use arrow_array::{ArrayRef, Int32Array, Int8Array, ListArray, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::column::reader::get_typed_column_reader;
use parquet::data_type::Int32Type;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a pretokenized file was made from: Parquet key-value metadata, compared before reuse.
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
            format: format
                .parse::<PretokenizedFormat>()
                .map_err(|_| anyhow!("unknown format `{format}` in {}", path.display()))?,
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

    /// Why a file with this metadata cannot stand in for `want`: inputs and layout matter.
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

/// An open pretokenized file, decoded by parquet's column reader into flat buffers (three times
/// Arrow's list arrays: this is the loaders' hot path).
pub struct PretokFile {
    pub file: ParquetFile,
    pub meta: Meta,
    reader: SerializedFileReader<std::fs::File>,
    /// Leaf columns: `tokens` or `input_ids`, then `attention_mask`.
    leaves: Vec<usize>,
}

/// Reusable decode buffers.
#[derive(Default)]
pub struct Scratch {
    values: Vec<i32>,
    mask: Vec<i32>,
    def: Vec<i16>,
    rep: Vec<i16>,
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
        let handle = crate::util::fs::open_input("the dataset", path)?;
        let reader = SerializedFileReader::new(handle)
            .map_err(|e| anyhow!("{} is not a readable Parquet file ({e})", path.display()))?;
        let names: &[&str] = match meta.format {
            PretokenizedFormat::TokenList => &["tokens"],
            PretokenizedFormat::Padded => &["input_ids", "attention_mask"],
        };
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let leaves = names
            .iter()
            .map(|n| {
                (0..schema.num_columns())
                    .find(|&i| schema.column(i).path().parts()[0] == *n)
                    .ok_or_else(|| anyhow!("{} has no `{n}` column", path.display()))
            })
            .collect::<Result<_>>()?;
        Ok(PretokFile {
            file,
            meta,
            reader,
            leaves,
        })
    }

    pub fn docs(&self) -> usize {
        self.file.rows()
    }

    /// One row group's documents as ids (padded: the masked part only).
    pub fn read(&self, rg: usize) -> Result<Docs> {
        let mut docs = Docs::default();
        self.read_into(rg, &mut docs, &mut Scratch::default())?;
        Ok(docs)
    }

    /// Like `read`, reusing the buffers of `docs` and `scratch`.
    pub fn read_into(&self, rg: usize, docs: &mut Docs, s: &mut Scratch) -> Result<()> {
        let rows = self.file.row_group_rows(rg);
        let group = self.reader.get_row_group(rg)?;
        let path = self.file.path.display();
        let read_leaf = |leaf: usize,
                         values: &mut Vec<i32>,
                         s_def: &mut Vec<i16>,
                         s_rep: &mut Vec<i16>|
         -> Result<()> {
            values.clear();
            s_def.clear();
            s_rep.clear();
            let mut col = get_typed_column_reader::<Int32Type>(group.get_column_reader(leaf)?);
            let (records, _, _) = col
                .read_records(rows.len(), Some(s_def), Some(s_rep), values)
                .map_err(|e| anyhow!("{path} is corrupt in row group {rg}: {e}"))?;
            if records != rows.len() {
                bail!(
                    "{path}: row group {rg} holds {records} rows, its metadata says {}",
                    rows.len()
                );
            }
            Ok(())
        };
        read_leaf(self.leaves[0], &mut s.values, &mut s.def, &mut s.rep)?;
        docs.first = rows.start;
        docs.offsets.clear();
        docs.ids.clear();
        match self.meta.format {
            PretokenizedFormat::TokenList => {
                // A record starts at repetition level 0; definition level 0 is an empty list.
                if s.def.iter().all(|&d| d > 0) {
                    // No empty lists (the usual case): scan blocks of repetition levels for record starts.
                    const BLOCK: usize = 64;
                    for (b, block) in s.rep.chunks(BLOCK).enumerate() {
                        if block.contains(&0) {
                            for (j, &r) in block.iter().enumerate() {
                                if r == 0 {
                                    docs.offsets.push(b * BLOCK + j);
                                }
                            }
                        }
                    }
                    docs.offsets.push(s.values.len());
                } else {
                    let mut v = 0;
                    for (&r, &d) in s.rep.iter().zip(&s.def) {
                        if r == 0 {
                            docs.offsets.push(v);
                        }
                        v += usize::from(d > 0);
                    }
                    docs.offsets.push(v);
                }
                docs.ids.extend(s.values.iter().map(|&x| x as u32));
            }
            PretokenizedFormat::Padded => {
                let (mut mask, mut def, mut rep) =
                    (std::mem::take(&mut s.mask), Vec::new(), Vec::new());
                read_leaf(self.leaves[1], &mut mask, &mut def, &mut rep)?;
                let width = self.meta.sequence_length + 1;
                if s.values.len() != rows.len() * width || mask.len() != s.values.len() {
                    bail!(
                        "{path}: row group {rg} holds {} ids and {} mask values for {} rows of seq+1 = {width}",
                        s.values.len(),
                        mask.len(),
                        rows.len()
                    );
                }
                docs.offsets.push(0);
                for (row, (ids, m)) in s
                    .values
                    .chunks_exact(width)
                    .zip(mask.chunks_exact(width))
                    .enumerate()
                {
                    // Right padding: the real tokens are the leading run of ones.
                    let n = m.iter().take_while(|&&x| x == 1).count();
                    if m[n..].iter().any(|&x| x != 0) {
                        bail!(
                            "row {} of {path} is not right-padded (its attention mask is not ones then zeros): it would train on padding",
                            rows.start + row
                        );
                    }
                    docs.ids.extend(ids[..n].iter().map(|&x| x as u32));
                    docs.offsets.push(docs.ids.len());
                }
                s.mask = mask;
            }
        }
        Ok(())
    }
}

/// The most documents in one row group (built in memory before it is written).
pub const MAX_ROW_GROUP_SIZE: usize = 1_000_000;

/// The most ids one padded row group holds: 5 bytes each in memory, 1.3 GB here.
pub const MAX_ROW_GROUP_TOKENS: usize = 1 << 28;

/// What a pretokenized file is called while it is written, beside its target.
pub const TEMP_PREFIX: &str = ".pretokenize-";

/// Writes a pretokenized file row group by row group into a temporary `finish` renames.
pub struct PretokWriter {
    format: PretokenizedFormat,
    seq_plus_one: usize,
    pad_id: u32,
    writer: ArrowWriter<std::fs::File>,
    tmp: tempfile::TempPath,
    /// Held until the file is in place: it is being written, not left behind.
    _lock: std::fs::File,
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
        crate::util::fs::make_dir(dir)?;
        let (file, tmp, lock) = crate::util::fs::locked_temp_beside(target, TEMP_PREFIX)?;
        // Everything but the counts goes into the Arrow schema, for pyarrow's and polars' metadata ...
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
        // The mask is runs of ones then zeros: delta encoding stores it in next to nothing.
        let mask = parquet::schema::types::ColumnPath::from(vec![
            "attention_mask".to_string(),
            "list".to_string(),
            "item".to_string(),
        ]);
        let tokens = parquet::schema::types::ColumnPath::from(vec![
            "tokens".to_string(),
            "list".to_string(),
            "item".to_string(),
        ]);
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(row_group_size.max(1)))
            .set_column_dictionary_enabled(mask.clone(), false)
            .set_column_encoding(mask, parquet::basic::Encoding::DELTA_BINARY_PACKED)
            .set_column_dictionary_enabled(tokens.clone(), false)
            .set_column_compression(tokens, Compression::UNCOMPRESSED)
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
            _lock: lock,
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
        crate::util::fs::persist(self.tmp, &self.target)?;
        Ok(self.target)
    }
}
