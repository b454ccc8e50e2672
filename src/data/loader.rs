//! The four loaders: padded or padding-free, from text tokenized on the fly or
//! from a pretokenized file. They differ only in where a document's ids come
//! from (`Source`); sample construction is shared (`samples`).
//!
//! A stream reads a range of documents in order, wraps around at its end and
//! skips documents with no tokens. With several ranks ([`DataOrder`]):
//! - global (the default): every rank reads the one sample sequence of the
//!   whole dataset and keeps its slice of each micro-batch (rank r of W at
//!   batch B: samples r·B … r·B+B−1 of every W·B), building the others' only
//!   as far as the sequence needs (padding-free windows, empty documents),
//!   never copying them. The samples of a step are the same whatever the
//!   world size, and so is the position after it: one [`LoaderState`] for all
//!   ranks, from which any world size resumes.
//! - contiguous: each rank reads its own range of documents ([`shard`]), as
//!   the reference study does, and has a position of its own.
//!
//! A background thread keeps `prefetch` batches ready, as contiguous integer
//! buffers.

use super::pretokenized::{Docs, PretokFile, Scratch};
use super::samples::{self, TokenBuffer};
use super::text::{TextChunk, TextFile};
use super::tokenizer::TextTokenizer;
use crate::config::{DataOrder, DatasetType, PretokenizedFormat};
use anyhow::{anyhow, bail, Result};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where documents come from.
#[derive(Debug, Clone)]
pub enum SourceSpec {
    /// A Parquet text column, tokenized as it is read.
    Text { path: PathBuf, column: String },
    /// A file written by `sweep pretokenize`.
    Pretokenized { path: PathBuf },
}

/// Everything a loader needs, resolved from a run's configuration.
#[derive(Clone)]
pub struct DataSpec {
    pub dataset_type: DatasetType,
    pub seq_len: usize,
    pub source: SourceSpec,
    pub tokenizer: Arc<TextTokenizer>,
    pub rank: usize,
    pub world_size: usize,
    pub order: DataOrder,
    /// Documents at the end of the dataset kept out of training (validation).
    pub holdout: usize,
}

/// Where a loader stands: enough to resume exactly (stored in checkpoints).
/// In the global order it is the same on every rank after a micro-batch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    pub epoch: u64,
    /// The next document of the range to read.
    pub next_doc: usize,
    /// Padding-free: the tokens waiting in the buffer.
    pub buffer: Vec<u32>,
    /// Samples of the sequence so far (in the global order, every rank's).
    pub samples: u64,
}

/// The documents of rank `rank` of `world`: a contiguous range.
pub fn shard(docs: usize, rank: usize, world: usize) -> Range<usize> {
    (rank * docs / world)..((rank + 1) * docs / world)
}

/// Where a cursor's documents come from, each kind with the row group it
/// has at hand.
enum Source {
    /// Text tokenized as it is read.
    Text {
        file: TextFile,
        tok: Arc<TextTokenizer>,
        chunk: Option<(usize, TextChunk)>,
        /// Tokens of the current document.
        tokens: Vec<u32>,
    },
    /// A pretokenized file: row groups are decoded one ahead on a helper
    /// thread, so decoding overlaps with building samples.
    Pretok {
        file: Arc<PretokFile>,
        docs: Option<(usize, Docs)>,
        ahead: Option<(usize, Pending)>,
        /// Buffers to decode into when nothing is read ahead.
        spare: Option<(Docs, Scratch)>,
    },
}

impl Source {
    fn text(file: TextFile, tok: Arc<TextTokenizer>) -> Source {
        Source::Text {
            file,
            tok,
            chunk: None,
            tokens: Vec::new(),
        }
    }

    fn pretokenized(file: PretokFile) -> Source {
        Source::Pretok {
            file: Arc::new(file),
            docs: None,
            ahead: None,
            spare: None,
        }
    }
}

/// A pretokenized row group being decoded on a helper thread.
type Pending = std::thread::JoinHandle<Result<(Docs, Scratch)>>;

/// Reads the documents of a range in order, forever, wrapping at its end.
struct DocCursor {
    source: Source,
    range: Range<usize>,
    next: usize,
    epoch: u64,
}

impl DocCursor {
    fn new(source: Source, range: Range<usize>) -> DocCursor {
        DocCursor {
            source,
            next: range.start,
            range,
            epoch: 0,
        }
    }

    fn parquet(&self) -> &super::text::ParquetFile {
        match &self.source {
            Source::Text { file, .. } => &file.file,
            Source::Pretok { file, .. } => &file.file,
        }
    }

