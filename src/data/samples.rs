//! How documents become (inputs, labels): the reference study's semantics
//! without its defects. Shared by every loader, on the fly or pretokenized, so
//! the two agree sample for sample by construction (and `sweep data verify`
//! checks the files they read).
//!
//! A document arrives as its ids with the BOS first (see `tokenizer`).
//! - Padded: the first seq+1 ids, right-padded; inputs = ids[..seq],
//!   labels = ids[1..], and labels past the document's end are -100. Padding
//!   is found by position, so the pad id never matters.
//! - Padding-free: documents are appended to a token buffer (a BOS between
//!   documents, never two); every window of seq+1 tokens is a sample, and its
//!   last token stays as the first of the next window (also when the buffer
//!   held exactly seq+1). Labels are -100 wherever the input is BOS: the first
//!   token of a document is never a target.

/// The label that the loss ignores.
pub const IGNORE: i64 = -100;

/// Fills one padded sample from a document; returns its training tokens.
pub fn padded(doc: &[u32], seq: usize, pad: u32, inputs: &mut [u32], labels: &mut [i64]) -> usize {
    debug_assert!(inputs.len() == seq && labels.len() == seq);
    let n = doc.len().min(seq + 1);
    let real = n.saturating_sub(1); // positions with a real next token
    inputs[..n.min(seq)].copy_from_slice(&doc[..n.min(seq)]);
    inputs[n.min(seq)..].fill(pad);
    for (l, &t) in labels[..real].iter_mut().zip(&doc[1..n]) {
        *l = t as i64;
    }
    labels[real..].fill(IGNORE);
    real
}

/// The padding-free token stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenBuffer {
    buf: Vec<u32>,
    /// Tokens before `start` were consumed; compacted lazily to avoid moves.
    start: usize,
}

impl TokenBuffer {
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends a document; its BOS is dropped when the buffer already ends
    /// with one, so a boundary never carries two.
    pub fn push(&mut self, doc: &[u32], bos: u32) {
        let doc = match (self.tokens().last(), doc.first()) {
            (Some(&last), Some(&first)) if last == bos && first == bos => &doc[1..],
            _ => doc,
        };
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(doc);
    }

    pub fn tokens(&self) -> &[u32] {
        &self.buf[self.start..]
    }

    /// Whether a whole window of seq+1 tokens is there.
    pub fn ready(&self, seq: usize) -> bool {
        self.len() > seq
    }

    /// Takes one window as a sample (the buffer must be `ready`); returns its
    /// training tokens. The window's last token stays in the buffer.
    pub fn take(&mut self, seq: usize, bos: u32, inputs: &mut [u32], labels: &mut [i64]) -> usize {
        debug_assert!(self.ready(seq));
        let w = &self.buf[self.start..self.start + seq + 1];
        inputs.copy_from_slice(&w[..seq]);
        for (l, &t) in labels.iter_mut().zip(&w[1..]) {
            *l = t as i64;
        }
        // BOS is rare: test whole blocks (vectorised) before looking closer.
        const BLOCK: usize = 32;
        let mut masked = 0;
        for (b, block) in w[..seq].chunks(BLOCK).enumerate() {
            if block.contains(&bos) {
                for (j, &x) in block.iter().enumerate() {
                    if x == bos {
                        labels[b * BLOCK + j] = IGNORE;
                        masked += 1;
                    }
                }
            }
        }
        self.start += seq;
        seq - masked
    }

    /// Passes over one window (another rank's sample) as [`Self::take`]
    /// would, without copying it.
    pub fn pass(&mut self, seq: usize) {
        debug_assert!(self.ready(seq));
        self.start += seq;
    }

    /// For checkpoints: what is left in the buffer.
    pub fn snapshot(&self) -> Vec<u32> {
        self.tokens().to_vec()
    }

