//! The report's page in a real browser: headless Chromium (Debian's, which
//! scripts/setup.sh installs), driven over the DevTools protocol through a
//! pipe (no port, no websocket). Each page is loaded from the disk with the
//! network cut off; the test fails on a console error, an uncaught exception
//! or a request for anything but the file itself (and `data:` URLs), checks
//! the summary table's cells against summary.csv, and takes a screenshot
//! that must show the charts.

use super::support::{project, run_ok, step_line, sweep, wait_for, write};
use base64::Engine;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const CHROMIUM: &str = "/usr/bin/chromium";

/// A headless Chromium and one page in it, over `--remote-debugging-pipe`
/// (the browser reads commands on fd 3 and writes replies and events on fd
/// 4, each message JSON ended by a NUL byte).
pub struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next: u64,
    session: String,
    /// Every event received, in order.
    events: Vec<Value>,
    _profile: tempfile::TempDir,
}

/// A pipe whose ends sit at or above fd 10, close-on-exec.
fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: a valid two-element array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let high = |fd: RawFd| {
        // SAFETY: duplicating a descriptor we own.
        let h = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        assert!(h >= 10);
        // SAFETY: closing the original, which nothing else uses.
        unsafe { libc::close(fd) };
        h
    };
    (high(fds[0]), high(fds[1]))
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let (cmd_read, cmd_write) = pipe();
        let (evt_read, evt_write) = pipe();
        let mut command = Command::new(CHROMIUM);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                // The network is off: any request that leaves the file fails
                // (and is recorded first).
                "--proxy-server=127.0.0.1:9",
                "--proxy-bypass-list=<-loopback>",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::dup2(cmd_read, 3) < 0 || libc::dup2(evt_write, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("starting chromium");
        // SAFETY: the child has its copies; ours of its ends can go.
        unsafe {
            libc::close(cmd_read);
            libc::close(evt_write);
        }
        // SAFETY: descriptors we own and nothing else closes.
        let (to, from) = unsafe {
            (
                std::fs::File::from_raw_fd(cmd_write),
                std::fs::File::from_raw_fd(evt_read),
            )
        };
        let mut b = Browser {
            child,
            to,
            from: BufReader::new(from),
            next: 0,
            session: String::new(),
            events: Vec::new(),
            _profile: profile,
        };
        let target = b.call(
            "Target.createTarget",
            json!({ "url": "about:blank" }),
            false,
        );
        let attached = b.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
            false,
        );
        b.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page", "Runtime", "Network", "Log"] {
            b.call(&format!("{domain}.enable"), json!({}), true);
        }
        b
    }

    fn read(&mut self) -> Value {
        let mut buf = Vec::new();
        let n = self.from.read_until(0, &mut buf).unwrap();
        assert!(n > 0, "chromium closed its pipe");
        buf.pop();
        serde_json::from_slice(&buf).unwrap()
    }

    /// Sends a command (to the page's session or the browser) and returns
    /// its result, keeping the events that arrive meanwhile.
    fn call(&mut self, method: &str, params: Value, in_page: bool) -> Value {
        self.next += 1;
        let mut msg = json!({ "id": self.next, "method": method, "params": params });
        if in_page {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let m = self.read();
            if m["id"] == self.next {
                assert!(m.get("error").is_none(), "{method}: {m}");
                return m["result"].clone();
            }
            self.events.push(m);
        }
    }

    /// Waits for an event of the page.
    fn wait(&mut self, method: &str) {
        if self.events.iter().any(|e| e["method"] == method) {
            return;
        }
        loop {
            let m = self.read();
            let done = m["method"] == method;
            self.events.push(m);
            if done {
                return;
            }
        }
    }

    /// Opens a file and waits until it has loaded.
    fn open(&mut self, page: &Path) -> String {
        let url = format!("file://{}", page.display());
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": false }),
            true,
        );
        self.events.clear();
        self.call("Page.navigate", json!({ "url": url }), true);
        self.wait("Page.loadEventFired");
        url
    }

    fn eval(&mut self, js: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": js, "returnByValue": true }),
            true,
        );
        r["result"]["value"].clone()
    }

    /// The whole page as a PNG, decoded: (width, height, RGBA bytes).
    fn screenshot(&mut self) -> (u32, u32, Vec<u8>) {
        let r = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
            true,
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        decoder.set_transformations(png::Transformations::EXPAND);
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        let rgba: Vec<u8> = match info.color_type {
            png::ColorType::Rgba => buf[..info.buffer_size()].to_vec(),
            png::ColorType::Rgb => buf[..info.buffer_size()]
                .chunks(3)
                .flat_map(|p| [p[0], p[1], p[2], 255])
                .collect(),
            other => panic!("a {other:?} screenshot"),
        };
        (info.width, info.height, rgba)
    }

    /// The first screen (the viewport) as PNG bytes.
    fn first_screen(&mut self) -> Vec<u8> {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }), true);
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap()
    }

    /// What went wrong while the page loaded: console errors, exceptions,
    /// error log entries, and requests for anything but `url` or data.
    fn complaints(&self, url: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in &self.events {
            let p = &e["params"];
            match e["method"].as_str().unwrap_or("") {
                "Runtime.consoleAPICalled" if p["type"] == "error" || p["type"] == "warning" => {
                    out.push(format!("console {}: {}", p["type"], p["args"]))
                }
                "Runtime.exceptionThrown" => {
                    out.push(format!("exception: {}", p["exceptionDetails"]))
                }
                "Log.entryAdded" if p["entry"]["level"] == "error" => {
                    out.push(format!("log: {}", p["entry"]["text"]))
                }
                "Network.requestWillBeSent" => {
                    let u = p["request"]["url"].as_str().unwrap_or("");
                    if u != url && !u.starts_with("data:") {
                        out.push(format!("request: {u}"));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The summary table as the browser rendered it: per row, per cell, its
/// `data-value` and its text.
fn rendered_table(b: &mut Browser) -> Vec<Vec<(String, String)>> {
    let v = b.eval(
        "Array.from(document.querySelectorAll('#summary tbody tr')).map(r => \
         Array.from(r.cells).map(c => [c.getAttribute('data-value') || '', c.textContent]))",
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|c| (c[0].as_str().unwrap().into(), c[1].as_str().unwrap().into()))
                .collect()
        })
        .collect()
}

/// summary.csv as rows of (column, value).
fn csv(path: &Path) -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
    lines
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split(',').map(|v| v.trim_matches('"').to_string()))
                .collect()
        })
        .collect()
}

