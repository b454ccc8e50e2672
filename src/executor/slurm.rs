//! The SLURM executor: `sbatch --parsable`, one job array per group of runs sharing a header
//! and throttle (or one job per packed block), `afterok` on the stage jobs its runs need, and
//! one `squeue` for the whole sweep's states.

use super::sbatch::{sbatch, Answer};
use super::{Decision, Event, Executor, Held, State, Status, Submitted, Unit, UnitKind};
use crate::manifest::ExecutorKind;
use crate::util::process::output;
use anyhow::{Context, Result};
use indexmap::IndexMap;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What runs share to go out as one array: header, throttle, excluded nodes — not their stage
/// (split by stage, the studied axis would be confounded with the hour).
type ArrayKey = (Vec<String>, Option<u32>, Vec<String>);

/// One `sbatch` call.
#[derive(Debug, Clone, Serialize)]
pub struct Sbatch {
    /// The job id (an array's base id for arrays); empty on a dry run.
    pub job_id: String,
    pub script: PathBuf,
    pub units: Vec<String>,
    pub array: bool,
    /// The block it runs, packed (`[slurm] pack`).
    pub block: Option<u32>,
    /// The job ids it waits for: its stages' (`afterok`), and the array before it where a throttled
    /// group past MaxArraySize goes out as several (`afterany`).
    pub depends_on: Vec<String>,
    /// The stages whose jobs those are, by name (what a dry run can say).
    pub after_stages: Vec<String>,
}

/// The SLURM executor.
pub struct SlurmExecutor;

impl Executor for SlurmExecutor {
    fn submit(
        &self,
        study_dir: &Path,
        units: &mut [Unit],
        decisions: &[Decision],
        dry_run: bool,
        on: &mut dyn FnMut(Event<'_>),
    ) -> Result<Submitted> {
        let held = submit(study_dir, units, decisions, dry_run, on)?;
        Ok(Submitted {
            held,
            ..Submitted::default()
        })
    }

    fn statuses(&self, jobs: &[(&str, &Path)]) -> Result<Vec<Status>> {
        let ids: Vec<&str> = jobs.iter().map(|(id, _)| *id).collect();
        let known = query(&ids)?;
        Ok(jobs
            .iter()
            .map(|(id, dir)| match known.get(*id) {
                Some(s) => super::ended::explain(dir, id, s.clone()),
                None => status_from_exit_file(dir, id),
            })
            .collect())
    }

    /// Records each cancel in its run directory (SLURM forgets unstarted jobs) before `scancel`.
    fn cancel(&self, jobs: &[(&str, &Path)]) -> Result<()> {
        let ids: Vec<String> = jobs.iter().map(|(id, _)| id.to_string()).collect();
        for (id, dir) in jobs {
            super::ended::mark_cancelled(dir, id)?;
        }
        cancel(&ids).inspect_err(|_| {
            for (_, dir) in jobs {
                let _ = std::fs::remove_file(dir.join(super::ended::CANCELLED));
            }
        })
    }
}

/// Submits what `decisions` says, stages first, recording each job id; past SLURM's submit
/// limit the rest is held back.
pub fn submit(
    study_dir: &Path,
    units: &mut [Unit],
    decisions: &[Decision],
    dry_run: bool,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Option<Held>> {
    let mut s = Sending {
        study_dir,
        dry_run,
        on,
        sent: vec![false; units.len()],
        limit: None,
    };
    let stage_jobs = submit_stages(units, decisions, &mut s)?;
    submit_blocks(units, decisions, &stage_jobs, &mut s)?;
    submit_arrays(units, decisions, &stage_jobs, &mut s)?;
    Ok(s.limit.map(|reason| Held {
        reason,
        units: (0..units.len())
            .filter(|&i| decisions[i] == Decision::Submit && !s.sent[i])
            .collect(),
    }))
}

/// One submission as it goes: what went out, and the limit that stopped it.
struct Sending<'a> {
    study_dir: &'a Path,
    dry_run: bool,
    on: &'a mut dyn FnMut(Event<'_>),
    /// By unit: submitted by this call.
    sent: Vec<bool>,
    /// The submit limit SLURM named once it refused a job: nothing more is sent.
    limit: Option<String>,
}