    fn docs(&self) -> usize {
        self.parquet().rows()
    }

    /// Positions the cursor (after a restore), dropping any read-ahead.
    fn seek(&mut self, next: usize, epoch: u64) {
        self.next = next;
        self.epoch = epoch;
        if let Source::Pretok { ahead, .. } = &mut self.source {
            *ahead = None;
        }
    }

    /// Moves on to the next document (wrapping around at the end of the
    /// range); returns its index.
    fn step(&mut self) -> usize {
        if self.next >= self.range.end {
            self.next = self.range.start;
            self.epoch += 1;
        }
        self.next += 1;
        self.next - 1
    }

    /// Whether the next document has more than `empty_len` ids, without
    /// tokenizing all of it: a padded sample of another rank needs no more.
    /// A text whose first few hundred bytes already give a token has one;
    /// only a text whose beginning gives none is tokenized whole.
    fn next_doc_has_tokens(&mut self, empty_len: usize) -> Result<bool> {
        if !matches!(self.source, Source::Text { .. }) {
            return Ok(self.next_doc()?.len() > empty_len);
        }
        let i = self.step();
        let Source::Text {
            file, tok, chunk, ..
        } = &mut self.source
        else {
            unreachable!("a text source, checked above");
        };
        let rg = file.file.row_group_of(i);
        let c = match chunk {
            Some((r, c)) if *r == rg => c,
            _ => &chunk.insert((rg, file.read(rg)?)).1,
        };
        let text = c.get(i - c.first_doc)?;
        const PREFIX: usize = 256;
        let mut end = text.len().min(PREFIX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if tok.document_ids(&text[..end])?.len() > empty_len {
            return Ok(true);
        }
        Ok(end < text.len() && tok.document_ids(text)?.len() > empty_len)
    }

    /// The next document's ids, borrowed until the next call.
    fn next_doc(&mut self) -> Result<&[u32]> {
        let i = self.step();
        let rg = self.parquet().row_group_of(i);
        let range = self.range.clone();
        match &mut self.source {
            Source::Text {
                file,
                tok,
                chunk,
                tokens,
            } => {
                let c = match chunk {
                    Some((r, c)) if *r == rg => c,
                    _ => &chunk.insert((rg, file.read(rg)?)).1,
                };
                *tokens = tok.document_ids(c.get(i - c.first_doc)?)?;
                Ok(tokens)
            }
            Source::Pretok {
                file,
                docs,
                ahead,
                spare,
            } => {
                if docs.as_ref().is_none_or(|(r, _)| *r != rg) {
                    load_row_group(file, rg, &range, docs, ahead, spare)?;
                }
                let (_, d) = docs.as_ref().expect("just loaded");
                Ok(d.doc(i - d.first))
            }
        }
    }
}

/// Makes row group `rg` of a pretokenized file the current one (taking it
/// from the read-ahead when that is the one being decoded) and starts
/// decoding the row group after it, within `range`, on a helper thread.
fn load_row_group(
    file: &Arc<PretokFile>,
    rg: usize,
    range: &Range<usize>,
    docs: &mut Option<(usize, Docs)>,
    ahead: &mut Option<(usize, Pending)>,
    spare: &mut Option<(Docs, Scratch)>,
) -> Result<()> {
    let (current, scratch) = match ahead.take() {
        Some((r, h)) if r == rg => h
            .join()
            .map_err(|_| anyhow!("the read-ahead thread panicked"))??,
        _ => {
            let (mut d, mut s) = spare.take().unwrap_or_default();
            file.read_into(rg, &mut d, &mut s)?;
            (d, s)
        }
    };
    // The previous row group's buffers go to the read-ahead of the next one.
    let mut d = docs
        .replace((rg, current))
        .map(|(_, d)| d)
        .unwrap_or_default();
    let mut s = scratch;
    let end_rg = file.file.row_group_of(range.end - 1);
    let next_rg = if rg >= end_rg {
        file.file.row_group_of(range.start)
    } else {
        rg + 1
    };
    if next_rg != rg {
        let f = Arc::clone(file);
        let h = std::thread::Builder::new()
            .name("sweep-read-ahead".into())
            .spawn(move || f.read_into(next_rg, &mut d, &mut s).map(|()| (d, s)))?;
        *ahead = Some((next_rg, h));
    } else {
        *spare = Some((d, s));
    }
    Ok(())
}

/// Which samples of a stream's sequence a rank keeps: of every
/// `world × batch`, the `batch` from `rank × batch` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slice {
    rank: usize,
    world: usize,
}

impl Slice {
    const ALL: Slice = Slice { rank: 0, world: 1 };
}

