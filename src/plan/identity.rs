//! A run's identity: what changes what it trains or measures, never its name, description,
//! hints or paths. Its hash is the run's id: `sweep submit` runs exactly the new identities.

use crate::config::TrainConfig;
use crate::util::hash::canonical_sha256;
use serde_json::{json, Value};

/// What counts as identity, by version: a new version changes every id. Version 2: the
/// trainer's departures from the defaults, the job's shape, `[local]` settings, the repeat.
pub const VERSION: u32 = 2;

/// Hex digits of an id: 64 bits (two of a study's 10^6 runs collide with chance ~3·10^-8).
pub const ID_HEX: usize = 16;

/// What a run computes from.
pub enum Work<'a> {
    /// The built-in trainer's configuration.
    Train(&'a TrainConfig),
    /// Any program: its command template and the values it is rendered with.
    Command { command: &'a str, params: Value },
}

/// Everything that makes a run what it is.
pub struct RunIdentity<'a> {
    pub work: Work<'a>,
    /// The job's shape and any other `[slurm]` key an axis varies.
    pub world: Value,
    /// `[local]` `threads` and `parallel` of a local study: they change what it measures.
    pub local: Option<(usize, usize)>,
}

/// A hashed identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    pub id: String,
    /// The whole hash: one id with two digests is a collision, not one run twice.
    pub digest: String,
    /// What was hashed (in `run.json`, so a later change is told field by field).
    pub value: Value,
}

impl RunIdentity<'_> {
    fn value(&self, repeat: Option<u32>) -> Value {
        let work = match &self.work {
            Work::Train(cfg) => json!({ "train": departures(cfg) }),
            Work::Command { command, params } => json!({ "command": command, "params": params }),
        };
        let mut v = json!({ "version": VERSION, "work": work, "world": self.world });
        if let Some((threads, parallel)) = self.local {
            v["local"] = json!({ "threads": threads, "parallel": parallel });
        }
        if let Some(r) = repeat {
            v["repeat"] = json!(r);
        }
        v
    }

    /// The identity of the configuration (`None`) or of one repeat of it.
    pub fn hash(&self, repeat: Option<u32>) -> Hashed {
        let value = self.value(repeat);
        let digest = canonical_sha256(&value);
        Hashed {
            id: digest[..ID_HEX].to_string(),
            digest,
            value,
        }
    }
}

/// The configuration's departures from the defaults, field by field: a new field at its default
/// changes no id.
fn departures(cfg: &TrainConfig) -> Value {
    let mine = serde_json::to_value(cfg).expect("a configuration serialises");
    let base = serde_json::to_value(TrainConfig::default()).expect("the defaults serialise");
    diff(mine, &base).unwrap_or_else(|| json!({}))
}

/// What of `mine` differs from `base` (None: nothing).
fn diff(mine: Value, base: &Value) -> Option<Value> {
    match (mine, base) {
        (Value::Object(m), Value::Object(b)) => {
            let kept: serde_json::Map<String, Value> = m
                .into_iter()
                .filter_map(|(k, v)| match b.get(&k) {
                    Some(bv) => diff(v, bv).map(|d| (k, d)),
                    None => Some((k, v)),
                })
                .collect();
            (!kept.is_empty()).then_some(Value::Object(kept))
        }
        (m, b) => (m != *b).then_some(m),
    }
}

/// The fields in which two identities differ, as a manifest names them, with both values.
pub fn differences(old: &Value, new: &Value) -> Vec<(String, String, String)> {
    changed_fields(old, new)
        .into_iter()
        .filter(|(k, _, _)| k != "version")
        .map(|(k, a, b)| (manifest_key(&k), a, b))
        .collect()
}

/// The dotted keys whose values differ between two objects, with both (`(unset)` where absent).
pub fn changed_fields(old: &Value, new: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out
}