impl Sending<'_> {
    /// The job id sbatch answered, or `None` where SLURM refused it for its submit limit.
    fn queued(&mut self, answer: Answer) -> Option<String> {
        match answer {
            Answer::Queued(id) => Some(id),
            Answer::Full(limit) => {
                self.limit = Some(limit);
                None
            }
        }
    }

    /// `job` went out with the units `members`: said at once.
    fn sent(&mut self, job: &Sbatch, members: &[usize]) {
        for &i in members {
            self.sent[i] = true;
        }
        (self.on)(Event::Submitted(job));
    }
}

/// Submits the stages due; every stage's job runs may wait for, by stage index.
fn submit_stages(
    units: &mut [Unit],
    decisions: &[Decision],
    s: &mut Sending<'_>,
) -> Result<HashMap<usize, String>> {
    let mut stage_jobs: HashMap<usize, String> = HashMap::new();
    for i in 0..units.len() {
        if units[i].kind != UnitKind::Stage {
            continue;
        }
        match &decisions[i] {
            Decision::Submit if s.limit.is_none() => {
                let script = units[i].dir.join(crate::layout::JOB_SBATCH);
                let Some(id) = s.queued(sbatch(&[], &script, s.dry_run)?) else {
                    continue;
                };
                if !s.dry_run {
                    units[i].record_job(ExecutorKind::Slurm, id.clone())?;
                }
                // A dry run has no id: the stage's name keeps its runs apart, as its id would.
                let dep = if s.dry_run {
                    units[i].name.clone()
                } else {
                    id.clone()
                };
                stage_jobs.insert(i, dep);
                let job = Sbatch {
                    job_id: id,
                    script,
                    units: vec![units[i].name.clone()],
                    array: false,
                    block: None,
                    depends_on: vec![],
                    after_stages: vec![],
                };
                s.sent(&job, &[i]);
            }
            Decision::Skip(st) if st.is_active() => {
                if let Some(j) = units[i].record.last_job() {
                    stage_jobs.insert(i, j.job_id.clone());
                }
            }
            _ => {}
        }
    }
    Ok(stage_jobs)
}

/// `--dependency=afterok:…` for the jobs `dep` names, if any.
fn after(dep: &[String]) -> Vec<String> {
    after_and(dep, None)
}

/// One `--dependency` (sbatch keeps only the last): `afterok` on `dep`, `afterany` on `any`,
/// with `--kill-on-invalid-dep=yes` (else a failed stage leaves dependants PENDING for ever).
fn after_and(dep: &[String], any: Option<&str>) -> Vec<String> {
    let mut parts = Vec::new();
    if !dep.is_empty() {
        parts.push(format!("afterok:{}", dep.join(":")));
    }
    if let Some(job) = any {
        parts.push(format!("afterany:{job}"));
    }
    let mut args = Vec::new();
    if !parts.is_empty() {
        args.push(format!("--dependency={}", parts.join(",")));
    }
    if !dep.is_empty() {
        args.push("--kill-on-invalid-dep=yes".to_string());
    }
    args
}

/// Packed runs, block by block, each block one job.
fn submit_blocks(
    units: &mut [Unit],
    decisions: &[Decision],
    stage_jobs: &HashMap<usize, String>,
    s: &mut Sending<'_>,
) -> Result<()> {
    let mut blocks: IndexMap<u32, Vec<usize>> = IndexMap::new();
    for (i, u) in units.iter().enumerate() {
        if let (UnitKind::Run, Decision::Submit, Some(b)) = (u.kind, &decisions[i], u.pack) {
            blocks.entry(b).or_default().push(i);
        }
    }
    for (block, members) in blocks {
        if s.limit.is_some() {
            break;
        }
        let (dep, after_stages) = waits_for(units, &members, stage_jobs);
        let allocation =
            crate::plan::pack::Allocation::of(members.iter().map(|&i| &units[i].slurm))
                .expect("a block has runs");
        let head = crate::plan::pack::block_header(&header(&units[members[0]].script), &allocation);
        let dirs: Vec<PathBuf> = members.iter().map(|&i| units[i].dir.clone()).collect();
        let script = super::scripts::block(s.study_dir, block, &head, &dirs, s.dry_run)?;
        let Some(id) = s.queued(sbatch(&after(&dep), &script, s.dry_run)?) else {
            break;
        };
        if !s.dry_run {
            for &i in &members {
                units[i].record_job_in(ExecutorKind::Slurm, id.clone(), Some(block))?;
            }
        }
        let job = Sbatch {
            job_id: id,
            script,
            units: members.iter().map(|&i| units[i].name.clone()).collect(),
            array: false,
            block: Some(block),
            after_stages,
            depends_on: dep.into_iter().filter(|_| !s.dry_run).collect(),
        };
        s.sent(&job, &members);
    }
    Ok(())
}

