//! Tests of the loaders: shards, the global and contiguous orders, resuming, prefetching and bad input.

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
        let mut s = SampleStream::open(&spec(p.clone(), DatasetType::Padded, 64, rank, 3)).unwrap();
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
                    let mut one = SampleStream::open(&global(&source, kind, seq, 0, 1)).unwrap();
                    let mut ranks: Vec<_> = (0..world)
                        .map(|r| SampleStream::open(&global(&source, kind, seq, r, world)).unwrap())
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
                            assert_eq!(p.state, whole.state, "{what}: one position for all ranks");
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
                    let mut s = SampleStream::open(&global(&source, kind, seq, r, world)).unwrap();
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
    std::fs::write(
        &tj,
        r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
        "pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
        "model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2},"unk_token":"[UNK]"}}"#,
    )
    .unwrap();
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
        e.contains("the dataset ") && e.contains("nope.parquet does not exist"),
        "{e}"
    );
}