/// The page's headers.
fn rendered_headers(b: &mut Browser) -> Vec<String> {
    let v = b.eval("Array.from(document.querySelectorAll('#summary th')).map(h => h.textContent)");
    v.as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap().to_string())
        .collect()
}

/// The page's cells equal summary.csv's values, row by row, column by
/// column as its headers name them (a column no row has is not shown).
fn table_matches_csv(
    headers: &[String],
    page: &[Vec<(String, String)>],
    csv_rows: &[Vec<(String, String)>],
) {
    let named = [
        ("Configuration", "run"),
        ("Runs", "repeats"),
        ("Tokens/sec", "tokens_per_second_mean"),
        ("MFU %", "mfu_pct_mean"),
        ("TFLOPs", "tflops_mean"),
        ("Training tokens %", "training_tokens_pct_mean"),
        ("Peak memory (MB)", "peak_memory_mb_mean"),
        ("Joules/token", "joules_per_token_mean"),
        ("Watts", "watts_mean"),
        ("Final loss", "final_loss"),
        ("Wall time (s)", "wall_time_s"),
        ("Speedup", "speedup"),
        ("State", "state"),
    ];
    let columns: Vec<(usize, &str)> = named
        .iter()
        .filter_map(|(h, c)| Some((headers.iter().position(|x| x == h)?, *c)))
        .collect();
    for must in ["Configuration", "Tokens/sec", "State"] {
        assert!(headers.iter().any(|h| h == must), "{must} in {headers:?}");
    }
    assert_eq!(page.len(), csv_rows.len(), "one row per configuration");
    for (row, want) in page.iter().zip(csv_rows) {
        let get = |c: &str| {
            want.iter()
                .find(|(k, _)| k == c)
                .map(|(_, v)| v.as_str())
                .unwrap()
        };
        for &(i, column) in &columns {
            let (value, text) = &row[i];
            let expected = get(column);
            match (value.parse::<f64>(), expected.parse::<f64>()) {
                (Ok(a), Ok(b)) => {
                    assert!(
                        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                        "{column}: page {a}, csv {b}"
                    );
                    if column != "repeats" && column != "speedup" {
                        let digits = if column == "final_loss" {
                            3
                        } else if column == "wall_time_s" {
                            1
                        } else if column == "peak_memory_mb_mean" || column == "watts_mean" {
                            0
                        } else if column == "joules_per_token_mean" {
                            4
                        } else {
                            2
                        };
                        // Three significant figures below 1 (as summary.md).
                        let digits = match b.abs() {
                            a if a > 0.0 && a < 1.0 => digits.max((-a.log10()).ceil() as usize + 2),
                            _ => digits,
                        };
                        let shown = format!("{b:.digits$}");
                        assert!(
                            text.starts_with(&shown),
                            "{column}: shows `{text}`, csv {shown}"
                        );
                    }
                }
                _ => assert_eq!(value, expected, "{column}"),
            }
        }
    }
}