/// The other runs: those sharing header and throttle as one array, a run alone as a job.
fn submit_arrays(
    units: &mut [Unit],
    decisions: &[Decision],
    stage_jobs: &HashMap<usize, String>,
    s: &mut Sending<'_>,
) -> Result<()> {
    let mut groups: IndexMap<ArrayKey, Vec<usize>> = IndexMap::new();
    for (i, u) in units.iter().enumerate() {
        if u.kind != UnitKind::Run || decisions[i] != Decision::Submit || u.pack.is_some() {
            continue;
        }
        groups
            .entry((header(&u.script), u.slurm.array_throttle, left_out(u)))
            .or_default()
            .push(i);
    }
    // Task indices stay below MaxArraySize: a larger group goes out as several arrays, each after
    // the one before where a throttle holds (`%N` is per array).
    let max = match s.dry_run || groups.values().all(|m| m.len() < 2) {
        true => crate::util::slurm::DEFAULT_MAX_ARRAY_SIZE,
        false => crate::util::slurm::max_array_size(),
    };
    let going = throttled_going(units, decisions, &groups);
    for (key, members) in groups {
        // A throttled group whose earlier array still runs waits for it.
        let mut previous: Option<String> = going.get(&key).cloned();
        let (head, throttle, exclude) = key;
        let mut arrays: std::collections::VecDeque<&[usize]> = members.chunks(max).collect();
        while let Some(chunk) = arrays.pop_front() {
            if s.limit.is_some() {
                return Ok(());
            }
            let job = ArrayJob {
                head: &head,
                throttle,
                exclude: &exclude,
                after: previous.as_deref().filter(|_| throttle.is_some()),
            };
            match submit_array(units, chunk, job, stage_jobs, s)? {
                Answer::Queued(id) => previous = Some(id),
                // Each task counts against the limit: the first half may fit where the whole does not.
                Answer::Full(_) if chunk.len() > 1 => {
                    let (first, second) = chunk.split_at(chunk.len().div_ceil(2));
                    arrays.push_front(second);
                    arrays.push_front(first);
                }
                // One run refused: nothing more is sent.
                refused => _ = s.queued(refused),
            }
        }
    }
    Ok(())
}

/// The newest job still going of each throttled group: its next array waits for it, or the
/// group would run twice N at once.
fn throttled_going(
    units: &[Unit],
    decisions: &[Decision],
    groups: &IndexMap<ArrayKey, Vec<usize>>,
) -> HashMap<ArrayKey, String> {
    let mut going: HashMap<ArrayKey, (u64, String)> = HashMap::new();
    for (u, d) in units.iter().zip(decisions) {
        let active = matches!(d, Decision::Skip(st) if st.is_active());
        if u.kind != UnitKind::Run
            || u.pack.is_some()
            || u.slurm.array_throttle.is_none()
            || !active
        {
            continue;
        }
        let key = (header(&u.script), u.slurm.array_throttle, left_out(u));
        let Some(job) = u.record.last_job().filter(|_| groups.contains_key(&key)) else {
            continue;
        };
        let base = job.job_id.split('_').next().unwrap_or_default();
        let Ok(n) = base.parse::<u64>() else { continue };
        if going.get(&key).is_none_or(|(newest, _)| n > *newest) {
            going.insert(key, (n, base.to_string()));
        }
    }
    going.into_iter().map(|(k, (_, id))| (k, id)).collect()
}

