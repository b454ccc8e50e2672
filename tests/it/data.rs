//! The data path end to end through the command line: pretokenize, verify,
//! dump; interoperability with pyarrow, polars and Hugging Face tokenizers;
//! the full corpus.

use super::support::{repo, run_ok, stdout, sweep};
use std::path::{Path, PathBuf};
use std::process::Command;

fn pretokenize(root: &Path, input: &Path, seq: usize, out: &Path) -> String {
    stdout(&run_ok(
        sweep(root)
            .arg("pretokenize")
            .arg("--input")
            .arg(input)
            .arg("--sequence-length")
            .arg(seq.to_string())
            .arg("--out")
            .arg(out)
            .arg("--quiet"),
    ))
}

fn dump(
    root: &Path,
    dataset: &Path,
    kind: &str,
    pretokenized: bool,
    seq: usize,
    samples: usize,
) -> Vec<u8> {
    let mut c = sweep(root);
    c.args([
        "data",
        "dump",
        "--dataset-type",
        kind,
        "--seq-len",
        &seq.to_string(),
        "--samples",
        &samples.to_string(),
        "--dataset",
    ])
    .arg(dataset);
    if pretokenized {
        c.arg("--pretokenized");
    }
    run_ok(&mut c).stdout
}

/// On-the-fly and pretokenized loaders give the same samples, in both modes,
/// and `verify` proves each file against its source.
fn check_equivalence(data: &Path, seq: usize, samples: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let root = repo();
    let out = tmp.path().join("pretok");
    pretokenize(&root, data, seq, &out);
    for (kind, file) in [
        ("padded", "padded.parquet"),
        ("padding-free", "token-list.parquet"),
    ] {
        let v = stdout(&run_ok(
            sweep(&root).args(["data", "verify"]).arg(out.join(file)),
        ));
        assert!(v.starts_with("OK:"), "{v}");
        let otf = dump(&root, data, kind, false, seq, samples);
        let pre = dump(&root, &out.join(file), kind, true, seq, samples);
        assert_eq!(otf.iter().filter(|&&b| b == b'\n').count(), samples);
        assert!(
            otf == pre,
            "{kind}: on-the-fly and pretokenized samples differ"
        );
    }
}

#[test]
fn bundled_data_is_the_same_on_the_fly_and_pretokenized() {
    let data = repo().join("assets/data/quickstart.parquet");
    check_equivalence(&data, 512, 300);
    // A second run keeps current outputs (the stage's cache key).
    let tmp = tempfile::tempdir().unwrap();
    pretokenize(&repo(), &data, 256, tmp.path());
    let again = pretokenize(&repo(), &data, 256, tmp.path());
    assert!(
        again.contains("kept    ") && !again.contains("wrote"),
        "{again}"
    );
    // A different sequence length invalidates the padded file only.
    let other = pretokenize(&repo(), &data, 128, tmp.path());
    assert!(
        other.contains("wrote   ")
            && other.contains("padded.parquet")
            && other.contains("kept    "),
        "{other}"
    );
}

/// `sweep data dump` prints what a rank trains on: in the global order the
/// ranks' slices interleave into the one-rank sequence, in the contiguous
/// order rank 1 starts at its own shard.
#[test]
fn dump_shows_each_ranks_slice_of_the_global_batches() {
    let root = repo();
    let data = root.join("assets/data/quickstart.parquet");
    let lines = |extra: &[&str]| -> Vec<String> {
        let mut c = sweep(&root);
        c.args([
            "data",
            "dump",
            "--dataset-type",
            "padding-free",
            "--seq-len",
            "32",
            "--dataset",
        ])
        .arg(&data)
        .args(extra);
        stdout(&run_ok(&mut c)).lines().map(String::from).collect()
    };
    let one = lines(&["--samples", "12", "--batch-size", "4"]);
    let ranks: Vec<Vec<String>> = (0..2)
        .map(|r| {
            let r = r.to_string();
            lines(&[
                "--samples",
                "6",
                "--batch-size",
                "2",
                "--world-size",
                "2",
                "--rank",
                &r,
            ])
        })
        .collect();
    let interleaved: Vec<String> = (0..3)
        .flat_map(|b| [&ranks[0][2 * b..2 * b + 2], &ranks[1][2 * b..2 * b + 2]].concat())
        .collect();
    assert_eq!(interleaved, one);
    let shard = lines(&[
        "--samples",
        "2",
        "--world-size",
        "2",
        "--rank",
        "1",
        "--data-order",
        "contiguous",
    ]);
    assert_ne!(
        shard[0], one[1],
        "rank 1's shard starts half-way through the documents"
    );
    // Nonsense gets a clear error.
    let e = sweep(&root)
        .args([
            "data",
            "dump",
            "--dataset-type",
            "padded",
            "--seq-len",
            "32",
            "--world-size",
            "2",
            "--rank",
            "2",
            "--dataset",
        ])
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&e.stderr);
    assert!(
        !e.status.success() && err.contains("--rank must be below --world-size"),
        "{err}"
    );
}

