//! Runs that ended without a measurement — HUNG, FAILED, TIMEOUT,
//! OUT_OF_MEMORY, NODE_FAIL, PREEMPTED — kept in the history's `failures`
//! table, one row per job, with the reason and the nodes it names (the
//! watchdog's or the launch doctor's, else the nodes the job ran on): a
//! node that hangs runs again and again shows in `sweep history`.

use super::{fingerprint_of, ran_at, system_of, Filter, History};
use crate::executor::State;
use crate::report::summary::Summary;
use anyhow::Result;
use rusqlite::params;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// The run's measurement id, and the job that failed it.
    pub attempt_id: String,
    pub job_id: String,
    pub study_attempt_id: String,
    pub study: String,
    pub run: String,
    pub configuration_id: String,
    pub configuration: String,
    pub system: String,
    /// The state's name, as `sweep status` says it.
    pub state: String,
    pub reason: Option<String>,
    pub nodes: Vec<String>,
    pub ran_at: String,
    pub recorded_at: String,
}

/// The states a failure is recorded for: those a run reached by itself
/// (not a cancel, an interrupt, or a state nobody knows).
fn recorded(state: State) -> bool {
    matches!(
        state,
        State::Failed
            | State::Timeout
            | State::OutOfMemory
            | State::NodeFail
            | State::Preempted
            | State::Hung
    )
}

/// A summary's runs that failed, as history rows.
pub fn failures(study: &str, s: &Summary) -> Vec<Failure> {
    let now = crate::util::now_rfc3339();
    s.runs
        .iter()
        .filter(|r| recorded(r.status.state))
        .filter_map(|r| {
            let (built, configuration) = (r.built.as_ref()?, r.configuration.as_ref()?);
            let fingerprint = fingerprint_of(r);
            let nodes = match &built.last_stop {
                Some(stop) if !stop.nodes.is_empty() => stop.nodes.clone(),
                _ => fingerprint
                    .as_ref()
                    .map(|f| f.nodes.clone())
                    .unwrap_or_default(),
            };
            Some(Failure {
                attempt_id: built.attempt_id.clone(),
                job_id: r.status.job_id.clone().unwrap_or_default(),
                study_attempt_id: built.study_attempt_id.clone(),
                study: study.to_string(),
                run: r.name.clone(),
                configuration_id: configuration.id.clone(),
                configuration: configuration.name.clone(),
                system: system_of(fingerprint.as_ref()),
                state: r.status.state.to_string(),
                reason: Some(r.status.describe()).filter(|d| d != r.status.state.as_str()),
                nodes,
                ran_at: ran_at(fingerprint.as_ref(), built),
                recorded_at: now.clone(),
            })
        })
        .collect()
}

/// Inserts failures not recorded yet (by run measurement and job); how
/// many were new.
pub(super) fn insert(
    tx: &rusqlite::Transaction<'_>,
    failures: &[Failure],
) -> rusqlite::Result<usize> {
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO failures (attempt_id, job_id, study_attempt_id, study, run,
         configuration_id, configuration, system, state, reason, nodes, ran_at, recorded_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?;
    let mut added = 0;
    for f in failures {
        added += insert.execute(params![
            f.attempt_id,
            f.job_id,
            f.study_attempt_id,
            f.study,
            f.run,
            f.configuration_id,
            f.configuration,
            f.system,
            f.state,
            f.reason,
            f.nodes.join(","),
            f.ran_at,
            f.recorded_at,
        ])?;
    }
    Ok(added)
}

impl History {
    /// The failures the filter matches, in the order they ran.
    pub fn failures(&self, filter: &Filter) -> Result<Vec<Failure>> {
        let fail = |e: rusqlite::Error| anyhow::anyhow!("reading {}: {e}", self.path.display());
        let (filter_sql, values) = filter.sql();
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT attempt_id, job_id, study_attempt_id, study, run, configuration_id,
                        configuration, system, state, reason, nodes, ran_at, recorded_at
                 FROM failures {filter_sql} ORDER BY ran_at, study, run, job_id"
            ))
            .map_err(fail)?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(values), |r| {
                let nodes: String = r.get(10)?;
                Ok(Failure {
                    attempt_id: r.get(0)?,
                    job_id: r.get(1)?,
                    study_attempt_id: r.get(2)?,
                    study: r.get(3)?,
                    run: r.get(4)?,
                    configuration_id: r.get(5)?,
                    configuration: r.get(6)?,
                    system: r.get(7)?,
                    state: r.get(8)?,
                    reason: r.get(9)?,
                    nodes: nodes
                        .split(',')
                        .filter(|n| !n.is_empty())
                        .map(str::to_string)
                        .collect(),
                    ran_at: r.get(11)?,
                    recorded_at: r.get(12)?,
                })
            })
            .map_err(fail)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(fail)
    }
}

/// `sweep history`'s failures, a line each.
pub fn text(failures: &[Failure]) -> String {
    use crate::util::text::{cell, printable};
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
        .set_header([
            "configuration",
            "system",
            "study",
            "ran",
            "job",
            "state",
            "nodes",
            "why",
        ]);
    for f in failures {
        t.add_row([
            cell(&f.configuration).into_owned(),
            cell(&f.system).into_owned(),
            cell(&f.study).into_owned(),
            printable(f.ran_at.get(..16).unwrap_or(&f.ran_at)).replace('T', " "),
            cell(&f.job_id).into_owned(),
            f.state.clone(),
            cell(&f.nodes.join(", ")).into_owned(),
            cell(f.reason.as_deref().unwrap_or("")).into_owned(),
        ]);
    }
    t.to_string()
}