    pub fn restore(tokens: Vec<u32>) -> TokenBuffer {
        TokenBuffer {
            buf: tokens,
            start: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const BOS: u32 = 1;
    const PAD: u32 = 0;

    fn pad(doc: &[u32], seq: usize) -> (Vec<u32>, Vec<i64>, usize) {
        let (mut i, mut l) = (vec![9; seq], vec![9; seq]);
        let n = padded(doc, seq, PAD, &mut i, &mut l);
        (i, l, n)
    }

    #[test]
    fn padded_short_document_is_right_padded_and_masked_by_position() {
        // No pad token: the pad id equals a real token (2 = EOS), yet only
        // positions past the document's end are masked.
        let (mut i, mut l) = (vec![0; 6], vec![0; 6]);
        let n = padded(&[BOS, 2, 5], 6, 2, &mut i, &mut l);
        assert_eq!(i, vec![BOS, 2, 5, 2, 2, 2]);
        assert_eq!(l, vec![2, 5, IGNORE, IGNORE, IGNORE, IGNORE]);
        assert_eq!(n, 2);
    }

    #[test]
    fn padded_long_document_is_truncated_to_seq_plus_one() {
        let doc: Vec<u32> = (1..=10).collect(); // BOS=1, then 2..10
        let (i, l, n) = pad(&doc, 4);
        assert_eq!(i, vec![1, 2, 3, 4]);
        assert_eq!(l, vec![2, 3, 4, 5]);
        assert_eq!(n, 4);
        // Exactly seq+1 tokens: every position trains.
        let (i, l, n) = pad(&doc[..5], 4);
        assert_eq!((i, l, n), (vec![1, 2, 3, 4], vec![2, 3, 4, 5], 4));
    }

    #[test]
    fn padded_empty_document_trains_nothing() {
        let (i, l, n) = pad(&[BOS], 3);
        assert_eq!((i, l, n), (vec![BOS, PAD, PAD], vec![IGNORE; 3], 0));
    }

    #[test]
    fn padding_free_keeps_one_bos_per_boundary_and_the_overlap() {
        let mut b = TokenBuffer::default();
        b.push(&[BOS, 10, 11, 12], BOS);
        b.push(&[BOS, 20, 21], BOS);
        let (mut i, mut l) = (vec![0; 4], vec![0; 4]);
        assert!(b.ready(4));
        let n = b.take(4, BOS, &mut i, &mut l);
        assert_eq!(i, vec![BOS, 10, 11, 12]);
        // The first token of a document (after BOS) is never a target; the
        // BOS that starts the next document is.
        assert_eq!(l, vec![IGNORE, 11, 12, BOS as i64]);
        assert_eq!(n, 3);
        // The window's last token (BOS) starts the next window.
        assert_eq!(b.tokens(), &[BOS, 20, 21]);
    }

    #[test]
    fn a_buffer_of_exactly_seq_plus_one_keeps_its_last_token() {
        let mut b = TokenBuffer::default();
        b.push(&[BOS, 2, 3, 4, 5], BOS); // exactly seq+1 = 5
        let (mut i, mut l) = (vec![0; 4], vec![0; 4]);
        b.take(4, BOS, &mut i, &mut l);
        assert_eq!(b.tokens(), &[5], "the reference emptied the buffer here");
        assert!(!b.ready(4));
    }

    #[test]
    fn a_document_after_a_trailing_bos_brings_no_second_bos() {
        let mut b = TokenBuffer::default();
        b.push(&[BOS, 7, BOS], BOS);
        b.push(&[BOS, 8], BOS);
        assert_eq!(b.tokens(), &[BOS, 7, BOS, 8]);
    }

    #[test]
    fn long_documents_span_several_windows_without_loss() {
        let doc: Vec<u32> = std::iter::once(BOS).chain(100..120).collect();
        let mut b = TokenBuffer::default();
        b.push(&doc, BOS);
        let mut seen = vec![];
        let (mut i, mut l) = (vec![0; 8], vec![0; 8]);
        while b.ready(8) {
            b.take(8, BOS, &mut i, &mut l);
            seen.extend_from_slice(&i);
        }
        assert_eq!(seen, doc[..16].to_vec(), "windows tile the stream");
        assert_eq!(b.tokens(), &doc[16..]);
    }
}