/// The screenshot is not blank and shows the charts (their first colour).
fn shows_charts(b: &mut Browser) {
    let (w, h, rgba) = b.screenshot();
    assert!(w >= 1000 && h >= 2000, "{w}x{h}: the whole page");
    let pixels = rgba.chunks(4);
    let n = (w * h) as usize;
    let inked = pixels
        .clone()
        .filter(|p| p[0] < 240 || p[1] < 240 || p[2] < 240)
        .count();
    let bars = pixels
        .filter(|p| p[0].abs_diff(78) < 8 && p[1].abs_diff(121) < 8 && p[2].abs_diff(167) < 8)
        .count();
    assert!(inked * 50 > n, "{inked} of {n} pixels are not white");
    assert!(bars > 5000, "{bars} pixels of the charts' bars");
}

fn chromium_here() -> bool {
    Path::new(CHROMIUM).exists()
}

/// Loads a study's page from the disk, offline, and checks it: nothing
/// fetched, no error, one script (the sorting), the table equal to
/// `summary.csv`, charts on the screenshot. Returns the page's first screen
/// as a PNG, which tests keep under the target directory (the README shows
/// the quickstart's).
pub fn check_study_page(page: &Path, summary_csv: &Path, screenshot: &str) -> Browser {
    assert!(
        chromium_here(),
        "{CHROMIUM} is missing: run scripts/setup.sh"
    );
    let html = std::fs::read_to_string(page).unwrap();
    // Nothing on the page is fetched: no URL with a scheme but file links.
    for bad in ["http://", "https://", "src=\"//", "@import", "url("] {
        assert!(!html.contains(bad), "`{bad}` in the page");
    }
    let mut b = Browser::launch();
    let url = b.open(page);
    assert_eq!(b.complaints(&url), Vec::<String>::new());
    let scripts = b.eval("[document.scripts.length, document.images.length]");
    assert_eq!(scripts, json!([1, 0]), "one script (the sorting), no image");
    let headers = rendered_headers(&mut b);
    table_matches_csv(&headers, &rendered_table(&mut b), &csv(summary_csv));
    shows_charts(&mut b);
    let png = b.first_screen();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(screenshot), png).unwrap();
    b
}

