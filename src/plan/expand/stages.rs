//! The pretokenize stages: one per distinct input, shared by every run
//! that reads it.

use super::*;

/// Finds the pretokenize jobs: one per distinct input, shared by all runs that read it.
pub(super) fn stages(
    m: &Manifest,
    study_dir: &std::path::Path,
    runs: &mut [Run],
) -> Result<Vec<Stage>, Diagnostics> {
    let spec = &m.stages.pretokenize;
    let mut stages: Vec<Stage> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for run in runs.iter_mut() {
        let Job::Train(cfg) = &mut run.job else {
            continue;
        };
        if !cfg.pretokenized || cfg.pretokenized_path.is_some() {
            continue;
        }
        if !spec.enabled {
            let mut d = m.locate("pretokenized");
            d.message = format!(
                "run `{}` reads pretokenized data but the pretokenize stage is disabled",
                run.name
            );
            d.help = Some("enable [stages.pretokenize] or set `pretokenized_path`".into());
            return Err(d.into());
        }
        let format = PretokenizedFormat::for_dataset(cfg.dataset_type);
        let key = json!({
            "dataset": cfg.dataset, "text_column": cfg.text_column, "tokenizer": cfg.tokenizer,
            "sequence_length": cfg.sequence_length, "format": format,
            "bos": cfg.bos_token, "eos": cfg.eos_token, "pad": cfg.pad_token,
            "row_group_size": spec.row_group_size,
        });
        let id = short_id(&key);
        let index = *by_id.entry(id.clone()).or_insert_with(|| {
            let name = format!("pretokenize-{}-{id}", format.as_str());
            let dir = study_dir.join(crate::layout::STAGES_DIR).join(&name);
            let mut slurm = SlurmSpec {
                nodes: std::num::NonZeroU32::MIN,
                ntasks_per_node: std::num::NonZeroU32::MIN,
                gpus_per_node: 0,
                array_throttle: None,
                requeue: false,
                // A stage is a job of its own, before the blocks that need it.
                pack: false,
                template: spec.template.clone(),
                job_name: Some(format!("{}-pretokenize", m.name)),
                ..m.slurm.clone()
            };
            if let Some(t) = &spec.time {
                slurm.time = t.clone();
            }
            slurm.cpus_per_task = spec.cpus_per_task.or(slurm.cpus_per_task);
            slurm.partition = spec.partition.clone().or(slurm.partition);
            slurm.mem = spec.mem.clone().or(slurm.mem);
            stages.push(Stage {
                id: id.clone(),
                output: dir.join(format!("{}.parquet", format.as_str())),
                name,
                dataset: crate::util::fs::absolute(&m.root, &cfg.dataset),
                text_column: cfg.text_column.clone(),
                tokenizer: crate::util::fs::absolute(&m.root, &cfg.tokenizer),
                sequence_length: cfg.sequence_length,
                format,
                specials: cfg.specials(),
                row_group_size: spec.row_group_size,
                dir,
                slurm,
            });
            stages.len() - 1
        });
        cfg.pretokenized_path = Some(stages[index].output.clone());
        run.stage = Some(index);
    }
    Ok(stages)
}
