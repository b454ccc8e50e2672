//! The malformed-manifest corpus: every file in tests/manifests/invalid/ says
//! on its first line where its error is and what it says:
//! `# expect: [FILE:]LINE:COL | message part [| help part]` (`*` = any).

use super::support::{project, sweep};
use std::path::Path;
use sweep::manifest::{Diagnostics, Manifest};
use sweep::plan::{render, Plan};

struct Expect {
    file: Option<String>,
    line: Option<usize>,
    col: Option<usize>,
    message: String,
    help: Option<String>,
}

fn parse_expect(text: &str) -> Expect {
    let first = text.lines().next().unwrap_or_default();
    let spec = first
        .strip_prefix("# expect:")
        .expect("first line is `# expect: ...`");
    let mut parts = spec.split('|').map(str::trim);
    let loc = parts.next().unwrap();
    let message = parts.next().unwrap_or("").to_string();
    let help = parts.next().map(str::to_string);
    let mut loc_parts: Vec<&str> = loc.split(':').collect();
    let file = if loc_parts.len() == 3 {
        Some(loc_parts.remove(0).to_string())
    } else {
        None
    };
    let num = |s: &str| {
        if s == "*" {
            None
        } else {
            Some(s.parse().expect("a line or column number"))
        }
    };
    Expect {
        file,
        line: num(loc_parts[0]),
        col: num(loc_parts[1]),
        message,
        help,
    }
}

/// The first error a manifest gives on its way through load, plan and render.
fn diagnose(path: &Path, root: &Path) -> Option<Diagnostics> {
    let m = match Manifest::load(path, root) {
        Ok(m) => m,
        Err(d) => return Some(d),
    };
    let plan = match Plan::new(
        m,
        &sweep::plan::PlanOptions::new(false, &sweep::config::RuntimeOptions::from_env().unwrap()),
    ) {
        Ok(p) => p,
        Err(d) => return Some(d),
    };
    render::render(&plan).err()
}