/// What one array of a group shares: header, throttle, nodes left out, the array to wait for.
struct ArrayJob<'a> {
    head: &'a [String],
    throttle: Option<u32>,
    exclude: &'a [String],
    after: Option<&'a str>,
}

/// One array of `members` (a run alone: its own job), after its stages and the array before.
fn submit_array(
    units: &mut [Unit],
    members: &[usize],
    job: ArrayJob<'_>,
    stage_jobs: &HashMap<usize, String>,
    s: &mut Sending<'_>,
) -> Result<Answer> {
    let (dep, after_stages) = waits_for(units, members, stage_jobs);
    let mut args = after_and(&dep, job.after);
    if !job.exclude.is_empty() {
        args.push(format!("--exclude={}", job.exclude.join(",")));
    }
    let (script, array) = match members {
        [one] => (units[*one].dir.join(crate::layout::JOB_SBATCH), false),
        _ => {
            let dirs: Vec<PathBuf> = members.iter().map(|&i| units[i].dir.clone()).collect();
            let script = super::scripts::array(s.study_dir, job.head, &dirs, s.dry_run)?;
            let mut range = format!("--array=0-{}", members.len() - 1);
            if let Some(t) = job.throttle {
                range.push_str(&format!("%{t}"));
            }
            args.push(range);
            (script, true)
        }
    };
    let id = match sbatch(&args, &script, s.dry_run)? {
        Answer::Queued(id) => id,
        full => return Ok(full),
    };
    if !s.dry_run {
        for (k, &i) in members.iter().enumerate() {
            let task = match array {
                true => format!("{id}_{k}"),
                false => id.clone(),
            };
            units[i].record_job(ExecutorKind::Slurm, task)?;
        }
    }
    let sent = Sbatch {
        job_id: id.clone(),
        script,
        units: members.iter().map(|&i| units[i].name.clone()).collect(),
        array,
        block: None,
        after_stages,
        depends_on: waited(dep, job.after, s.dry_run),
    };
    s.sent(&sent, members);
    Ok(Answer::Queued(id))
}

/// The jobs a submitted job waits for, as submitted (none on a dry run).
fn waited(dep: Vec<String>, after: Option<&str>, dry_run: bool) -> Vec<String> {
    match dry_run {
        true => Vec::new(),
        false => dep.into_iter().chain(after.map(str::to_string)).collect(),
    }
}

/// The nodes a run that hung leaves out when it runs again: those its watchdog named, unless
/// its partition would then have too few.
fn left_out(u: &Unit) -> Vec<String> {
    let Some(job) = u.record.last_job() else {
        return Vec::new();
    };
    let Some(s) = job.stopped.as_ref() else {
        return Vec::new();
    };
    if s.by != crate::plan::record::StoppedBy::Watchdog || s.nodes.is_empty() {
        return Vec::new();
    }
    let nodes = cluster_nodes(u.slurm.partition.as_deref());
    let left = nodes.iter().filter(|n| !s.nodes.contains(n)).count();
    if left < u.slurm.nodes.get() as usize {
        eprintln!(
            "sweep: {} hung on {}; not leaving {} out: {} would leave too few nodes for it",
            u.name,
            s.nodes.join(", "),
            if s.nodes.len() > 1 { "them" } else { "it" },
            u.slurm
                .partition
                .as_deref()
                .map_or("the cluster".to_string(), |p| format!("partition {p}")),
        );
        return Vec::new();
    }
    eprintln!(
        "sweep: {} hung on {}: its retry leaves {} out (--exclude)",
        u.name,
        s.nodes.join(", "),
        s.nodes.join(", ")
    );
    s.nodes.clone()
}

