//! The manifest's axes (grid and zip), exclusions and derived values,
//! each checked against what a run may vary.

use super::validate::*;
use super::*;

impl Validator<'_, '_> {
    pub(super) fn axes(&mut self, grid: &toml::Table, zip: &[toml::Table]) -> Vec<Axis> {
        let mut axes = Vec::new();
        for (key, path, value) in flatten(grid, "", "sweep.grid") {
            if let Some(values) = self.axis_values(&key, &path, &value, true) {
                axes.push(Axis {
                    keys: vec![key],
                    rows: values.into_iter().map(|v| vec![v]).collect(),
                    paths: vec![path],
                });
            }
        }
        for (g, group) in zip.iter().enumerate() {
            let group_path = format!("sweep.zip[{g}]");
            let entries = flatten(group, "", &group_path);
            if entries.is_empty() {
                self.at_key(&group_path, "this zip group has no axes");
                continue;
            }
            let mut columns = Vec::new();
            for (key, path, value) in entries {
                if let Some(values) = self.axis_values(&key, &path, &value, false) {
                    columns.push((key, path, values));
                }
            }
            let lens: Vec<usize> = columns.iter().map(|c| c.2.len()).collect();
            if lens.windows(2).any(|w| w[0] != w[1]) {
                let detail = columns
                    .iter()
                    .map(|(k, _, v)| format!("`{k}` has {}", v.len()))
                    .collect::<Vec<_>>()
                    .join(", ");
                let d = self
                    .source
                    .at_key(&columns[1].1, format!("zipped lists must have equal lengths: {detail}"))
                    .with_help("zip pairs the i-th values of every list; use [sweep.grid] for all combinations");
                self.err(d);
                continue;
            }
            if columns.is_empty() {
                continue;
            }
            let n = lens[0];
            let rows: Vec<Vec<Value>> = (0..n)
                .map(|i| columns.iter().map(|c| c.2[i].clone()).collect())
                .collect();
            let mut seen = std::collections::HashSet::with_capacity(n);
            let key = |row: &[Value]| {
                row.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join("\u{1f}")
            };
            if let Some(i) = (0..n).find(|&i| !seen.insert(key(&rows[i]))) {
                let p = format!("{}[{i}]", columns[0].1);
                self.at_value(
                    &p,
                    format!("row {i} of this zip group repeats an earlier row"),
                );
                continue;
            }
            axes.push(Axis {
                keys: columns.iter().map(|c| c.0.clone()).collect(),
                paths: columns.iter().map(|c| c.1.clone()).collect(),
                rows,
            });
        }
        // One key, one axis.
        let mut seen: Vec<(String, String)> = Vec::new();
        for axis in &axes {
            for (k, p) in axis.keys.iter().zip(&axis.paths) {
                if let Some((_, first)) = seen.iter().find(|(s, _)| s == k) {
                    let msg = format!("`{k}` is swept twice (also at `{first}`)");
                    self.at_key(p, msg);
                } else {
                    seen.push((k.clone(), p.clone()));
                }
            }
        }
        axes
    }

