//! The repository's own text points at what exists: every file path that
//! the code, scripts, templates and docs name, and every link of the README
//! and docs/ (with its heading), so a move or a rename cannot leave a reader
//! at a file that is gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file below `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The repository paths a text names: `src/…`, `scripts/…`, `docs/…`,
/// `templates/…`, `tests/…`, `experiments/…` with a file ending, where the
/// name starts the path (not a path inside another project, such as a
/// crate's `src/lib.rs` after `cudarc-0.19.*/`).
fn named_paths(text: &str) -> BTreeSet<String> {
    const TOPS: [&str; 6] = [
        "src/",
        "scripts/",
        "docs/",
        "templates/",
        "tests/",
        "experiments/",
    ];
    const ENDS: [&str; 11] = [
        ".rs", ".sh", ".md", ".cu", ".cuh", ".hpp", ".py", ".j2", ".toml", ".html", ".json",
    ];
    let mut out = BTreeSet::new();
    for top in TOPS {
        for (at, _) in text.match_indices(top) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || "/*._-~$".contains(c)) {
                continue;
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || "/._-".contains(*c))
                .collect();
            let path = path.trim_end_matches('.');
            if ENDS.iter().any(|e| path.ends_with(e)) {
                out.insert(path.to_string());
            }
        }
    }
    out
}

#[test]
fn every_file_path_the_repository_names_exists() {
    let root = root();
    let mut texts = Vec::new();
    for dir in ["src", "scripts", "templates", "docs", "experiments", ".ci"] {
        files(&root.join(dir), &mut texts);
    }
    texts.push(root.join("README.md"));
    let mut missing = Vec::new();
    for file in &texts {
        // Text only: a file that is not UTF-8 (an image) names nothing.
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for path in named_paths(&text) {
            if !root.join(&path).exists() {
                missing.push(format!(
                    "{} names {path}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        texts.len() > 100,
        "read only {} files: is this the repository?",
        texts.len()
    );
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, other
/// punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_link_of_the_readme_and_docs_leads_to_a_file_and_heading() {
    let root = root();
    let mut pages = Vec::new();
    files(&root.join("docs"), &mut pages);
    pages.retain(|p| p.extension().is_some_and(|e| e == "md"));
    pages.push(root.join("README.md"));
    let mut broken = Vec::new();
    let mut links = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices("](") {
            let target: String = text[at + 2..].chars().take_while(|&c| c != ')').collect();
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            links += 1;
            let (file, heading) = target.split_once('#').unwrap_or((&target, ""));
            let file = match file {
                "" => page.clone(),
                f => page.parent().unwrap().join(f),
            };
            let shown = page.strip_prefix(&root).unwrap().display();
            if !file.exists() {
                broken.push(format!("{shown}: ({target}): no such file"));
            } else if !heading.is_empty()
                && file.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&file).unwrap()).contains(heading)
            {
                broken.push(format!("{shown}: ({target}): no such heading"));
            }
        }
    }
    assert!(links > 20, "found only {links} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
