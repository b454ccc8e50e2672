//! Content hashes: sha256 of files, and short stable ids of structured values.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// Hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut hasher = Sha256::new();
    stream_file(path, |chunk| hasher.update(chunk))?;
    Ok(hex(&hasher.finalize()))
}

/// Hands a file to `f` a megabyte at a time; returns its length.
pub fn stream_file(path: &Path, mut f: impl FnMut(&[u8])) -> Result<u64> {
    let mut file = crate::util::fs::open_input("the file", path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(bytes);
        }
        f(&buf[..n]);
        bytes += n as u64;
    }
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A short id (8 hex digits) of a JSON value that does not depend on the order
/// of keys in its objects (stages' ids).
pub fn short_id(value: &serde_json::Value) -> String {
    canonical_sha256(value)[..8].to_string()
}

/// The hex sha256 of a JSON value written with its objects' keys sorted:
/// the same for the same value, whatever the order it was built in.
pub fn canonical_sha256(value: &serde_json::Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    sha256_bytes(canonical.as_bytes())
}

/// Serialises with object keys sorted, whatever map type serde_json was built with.
fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn short_id_ignores_key_order() {
        let a = json!({"b": 1, "a": {"y": [1, 2], "x": "s"}});
        let b = json!({"a": {"x": "s", "y": [1, 2]}, "b": 1});
        assert_eq!(short_id(&a), short_id(&b));
        assert_ne!(
            short_id(&a),
            short_id(&json!({"b": 2, "a": {"x": "s", "y": [1, 2]}}))
        );
        assert_eq!(short_id(&a).len(), 8);
    }

    #[test]
    fn sha256_of_known_bytes() {
        assert_eq!(
            sha256_bytes(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