    /// The values of one axis; `unique` for grid axes (a zip column may repeat values).
    pub(super) fn axis_values(
        &mut self,
        key: &str,
        path: &str,
        value: &Value,
        unique: bool,
    ) -> Option<Vec<Value>> {
        let Value::Array(values) = value else {
            self.at_value_help(
                path,
                format!("axis `{key}` must be a list of values"),
                format!("write `{key} = [{value}]`, or set it in [defaults] if it does not vary"),
            );
            return None;
        };
        if values.is_empty() {
            self.at_value(path, format!("axis `{key}` has no values"));
            return None;
        }
        let mut ok = true;
        let mut seen = std::collections::HashSet::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            let p = format!("{path}[{i}]");
            match v {
                Value::String(_) | Value::Integer(_) | Value::Float(_) | Value::Boolean(_) => {
                    if unique && !seen.insert(v.to_string()) {
                        self.at_value(&p, format!("axis `{key}` lists {v} twice"));
                        ok = false;
                    }
                }
                _ => {
                    self.at_value(
                        &p,
                        format!(
                            "axis values must be strings, numbers or booleans, not {}",
                            v.type_str()
                        ),
                    );
                    ok = false;
                }
            }
        }
        ok.then(|| values.clone())
    }

    pub(super) fn check_axis_key(&mut self, mode: &Mode, key: &str, path: &str, axis: &Axis) {
        if RESERVED.contains(&key) {
            self.at_key_help(
                path,
                format!("`{key}` is a reserved name: the templates give it a value of their own"),
                format!(
                    "name the axis otherwise; reserved: {} (`[sweep] repeats` numbers repeats)",
                    RESERVED.join(", ")
                ),
            );
            return;
        }
        let col = axis.keys.iter().position(|k| k == key).unwrap();
        let (head, rest) = match key.split_once('.') {
            Some((h, r)) => (h, Some(r)),
            None => (key, None),
        };
        if head == "slurm" {
            let Some(field) = rest else {
                self.at_key(path, "sweep `slurm.<key>`, not the whole [slurm] table");
                return;
            };
            if field == "pack" {
                self.at_key_help(
                    path,
                    "`slurm.pack` is one choice for the whole study, not an axis",
                    "set `pack = true` in [slurm]: every block of the blocked design becomes one job",
                );
                return;
            }
            if self.written("slurm", field) {
                self.at_key_help(
                    path,
                    format!("`{key}` is set both in [slurm] and as an axis"),
                    "remove one of the two",
                );
                return;
            }
            self.type_check::<SlurmSpec>(
                key,
                field,
                path,
                axis,
                col,
                &known_fields::<SlurmSpec>(),
                None,
            );
            return;
        }
        if hints::KEYS.contains(&key) {
            self.at_key_help(
                path,
                format!("`{key}` is a hint for `sweep plan`: it changes no run, so sweeping it would make runs that are one and the same"),
                "set it once, in [plan]",
            );
            return;
        }
        if self.written("defaults", key) {
            self.at_key_help(
                path,
                format!("`{key}` is set both in [defaults] and as an axis"),
                "an axis gives the values itself: remove the key from [defaults]",
            );
            return;
        }
        if let Mode::Train(_) = mode {
            let (fields, sub, nested): (Vec<String>, &str, Option<&str>) = match (head, rest) {
                ("architecture", Some(r)) => {
                    (known_fields::<ModelOverrides>(), r, Some("architecture"))
                }
                ("monitor", Some(r)) => (known_fields::<MonitorConfig>(), r, Some("monitor")),
                _ => (known_fields::<TrainConfig>(), key, None),
            };
            self.type_check::<TrainConfig>(key, sub, path, axis, col, &fields, nested);
        }
    }

    pub(super) fn at_key_help(
        &mut self,
        path: &str,
        msg: impl Into<String>,
        help: impl Into<String>,
    ) {
        let d = self.source.at_key(path, msg).with_help(help);
        self.err(d);
    }

    /// Checks that `field` exists on `T` and that every value of the axis has
    /// the right type, by deserialising a one-key table per value.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn type_check<T: DeserializeOwned>(
        &mut self,
        key: &str,
        field: &str,
        path: &str,
        axis: &Axis,
        col: usize,
        fields: &[String],
        nested: Option<&str>,
    ) {
        if !fields.iter().any(|f| f == field) {
            let help = match did_you_mean(field, fields.iter().map(String::as_str)) {
                Some(s) => format!("did you mean `{}`?", key.replace(field, s)),
                None => format!("known keys: {}", fields.join(", ")),
            };
            self.at_key_help(path, format!("unknown key `{key}`"), help);
            return;
        }
        for (i, row) in axis.rows.iter().enumerate() {
            let mut inner = toml::Table::new();
            inner.insert(field.to_string(), row[col].clone());
            let table = match nested {
                Some(n) => {
                    let mut t = toml::Table::new();
                    t.insert(n.to_string(), Value::Table(inner));
                    t
                }
                None => inner,
            };
            if let Err(e) = T::deserialize(Value::Table(table)) {
                self.at_value(
                    &format!("{path}[{i}]"),
                    format!(
                        "bad value for `{key}`: {}",
                        source::plain_types(e.message().trim())
                    ),
                );
            }
        }
    }

    pub(super) fn exclude(&mut self, rules: &[toml::Table], axes: &[Axis]) -> Vec<ExcludeRule> {
        let mut out = Vec::new();
        for (r, rule) in rules.iter().enumerate() {
            let path = format!("sweep.exclude[{r}]");
            let conds = flatten(rule, "", &path);
            if conds.is_empty() {
                self.at_key(&path, "an exclude rule needs at least one `key = value`");
                continue;
            }
            let mut conditions = Vec::new();
            for (key, p, value) in conds {
                let axis = axes.iter().find(|a| a.keys.contains(&key));
                match axis {
                    None => {
                        let keys: Vec<&str> = axes
                            .iter()
                            .flat_map(|a| a.keys.iter().map(String::as_str))
                            .collect();
                        let help = match did_you_mean(&key, keys.iter().copied()) {
                            Some(s) => format!("did you mean `{s}`?"),
                            None => format!(
                                "exclude rules name axes; the axes are: {}",
                                keys.join(", ")
                            ),
                        };
                        self.at_key_help(&p, format!("`{key}` is not an axis"), help);
                    }
                    Some(a) => {
                        let col = a.keys.iter().position(|k| *k == key).unwrap();
                        if !a.rows.iter().any(|row| row[col] == value) {
                            self.at_value(&p, format!("`{key} = {value}` matches no value of the axis, so this rule excludes nothing"));
                        } else {
                            conditions.push((key, value));
                        }
                    }
                }
            }
            out.push(ExcludeRule { conditions });
        }
        out
    }

    pub(super) fn derived(
        &mut self,
        table: &toml::Table,
        axes: &[Axis],
        defaults: &toml::Table,
    ) -> Vec<Derived> {
        let mut out = Vec::new();
        for (key, value) in table {
            let path = join_key("sweep.derived", key);
            let Value::String(expr) = value else {
                self.at_value_help(
                    &path,
                    format!("derived value `{key}` must be a string holding an expression"),
                    "e.g. `global_batch_size = \"batch_size * slurm.nodes * slurm.gpus_per_node\"`",
                );
                continue;
            };
            if let Some(field) = key.strip_prefix("slurm.") {
                // Planned before derived values are: shown, and never applied.
                self.at_key_help(
                    &path,
                    format!("a derived value cannot set [slurm]'s `{field}`: the job's [slurm] is settled before derived values are computed"),
                    format!("write `{field}` in [slurm], or sweep it as an axis `\"slurm.{field}\" = [...]`; a derived value may read `slurm.{field}`"),
                );
                continue;
            }
            let head = key.split('.').next().unwrap_or_default();
            if RESERVED.contains(&head) {
                self.at_key(
                    &path,
                    format!(
                        "`{key}` is a reserved name: the templates give it a value of their own (reserved: {})",
                        RESERVED.join(", ")
                    ),
                );
                continue;
            }
            if axes.iter().any(|a| a.keys.contains(key)) {
                self.at_key(
                    &path,
                    format!("`{key}` is both an axis and a derived value"),
                );
                continue;
            }
            if defaults.contains_key(key) {
                self.at_key(
                    &path,
                    format!("`{key}` is both in [defaults] and a derived value"),
                );
                continue;
            }
            if let Err(e) = self.engine.check(expr) {
                self.at_value(
                    &path,
                    format!("derived value `{key}` does not compile: {}", describe(&e)),
                );
                continue;
            }
            out.push(Derived {
                key: key.clone(),
                expr: expr.clone(),
            });
        }
        out
    }
}