/// Samples from a range of documents: one rank's, or the whole sequence of
/// which a rank keeps its slice.
pub struct SampleStream {
    cursor: DocCursor,
    slice: Slice,
    kind: DatasetType,
    seq: usize,
    bos: Option<u32>,
    pad: u32,
    buffer: TokenBuffer,
    samples: u64,
}

impl SampleStream {
    /// A stream over this rank's training samples: its slice of the global
    /// sequence, or its shard's.
    pub fn open(spec: &DataSpec) -> Result<SampleStream> {
        let source = open_source(spec)?;
        let mut s = Self::over(spec, source, 0..0)?;
        let total = s.cursor.docs();
        if spec.holdout >= total {
            bail!(
                "validation_documents ({}) leaves no training documents of {total}",
                spec.holdout
            );
        }
        let training = total - spec.holdout;
        let range = match spec.order {
            DataOrder::Global => {
                s.slice = Slice {
                    rank: spec.rank,
                    world: spec.world_size,
                };
                0..training
            }
            DataOrder::Contiguous => shard(training, spec.rank, spec.world_size),
        };
        if range.is_empty() {
            bail!(
                "rank {} of {} gets no documents: the dataset has only {total}",
                spec.rank,
                spec.world_size
            );
        }
        s.cursor.range = range.clone();
        s.cursor.next = range.start;
        Ok(s)
    }

    /// A stream over the held-out documents (the same for every rank).
    pub fn open_validation(spec: &DataSpec) -> Result<SampleStream> {
        let source = open_source(spec)?;
        let mut s = Self::over(spec, source, 0..0)?;
        let total = s.cursor.docs();
        s.cursor.range = (total - spec.holdout.min(total))..total;
        s.cursor.next = s.cursor.range.start;
        Ok(s)
    }

    fn over(spec: &DataSpec, source: Source, range: Range<usize>) -> Result<SampleStream> {
        if spec.seq_len == 0 {
            bail!("the sequence length must be at least 1 token");
        }
        if spec.world_size == 0 || spec.rank >= spec.world_size {
            bail!(
                "rank {} of {} ranks does not exist",
                spec.rank,
                spec.world_size
            );
        }
        let bos = match spec.dataset_type {
            DatasetType::PaddingFree => Some(spec.tokenizer.require_bos("padding-free data")?),
            DatasetType::Padded => spec.tokenizer.bos,
        };
        Ok(SampleStream {
            cursor: DocCursor::new(source, range),
            slice: Slice::ALL,
            kind: spec.dataset_type,
            seq: spec.seq_len,
            bos,
            pad: spec.tokenizer.pad_id(),
            buffer: TokenBuffer::default(),
            samples: 0,
        })
    }

    /// Fills one sample; returns its training tokens (labels not -100).
    pub fn next_into(&mut self, inputs: &mut [u32], labels: &mut [i64]) -> Result<usize> {
        self.advance(Some((inputs, labels)))
    }

    /// Passes over the next `n` samples of the sequence (other ranks'):
    /// their documents are read, nothing is copied.
    fn skip(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            self.advance(None)?;
        }
        Ok(())
    }

    /// The next sample of the sequence, into `out` when given; returns its
    /// training tokens (0 when skipped). Documents without tokens are
    /// skipped; a whole pass over the range without one is an error rather
    /// than a hang.
    fn advance(&mut self, out: Option<(&mut [u32], &mut [i64])>) -> Result<usize> {
        self.samples += 1;
        let empty_len = usize::from(self.bos.is_some());
        let mut skipped = 0;
        loop {
            if let DatasetType::PaddingFree = self.kind {
                if self.buffer.ready(self.seq) {
                    let bos = self.bos.expect("padding-free streams have a BOS");
                    return Ok(match out {
                        Some((inputs, labels)) => self.buffer.take(self.seq, bos, inputs, labels),
                        None => {
                            self.buffer.pass(self.seq);
                            0
                        }
                    });
                }
            }
            // Another rank's padded sample: only whether it has tokens matters.
            if let (DatasetType::Padded, None) = (self.kind, &out) {
                if self.cursor.next_doc_has_tokens(empty_len)? {
                    return Ok(0);
                }
                skipped += 1;
                if skipped > self.cursor.range.len() {
                    bail!("documents {:?} hold no tokens at all", self.cursor.range);
                }
                continue;
            }
            let doc = self.cursor.next_doc()?;
            if doc.len() <= empty_len {
                skipped += 1;
                if skipped > self.cursor.range.len() {
                    bail!("documents {:?} hold no tokens at all", self.cursor.range);
                }
                continue;
            }
            skipped = 0;
            match self.kind {
                DatasetType::Padded => {
                    return Ok(match out {
                        Some((inputs, labels)) => {
                            samples::padded(doc, self.seq, self.pad, inputs, labels)
                        }
                        None => 0,
                    })
                }
                DatasetType::PaddingFree => self
                    .buffer
                    .push(doc, self.bos.expect("padding-free streams have a BOS")),
            }
        }
    }

    /// One sample as owned vectors (for `sweep data dump` and tests).
    pub fn next_sample(&mut self) -> Result<(Vec<u32>, Vec<i64>)> {
        let (mut i, mut l) = (vec![0; self.seq], vec![0; self.seq]);
        self.next_into(&mut i, &mut l)?;
        Ok((i, l))
    }

    pub fn state(&self) -> LoaderState {
        LoaderState {
            epoch: self.cursor.epoch,
            next_doc: self.cursor.next,
            buffer: self.buffer.snapshot(),
            samples: self.samples,
        }
    }

    /// Continues exactly where `state` left off.
    pub fn restore(&mut self, state: &LoaderState) -> Result<()> {
        if state.next_doc < self.cursor.range.start || state.next_doc > self.cursor.range.end {
            bail!(
                "the checkpoint's data position (document {}) is outside this rank's shard {:?}: was the dataset or world size changed?",
                state.next_doc,
                self.cursor.range
            );
        }
        self.cursor.seek(state.next_doc, state.epoch);
        self.buffer = TokenBuffer::restore(state.buffer.clone());
        self.samples = state.samples;
        Ok(())
    }

    pub fn seq_len(&self) -> usize {
        self.seq
    }
}