#[test]
#[ignore = "needs Debian's chromium (scripts/setup.sh installs it; scripts/test.sh runs this)"]
fn the_report_page_loads_offline_and_shows_the_csvs_numbers() {
    let root = project();
    let m = root.path().join("p.toml");
    // Three configurations, two repeats each; every run logs 10 steps.
    let body = |tps: usize| {
        (1..=10)
            .map(|s| step_line(s, 10.0 - s as f64 * 0.1, (tps + s % 3) as f64, s as f64))
            .collect::<Vec<_>>()
            .join("\\\\n")
            .replace('"', "\\\"")
    };
    write(
        &m,
        &format!(
            r#"name = "page"
description = "<img src=x onerror=alert(1)> \"quoted\" & <b>bold</b>"
executor = "local"
command = """
case {{{{ speed }}}} in
  slow) printf '{}\\n' > "$SWEEP_RUN_DIR/metrics.jsonl" ;;
  fast) printf '{}\\n' > "$SWEEP_RUN_DIR/metrics.jsonl" ;;
  failing) echo 'the last words of a failing run'; exit 3 ;;
esac
"""
[sweep]
repeats = 2
[sweep.grid]
speed = ["slow", "fast", "failing"]
[report]
baseline = "slow"
skip_first = 2
"#,
            body(100),
            body(130)
        ),
    );
    let _ = sweep(root.path()).arg("run").arg(&m).output().unwrap();
    let study = root.path().join("results/page");
    let mut b = check_study_page(
        &study.join("report.html"),
        &study.join("summary.csv"),
        "page.png",
    );
    // The description is text, not an image.
    let lead = b.eval("document.querySelector('.lead').textContent");
    assert!(
        lead.as_str()
            .unwrap()
            .contains("<img src=x onerror=alert(1)>"),
        "{lead}"
    );
    // The notes the terminal prints beside the table are on the page too.
    let notes = b.eval(
        "Array.from(document.querySelectorAll('p.hint')).map(p => p.textContent).join(' | ')",
    );
    assert!(
        notes
            .as_str()
            .unwrap()
            .contains("Note: rows of 2 repeats have wide 95% intervals"),
        "{notes}"
    );
    // The failing configuration's runs show their last log lines.
    let text = b.eval("document.getElementById('configurations').textContent");
    assert!(
        text.as_str()
            .unwrap()
            .contains("the last words of a failing run"),
        "{text}"
    );
    // Sorting by tokens/s puts the slowest first, then the fastest; the
    // failed configuration, which has no figure, stays last.
    let order = |b: &mut Browser| {
        b.eval("Array.from(document.querySelectorAll('#summary tbody tr')).map(r => r.cells[0].getAttribute('data-value'))")
    };
    b.eval("Array.from(document.querySelectorAll('#summary th')).find(h => h.textContent == 'Tokens/sec').click()");
    assert_eq!(order(&mut b), json!(["slow", "fast", "failing"]));
    b.eval("Array.from(document.querySelectorAll('#summary th')).find(h => h.textContent == 'Tokens/sec').click()");
    assert_eq!(order(&mut b), json!(["fast", "slow", "failing"]));

    // A comparison's page, against a copy of the study.
    let before = root.path().join("results/page-before");
    run_ok(Command::new("cp").arg("-r").arg(&study).arg(&before));
    run_ok(sweep(root.path()).arg("compare").arg(&before).arg(&study));
    let cmp: PathBuf = root
        .path()
        .join("results/compare/page-before-vs-page/comparison.html");
    let url = b.open(&cmp);
    assert_eq!(b.complaints(&url), Vec::<String>::new());
    let rows = b.eval("document.querySelectorAll('#summary tbody tr').length");
    assert_eq!(rows, 3);
}
/// Names from imported logs hold markup, quotes and control characters: the
/// page shows them as text.
#[test]
#[ignore = "needs Debian's chromium (scripts/setup.sh installs it; scripts/test.sh runs this)"]
fn hostile_names_are_text_on_the_page() {
    assert!(
        chromium_here(),
        "{CHROMIUM} is missing: run scripts/setup.sh"
    );
    let root = project();
    let logs = root.path().join("logs");
    let evil = "<script>alert(1)<\\script> \"q\" 'a' \u{1b}[31m";
    let line = (1..=6)
        .map(|s| step_line(s, 2.0, 100.0 + s as f64, s as f64) + "\n")
        .collect::<String>();
    write(&logs.join(format!("{evil}.jsonl")), &line);
    write(&logs.join("plain.jsonl"), &line);
    let glob = format!("{}/*.jsonl", logs.display());
    run_ok(sweep(root.path()).args([
        "report",
        "--import",
        &glob,
        "--log-format",
        "jsonl",
        "--name",
        "evil",
    ]));
    let page = root.path().join("results/evil/report.html");
    let mut b = Browser::launch();
    let url = b.open(&page);
    assert_eq!(b.complaints(&url), Vec::<String>::new());
    let v = b.eval("[document.scripts.length, document.querySelector('#summary').textContent]");
    assert_eq!(v[0], 1, "only the page's own script");
    let text = v[1].as_str().unwrap();
    assert!(
        text.contains("<script>alert(1)<\\script> \"q\" 'a' \\u{1b}[31m"),
        "{text}"
    );
}

/// While `sweep run` watches, the page appears as soon as a run has ended
/// and reloads itself; once the sweep is done it is final and still.
#[test]
fn the_page_reloads_while_runs_go_and_stops_when_the_sweep_ends() {
    let root = project();
    let m = root.path().join("live.toml");
    let go = root.path().join("go");
    let line = step_line(1, 2.0, 100.0, 1.0).replace('"', "\\\"");
    write(
        &m,
        &format!(
            r#"name = "live"
executor = "local"
command = """
if [ {{{{ x }}}} = slow ]; then
  for i in $(seq 600); do [ -e '{}' ] && break; sleep 0.1; done
fi
printf '{line}\n' > "$SWEEP_RUN_DIR/metrics.jsonl"
"""
[sweep.grid]
x = ["fast", "slow"]
[local]
parallel = 2
"#,
            go.display()
        ),
    );
    let mut child = sweep(root.path())
        .arg("run")
        .arg(&m)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let page = root.path().join("results/live/report.html");
    let live = wait_for(30, "a live page", || {
        std::fs::read_to_string(&page)
            .ok()
            .filter(|h| h.contains("http-equiv=\"refresh\""))
    });
    assert!(live.contains("reloads itself"), "{live}");
    assert!(
        live.contains("<td data-value=\"fast\">"),
        "the fast run's row: {live}"
    );
    std::fs::write(&go, "").unwrap();
    assert!(child.wait().unwrap().success());
    let done = std::fs::read_to_string(&page).unwrap();
    assert!(
        !done.contains("http-equiv=\"refresh\""),
        "the final page reloads"
    );
    assert!(
        done.contains("<td data-value=\"slow\">"),
        "the slow run's row: {done}"
    );
}

