//! `sweep report`, `check` and `history`: what is read, what it is judged
//! against, and how the result is written.

use std::path::PathBuf;

use super::*;

#[derive(clap::Args, Debug, Clone)]
pub struct ReportCli {
    /// A manifest, or a results/<study> directory.
    pub target: Option<PathBuf>,
    /// Where summary.{md,csv,parquet}, report.html and the charts (DIR/plots) go (default: results/<study>, charts in plots/<study>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Log points skipped at the start of every run (default: the manifest's, else 5).
    #[arg(long, value_parser = count(0, MAX_STEPS))]
    pub skip_first: Option<usize>,
    /// The run speedups are measured against (default: the manifest's `baseline`).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Group runs by these parameters (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub group_by: Vec<String>,
    /// Read these log files instead (one run each), e.g. another program's logs.
    #[arg(long, value_name = "GLOB")]
    pub import: Option<String>,
    /// How the imported logs are written (default: `pattern` with --pattern, else `reference`).
    #[arg(long, value_enum, requires = "import")]
    pub log_format: Option<crate::report::LogFormat>,
    /// A regex with named groups (step, loss, tokens_per_second, mfu_pct, tflops, ...) that matches the imported logs' lines (implies --log-format pattern).
    #[arg(long, requires = "import")]
    pub pattern: Option<String>,
    /// With --import: the study name (results/<name>, plots/<name>).
    #[arg(long, default_value = "imported", value_parser = study_name, requires = "import")]
    pub name: String,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the charts.
    #[arg(long)]
    pub no_plots: bool,
    #[command(flatten)]
    pub read: ImportReadCli,
}

/// What an imported log's figures mean beyond its pattern's groups: the
/// `[report]` keys of a `command` study, as flags (docs/report.md).
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Imported logs: the [report] keys of a command study")]
pub struct ImportReadCli {
    /// The --pattern group that is tokens per second per device.
    #[arg(long, value_name = "GROUP", requires = "pattern")]
    pub throughput: Option<String>,
    /// The --pattern group that is the peak memory per device, its unit at the end of its name (mem_gb, mem_gib, mem_mb, mem_bytes).
    #[arg(long, value_name = "GROUP", requires = "pattern")]
    pub memory: Option<String>,
    /// The --pattern group that is a step's time: its unit at the end of its name (time_ms, step_s, it_per_s) or in each figure (5.33ms, tqdm's 3.98it/s).
    #[arg(long, value_name = "GROUP", requires = "pattern")]
    pub step_time: Option<String>,
    /// Tokens one process trains per step (micro-batch × sequence length × gradient-accumulation steps): tokens/s = this ÷ each step's time.
    #[arg(long, value_name = "TOKENS", requires = "pattern", value_parser = tokens_per_step)]
    pub tokens_per_step: Option<f64>,
    /// Other --pattern groups to chart (comma-separated).
    #[arg(
        long,
        value_name = "GROUP",
        value_delimiter = ',',
        requires = "pattern"
    )]
    pub charts: Vec<String>,
    /// Training FLOPs per token: TFLOP/s from tokens/s.
    #[arg(long, value_name = "FLOPS", requires = "import")]
    pub flops_per_token: Option<f64>,
    /// Instead of --flops-per-token: a built-in model preset the program trained, with --sequence-length.
    #[arg(long, value_name = "PRESET", requires = "import")]
    pub model: Option<String>,
    /// The sequence length the program trained, for --model.
    #[arg(long, value_name = "TOKENS", requires = "model", value_parser = count(1, MAX_SEQ))]
    pub sequence_length: Option<usize>,
    /// The device the program trained on (a name the device table knows): MFU against its dense bf16 peak.
    #[arg(long, value_name = "DEVICE", requires = "import")]
    pub gpu: Option<String>,
    /// Instead of --gpu: the peak FLOP/s of one process's device (a CPU's as `sweep bench peak` measures it).
    #[arg(long, value_name = "FLOP/S", requires = "import")]
    pub peak_flops: Option<f64>,
}

