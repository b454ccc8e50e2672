//! Which keys and values each table of a manifest takes, read from the
//! types that parse them, for errors that name what was meant.

use super::*;

/// The keys a table of the manifest takes, by its key path, from the types
/// that read it.
pub(super) fn fields_of(section: &str) -> Option<Vec<String>> {
    use crate::config::{ModelOverrides, MonitorConfig};
    Some(match section {
        "" => known_fields::<ManifestFile>(),
        "sweep" => known_fields::<schema::SweepFile>(),
        "slurm" => known_fields::<SlurmSpec>(),
        "local" => known_fields::<LocalSpec>(),
        "stages" => known_fields::<StagesSpec>(),
        "stages.pretokenize" => known_fields::<PretokenizeStageSpec>(),
        "report" => known_fields::<ReportSpec>(),
        "environment" => known_fields::<EnvironmentSpec>(),
        "plan" => known_fields::<PlanHints>(),
        "defaults" => known_fields::<TrainConfig>(),
        "defaults.architecture" => known_fields::<ModelOverrides>(),
        "defaults.monitor" => known_fields::<MonitorConfig>(),
        _ => return None,
    })
}

/// The values an enum key takes, by its key path, and what they are called.
pub(super) fn values_of(key: &str) -> Option<(&'static str, Vec<String>)> {
    use crate::config::{
        AttentionKind, DataOrder, DatasetType, DeviceKind, LrSchedule, Precision, Recompute,
    };
    if key == "slurm.template" || key == "stages.pretokenize.template" {
        let names = TemplateChoice::NAMES
            .iter()
            .map(|n| n.to_string())
            .collect();
        return Some(("template", names));
    }
    Some((
        "value",
        match key {
            "executor" => known_variants::<ExecutorKind>(),
            "defaults.dataset_type" => known_variants::<DatasetType>(),
            "defaults.data_order" => known_variants::<DataOrder>(),
            "defaults.precision" => known_variants::<Precision>(),
            "defaults.attention" => known_variants::<AttentionKind>(),
            "defaults.recompute" => known_variants::<Recompute>(),
            "defaults.kernels" => known_variants::<crate::config::runtime::CudaKernels>(),
            "defaults.device" => known_variants::<DeviceKind>(),
            "defaults.lr_schedule" => known_variants::<LrSchedule>(),
            _ => return None,
        },
    ))
}

/// Where a TOML error's key is not a key of its table, or its value not one
/// of its enum's: the message and a did-you-mean, from the types' own lists
/// (never from the text of serde's message).
pub(super) fn explain_key(source: &ManifestText, key: &str) -> Option<(String, String)> {
    let section = source::parent_path(key).unwrap_or("");
    let word = source::last_segment(key);
    let help = |word: &str, expected: &[String]| match did_you_mean(
        word,
        expected.iter().map(String::as_str),
    ) {
        Some(s) => format!("did you mean `{s}`?"),
        None if expected.is_empty() => "this table takes no keys".to_string(),
        None => format!("expected one of: {}", expected.join(", ")),
    };
    if let Some(fields) = fields_of(section) {
        if !fields.iter().any(|f| f == word) {
            let at = if section.is_empty() {
                String::new()
            } else {
                format!(" in [{section}]")
            };
            return Some((format!("unknown key `{word}`{at}"), help(word, &fields)));
        }
    }
    let (noun, values) = values_of(key)?;
    let value = source.string_value(key)?;
    (!values.iter().any(|v| v == value))
        .then(|| (format!("unknown {noun} `{value}`"), help(value, &values)))
}

/// The field names of a struct, from its own `Deserialize` implementation
/// (serde's derive hands them to `deserialize_struct`), so the list never
/// drifts from the type.
pub fn known_fields<T: DeserializeOwned>() -> Vec<String> {
    probed_names::<T>()
}

/// The variant names of an enum (as manifests spell them), from its own
/// `Deserialize` implementation, as [`known_fields`] does for structs.
pub fn known_variants<T: DeserializeOwned>() -> Vec<String> {
    probed_names::<T>()
}

/// The names a type's `Deserialize` asks for: its fields or its variants.
pub(super) fn probed_names<T: DeserializeOwned>() -> Vec<String> {
    let mut probe = FieldsProbe(None);
    let _ = T::deserialize(&mut probe);
    probe
        .0
        .unwrap_or_default()
        .iter()
        .map(|f| f.to_string())
        .collect()
}

/// A deserializer that records the field (or variant) list it is asked for
/// and gives nothing.
pub(super) struct FieldsProbe(Option<&'static [&'static str]>);

impl<'de> serde::Deserializer<'de> for &mut FieldsProbe {
    type Error = serde::de::value::Error;

    fn deserialize_struct<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(serde::de::Error::custom("probed"))
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(variants);
        Err(serde::de::Error::custom("probed"))
    }

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
        identifier ignored_any
    }
}