/// A study measured twice (`sweep run --again`), one configuration 30%
/// slower the second time: `report.html` shows each configuration's history
/// (a chart and a table of its attempts, with dates and commits) and the
/// latest attempt's verdict, and `sweep check --html` writes a page of its
/// own. Both load offline without a complaint, their one script the
/// sorting; a hostile system name is text on both.
#[test]
#[ignore = "needs Debian's chromium (scripts/setup.sh installs it; scripts/test.sh runs this)"]
fn the_history_and_the_check_page_load_offline() {
    let root = project();
    let m = root.path().join("h.toml");
    let system = "<script>alert(1)</script> & \"q\"";
    write(
        &m,
        &format!(
            r#"name = "trend"
executor = "local"
command = """
f=$(cat factor-{{{{ config }}}})
r=$((RANDOM % 7))
for s in 1 2 3 4 5 6 7 8; do
  awk -v f="$f" -v s="$s" -v r="$r" 'BEGIN {{ printf "step %d: %.1f tokens/s\\n", s, f * (1000 + r + (s * 37) % 11) }}'
done
"""
[sweep]
repeats = 3
[sweep.grid]
config = ["a", "b"]
[report]
skip_first = 1
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
[environment]
system = {system:?}
"#
        ),
    );
    write(&root.path().join("factor-a"), "1.0");
    write(&root.path().join("factor-b"), "1.0");
    run_ok(sweep(root.path()).arg("run").arg(&m));
    write(&root.path().join("factor-b"), "0.7");
    run_ok(sweep(root.path()).args(["run", "--again"]).arg(&m));

    let study = root.path().join("results/trend");
    let mut b = check_study_page(
        &study.join("report.html"),
        &study.join("summary.csv"),
        "history.png",
    );
    let seen = b.eval(
        "[document.querySelectorAll('#history .trend').length,
          document.querySelectorAll('#history svg').length,
          Array.from(document.querySelectorAll('#history span.verdict')).map(s => s.textContent),
          document.querySelectorAll('#history table.attempts tbody tr').length,
          document.querySelector('#history h3 small').textContent]",
    );
    assert_eq!(
        seen,
        json!([2, 2, ["unchanged", "regressed"], 4, format!("on {system}")]),
        "{seen}"
    );

    let out = root.path().join("out");
    let (page, junit) = (out.join("check.html"), out.join("check.xml"));
    let check = sweep(root.path())
        .args(["check", "--history"])
        .arg(&m)
        .arg("--html")
        .arg(&page)
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(1), "{check:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    for bad in ["http://", "https://", "src=\"//", "@import", "url("] {
        assert!(!html.contains(bad), "`{bad}` in the check page");
    }
    let url = b.open(&page);
    assert_eq!(b.complaints(&url), Vec::<String>::new());
    let seen = b.eval(
        "[document.scripts.length, document.images.length,
          Array.from(document.querySelectorAll('#verdicts tbody tr')).map(r => [r.cells[0].textContent, r.cells[1].textContent, r.cells[2].textContent]),
          document.getElementById('outcome').textContent,
          document.querySelector('#why li').textContent,
          document.querySelectorAll('#history .trend svg').length]",
    );
    assert_eq!(seen[0], 1, "one script (the sorting)");
    assert_eq!(seen[1], 0, "no image");
    assert_eq!(
        seen[2],
        json!([["a", system, "unchanged"], ["b", system, "regressed"]]),
        "{seen}"
    );
    assert!(seen[3].as_str().unwrap().starts_with("Failed"), "{seen}");
    assert!(
        seen[4]
            .as_str()
            .unwrap()
            .starts_with("b regressed: nothing its fingerprints record differs"),
        "{seen}"
    );
    assert_eq!(seen[5], 2);
}