impl ImportReadCli {
    /// The `[report]` settings these flags stand for, around `pattern`.
    pub fn spec(&self, pattern: Option<String>) -> crate::manifest::ReportSpec {
        crate::manifest::ReportSpec {
            line_pattern: pattern,
            throughput: self.throughput.clone(),
            memory: self.memory.clone(),
            step_time: self.step_time.clone(),
            tokens_per_step: self.tokens_per_step.map(crate::manifest::PerRun::Number),
            charts: self.charts.clone(),
            flops_per_token: self.flops_per_token.map(crate::manifest::PerRun::Number),
            model: self.model.clone(),
            sequence_length: self.sequence_length,
            gpu: self.gpu.clone(),
            peak_flops: self.peak_flops.map(crate::manifest::PerRun::Number),
            ..crate::manifest::ReportSpec::default()
        }
    }
}

/// `--tokens-per-step`: a number of tokens above 0, as `[report]
/// tokens_per_step` may come out.
fn tokens_per_step(s: &str) -> Result<f64, String> {
    let most = crate::manifest::MAX_TOKENS_PER_STEP;
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 && t <= most => Ok(t),
        _ => Err(format!(
            "`{s}` is not a number of tokens above 0 (at most {most:e})"
        )),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct CheckCli {
    /// The study checked: a manifest or a results/<study> directory (its latest attempt).
    pub target: PathBuf,
    /// Check against another study (a manifest or a results/<study> directory) instead of the history.
    #[arg(long, value_name = "STUDY", conflicts_with = "history")]
    pub against: Option<PathBuf>,
    /// Check against the history: the same configuration on the same system, its last N attempts pooled (the default).
    #[arg(long)]
    pub history: bool,
    /// Attempts of the history pooled as the reference.
    #[arg(long, value_name = "N", default_value_t = crate::report::check::DEFAULT_LAST, value_parser = count(1, 10_000))]
    pub last: usize,
    /// The change (percent) that matters: `regressed`/`improved` need a significant change at least this large, `unchanged` an interval within it.
    #[arg(long, value_name = "PCT", default_value_t = crate::report::check::DEFAULT_THRESHOLD_PCT, value_parser = percent)]
    pub threshold: f64,
    /// Also write the verdicts as JUnit XML (one test case per configuration).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Also write the verdicts, what differs and each configuration's history as a page (self-contained HTML).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print the verdicts as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Log points skipped at the start of every run (default: the manifest's, else 5).
    #[arg(long, value_parser = count(0, MAX_STEPS))]
    pub skip_first: Option<usize>,
}

#[derive(clap::Args, Debug, Clone)]
pub struct HistoryCli {
    /// Only this study: a manifest or a results/<study> directory (default: every study).
    #[arg(conflicts_with = "import")]
    pub target: Option<PathBuf>,
    /// Only the configuration of this name.
    #[arg(long = "config", value_name = "NAME")]
    pub configuration: Option<String>,
    /// Only this system (as `sweep history` lists them: `<cluster>/<partition>`, `local/<host>`).
    #[arg(long)]
    pub system: Option<String>,
    /// Only what ran on or after this date (`2026-11-01`, or RFC 3339).
    #[arg(long, value_name = "DATE", value_parser = since)]
    pub since: Option<String>,
    #[arg(long)]
    pub json: bool,
    /// Record a study reported before the history existed (a results/<study> directory).
    #[arg(long, value_name = "DIR")]
    pub import: Option<PathBuf>,
}

/// `--since`: a date or an RFC 3339 time, as the history's UTC times compare.
fn since(s: &str) -> Result<String, String> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.format("%Y-%m-%d").to_string());
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .map_err(|_| format!("`{s}` is neither a date (2026-11-01) nor an RFC 3339 time"))
}