fn open_source(spec: &DataSpec) -> Result<Source> {
    Ok(match &spec.source {
        SourceSpec::Text { path, column } => {
            Source::text(TextFile::open(path, column)?, spec.tokenizer.clone())
        }
        SourceSpec::Pretokenized { path } => {
            let p = PretokFile::open(path)?;
            check_pretokenized(&p, spec)?;
            Source::pretokenized(p)
        }
    })
}

/// A pretokenized file must come from this tokenizer and fit this layout.
fn check_pretokenized(p: &PretokFile, spec: &DataSpec) -> Result<()> {
    let path = p.file.path.display();
    let m = &p.meta;
    if m.tokenizer_sha256 != spec.tokenizer.sha256 {
        bail!(
            "{path} was tokenized with {} (sha256 {}), not with {}: pretokenize it again",
            m.tokenizer,
            &m.tokenizer_sha256[..12.min(m.tokenizer_sha256.len())],
            spec.tokenizer.path.display()
        );
    }
    match (spec.dataset_type, m.format) {
        (DatasetType::PaddingFree, PretokenizedFormat::Padded) => bail!(
            "{path} is padded (each document cut to seq+1 tokens); padding-free data needs the token-list format"
        ),
        (DatasetType::Padded, PretokenizedFormat::Padded) if m.sequence_length != spec.seq_len => bail!(
            "{path} is padded to sequence length {}, but the run uses {}",
            m.sequence_length,
            spec.seq_len
        ),
        _ => Ok(()),
    }
}

/// One batch, ready for the train step.
#[derive(Debug, Clone)]
pub struct Batch {
    /// batch × seq input ids, row-major.
    pub inputs: Vec<u32>,
    /// batch × seq labels, -100 where ignored.
    pub labels: Vec<i64>,
    pub batch_size: usize,
    pub seq_len: usize,
    pub training_tokens: usize,
    /// The loader's position after this batch (to checkpoint with it).
    pub state: LoaderState,
}

/// This rank's next `batch_size` samples: in the global order, its slice of
/// the next `world × batch_size`, the position after all of them.
pub fn next_batch(stream: &mut SampleStream, batch_size: usize) -> Result<Batch> {
    let seq = stream.seq_len();
    let Slice { rank, world } = stream.slice;
    let mut inputs = vec![0u32; batch_size * seq];
    let mut labels = vec![0i64; batch_size * seq];
    let mut training_tokens = 0;
    let others = |ranks: usize| {
        ranks
            .checked_mul(batch_size)
            .ok_or_else(|| anyhow!("{ranks} ranks × batch {batch_size} overflows"))
    };
    stream.skip(others(rank)?)?;
    for b in 0..batch_size {
        let r = b * seq..(b + 1) * seq;
        training_tokens += stream.next_into(&mut inputs[r.clone()], &mut labels[r])?;
    }
    stream.skip(others(world - 1 - rank)?)?;
    Ok(Batch {
        inputs,
        labels,
        batch_size,
        seq_len: seq,
        training_tokens,
        state: stream.state(),
    })
}

