//! The data path: text datasets, tokenizers, pretokenized files, and the
//! loaders that turn either into training batches.
//!
//! `import` (text files -> Parquet) and `pretokenize` (Parquet text -> ids)
//! prepare data; `loader` feeds the trainer; `verify` proves pretokenized and
//! on-the-fly data are the same.

pub mod import;
pub mod loader;
pub mod pretokenize;
pub mod pretokenized;
pub mod samples;
pub mod text;
pub mod tokenizer;
pub mod verify;

pub use loader::{Batch, DataLoader, DataSpec, LoaderState, SampleStream, SourceSpec};
pub use tokenizer::{SpecialTokens, TextTokenizer};