/// The nodes SLURM lists (in `partition`), each once.
fn cluster_nodes(partition: Option<&str>) -> Vec<String> {
    let mut cmd = crate::util::slurm::query("sinfo");
    cmd.args(["--noheader", "--Node", "--format=%N"]);
    if let Some(p) = partition {
        cmd.arg(format!("--partition={p}"));
    }
    let mut nodes: Vec<String> = output(&mut cmd)
        .map(|o| {
            o.lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The job ids `members` wait for (`afterok`): every unfinished stage they need, in plan order,
/// and those stages' names.
fn waits_for(
    units: &[Unit],
    members: &[usize],
    stage_jobs: &HashMap<usize, String>,
) -> (Vec<String>, Vec<String>) {
    let mut stages: Vec<usize> = members
        .iter()
        .filter_map(|&i| units[i].stage)
        .filter(|s| stage_jobs.contains_key(s))
        .collect();
    stages.sort_unstable();
    stages.dedup();
    (
        stages.iter().map(|s| stage_jobs[s].clone()).collect(),
        stages.iter().map(|&s| units[s].name.clone()).collect(),
    )
}

/// The `#SBATCH` lines of a script that do not name the run (its output file).
fn header(script: &str) -> Vec<String> {
    script
        .lines()
        .filter(|l| l.starts_with("#SBATCH"))
        .filter(|l| !l.contains("--output="))
        .map(str::to_string)
        .collect()
}

/// Every state SLURM still knows for these jobs: one `squeue`, then one `sacct` for the rest.
pub fn query(ids: &[&str]) -> Result<HashMap<String, Status>> {
    let out = output(crate::util::slurm::query("squeue").args([
        "--me",
        "--noheader",
        "--states=all",
        "--array",
        "--Format=JobArrayID:64,State:32,exit_code:16,Reason:512",
    ]))
    .context(
        "asking SLURM for the sweep's jobs (is the cluster up? `scripts/local-slurm.sh up`)",
    )?;
    let mut found = parse_squeue(&out);
    let missing: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !found.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        found.extend(sacct(&missing));
    }
    Ok(found)
}

pub(crate) fn parse_squeue(out: &str) -> HashMap<String, Status> {
    let mut map = HashMap::new();
    for line in out.lines() {
        let mut parts = line.split_whitespace();
        let (Some(id), Some(state), Some(exit)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let reason = parts.collect::<Vec<_>>().join(" ");
        // A job SLURM could not launch never ran: its code (`0:53`) is neither status nor signal.
        let (code, signal) = match reason.as_str() {
            "JobLaunchFailure" => (None, None),
            _ => parse_exit(exit),
        };
        let state = match (State::from_slurm(state), code) {
            // The trainer's and the watchdog's exit codes say what failed.
            (State::Failed, Some(c)) => Status::exited(c).state,
            (state, _) => state,
        };
        map.insert(
            id.to_string(),
            Status {
                state,
                exit_code: if state.is_active() { None } else { code },
                signal,
                reason: Some(reason).filter(|r| !r.is_empty() && r != "None"),
                job_id: Some(id.to_string()),
                run_s: None,
            },
        );
    }
    map
}

/// `sacct` (else the exit-code files), a thousand ids a call (the kernel's 128 KiB of arguments).
fn sacct(ids: &[&str]) -> HashMap<String, Status> {
    ids.chunks(1000).flat_map(sacct_some).collect()
}

fn sacct_some(ids: &[&str]) -> HashMap<String, Status> {
    let out = crate::util::slurm::query("sacct")
        .args([
            "-X",
            "-P",
            "-n",
            "-o",
            "JobID,State,ExitCode,ElapsedRaw",
            "-j",
            &ids.join(","),
        ])
        .output();
    let mut map = HashMap::new();
    let Ok(out) = out else { return map };
    if !out.status.success() {
        return map;
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split('|').collect();
        if f.len() < 3 {
            continue;
        }
        let (code, signal) = parse_exit(f[2]);
        let state = match (State::from_slurm(f[1]), code) {
            // The trainer says it ran out of device memory by its exit code.
            (State::Failed, Some(c)) => Status::exited(c).state,
            (state, _) => state,
        };
        map.insert(
            f[0].to_string(),
            Status {
                state,
                exit_code: code,
                signal,
                reason: None,
                job_id: Some(f[0].to_string()),
                // Seconds; a job still running is not done measuring.
                run_s: f
                    .get(3)
                    .and_then(|s| s.trim().parse().ok())
                    .filter(|_| !state.is_active()),
            },
        );
    }
    map
}

/// `3:0` (code:signal, scontrol/sacct) or a raw wait status (`768`, squeue on 22.05).
pub(crate) fn parse_exit(s: &str) -> (Option<i32>, Option<i32>) {
    if let Some((c, sig)) = s.split_once(':') {
        return (c.parse().ok(), sig.parse().ok().filter(|&x: &i32| x != 0));
    }
    match s.parse::<i32>() {
        Ok(raw) => (Some(raw >> 8), Some(raw & 0x7f).filter(|&x| x != 0)),
        Err(_) => (None, None),
    }
}

/// The state of a job the scheduler forgot, from what its run directory recorded.
pub fn status_from_exit_file(dir: &Path, job_id: &str) -> Status {
    super::ended::recorded(dir, job_id).unwrap_or_else(|| {
        Status::new(State::Unknown).with_reason(format!(
            "SLURM no longer lists job {job_id} and it left no exit code in its run directory"
        ))
    })
}

/// A partition's name and time limit in seconds (`None`: unlimited) as `sinfo` gives them (the
/// default partition where `partition` is `None`); `Ok(None)` where there is no such partition.
pub fn partition_limit(partition: Option<&str>) -> Result<Option<(String, Option<u64>)>> {
    let out = output(crate::util::slurm::query("sinfo").args(["--noheader", "--format=%P %l"]))
        .context("asking SLURM for its partitions' time limits (sinfo)")?;
    Ok(parse_partition_limit(&out, partition))
}

fn parse_partition_limit(out: &str, partition: Option<&str>) -> Option<(String, Option<u64>)> {
    out.lines().find_map(|line| {
        let (name, limit) = line.trim().split_once(' ')?;
        let (name, default) = match name.strip_suffix('*') {
            Some(n) => (n, true),
            None => (name, false),
        };
        let wanted = match partition {
            Some(p) => p == name,
            None => default,
        };
        let limit = match limit.trim() {
            "infinite" | "UNLIMITED" => None,
            l => Some(crate::manifest::parse_slurm_time(l).ok()?),
        };
        wanted.then(|| (name.to_string(), limit))
    })
}

pub fn cancel(ids: &[String]) -> Result<()> {
    // A packed block's runs share its job: cancelled once.
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    output(crate::util::slurm::query("scancel").args(&ids))
        .context("cancelling the sweep's jobs")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_decode() {
        assert_eq!(parse_exit("768"), (Some(3), None));
        assert_eq!(parse_exit("15"), (Some(0), Some(15)));
        assert_eq!(parse_exit("3:0"), (Some(3), None));
        assert_eq!(parse_exit("0:15"), (Some(0), Some(15)));
    }

    #[test]
    fn squeue_lines_parse() {
        let out = "5_0       RUNNING     0      None\n4   FAILED   768   NonZeroExitCode\n7_[1-5%1]  PENDING  0  JobArrayTaskLimit\n9  FAILED  4021  JobLaunchFailure\n";
        let m = parse_squeue(out);
        assert_eq!(m["5_0"].state, State::Running);
        assert_eq!(m["4"].describe(), "FAILED (exit 3)");
        assert_eq!(m["9"].describe(), "FAILED (JobLaunchFailure)");
        assert_eq!(m["7_[1-5%1]"].reason.as_deref(), Some("JobArrayTaskLimit"));
    }

    #[test]
    fn partition_limits_parse() {
        let out = "debug* infinite\nnormal 1-00:00:00\nshort 10:00\n";
        assert_eq!(
            parse_partition_limit(out, None),
            Some(("debug".into(), None))
        );
        assert_eq!(
            parse_partition_limit(out, Some("short")),
            Some(("short".into(), Some(600)))
        );
        assert_eq!(
            parse_partition_limit(out, Some("normal")),
            Some(("normal".into(), Some(86_400)))
        );
        assert_eq!(parse_partition_limit(out, Some("gpu")), None);
    }

    #[test]
    fn array_header_drops_only_the_output_line() {
        let s = "#!/bin/bash\n#SBATCH --job-name=x\n#SBATCH --output=/r/a/%x-%j.out\n#SBATCH --time=1\necho\n";
        assert_eq!(header(s), vec!["#SBATCH --job-name=x", "#SBATCH --time=1"]);
    }
}
