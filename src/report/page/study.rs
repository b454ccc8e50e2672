//! `report.html`: a study on one page — what was run, the problems, the
//! summary table, every chart, its history, and a section per
//! configuration with its parameters, its runs and links to their files.

use super::check::history_section;
use super::{figures, provenance, render, Cell, Html, Live, Provenance};
use crate::executor::State;
use crate::report::check::Check;
use crate::report::export::{shown, Exporter, Tables};
use crate::report::ingest::{LogTail, RunLog};
use crate::report::plot::Chart;
use crate::report::summary::Row;
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What a study's page shows: its tables, charts and provenance, where it
/// is written (links to run files are relative to it), and its history.
pub struct StudyPage<'a> {
    pub tables: Tables<'a>,
    pub charts: &'a [Chart],
    pub provenance: &'a Provenance,
    pub dir: &'a Path,
    pub live: Live,
    pub history: Option<&'a Check>,
}

impl Exporter<StudyPage<'_>> for Html {
    fn export(&self, page: &StudyPage<'_>) -> Result<Vec<u8>> {
        Ok(study(page).into_bytes())
    }
}

fn study(page: &StudyPage<'_>) -> String {
    let StudyPage {
        tables,
        charts,
        provenance: p,
        dir,
        live,
        history,
    } = page;
    let (s, baseline, skip_first) = (tables.summary, tables.baseline, tables.skip_first);
    let columns = shown::columns(s);
    let headers: Vec<&str> = std::iter::once("Configuration")
        .chain(columns.iter().map(|c| c.header.as_str()))
        .chain(["State"])
        .collect();
    let rows: Vec<serde_json::Value> = s
        .rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let is_base = baseline.is_some_and(|b| r.name == b || r.members.iter().any(|m| m == b));
            let mut cells: Vec<Cell> = columns
                .iter()
                .map(|c| Cell::value(c.cells[i].value, &c.cells[i].text))
                .collect();
            cells.push(Cell::text(&r.state));
            serde_json::json!({
                "name": r.name,
                "shown": if is_base { format!("{} (baseline)", r.name) } else { r.name.clone() },
                "baseline": is_base,
                "cells": cells,
            })
        })
        .collect();
    let mut design: Vec<String> = s.pairing().into_iter().collect();
    if let Some(d) = &s.design {
        design.push(format!("Where each block ran: {}", d.places_line()));
        design.extend(d.effects_line().map(|l| format!("Place in the block: {l}")));
    }
    let charts: Vec<&Chart> = charts.iter().collect();
    render(
        "study.html",
        serde_json::json!({
            "title": format!("{} — sweep report", p.study),
            "reload": live.reload,
            "study": p.study,
            "description": p.description.trim(),
            "provenance": provenance(p),
            "problems": s.problems.iter().map(|pr| pr.describe()).collect::<Vec<_>>(),
            "stragglers": s.stragglers.iter().map(|st| st.describe()).collect::<Vec<_>>(),
            "straggler_threshold_pct": format!("{:.0}", crate::report::straggler::THRESHOLD_PCT),
            "skip_first": skip_first,
            "design": design,
            "baseline": baseline,
            "comparisons": s.rows.len().saturating_sub(1),
            "headers": headers,
            "rows": rows,
            "mfu_note": shown::mfu_note(s),
            "hints": s.hints,
            "charts": figures(&charts),
            "history": history.filter(|c| !c.trends.is_empty()).map(history_section),
            "configurations": s.rows.iter().map(|row| configuration(row, &s.runs, dir)).collect::<Vec<_>>(),
            "manifest": p.manifest.as_ref().map(|(path, text)| serde_json::json!({
                "path": path.display().to_string(),
                "text": text,
            })),
        }),
    )
}

#[derive(Serialize)]
struct FileLink {
    href: String,
    name: String,
}

#[derive(Serialize)]
struct RunShown {
    name: String,
    state: String,
    class: &'static str,
    notes: Vec<String>,
    files: Vec<FileLink>,
    log: Option<LogTail>,
}

/// A configuration's section: its parameters and its runs, each with its
/// state, notes, files and, for a failed run, the last lines of its log.
fn configuration(row: &Row, runs: &[RunLog], page_dir: &Path) -> serde_json::Value {
    let runs: Vec<RunShown> = row
        .runs
        .iter()
        .map(|&i| {
            let run = &runs[i];
            let ok = run.status.state == State::Completed && run.issues.is_empty();
            let files = run
                .dir
                .as_deref()
                .map(|dir| {
                    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.is_file())
                        .collect();
                    names.sort();
                    names
                        .iter()
                        .filter_map(|f| {
                            Some(FileLink {
                                href: file_link(page_dir, f)?,
                                name: f.file_name()?.to_string_lossy().into_owned(),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            RunShown {
                name: run.name.clone(),
                state: run.status.describe(),
                class: if ok { "state-ok" } else { "state-bad" },
                notes: run.reason.iter().chain(&run.issues).cloned().collect(),
                files,
                log: run.log_tail.clone(),
            }
        })
        .collect();
    serde_json::json!({
        "name": row.name,
        "params": row.params.iter().collect::<Vec<_>>(),
        "runs": runs,
    })
}

/// A link to a file of a run's directory, relative to the page.
fn file_link(page_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(page_dir).ok()?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| percent_encode(&c.as_os_str().to_string_lossy()))
        .collect();
    Some(parts.join("/"))
}

/// Every byte but unreserved URL characters as %XX.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_links_are_percent_encoded() {
        assert_eq!(percent_encode("a b/é"), "a%20b%2F%C3%A9");
    }
}