fn walk(prefix: &str, old: &Value, new: &Value, out: &mut Vec<(String, String, String)>) {
    let show = |v: Option<&Value>| v.map_or("(unset)".to_string(), |v| v.to_string());
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) if x.is_object() && y.is_object() => walk(&key, x, y, out),
                    (x, y) if x != y => out.push((key, show(x), show(y))),
                    _ => {}
                }
            }
        }
        (a, b) if a != b => out.push((prefix.to_string(), a.to_string(), b.to_string())),
        _ => {}
    }
}

/// An identity's key as the manifest writes it.
fn manifest_key(key: &str) -> String {
    for (inner, outer) in [
        ("work.train.", ""),
        ("work.params.", ""),
        ("world.slurm.", "slurm."),
        ("world.", "slurm."),
        ("local.", "[local] "),
    ] {
        if let Some(rest) = key.strip_prefix(inner) {
            return format!("{outer}{rest}");
        }
    }
    match key {
        "work.command" => "command".into(),
        "local" => "[local]".into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TrainConfig {
        TrainConfig {
            dataset: "d.parquet".into(),
            learning_rate: 1e-3,
            ..Default::default()
        }
    }

    fn identity(cfg: &TrainConfig) -> RunIdentity<'_> {
        RunIdentity {
            work: Work::Train(cfg),
            world: json!({ "nodes": 1, "ntasks_per_node": 1, "gpus_per_node": 0 }),
            local: None,
        }
    }

    #[test]
    fn only_what_departs_from_the_defaults_is_hashed() {
        let c = cfg();
        let v = identity(&c).value(None);
        assert_eq!(
            v["work"]["train"],
            json!({ "dataset": "d.parquet", "learning_rate": 1e-3 }),
            "a field at its default is no part of the identity, so adding one changes no id"
        );
        // Written out at their defaults, fields change nothing either.
        let explicit: TrainConfig = toml::from_str(
            "dataset = 'd.parquet'\nlearning_rate = 1e-3\nprefetch = 4\n[monitor]\nwindow = 20\n",
        )
        .unwrap();
        assert_eq!(identity(&explicit).hash(None), identity(&c).hash(None));
        // A nested departure keeps only itself.
        let mut deeper = cfg();
        deeper.architecture.n_layers = Some(2);
        deeper.monitor.window = 50;
        let v = identity(&deeper).value(None);
        assert_eq!(v["work"]["train"]["architecture"], json!({ "n_layers": 2 }));
        assert_eq!(v["work"]["train"]["monitor"], json!({ "window": 50 }));
    }

    #[test]
    fn what_a_run_computes_or_measures_changes_its_id_and_nothing_else_does() {
        let c = cfg();
        let base = identity(&c).hash(None);
        assert_eq!(base.id.len(), ID_HEX);
        assert_eq!(base.id, base.digest[..ID_HEX]);
        let threads = TrainConfig {
            threads: 2,
            ..cfg()
        };
        assert_ne!(identity(&threads).hash(None), base);
        let local = RunIdentity {
            local: Some((2, 1)),
            ..identity(&c)
        };
        assert_ne!(
            local.hash(None),
            base,
            "[local] threads change what a run measures"
        );
        assert_ne!(
            identity(&c).hash(Some(1)),
            base,
            "a repeat is a run of its own"
        );
        assert_ne!(identity(&c).hash(Some(1)), identity(&c).hash(Some(2)));
    }

    #[test]
    fn differences_are_named_as_the_manifest_names_them() {
        let (a, b) = (
            cfg(),
            TrainConfig {
                threads: 2,
                ..cfg()
            },
        );
        let mut old = identity(&a).hash(None).value;
        let new = RunIdentity {
            local: Some((1, 2)),
            ..identity(&b)
        }
        .hash(None)
        .value;
        old["world"]["nodes"] = json!(2);
        assert_eq!(
            differences(&old, &new),
            vec![
                (
                    "[local]".to_string(),
                    "(unset)".to_string(),
                    "{\"parallel\":2,\"threads\":1}".to_string()
                ),
                (
                    "threads".to_string(),
                    "(unset)".to_string(),
                    "2".to_string()
                ),
                ("slurm.nodes".to_string(), "2".to_string(), "1".to_string()),
            ]
        );
    }
}
