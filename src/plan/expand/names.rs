//! Run names: made from the axes or the template, and checked — unique,
//! unlike one another past a case or a separator, with unique ids.

use super::*;

/// `padded_pretokenized-true_batch_size-2`: the axis values, in axis order.
pub(super) fn default_name(m: &Manifest, params: &IndexMap<String, Json>) -> String {
    let parts: Vec<String> = m
        .axis_keys()
        .map(|k| {
            let short = k.rsplit('.').next().unwrap_or(k);
            match &params[k] {
                Json::String(s) => s.clone(),
                v => format!("{short}-{v}"),
            }
        })
        .collect();
    if parts.is_empty() {
        "run".into()
    } else {
        parts.join("_")
    }
}

pub(super) fn show_params(params: &IndexMap<String, Json>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which run an error is in, for its help line: its values, or every run
/// where the study has no axes.
pub(super) fn in_the_run(params: &IndexMap<String, Json>) -> String {
    match params.is_empty() {
        true => "in every run (the study has no axes)".to_string(),
        false => format!("in the run with {}", show_params(params)),
    }
}

pub(super) fn check_names(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(runs.len());
    for (i, r) in runs.iter().enumerate() {
        if let Some(&j) = seen.get(r.name.as_str()) {
            let at = if m.name_template.is_some() {
                "sweep.name"
            } else {
                "sweep"
            };
            let written = |run: &Run| {
                run.sanitized_from
                    .clone()
                    .unwrap_or_else(|| run.name.clone())
            };
            let message = match runs[j].sanitized_from.is_some() || r.sanitized_from.is_some() {
                // Names become directory names: other characters than
                // letters, digits, `.`, `_` and `-` become `-`.
                true => format!(
                    "two runs are both named `{}` once their names are made directory names: `{}` and `{}` (characters other than letters, digits, `.`, `_` and `-` become `-`)",
                    r.name,
                    written(&runs[j]).escape_debug(),
                    written(r).escape_debug()
                ),
                false => format!("two runs are both named `{}`", r.name),
            };
            let d = m
                .source
                .at_value(at, message)
                .with_help(format!(
                    "runs with {} and with {}: make the run-name template use every axis that varies, in plain characters",
                    show_params(&runs[j].params),
                    show_params(&r.params)
                ));
            return Err(d.into());
        }
        seen.insert(&r.name, i);
    }
    check_look_alikes(m, runs)
}

/// Two runs whose names, as the manifest writes them, look the same (they
/// differ only in characters Unicode lists as confusable — `а` and `a`,
/// `é` written as one character or two, full-width letters) name two
/// different runs that no reader of the plan or the report can tell apart.
/// Names in plain ASCII are compared as they are.
pub(super) fn check_look_alikes(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    let written = |run: &Run| {
        run.sanitized_from
            .clone()
            .unwrap_or_else(|| run.name.clone())
    };
    // By skeleton (UTS #39): the first run of each, and whether one of
    // them is not plain ASCII (two ASCII names, `bs-1` and `bs-l`, are
    // told apart as they are written).
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, r) in runs.iter().enumerate() {
        let name = written(r);
        let key: String = unicode_security::skeleton(&name).collect();
        let Some(&j) = seen.get(&key) else {
            seen.insert(key, i);
            continue;
        };
        let other = written(&runs[j]);
        if other == name || (other.is_ascii() && name.is_ascii()) {
            continue;
        }
        let (a, b) = first_difference(&other, &name);
        let at = if m.name_template.is_some() {
            "sweep.name"
        } else {
            "sweep"
        };
        let d = m
            .source
            .at_value(
                at,
                format!(
                    "two runs' names look alike: `{}` and `{}` differ only in characters that look the \
                     same (U+{a} against U+{b}): no reader of the plan or the report can tell the two runs apart",
                    crate::util::text::cell(&other).escape_debug(),
                    crate::util::text::cell(&name).escape_debug(),
                ),
            )
            .with_help(format!(
                "runs with {} and with {}: write the values in plain characters",
                show_params(&runs[j].params),
                show_params(&r.params)
            ));
        return Err(d.into());
    }
    Ok(())
}

/// The first characters in which two strings differ, as hex code points.
pub(super) fn first_difference(a: &str, b: &str) -> (String, String) {
    let hex =
        |c: Option<char>| c.map_or_else(|| "end".to_string(), |c| format!("{:04X}", c as u32));
    let mut x = a.chars();
    let mut y = b.chars();
    loop {
        match (x.next(), y.next()) {
            (Some(p), Some(q)) if p == q => continue,
            (p, q) => return (hex(p), hex(q)),
        }
    }
}

/// Two runs with the same id are one run twice (they differ only in values
/// that change neither what they train nor the job): an error, at the first
/// value in which they differ.
pub(super) fn check_ids(m: &Manifest, runs: &[Run]) -> Result<(), Diagnostics> {
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(runs.len());
    for (i, r) in runs.iter().enumerate() {
        let Some(&j) = seen.get(r.id.as_str()) else {
            seen.insert(&r.id, i);
            continue;
        };
        let other = &runs[j];
        if other.digest != r.digest {
            // Astronomically unlikely (see identity::ID_HEX), and no fault of
            // the manifest: said as what it is.
            let d = m.source.at_key("sweep", format!(
                "runs `{}` and `{}` are different runs whose ids collide ({}): a 64-bit hash collision",
                other.name, r.name, r.id
            )).with_help("change any value of one of them (a seed, a name does not count) and plan again; please report it");
            return Err(d.into());
        }
        let differs = r
            .params
            .iter()
            .find(|(k, v)| other.params.get(*k) != Some(*v))
            .map(|(k, _)| k.as_str());
        let mut d = match differs {
            Some(k) => m.locate(k),
            None => m.source.at_key("sweep", ""),
        };
        d.message = format!(
            "runs `{}` and `{}` are the same run (id {}): {} changes neither what they train nor the job",
            other.name,
            r.name,
            r.id,
            differs.map_or("nothing".into(), |k| format!("`{k}`"))
        );
        d.help = Some(format!(
            "runs with {} and with {}: drop the value that makes no difference, or sweep what it should change",
            show_params(&other.params),
            show_params(&r.params)
        ));
        return Err(d.into());
    }
    Ok(())
}
