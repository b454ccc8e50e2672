//! JUnit XML, as GitLab and Jenkins read it: `sweep check --junit`.

use super::text::number;
use super::Exporter;
use crate::report::check::Check;
use crate::report::judge::Verdict;
use anyhow::Result;

pub struct JUnit;

/// Text as XML 1.0 holds it: escaped, and without the control characters
/// it cannot hold at all.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// One test case per configuration; a regression or a failed run is a
/// failure with the figures in its message, a configuration without a
/// reference or that cannot be told is skipped.
impl Exporter<Check> for JUnit {
    fn export(&self, c: &Check) -> Result<Vec<u8>> {
        Ok(junit(c).into_bytes())
    }
}

fn junit(c: &Check) -> String {
    let failures = c.rows.iter().filter(|r| r.verdict.fails()).count();
    let skipped = c.count(Verdict::New) + c.count(Verdict::Inconclusive);
    let suite = xml(&c.study);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"sweep check\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">\n\
         <testsuite name=\"{suite}\" tests=\"{n}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\" timestamp=\"{at}\">\n",
        n = c.rows.len(),
        at = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S"),
    ));
    out.push_str(&format!(
        "<properties><property name=\"reference\" value=\"{}\"/><property name=\"threshold_pct\" value=\"{}\"/></properties>\n",
        xml(&c.reference),
        c.threshold_pct
    ));
    for r in &c.rows {
        let figures = format!(
            "{}: {} tokens/s now ({} runs) against {} ({} runs); {}",
            r.verdict.as_str(),
            number(r.now_mean),
            r.now_runs,
            number(r.reference_mean),
            r.reference_runs,
            r.note
        );
        out.push_str(&format!(
            "<testcase classname=\"sweep.{suite}\" name=\"{}\" time=\"0\">",
            xml(&r.configuration)
        ));
        match r.verdict {
            v if v.fails() => {
                let mut body = figures.clone();
                if !r.differences.is_empty() {
                    body.push_str(&format!("\nwhat differs: {}", r.differences.join("; ")));
                }
                for st in &r.stragglers {
                    body.push_str(&format!("\nstraggler {st}"));
                }
                out.push_str(&format!(
                    "<failure type=\"{}\" message=\"{}\">{}</failure>",
                    v.as_str(),
                    xml(&figures),
                    xml(&body)
                ));
            }
            Verdict::New | Verdict::Inconclusive => {
                out.push_str(&format!("<skipped message=\"{}\"/>", xml(&figures)));
            }
            _ => out.push_str(&format!("<system-out>{}</system-out>", xml(&figures))),
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("</testsuite>\n</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn junit_text_is_escaped() {
        assert_eq!(
            xml("a<b>&\"c'\u{1}"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}"
        );
    }
}
