//! Every independent error of a table at once. serde stops at the first key
//! it cannot take, so a manifest with a misspelt key in `[sweep]` and a
//! wrong type in `[slurm]` would take a round each. Here each key is tried
//! alone (a table's keys one by one, down to the key that fails), which
//! finds every failing key with serde's own message and span; a key that is
//! missing is the whole table's error, not any one key's.

use serde::de::DeserializeOwned;
use toml::de::{DeString, DeTable, DeValue};
use toml::Spanned;

/// A key that does not deserialise on its own: its path from the table
/// given, and serde's error (spans into the document).
#[derive(Debug)]
pub struct KeyError {
    pub path: Vec<String>,
    pub error: toml::de::Error,
}

/// The keys of `root` that `T` refuses, each found alone, in document order.
pub fn key_errors<T: DeserializeOwned>(root: &Spanned<DeTable<'_>>) -> Vec<KeyError> {
    let mut out = Vec::new();
    walk::<T>(root, &mut Vec::new(), root.get_ref(), &mut out);
    out
}

/// `root` without the keys at `paths` (each a path that [`key_errors`] gave).
pub fn without<'i>(root: &Spanned<DeTable<'i>>, paths: &[Vec<String>]) -> Spanned<DeTable<'i>> {
    let mut table = root.get_ref().clone();
    for path in paths {
        remove(&mut table, path);
    }
    Spanned::new(root.span(), table)
}

fn remove(table: &mut DeTable<'_>, path: &[String]) {
    match path {
        [] => {}
        [last] => {
            *table = std::mem::take(table)
                .into_iter()
                .filter(|(k, _)| k.get_ref().as_ref() != last.as_str())
                .collect();
        }
        [first, rest @ ..] => {
            for (k, v) in table.iter_mut() {
                if k.get_ref().as_ref() == first.as_str() {
                    if let DeValue::Table(t) = v.get_mut() {
                        remove(t, rest);
                    }
                }
            }
        }
    }
}

fn walk<'i, T: DeserializeOwned>(
    root: &Spanned<DeTable<'i>>,
    prefix: &mut Vec<Spanned<DeString<'i>>>,
    table: &DeTable<'i>,
    out: &mut Vec<KeyError>,
) {
    for (key, value) in table {
        prefix.push(key.clone());
        if let Some(error) = probe::<T>(root, prefix, value.clone()) {
            // A table whose key is fine on its own (tried empty): the error
            // is one of its keys'.
            let empty = Spanned::new(value.span(), DeValue::Table(DeTable::new()));
            match value.get_ref() {
                DeValue::Table(inner)
                    if !inner.is_empty() && probe::<T>(root, prefix, empty).is_none() =>
                {
                    walk::<T>(root, prefix, inner, out)
                }
                _ => out.push(KeyError {
                    path: prefix.iter().map(|k| k.get_ref().to_string()).collect(),
                    error,
                }),
            }
        }
        prefix.pop();
    }
}

/// `T`'s error for a table that holds only `value` at `path`, if it is not
/// one of a key being missing (the key alone lacks its siblings).
fn probe<'i, T: DeserializeOwned>(
    root: &Spanned<DeTable<'i>>,
    path: &[Spanned<DeString<'i>>],
    value: Spanned<DeValue<'i>>,
) -> Option<toml::de::Error> {
    let (first, rest) = path.split_first()?;
    let mut value = value;
    for key in rest.iter().rev() {
        let mut t = DeTable::new();
        t.insert(key.clone(), value);
        value = Spanned::new(key.span(), DeValue::Table(t));
    }
    let mut top = DeTable::new();
    top.insert(first.clone(), value);
    let doc = Spanned::new(root.span(), top);
    match T::deserialize(toml::de::Deserializer::from(doc)) {
        Err(e) if !e.message().starts_with("missing field") => Some(e),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        name: String,
        #[serde(default)]
        a: Section,
        #[serde(default)]
        b: Section,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    #[allow(dead_code)]
    struct Section {
        count: usize,
        label: String,
        inner: Option<Inner>,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        x: u8,
    }

    fn errors(text: &str) -> Vec<(String, String)> {
        let doc = DeTable::parse(text).unwrap();
        key_errors::<Doc>(&doc)
            .into_iter()
            .map(|e| (e.path.join("."), e.error.message().to_string()))
            .collect()
    }

    #[test]
    fn every_failing_key_is_found_alone_and_a_missing_key_is_no_keys_error() {
        let found =
            errors("[a]\ncount = \"ten\"\nlabl = \"x\"\n[b]\ninner = { x = 300 }\n[c]\nz = 1\n");
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["a.count", "a.labl", "b.inner.x", "c"], "{found:?}");
        assert!(found[1].1.contains("unknown field `labl`"), "{found:?}");
        // `name` is missing too: that is the document's error, not a key's.
        assert!(errors("[a]\ncount = 1\n").is_empty());
    }

    #[test]
    fn without_leaves_the_rest() {
        let doc = DeTable::parse("name = \"n\"\n[a]\ncount = \"ten\"\nlabel = \"x\"\n").unwrap();
        let bad: Vec<Vec<String>> = key_errors::<Doc>(&doc)
            .into_iter()
            .map(|e| e.path)
            .collect();
        let rest = Doc::deserialize(toml::de::Deserializer::from(without(&doc, &bad))).unwrap();
        assert_eq!((rest.a.count, rest.a.label.as_str()), (0, "x"));
    }
}
