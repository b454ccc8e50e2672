//! The four loaders: padded or padding-free, from text tokenized on the fly or a pretokenized
//! file; they differ only in where ids come from (`Documents`). A stream reads documents in
//! order, wraps around, skips empty ones. With several ranks ([`DataOrder`]): `global` has every
//! rank follow one sample sequence and keep its slice (the same samples at any world size, one
//! [`LoaderState`]); `contiguous` gives each rank its own range ([`shard`]), as the reference
//! does. A background thread keeps `prefetch` batches ready.

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

/// Where a loader stands, enough to resume exactly; in the global order the same on every rank.
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

/// Where a cursor's documents come from, with the row group at hand.
enum Documents {
    /// Text tokenized as it is read.
    Text {
        file: TextFile,
        tok: Arc<TextTokenizer>,
        chunk: Option<(usize, TextChunk)>,
        /// Tokens of the current document.
        tokens: Vec<u32>,
    },
    /// A pretokenized file: the next row group is decoded on a helper thread.
    Pretok {
        file: Arc<PretokFile>,
        docs: Option<(usize, Docs)>,
        ahead: Option<(usize, Pending)>,
        /// Buffers to decode into when nothing is read ahead.
        spare: Option<(Docs, Scratch)>,
    },
}

impl Documents {
    fn text(file: TextFile, tok: Arc<TextTokenizer>) -> Documents {
        Documents::Text {
            file,
            tok,
            chunk: None,
            tokens: Vec::new(),
        }
    }

    fn pretokenized(file: PretokFile) -> Documents {
        Documents::Pretok {
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
    source: Documents,
    range: Range<usize>,
    next: usize,
    epoch: u64,
}

impl DocCursor {
    fn new(source: Documents, range: Range<usize>) -> DocCursor {
        DocCursor {
            source,
            next: range.start,
            range,
            epoch: 0,
        }
    }

    fn parquet(&self) -> &super::text::ParquetFile {
        match &self.source {
            Documents::Text { file, .. } => &file.file,
            Documents::Pretok { file, .. } => &file.file,
        }
    }

    fn docs(&self) -> usize {
        self.parquet().rows()
    }

    /// Positions the cursor (after a restore), dropping any read-ahead.
    fn seek(&mut self, next: usize, epoch: u64) {
        self.next = next;
        self.epoch = epoch;
        if let Documents::Pretok { ahead, .. } = &mut self.source {
            *ahead = None;
        }
    }

    /// Moves on to the next document (wrapping around); returns its index.
    fn step(&mut self) -> usize {
        if self.next >= self.range.end {
            self.next = self.range.start;
            self.epoch += 1;
        }
        self.next += 1;
        self.next - 1
    }

    /// Whether the next document has more than `empty_len` ids, tokenizing only its start where
    /// that already gives a token (another rank's padded sample needs no more).
    fn next_doc_has_tokens(&mut self, empty_len: usize) -> Result<bool> {
        if !matches!(self.source, Documents::Text { .. }) {
            return Ok(self.next_doc()?.len() > empty_len);
        }
        let i = self.step();
        let Documents::Text {
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
            Documents::Text {
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
            Documents::Pretok {
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

/// Makes row group `rg` current (from the read-ahead when it is that one) and starts decoding
/// the next within `range` on a helper thread.
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

/// Which samples a rank keeps: of every `world × batch`, the `batch` from `rank × batch` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slice {
    rank: usize,
    world: usize,
}

impl Slice {
    const ALL: Slice = Slice { rank: 0, world: 1 };
}

/// Samples from a range of documents: one rank's, or the sequence a rank keeps its slice of.
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
    /// A stream over this rank's training samples.
    pub fn open(spec: &DataSpec) -> Result<SampleStream> {
        let source = open_documents(spec)?;
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
        let source = open_documents(spec)?;
        let mut s = Self::over(spec, source, 0..0)?;
        let total = s.cursor.docs();
        s.cursor.range = (total - spec.holdout.min(total))..total;
        s.cursor.next = s.cursor.range.start;
        Ok(s)
    }

    fn over(spec: &DataSpec, source: Documents, range: Range<usize>) -> Result<SampleStream> {
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

    /// Passes over the next `n` samples (other ranks'): read, not copied.
    fn skip(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            self.advance(None)?;
        }
        Ok(())
    }

    /// The next sample, into `out` when given; its training tokens (0 when skipped). A whole pass
    /// without tokens is an error, not a hang.
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

fn open_documents(spec: &DataSpec) -> Result<Documents> {
    Ok(match &spec.source {
        SourceSpec::Text { path, column } => {
            Documents::text(TextFile::open(path, column)?, spec.tokenizer.clone())
        }
        SourceSpec::Pretokenized { path } => {
            let p = PretokFile::open(path)?;
            check_pretokenized(&p, spec)?;
            Documents::pretokenized(p)
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

/// This rank's next `batch_size` samples (in the global order, its slice of `world ×` them).
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
mod tests;
