//! Reading the text column of a Parquet dataset, one row group at a time.

use anyhow::{anyhow, bail, Context, Result};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// An open Parquet file with its metadata read once; row groups are read on demand.
pub struct ParquetFile {
    pub path: PathBuf,
    file: File,
    meta: ArrowReaderMetadata,
    /// First row of every row group, plus the total at the end.
    starts: Vec<usize>,
}

impl ParquetFile {
    pub fn open(path: &Path) -> Result<ParquetFile> {
        Self::open_with(path, ArrowReaderOptions::new())
    }

    fn open_with(path: &Path, options: ArrowReaderOptions) -> Result<ParquetFile> {
        let file = crate::util::fs::open_input("the dataset", path)?;
        let meta = ArrowReaderMetadata::load(&file, options)
            .map_err(|e| anyhow!("{} is not a readable Parquet file ({e})", path.display()))?;
        let mut starts = vec![0usize];
        for rg in meta.metadata().row_groups() {
            starts.push(starts.last().unwrap() + rg.num_rows() as usize);
        }
        Ok(ParquetFile {
            path: path.to_path_buf(),
            file,
            meta,
            starts,
        })
    }

    pub fn rows(&self) -> usize {
        *self.starts.last().unwrap()
    }

    pub fn row_groups(&self) -> usize {
        self.starts.len() - 1
    }

    /// The rows a row group holds.
    pub fn row_group_rows(&self, rg: usize) -> Range<usize> {
        self.starts[rg]..self.starts[rg + 1]
    }

    /// The row group that holds a row.
    pub fn row_group_of(&self, row: usize) -> usize {
        self.starts.partition_point(|&s| s <= row) - 1
    }

    pub fn key_value(&self) -> Vec<(String, String)> {
        self.meta
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .map(|kv| {
                kv.iter()
                    .map(|k| (k.key.clone(), k.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn column_names(&self) -> Vec<String> {
        self.meta
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub fn column_type(&self, name: &str) -> Option<DataType> {
        self.meta
            .schema()
            .field_with_name(name)
            .ok()
            .map(|f| f.data_type().clone())
    }

    /// The named columns of one row group.
    pub fn read_columns(&self, rg: usize, names: &[&str]) -> Result<Vec<ArrayRef>> {
        let schema = self.meta.schema();
        let mut roots = Vec::new();
        for n in names {
            roots.push(schema.index_of(n).map_err(|_| self.missing(n))?);
        }
        let mask = ProjectionMask::roots(self.meta.parquet_schema(), roots.clone());
        let file = self.file.try_clone().context("reopening the dataset")?;
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.meta.clone())
            .with_row_groups(vec![rg])
            .with_projection(mask)
            .with_batch_size(self.row_group_rows(rg).len().max(1))
            .build()
            .with_context(|| format!("reading row group {rg} of {}", self.path.display()))?;
        let mut parts: Vec<Vec<ArrayRef>> = vec![Vec::new(); names.len()];
        for batch in reader {
            let batch = batch.map_err(|e| {
                anyhow!(
                    // Arrow's reason says what (a corrupt page, text that
                    // is not UTF-8): it is passed on, not guessed at.
                    "row group {rg} of {} cannot be decoded: {e}",
                    self.path.display()
                )
            })?;
            for (i, n) in names.iter().enumerate() {
                parts[i].push(batch.column_by_name(n).expect("projected column").clone());
            }
        }
        parts
            .into_iter()
            .map(|p| match p.len() {
                1 => Ok(p.into_iter().next().unwrap()),
                _ => {
                    let refs: Vec<&dyn Array> = p.iter().map(|a| a.as_ref()).collect();
                    arrow_select::concat::concat(&refs).map_err(Into::into)
                }
            })
            .collect()
    }

    pub fn missing(&self, column: &str) -> anyhow::Error {
        anyhow!(
            "{} has no column `{column}` (its columns: {}); set `text_column` to the one that holds the text",
            self.path.display(),
            self.column_names().join(", ")
        )
    }
}

/// The texts of one row group, borrowed from Arrow's buffers.
pub struct TextChunk {
    array: ArrayRef,
    pub first_doc: usize,
}

impl TextChunk {
    pub fn len(&self) -> usize {
        self.array.len()
    }

    pub fn is_empty(&self) -> bool {
        self.array.is_empty()
    }

    /// Document `i` of the chunk (a null row reads as an empty document).
    pub fn get(&self, i: usize) -> Result<&str> {
        if self.array.is_null(i) {
            return Ok("");
        }
        match self.array.data_type() {
            DataType::Utf8 => Ok(self.array.as_string::<i32>().value(i)),
            DataType::LargeUtf8 => Ok(self.array.as_string::<i64>().value(i)),
            DataType::Utf8View => Ok(self.array.as_string_view().value(i)),
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                let bytes = match self.array.data_type() {
                    DataType::Binary => self.array.as_binary::<i32>().value(i),
                    DataType::BinaryView => self.array.as_binary_view().value(i),
                    _ => self.array.as_binary::<i64>().value(i),
                };
                std::str::from_utf8(bytes).map_err(|e| {
                    anyhow!(
                        "document {} is not valid UTF-8 (at byte {}); re-encode the dataset, e.g. with `sweep data import-text`",
                        self.first_doc + i,
                        e.valid_up_to()
                    )
                })
            }
            other => bail!("the text column holds {other}, not strings"),
        }
    }

    /// Null rows (each read as an empty document).
    pub fn nulls(&self) -> usize {
        self.array.null_count()
    }

    pub fn texts(&self) -> Result<Vec<&str>> {
        (0..self.len()).map(|i| self.get(i)).collect()
    }
}

/// A dataset's text column.
pub struct TextFile {
    pub file: ParquetFile,
    pub column: String,
}

impl TextFile {
    pub fn open(path: &Path, column: &str) -> Result<TextFile> {
        let mut file = ParquetFile::open(path)?;
        if let Some(DataType::Dictionary(..)) = file.column_type(column) {
            // A dictionary (pandas' category, polars' Categorical) is only
            // the file's Arrow schema's hint: Parquet stores the column as
            // its texts, and read without the hint it is plain text.
            let plain = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
            file = ParquetFile::open_with(path, plain)?;
        }
        match file.column_type(column) {
            None => return Err(file.missing(column)),
            Some(
                DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView,
            ) => {}
            Some(other) => bail!(
                "column `{column}` of {} holds {other}, not text",
                path.display()
            ),
        }
        Ok(TextFile {
            file,
            column: column.to_string(),
        })
    }

    pub fn docs(&self) -> usize {
        self.file.rows()
    }

    pub fn read(&self, rg: usize) -> Result<TextChunk> {
        let array = self.file.read_columns(rg, &[&self.column])?.remove(0);
        Ok(TextChunk {
            array,
            first_doc: self.file.row_group_rows(rg).start,
        })
    }
}