/// Batches made on a background thread, `prefetch` ahead of the trainer.
pub struct DataLoader {
    rx: Receiver<Result<Batch>>,
    handle: Option<std::thread::JoinHandle<()>>,
    /// Time the trainer spent waiting for data.
    pub waited: Duration,
}

impl DataLoader {
    pub fn spawn(mut stream: SampleStream, batch_size: usize, prefetch: usize) -> DataLoader {
        let (tx, rx) = sync_channel(prefetch.max(1));
        let handle = std::thread::Builder::new()
            .name("sweep-loader".into())
            .spawn(move || loop {
                let b = next_batch(&mut stream, batch_size);
                let failed = b.is_err();
                if tx.send(b).is_err() || failed {
                    return; // the trainer is gone, or the error is delivered
                }
            })
            .expect("spawning the loader thread");
        DataLoader {
            rx,
            handle: Some(handle),
            waited: Duration::ZERO,
        }
    }

    pub fn next_batch(&mut self) -> Result<Batch> {
        let t = Instant::now();
        let b = self
            .rx
            .recv()
            .map_err(|_| anyhow!("the data loader stopped"))?;
        self.waited += t.elapsed();
        b
    }
}

impl Drop for DataLoader {
    fn drop(&mut self) {
        // Closing the channel ends the thread at its next send.
        let (_, dead) = sync_channel(1);
        self.rx = dead;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenizer::tests::mistral;
    use crate::data::tokenizer::SpecialTokens;
    use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
    use std::path::Path;

    /// A Parquet file with one column of these values (strings or raw bytes).
    pub fn write_column(path: &Path, name: &str, array: ArrayRef, row_group: usize) {
        let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            name,
            array.data_type().clone(),
            false,
        )]));
        let props = parquet::file::properties::WriterProperties::builder()
            .set_max_row_group_row_count(Some(row_group))
            .build();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(path).unwrap(),
            schema.clone(),
            Some(props),
        )
        .unwrap();
        w.write(&RecordBatch::try_new(schema, vec![array]).unwrap())
            .unwrap();
        w.close().unwrap();
    }

    fn texts(dir: &Path, docs: &[&str]) -> PathBuf {
        let p = dir.join("texts.parquet");
        write_column(&p, "text", Arc::new(StringArray::from(docs.to_vec())), 3);
        p
    }

    fn spec(path: PathBuf, kind: DatasetType, seq: usize, rank: usize, world: usize) -> DataSpec {
        DataSpec {
            dataset_type: kind,
            seq_len: seq,
            source: SourceSpec::Text {
                path,
                column: "text".into(),
            },
            tokenizer: Arc::new(mistral()),
            rank,
            world_size: world,
            order: DataOrder::Contiguous,
            holdout: 0,
        }
    }

    /// Documents named so that each one's first word identifies it.
    fn named_docs(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("doc{i} says hello to the world number {i}"))
            .collect()
    }

    #[test]
    fn empty_documents_are_skipped_in_both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let p = texts(dir.path(), &["", "Alpha beta.", "", "", "Gamma delta."]);
        let tok = mistral();
        let alpha = tok.document_ids("Alpha beta.").unwrap();
        let gamma = tok.document_ids("Gamma delta.").unwrap();
        let mut s = SampleStream::open(&spec(p.clone(), DatasetType::Padded, 8, 0, 1)).unwrap();
        assert_eq!(&s.next_sample().unwrap().0[..alpha.len()], &alpha[..]);
        assert_eq!(&s.next_sample().unwrap().0[..gamma.len()], &gamma[..]);
        // Wraps around to the first non-empty document, one epoch later.
        assert_eq!(&s.next_sample().unwrap().0[..alpha.len()], &alpha[..]);
        assert_eq!(s.state().epoch, 1);
        let mut f = SampleStream::open(&spec(p, DatasetType::PaddingFree, 6, 0, 1)).unwrap();
        let (i, _) = f.next_sample().unwrap();
        let mut stream = alpha.clone();
        stream.extend(&gamma);
        assert_eq!(
            i,
            stream[..6].to_vec(),
            "no trace of the empty documents, one BOS per boundary"
        );
    }

    #[test]
    fn a_file_of_only_empty_documents_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let p = texts(dir.path(), &["", ""]);
        let mut s = SampleStream::open(&spec(p, DatasetType::Padded, 8, 0, 1)).unwrap();
        let e = s.next_sample().unwrap_err().to_string();
        assert!(e.contains("hold no tokens"), "{e}");
    }

    #[test]
    fn shards_cover_every_document_once_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let docs = named_docs(10);
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let p = texts(dir.path(), &refs);
        let tok = mistral();
        let firsts: Vec<u32> = docs
            .iter()
            .map(|d| tok.document_ids(d).unwrap()[2])
            .collect();
        let mut seen = Vec::new();
        for rank in 0..3 {
            let r = shard(10, rank, 3);
            let mut s =
                SampleStream::open(&spec(p.clone(), DatasetType::Padded, 64, rank, 3)).unwrap();
            for _ in 0..r.len() {
                seen.push(s.next_sample().unwrap().0[2]);
            }
            assert_eq!(s.state().epoch, 0);
            // The next sample starts the rank's next epoch at its first document.
            assert_eq!(s.next_sample().unwrap().0[2], firsts[r.start]);
        }
        assert_eq!(
            seen, firsts,
            "contiguous shards, in order, each document once"
        );
        assert_eq!(shard(10, 0, 3), 0..3);
        assert_eq!(shard(10, 2, 3), 6..10);
    }

    #[test]
    fn resuming_from_a_state_continues_the_same_samples() {
        let dir = tempfile::tempdir().unwrap();
        let docs = named_docs(7);
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let p = texts(dir.path(), &refs);
        for kind in [DatasetType::Padded, DatasetType::PaddingFree] {
            let mut a = SampleStream::open(&spec(p.clone(), kind, 5, 0, 1)).unwrap();
            for _ in 0..4 {
                a.next_sample().unwrap();
            }
            let state = a.state();
            let expected: Vec<_> = (0..12).map(|_| a.next_sample().unwrap()).collect();
            let mut b = SampleStream::open(&spec(p.clone(), kind, 5, 0, 1)).unwrap();
            b.restore(&state).unwrap();
            let got: Vec<_> = (0..12).map(|_| b.next_sample().unwrap()).collect();
            assert_eq!(got, expected, "{kind:?}");
        }
    }

    /// The same documents as text and as both pretokenized formats.
    fn every_source(dir: &Path, docs: &[String], seq: usize) -> Vec<(&'static str, SourceSpec)> {
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let text = texts(dir, &refs);
        let out = dir.join("pretokenized");
        let args = crate::data::pretokenize::PretokenizeArgs {
            input: text.clone(),
            text_column: "text".into(),
            tokenizer: Path::new(env!("CARGO_MANIFEST_DIR")).join(crate::config::DEFAULT_TOKENIZER),
            specials: SpecialTokens::default(),
            seq_len: seq,
            formats: vec![PretokenizedFormat::Padded, PretokenizedFormat::TokenList],
            out_dir: out.clone(),
            row_group_size: 4,
            threads: 1,
            force: true,
            progress: false,
        };
        crate::data::pretokenize::run(&args).unwrap();
        let file = |f| crate::data::pretokenize::output_path(&out, f);
        vec![
            (
                "text",
                SourceSpec::Text {
                    path: text,
                    column: "text".into(),
                },
            ),
            (
                "padded file",
                SourceSpec::Pretokenized {
                    path: file(PretokenizedFormat::Padded),
                },
            ),
            (
                "token-list file",
                SourceSpec::Pretokenized {
                    path: file(PretokenizedFormat::TokenList),
                },
            ),
        ]
    }

    fn global(
        source: &SourceSpec,
        kind: DatasetType,
        seq: usize,
        rank: usize,
        world: usize,
    ) -> DataSpec {
        DataSpec {
            source: source.clone(),
            order: DataOrder::Global,
            ..spec(PathBuf::new(), kind, seq, rank, world)
        }
    }

    /// Rank r of W at batch B holds samples r·B … r·B+B−1 of every W·B of
    /// the one sequence a single rank reads at batch W·B, and every rank
    /// stands at the same position after each micro-batch.
    #[test]
    fn in_the_global_order_any_world_size_sees_the_same_samples() {
        let dir = tempfile::tempdir().unwrap();
        // Empty documents and lengths around the sequence length, so that
        // skipping and padding-free windows are exercised.
        let mut docs = named_docs(11);
        docs[3].clear();
        docs[7] = docs[7].repeat(3);
        // Longer than the prefix a passing rank tokenizes, and only spaces.
        docs[5] = docs[5].repeat(20);
        docs[9] = "   ".into();
        let seq = 9;
        for (name, source) in every_source(dir.path(), &docs, seq) {
            let kinds: &[DatasetType] = match name {
                "padded file" => &[DatasetType::Padded],
                "token-list file" => &[DatasetType::PaddingFree],
                _ => &[DatasetType::Padded, DatasetType::PaddingFree],
            };
            for &kind in kinds {
                for world in 1..=3 {
                    for batch in 1..=2 {
                        let mut one =
                            SampleStream::open(&global(&source, kind, seq, 0, 1)).unwrap();
                        let mut ranks: Vec<_> = (0..world)
                            .map(|r| {
                                SampleStream::open(&global(&source, kind, seq, r, world)).unwrap()
                            })
                            .collect();
                        // Past an epoch, so the wrap-around is covered too.
                        for step in 0..40 {
                            let whole = next_batch(&mut one, world * batch).unwrap();
                            let parts: Vec<Batch> = ranks
                                .iter_mut()
                                .map(|s| next_batch(s, batch).unwrap())
                                .collect();
                            let what =
                                format!("{name} {kind:?} world {world} batch {batch} step {step}");
                            let inputs: Vec<u32> =
                                parts.iter().flat_map(|p| p.inputs.clone()).collect();
                            let labels: Vec<i64> =
                                parts.iter().flat_map(|p| p.labels.clone()).collect();
                            assert_eq!(inputs, whole.inputs, "{what}");
                            assert_eq!(labels, whole.labels, "{what}");
                            let tokens: usize = parts.iter().map(|p| p.training_tokens).sum();
                            assert_eq!(tokens, whole.training_tokens, "{what}");
                            for p in &parts {
                                assert_eq!(
                                    p.state, whole.state,
                                    "{what}: one position for all ranks"
                                );
                            }
                        }
                        assert!(
                            one.state().epoch >= 1,
                            "{name} {kind:?}: past the first epoch"
                        );
                    }
                }
            }
        }
    }

    /// A position written by 2 ranks continues on 1 or 3: the sequence goes
    /// on with no sample skipped or repeated.
    #[test]
    fn a_global_position_resumes_on_any_world_size() {
        let dir = tempfile::tempdir().unwrap();
        let docs = named_docs(7);
        let seq = 6;
        for (name, source) in every_source(dir.path(), &docs, seq) {
            let kind = match name {
                "padded file" => DatasetType::Padded,
                _ => DatasetType::PaddingFree,
            };
            let mut one = SampleStream::open(&global(&source, kind, seq, 0, 1)).unwrap();
            let mut two: Vec<_> = (0..2)
                .map(|r| SampleStream::open(&global(&source, kind, seq, r, 2)).unwrap())
                .collect();
            for _ in 0..3 {
                next_batch(&mut one, 2).unwrap();
                for s in &mut two {
                    next_batch(s, 1).unwrap();
                }
            }
            let state = two[0].state();
            assert_eq!(state, two[1].state());
            assert_eq!(state.samples, 6);
            let want = next_batch(&mut one, 6).unwrap();
            for world in [1, 3] {
                let batch = 6 / world;
                let inputs: Vec<u32> = (0..world)
                    .flat_map(|r| {
                        let mut s =
                            SampleStream::open(&global(&source, kind, seq, r, world)).unwrap();
                        s.restore(&state).unwrap();
                        next_batch(&mut s, batch).unwrap().inputs
                    })
                    .collect();
                assert_eq!(inputs, want.inputs, "{name}: resumed on {world} rank(s)");
            }
        }
    }

    /// The reference's sharding: rank r reads documents shard(n, r, W) only,
    /// its first sample the first document of its shard.
    #[test]
    fn the_contiguous_order_keeps_the_references_shards() {
        let dir = tempfile::tempdir().unwrap();
        let docs = named_docs(10);
        let tok = mistral();
        for (name, source) in every_source(dir.path(), &docs, 32) {
            if name == "token-list file" {
                continue;
            }
            for rank in 0..4 {
                let mut sp = global(&source, DatasetType::Padded, 32, rank, 4);
                sp.order = DataOrder::Contiguous;
                let mut s = SampleStream::open(&sp).unwrap();
                let b = next_batch(&mut s, 2).unwrap();
                // The reference's ranges of 10 documents over 4 ranks:
                // [rank·n/W, (rank+1)·n/W).
                let r = [0..2, 2..5, 5..7, 7..10][rank].clone();
                for (i, d) in r.clone().take(2).enumerate() {
                    let ids = tok.document_ids(&docs[d]).unwrap();
                    assert_eq!(
                        &b.inputs[i * 32..i * 32 + ids.len()],
                        &ids[..],
                        "{name} rank {rank}"
                    );
                }
                assert_eq!(
                    b.state.next_doc,
                    r.start + 2,
                    "{name} rank {rank}: its own position"
                );
            }
        }
    }

    #[test]
    fn prefetched_batches_equal_the_stream() {
        let dir = tempfile::tempdir().unwrap();
        let docs = named_docs(9);
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let p = texts(dir.path(), &refs);
        let s = spec(p, DatasetType::PaddingFree, 7, 0, 1);
        let mut direct = SampleStream::open(&s).unwrap();
        let mut loader = DataLoader::spawn(SampleStream::open(&s).unwrap(), 3, 2);
        for _ in 0..5 {
            let b = loader.next_batch().unwrap();
            let want = next_batch(&mut direct, 3).unwrap();
            assert_eq!(
                (b.inputs, b.labels, b.training_tokens, b.state),
                (want.inputs, want.labels, want.training_tokens, want.state)
            );
        }
    }

    #[test]
    fn a_tokenizer_without_bos_cannot_make_padding_free_data() {
        let dir = tempfile::tempdir().unwrap();
        let tj = dir.path().join("tokenizer.json");
        std::fs::write(&tj, r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
            "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#).unwrap();
        let tok = TextTokenizer::load(&tj, &SpecialTokens::default()).unwrap();
        assert_eq!((tok.bos, tok.eos, tok.pad), (None, None, None));
        let p = texts(dir.path(), &["hello world hello", "world"]);
        let mut s = spec(p, DatasetType::PaddingFree, 2, 0, 1);
        s.tokenizer = Arc::new(tok);
        let e = SampleStream::open(&s).err().unwrap().to_string();
        assert!(
            e.contains("no BOS token") && e.contains("`bos_token`"),
            "{e}"
        );
        // Padded data works without BOS (and without a pad token).
        s.dataset_type = DatasetType::Padded;
        let (i, l) = SampleStream::open(&s).unwrap().next_sample().unwrap();
        assert_eq!((i, l), (vec![1, 2], vec![2, 1]));
    }

    #[test]
    fn bad_input_gets_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        // Invalid UTF-8 in a binary text column.
        let p = dir.path().join("bin.parquet");
        let values: Vec<&[u8]> = vec![b"fine", b"caf\xe9"];
        write_column(&p, "text", Arc::new(BinaryArray::from(values)), 10);
        let mut s = SampleStream::open(&spec(p, DatasetType::Padded, 4, 0, 1)).unwrap();
        s.next_sample().unwrap();
        let e = s.next_sample().unwrap_err().to_string();
        assert!(e.contains("document 1 is not valid UTF-8"), "{e}");
        // The same in a column typed as strings (a writer that did not
        // check): Arrow refuses the row group, and says why.
        let p = dir.path().join("str.parquet");
        let bytes = arrow_buffer::Buffer::from(&b"finecaf\xe9"[..]);
        let offsets = arrow_buffer::OffsetBuffer::new(vec![0i32, 4, 8].into());
        // SAFETY: deliberately invalid UTF-8, only ever written to a file.
        let bad = unsafe { arrow_array::StringArray::new_unchecked(offsets, bytes, None) };
        write_column(&p, "text", Arc::new(bad), 10);
        let e = match SampleStream::open(&spec(p, DatasetType::Padded, 4, 0, 1)) {
            Ok(mut s) => format!("{:#}", s.next_sample().unwrap_err()),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains("row group 0 of") && e.to_lowercase().contains("utf"),
            "{e}"
        );
        // A missing column names the ones that exist.
        let p = texts(dir.path(), &["a"]);
        let mut sp = spec(p, DatasetType::Padded, 4, 0, 1);
        sp.source = SourceSpec::Text {
            path: dir.path().join("texts.parquet"),
            column: "content".into(),
        };
        let e = SampleStream::open(&sp).err().unwrap().to_string();
        assert!(
            e.contains("no column `content`")
                && e.contains("its columns: text")
                && e.contains("text_column"),
            "{e}"
        );
        // A corrupt file and a missing file.
        let c = dir.path().join("corrupt.parquet");
        let bytes = std::fs::read(dir.path().join("texts.parquet")).unwrap();
        std::fs::write(&c, &bytes[..bytes.len() / 2]).unwrap();
        sp.source = SourceSpec::Text {
            path: c,
            column: "text".into(),
        };
        let e = SampleStream::open(&sp).err().unwrap().to_string();
        assert!(e.contains("is not a readable Parquet file"), "{e}");
        sp.source = SourceSpec::Text {
            path: dir.path().join("nope.parquet"),
            column: "text".into(),
        };
        let e = format!("{:#}", SampleStream::open(&sp).err().unwrap());
        assert!(
            e.contains("opening dataset") && e.contains("nope.parquet"),
            "{e}"
        );
    }
}