#[test]
fn every_malformed_manifest_gets_a_located_error_and_writes_nothing() {
    let corpus = super::support::repo().join("tests/manifests/invalid");
    let root = project();
    let copy = root.path().join("corpus");
    std::fs::create_dir_all(&copy).unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        std::fs::copy(f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let manifests: Vec<_> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "toml"))
        .collect();
    assert!(
        manifests.len() >= 40,
        "the corpus has {} manifests",
        manifests.len()
    );

    let mut failures = Vec::new();
    for f in manifests {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let path = copy.join(&name);
        let text = std::fs::read_to_string(&path).unwrap();
        let want = parse_expect(&text);
        let Some(found) = diagnose(&path, root.path()) else {
            failures.push(format!("{name}: no error"));
            continue;
        };
        let d = &found.0[0];
        let (file, line, col, message, help) = (
            d.file.display().to_string(),
            &d.line,
            &d.column,
            &d.message,
            &d.help,
        );
        let shown = d.to_string();
        let mut bad = Vec::new();
        match &want.file {
            Some(w) if !file.ends_with(w.as_str()) => bad.push(format!("file {file}, want {w}")),
            None if !file.ends_with(&name) => bad.push(format!("file {file}, want the manifest")),
            _ => {}
        }
        if want.line.is_some_and(|l| l != *line) || want.col.is_some_and(|c| c != *col) {
            bad.push(format!(
                "at {line}:{col}, want {:?}:{:?}",
                want.line, want.col
            ));
        }
        if !message.contains(&want.message) {
            bad.push(format!("message `{message}` lacks `{}`", want.message));
        }
        if let Some(h) = &want.help {
            if !help.as_deref().unwrap_or("").contains(h.as_str()) {
                bad.push(format!("help {help:?} lacks `{h}`"));
            }
        }
        if *line > 0 && !shown.contains(&format!(":{line}:{col}")) {
            bad.push("the rendered error does not show file:line:col".into());
        }

        // The command line says the same, fails, and writes nothing.
        let out = sweep(root.path())
            .arg("render")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // (after the plan's warnings, where it has some: a template that
        // fails to render fails the render, not the plan)
        if out.status.success() || !stderr.lines().any(|l| l.starts_with("error: ")) {
            bad.push(format!(
                "`sweep render` exited {} with stderr `{stderr}`",
                out.status
            ));
        }
        if root.path().join("results").exists() {
            bad.push("results/ was written".into());
            std::fs::remove_dir_all(root.path().join("results")).unwrap();
        }
        if !bad.is_empty() {
            failures.push(format!("{name}: {}\n{shown}", bad.join("; ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} manifests misbehave:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A zip group one row longer than the default limit (150,001 rows, too large
/// a file to keep in the corpus), and the same within a raised `max_runs`:
/// counted from the axis lengths, refused before anything is expanded.
#[test]
fn a_huge_zip_is_refused_and_max_runs_raises_the_limit() {
    let rows = sweep::manifest::DEFAULT_MAX_RUNS as usize + 50_001;
    let list = |offset: usize| {
        (0..rows)
            .map(|i| (i + offset).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let zip = format!("[[sweep.zip]]\na = [{}]\nb = [{}]\n", list(0), list(1));
    let parse =
        |text: String| Manifest::parse(Path::new("huge.toml"), Path::new("/p"), text, "0".into());
    let err = parse(format!("name = \"z\"\ncommand = \"echo\"\n{zip}")).unwrap_err();
    let d = &err.0[0];
    assert!(
        d.message.contains(&format!("expands to {rows} runs"))
            && d.message.contains("max_runs = 100000"),
        "{d}"
    );
    assert!(
        d.to_string().len() < 2_000,
        "the excerpt is a window, not the 1.5 MB line"
    );
    let m = parse(format!(
        "name = \"z\"\ncommand = \"echo\"\n[sweep]\nmax_runs = {rows}\n{zip}"
    ))
    .unwrap();
    assert_eq!(m.axes[0].rows.len(), rows);
}

/// A manifest with independent mistakes in three sections and one in a
/// value the plan checks: one round of `sweep plan` names all four, each at
/// its line, in the order of the file.
#[test]
fn every_independent_error_is_reported_at_once() {
    let root = project();
    let path = root.path().join("four.toml");
    std::fs::write(
        &path,
        "name = \"four\"\n\
         [defaults]\n\
         warmup_steps = \"ten\"\n\
         lerning_rate = 0.1\n\
         [sweep]\n\
         repeets = 2\n\
         [sweep.grid]\n\
         batch_size = [1, 2]\n\
         [report]\n\
         line_pattern = \"(unclosed\"\n\
         [slurm]\n\
         partition = 3\n",
    )
    .unwrap();
    let out = sweep(root.path()).arg("plan").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // One block per error: its message, then where it is.
    let blocks: Vec<&str> = stderr.split("error: ").skip(1).collect();
    let mut at = Vec::new();
    for (line, says) in [
        (6, "unknown key `repeets` in [sweep]"),
        (10, "not a valid regular expression"),
        (12, "expected a string"),
    ] {
        let i = blocks
            .iter()
            .position(|b| b.starts_with(says) && b.contains(&format!("four.toml:{line}:")))
            .unwrap_or_else(|| panic!("no `{says}` at line {line}:\n{stderr}"));
        at.push(i);
    }
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "in file order:\n{stderr}"
    );
    // [defaults] is the trainer's: both of its wrong keys, in the same round.
    let m = Manifest::load(&path, root.path()).unwrap_err();
    let lines: Vec<usize> = m.0.iter().map(|d| d.line).collect();
    for line in [3, 4, 6, 10, 12] {
        assert!(lines.contains(&line), "line {line} in {lines:?}:\n{stderr}");
    }
}