#[test]
#[ignore = "needs the full corpus: scripts/fetch-assets.sh (scripts/test.sh runs it)"]
fn the_full_corpus_is_the_same_on_the_fly_and_pretokenized() {
    let data = repo().join("assets/data/corpus.parquet");
    assert!(data.exists(), "run scripts/fetch-assets.sh first");
    check_equivalence(&data, 2048, 1000);
}

fn python(script: &str) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs pyarrow, polars and tokenizers: scripts/setup.sh (scripts/test.sh runs it)"]
fn pyarrow_polars_and_hf_tokenizers_agree_with_our_files() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("assets/data/quickstart.parquet");
    let tok = repo().join("assets/tokenizers/mistral-7b/tokenizer.json");
    let out = tmp.path().join("p");
    pretokenize(&repo(), &data, 512, &out);
    let script = format!(
        r#"
import pyarrow.parquet as pq, polars as pl
from tokenizers import Tokenizer
tok = Tokenizer.from_file({tok:?})
texts = pq.read_table({data:?})["text"].to_pylist()
tl = pq.read_table({tl:?})
meta = pq.read_schema({tl:?}).metadata
assert meta[b"format"] == b"token-list" and meta[b"tokenizer"] == b"mistral-7b", meta
assert pq.ParquetFile({tl:?}).metadata.row_group(0).num_rows == 466 or pq.ParquetFile({tl:?}).metadata.num_row_groups == 1
ids = tl["tokens"].to_pylist()
assert len(ids) == len(texts)
# Mistral's post-processor adds the BOS itself, so encode() is exactly our document ids.
for t, i in zip(texts, ids):
    assert tok.encode(t).ids == i
pd = pl.read_parquet({pd:?})
assert pd.columns == ["input_ids", "attention_mask"] and pd.height == len(texts)
for t, (inp, mask) in zip(texts, pd.iter_rows()):
    n = sum(mask)
    assert len(inp) == 513 and list(mask) == [1] * n + [0] * (513 - n)
    assert list(inp[:n]) == tok.encode(t).ids[:513]
print("OK", len(texts))
"#,
        tok = tok.display().to_string(),
        data = data.display().to_string(),
        tl = out.join("token-list.parquet").display().to_string(),
        pd = out.join("padded.parquet").display().to_string(),
    );
    assert!(python(&script).starts_with("OK 466"));
}

/// A text column is read as the same documents whichever Arrow type pyarrow
/// or polars wrote it as: offsets of 32 or 64 bits, bytes, or a dictionary
/// (pandas' category, polars' Categorical; refused before as "not text").
#[test]
#[ignore = "needs pyarrow and polars: scripts/setup.sh (scripts/test.sh runs it)"]
fn every_text_type_pyarrow_and_polars_write_reads_as_the_same_documents() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let data = repo().join("assets/data/quickstart.parquet");
    let kinds = python(&format!(
        r#"
import pyarrow as pa, pyarrow.parquet as pq, polars as pl
texts = pq.read_table({data:?})["text"].to_pylist()[:40] + [None]
out = {d:?}
for name, col in [
    ("string", pa.array(texts, pa.string())),
    ("large_string", pa.array(texts, pa.large_string())),
    ("binary", pa.array([t and t.encode() for t in texts], pa.binary())),
    ("large_binary", pa.array([t and t.encode() for t in texts], pa.large_binary())),
    ("dictionary", pa.array(texts).dictionary_encode()),
]:
    pq.write_table(pa.table({{"text": col}}), f"{{out}}/{{name}}.parquet", row_group_size=16)
pl.DataFrame({{"text": texts}}, schema={{"text": pl.Categorical}}).write_parquet(f"{{out}}/categorical.parquet")
for name in ["dictionary", "categorical"]:
    assert pa.types.is_dictionary(pq.read_schema(f"{{out}}/{{name}}.parquet").field("text").type)
print("string large_string binary large_binary dictionary categorical")
"#,
        data = data.display().to_string(),
        d = d.display().to_string(),
    ));
    let read = |kind: &str| {
        dump(
            &repo(),
            &d.join(format!("{kind}.parquet")),
            // One sample a document, the null one included.
            "padded",
            false,
            64,
            41,
        )
    };
    let plain = read("string");
    assert!(!plain.is_empty());
    for kind in kinds.split_whitespace().skip(1) {
        assert!(
            read(kind) == plain,
            "{kind} reads as other documents than string"
        );
    }
}

