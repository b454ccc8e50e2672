//! A run's values between the manifest's TOML and the templates' JSON,
//! and the trainer's configuration made of them.

use super::*;

/// A `[defaults]`-shaped table as a trainer configuration (types only).
pub(super) fn parse_train(table: &toml::Table) -> Result<TrainConfig, toml::de::Error> {
    Value::Table(table.clone()).try_into()
}

/// A `[defaults]`-shaped table as a checked trainer configuration; on error
/// the key at fault (when known) and the message.
pub(super) fn check_train(
    table: &toml::Table,
    features: Features,
) -> Result<TrainConfig, (Option<&'static str>, String)> {
    if table.contains_key("launcher") {
        let msg = "`launcher` is for a `command` study: sweep starts the built-in trainer's ranks itself (srun on SLURM, mpirun on this machine)";
        return Err((Some("launcher"), msg.to_string()));
    }
    let cfg = parse_train(table).map_err(|e| (None, e.message().to_string()))?;
    cfg.validate()
        .and_then(|()| cfg.check_build(features))
        .map_err(|e| (Some(e.key), e.message))?;
    Ok(cfg)
}

pub(super) fn set_dotted(table: &mut toml::Table, key: &str, value: Value) {
    match key.split_once('.') {
        None => {
            table.insert(key.to_string(), value);
        }
        Some((head, rest)) => {
            let entry = table
                .entry(head.to_string())
                .or_insert_with(|| Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = Value::Table(toml::Table::new());
            }
            if let Value::Table(t) = entry {
                set_dotted(t, rest, value);
            }
        }
    }
}

pub(super) fn table_json(table: &toml::Table, params: &IndexMap<String, Json>) -> Json {
    let mut v = to_json(&Value::Table(table.clone()));
    for (k, p) in params {
        if !k.contains('.') {
            v[k.as_str()] = p.clone();
        }
    }
    v
}

pub(crate) fn to_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::String(s.clone()),
        Value::Integer(i) => json!(i),
        Value::Float(f) => json!(f),
        Value::Boolean(b) => json!(b),
        Value::Datetime(d) => Json::String(d.to_string()),
        Value::Array(a) => Json::Array(a.iter().map(to_json).collect()),
        Value::Table(t) => Json::Object(t.iter().map(|(k, v)| (k.clone(), to_json(v))).collect()),
    }
}

/// A derived value as TOML; `none` has no TOML form and is an error, not a
/// silently missing key.
pub(super) fn json_to_toml(v: &Json) -> Result<Value, &'static str> {
    Ok(match v {
        Json::Null => return Err("is none (TOML has no null)"),
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::Integer(i),
            (None, Some(f)) => Value::Float(f),
            (None, None) => return Err("is a number TOML cannot hold"),
        },
        Json::String(s) => Value::String(s.clone()),
        Json::Array(a) => Value::Array(a.iter().map(json_to_toml).collect::<Result<_, _>>()?),
        Json::Object(o) => Value::Table(
            o.iter()
                .map(|(k, v)| Ok((k.clone(), json_to_toml(v)?)))
                .collect::<Result<_, &'static str>>()?,
        ),
    })
}