/// The reference study's own defects, written into our files with pyarrow:
/// `verify` must catch left padding and truncated token lists.
#[test]
#[ignore = "needs pyarrow: scripts/setup.sh (scripts/test.sh runs it)"]
fn verify_catches_the_reference_studys_defects() {
    let tmp = tempfile::tempdir().unwrap();
    let data = repo().join("assets/data/quickstart.parquet");
    let out = tmp.path().join("p");
    pretokenize(&repo(), &data, 512, &out);
    let bad = |name: &str| -> PathBuf { tmp.path().join(name) };
    python(&format!(
        r#"
import pyarrow as pa, pyarrow.parquet as pq
def meta(path):
    return dict(pq.ParquetFile(path).metadata.metadata)
t = pq.read_table({pd:?})
ids, masks = t["input_ids"].to_pylist(), t["attention_mask"].to_pylist()
left = [[i[k] for k in range(len(m)) if m[k] == 0] + [i[k] for k in range(len(m)) if m[k] == 1] for i, m in zip(ids, masks)]
lmask = [sorted(m) for m in masks]
pq.write_table(pa.table({{"input_ids": pa.array(left, pa.list_(pa.int32())), "attention_mask": pa.array(lmask, pa.list_(pa.int8()))}}).replace_schema_metadata(meta({pd:?})), {left:?})
tl = pq.read_table({tl:?})
toks = [x[:300] for x in tl["tokens"].to_pylist()]
pq.write_table(pa.table({{"tokens": pa.array(toks, pa.list_(pa.int32()))}}).replace_schema_metadata(meta({tl:?})), {trunc:?})
"#,
        pd = out.join("padded.parquet").display().to_string(),
        tl = out.join("token-list.parquet").display().to_string(),
        left = bad("left.parquet").display().to_string(),
        trunc = bad("trunc.parquet").display().to_string(),
    ));
    let left = sweep(&repo())
        .args(["data", "verify"])
        .arg(bad("left.parquet"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&left.stderr);
    assert!(
        !left.status.success() && err.contains("not right-padded"),
        "{err}"
    );
    let trunc = sweep(&repo())
        .args(["data", "verify"])
        .arg(bad("trunc.parquet"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&trunc.stdout);
    assert!(
        !trunc.status.success() && out.contains("MISMATCH") && out.contains("differs at token 300"),
        "{out}"
    );
}

/// `sweep-bench data` runs its Python peer on the same pretokenized files
/// and prints both (the figures themselves are the benchmark's business).
#[test]
fn the_data_benchmark_runs_its_python_peer_beside_the_loaders() {
    let root = super::support::project();
    let out = stdout(&run_ok(
        super::support::sweep_bench(root.path())
            .args(["data", "--loader", "pretokenized", "--samples", "20"])
            .args(["--repeats", "1", "--seq-len", "256", "--dataset"])
            .arg(repo().join("assets/data/quickstart.parquet"))
            .args(["--tokenizer"])
            .arg(repo().join("assets/tokenizers/mistral-7b/tokenizer.json")),
    ));
    for loader in ["pretokenized padded", "pretokenized token-list"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(loader))
            .unwrap_or_else(|| panic!("{out}"));
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert!(
            cells.iter().rev().nth(1).is_some_and(|c| *c == "us")
                && cells.last().unwrap().ends_with('x'),
            "{loader}: the Python peer's time and the speedup: {line}"
        );
    }
}

/// An input of no rows is an error that says so; null texts become empty
/// documents (a BOS alone), and pretokenize says how many there were.
#[test]
fn empty_datasets_and_null_texts_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    python(&format!(
        "import pyarrow as pa, pyarrow.parquet as pq\n\
         pq.write_table(pa.table({{'text': pa.array([], pa.string())}}), '{d}/empty.parquet')\n\
         pq.write_table(pa.table({{'text': ['A first document.', None, 'A third one.', None]}}), '{d}/nulls.parquet')",
        d = d.display()
    ));
    let tok = repo().join("assets/tokenizers/mistral-7b/tokenizer.json");
    let run = |input: &str| {
        sweep(d)
            .args([
                "pretokenize",
                "--quiet",
                "--sequence-length",
                "16",
                "--out",
                "out",
                "--input",
                input,
            ])
            .arg("--tokenizer")
            .arg(&tok)
            .output()
            .unwrap()
    };
    let o = run("empty.parquet");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("empty.parquet holds no rows"),
        "{err}"
    );
    assert!(!d.join("out/padded.parquet").exists());
    let o = run("nulls.parquet");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("2 of 4 documents in `text` are null"), "{err}");
}
