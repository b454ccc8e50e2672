//! The minijinja environment of manifests (derived values, run names, command lines), job
//! scripts and pages. Scripts and command lines escape every value as one shell word and refuse
//! control characters (a newline would start an `#SBATCH` directive of its own); `|safe` marks
//! what validation checked, `|shquote` quotes anything. Pages write values as HTML text ([`esc`]).

use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};

const SH: &str = "sh";

/// How many steps one render may take: a template is user input (three nested loops run hours).
pub const VALUE_FUEL: u64 = 100_000;
pub const SCRIPT_FUEL: u64 = 1_000_000;
/// An array's or a block's script, one line per run (rendered once).
pub const GROUP_SCRIPT_FUEL: u64 = 100_000_000;

pub struct Engine {
    env: Environment<'static>,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    pub fn new() -> Engine {
        let mut env = Environment::new();
        env.set_fuel(Some(VALUE_FUEL));
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .keep_trailing_newline(true)
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("default delimiters are valid"),
        );
        env.set_auto_escape_callback(|name| {
            let shell = [".sbatch", ".sh", "command"]
                .iter()
                .any(|s| name.contains(s));
            match (shell, name.ends_with(".html")) {
                (true, _) => AutoEscape::Custom(SH.into()),
                (_, true) => AutoEscape::Html,
                _ => AutoEscape::None,
            }
        });
        env.set_formatter(|out, state, value| match state.auto_escape() {
            _ if value.is_safe() => minijinja::escape_formatter(out, state, value),
            AutoEscape::Custom(name) if name == SH => out
                .write_str(&shell_quote(&shell_text(value)?))
                .map_err(Error::from),
            // A page writes nothing for a missing value.
            AutoEscape::Html => {
                let text = match value.as_str() {
                    Some(s) => s.to_string(),
                    None if value.is_none() || value.is_undefined() => String::new(),
                    None => value.to_string(),
                };
                out.write_str(&esc(&text)).map_err(Error::from)
            }
            _ => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("shquote", |v: Value| {
            Value::from_safe_string(shell_quote(&display(&v)))
        });
        // A value inside quotes in a command line (see `add_command`): escaped to stay their text.
        env.add_filter(IN_SINGLE_QUOTES, |v: Value| -> Result<Value, Error> {
            if v.is_safe() {
                return Ok(v);
            }
            let s = shell_text(&v)?.replace('\'', r"'\''");
            Ok(Value::from_safe_string(s))
        });
        env.add_filter(IN_BACKQUOTES, |v: Value| -> Result<Value, Error> {
            if v.is_safe() {
                return Ok(v);
            }
            Err(Error::new(
                ErrorKind::InvalidOperation,
                "a value inside backquotes (`…{{ x }}…`) cannot be quoted safely: bash reads backslashes and backquotes there twice; write the substitution as $( … ), where the value is one word",
            ))
        });
        // A here-document's body: bash expands `$`, backquotes and backslashes (under a quoted
        // delimiter, nothing).
        env.add_filter(IN_HEREDOC, |v: Value| backslashed(v, &['\\', '$', '`']));
        env.add_filter(IN_HEREDOC_AS_WRITTEN, |v: Value| -> Result<Value, Error> {
            Ok(Value::from_safe_string(shell_text(&v)?))
        });
        env.add_filter(IN_DOUBLE_QUOTES, |v: Value| {
            backslashed(v, &['\\', '"', '$', '`'])
        });
        Engine { env }
    }

    /// Adds a named template (errors carry the name and line).
    pub fn add(&mut self, name: &str, source: &str) -> Result<(), Error> {
        self.env
            .add_template_owned(name.to_string(), source.to_string())
    }

    /// Adds a command line: a value written inside quotes (`--data "{{ dataset }}"`) is escaped
    /// for those quotes, not quoted again.
    pub fn add_command(&mut self, name: &str, source: &str) -> Result<(), Error> {
        self.add(name, &escape_for_quotes(source))
    }

    /// Steps one render may take ([`VALUE_FUEL`] unless set; `None` for sweep's own templates).
    pub fn set_fuel(&mut self, steps: Option<u64>) {
        self.env.set_fuel(steps);
    }

    pub fn render(&self, name: &str, ctx: &Value) -> Result<String, Error> {
        self.env.get_template(name)?.render(ctx)
    }

    /// Checks that a derived value, name or command compiles.
    pub fn check(&self, src: &str) -> Result<(), Error> {
        if is_template(src) {
            self.env.template_from_str(src).map(|_| ())
        } else {
            self.env.compile_expression(src).map(|_| ())
        }
    }

    /// Checks that a template (a command line) compiles.
    pub fn check_template(&self, src: &str) -> Result<(), Error> {
        self.env.template_from_str(src).map(|_| ())
    }

    /// Evaluates a derived value: `{{ }}` renders (a string), anything else is an expression.
    pub fn eval(&self, src: &str, ctx: &Value) -> Result<Value, Error> {
        if is_template(src) {
            self.env.render_str(src, ctx).map(Value::from)
        } else {
            let v = self.env.compile_expression(src)?.eval(ctx)?;
            if v.is_undefined() {
                return Err(Error::new(
                    ErrorKind::UndefinedError,
                    "the expression is undefined",
                ));
            }
            Ok(v)
        }
    }
}

impl Engine {
    /// Whether a template or expression reads the variable `name`, by its syntax tree.
    pub fn uses(&self, src: &str, name: &str) -> bool {
        let vars = if is_template(src) {
            // A template borrows its source for the environment's lifetime: a local environment reads it.
            let env = Environment::new();
            env.template_from_str(src)
                .map(|t| t.undeclared_variables(false))
        } else {
            self.env
                .compile_expression_owned(src.to_string())
                .map(|e| e.undeclared_variables(false))
        };
        vars.is_ok_and(|v| v.contains(name))
    }
}

/// Text as HTML: `<`, `>`, `&` and quotes escaped, control characters as escapes.
pub fn esc(s: &str) -> String {
    let printable = crate::util::text::printable(s);
    let mut out = String::with_capacity(printable.len());
    for c in printable.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A template context from anything serialisable.
pub fn context<T: serde::Serialize>(value: &T) -> Value {
    Value::from(minijinja::value::Serde(value))
}

fn is_template(src: &str) -> bool {
    src.contains("{{") || src.contains("{%")
}

/// A value as a script may hold it: one value, on one line.
fn shell_text(value: &Value) -> Result<String, Error> {
    if value.kind() == minijinja::value::ValueKind::Map {
        // `{{ run }}` for `{{ run.name }}`: a table's dump would be one garbled word.
        let fields: Vec<String> = value
            .try_iter()
            .map(|keys| keys.map(|k| k.to_string()).collect())
            .unwrap_or_default();
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "a table of values ({}), not one value: write one of its fields, e.g. `.{}`",
                fields.join(", "),
                fields.first().map_or("name", String::as_str)
            ),
        ));
    }
    let s = display(value);
    if let Some(c) = crate::util::text::forbidden_char(&s, false) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "the value `{}` contains {}: a job script takes one-line values only",
                s.escape_debug(),
                crate::util::text::describe_char(c)
            ),
        ));
    }
    Ok(s)
}

/// `v` with a backslash before each of `special` (what bash reads inside double quotes or a
/// here-document), where not safe already.
fn backslashed(v: Value, special: &[char]) -> Result<Value, Error> {
    if v.is_safe() {
        return Ok(v);
    }
    let mut s = String::new();
    for c in shell_text(&v)?.chars() {
        if special.contains(&c) {
            s.push('\\');
        }
        s.push(c);
    }
    Ok(Value::from_safe_string(s))
}

const IN_SINGLE_QUOTES: &str = "in_single_quotes";
const IN_DOUBLE_QUOTES: &str = "in_double_quotes";
const IN_BACKQUOTES: &str = "in_backquotes";
const IN_HEREDOC: &str = "in_heredoc";
const IN_HEREDOC_AS_WRITTEN: &str = "in_heredoc_as_written";

/// Where bash is in a command line, innermost last. `$( )` starts afresh inside double quotes.
#[derive(Clone, Copy, PartialEq)]
enum Context {
    Single,
    Double,
    /// `$( … )` (and `$(( … ))`), with the parentheses open inside it.
    Substitution(usize),
    Backquotes,
}

/// Rewrites each `{{ expr }}` inside shell quotes to `{{ (expr)|in_single_quotes }}` (or double
/// quotes, or a here-document's filter); inside backquotes to `|in_backquotes`, which refuses it.
/// Quotes, `$( )`, backquotes and here-documents are followed as bash reads them; tags are passed
/// over (a quote opened in one branch of an `if` is not seen). Lines keep their numbers.
fn escape_for_quotes(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut open: Vec<Context> = Vec::new();
    // Here-documents begun on this line, their bodies due after it.
    let mut heredocs: Vec<Heredoc> = Vec::new();
    // Whether a `#` here would start a comment (bash: at a word's start).
    let mut word_start = true;
    let mut rest = src;
    while let Some(c) = rest.chars().next() {
        if let Some((whole, tag)) = tag_at(rest) {
            let filter = match open.last() {
                Some(Context::Single) => Some(IN_SINGLE_QUOTES),
                Some(Context::Double) => Some(IN_DOUBLE_QUOTES),
                Some(Context::Backquotes) => Some(IN_BACKQUOTES),
                Some(Context::Substitution(_)) | None => None,
            };
            out.push_str(&filtered(whole, tag, filter));
            rest = &rest[whole.len()..];
            word_start = false;
            continue;
        }
        let mut len = c.len_utf8();
        let escaped = || rest[1..].chars().next().map_or(0, char::len_utf8);
        match (open.last().copied(), c) {
            (Some(Context::Single), '\'') => drop(open.pop()),
            (Some(Context::Single), _) => {}
            (_, '\\') => len += escaped(),
            (Some(Context::Double), '"') => drop(open.pop()),
            (_, '$') if rest[1..].starts_with('(') => {
                open.push(Context::Substitution(0));
                len += 1;
            }
            (Some(Context::Backquotes), '`') => drop(open.pop()),
            (_, '`') => open.push(Context::Backquotes),
            (Some(Context::Double), _) => {}
            (_, '\'') => open.push(Context::Single),
            (_, '"') => open.push(Context::Double),
            (_, '#') if word_start => len = rest.find('\n').unwrap_or(rest.len()),
            (_, '<') if rest.starts_with("<<") && !rest.starts_with("<<<") => {
                if let Some((h, taken)) = Heredoc::begun(&rest[2..]) {
                    heredocs.push(h);
                    len = 2 + taken;
                }
            }
            (_, '\n') if !heredocs.is_empty() => {
                out.push('\n');
                rest = heredoc_bodies(&rest[1..], std::mem::take(&mut heredocs), &mut out);
                word_start = true;
                continue;
            }
            (Some(Context::Substitution(n)), '(') => {
                open.pop();
                open.push(Context::Substitution(n + 1));
            }
            (Some(Context::Substitution(n)), ')') => {
                open.pop();
                if n > 0 {
                    open.push(Context::Substitution(n - 1));
                }
            }
            _ => {}
        }
        let quoted = matches!(open.last(), Some(Context::Single | Context::Double));
        word_start = !quoted && (c.is_whitespace() || ";&|()`".contains(c));
        out.push_str(&rest[..len]);
        rest = &rest[len..];
    }
    out
}

/// The minijinja tag `rest` starts with, and its opening; `None` for none or one left unclosed.
fn tag_at(rest: &str) -> Option<(&str, &'static str)> {
    let tag = ["{{", "{%", "{#"]
        .into_iter()
        .find(|t| rest.starts_with(t))?;
    let close = match tag {
        "{{" => "}}",
        "{%" => "%}",
        _ => "#}",
    };
    let end = tag_end(rest, close)?;
    Some((&rest[..end + 2], tag))
}

/// A `{{ expr }}` tag as `{{ (expr)|filter }}`; any other tag as it is.
fn filtered(whole: &str, tag: &str, filter: Option<&str>) -> String {
    let Some(filter) = filter.filter(|_| tag == "{{") else {
        return whole.to_string();
    };
    let inner = &whole[2..whole.len() - 2];
    let (open, inner) = match inner.strip_prefix(['-', '+']) {
        Some(x) => (&inner[..1], x),
        None => ("", inner),
    };
    let (inner, shut) = match inner.strip_suffix(['-', '+']) {
        Some(x) => (x, &inner[inner.len() - 1..]),
        None => (inner, ""),
    };
    format!("{{{{{open} ({inner})|{filter} {shut}}}}}")
}

/// A here-document (`<<EOF`, `<<-'EOF'`): a quoted delimiter takes the body as written.
struct Heredoc {
    delimiter: String,
    literal: bool,
    /// `<<-`: leading tabs are no part of a line.
    tabs: bool,
}

impl Heredoc {
    /// The here-document whose `<<` precedes `rest`, and the length of its operator and delimiter.
    fn begun(rest: &str) -> Option<(Heredoc, usize)> {
        let tabs = rest.starts_with('-');
        let after = &rest[usize::from(tabs)..];
        let word = after.trim_start_matches([' ', '\t']);
        let end = word
            .find(|c: char| c.is_whitespace() || ";&|<>()".contains(c))
            .unwrap_or(word.len());
        let written = &word[..end];
        let delimiter: String = written.chars().filter(|c| !"'\"\\".contains(*c)).collect();
        if delimiter.is_empty() || written.contains("{{") {
            return None;
        }
        let taken = rest.len() - word.len() + end;
        let literal = written.len() != delimiter.len();
        Some((
            Heredoc {
                delimiter,
                literal,
                tabs,
            },
            taken,
        ))
    }
}

/// The bodies of `heredocs` from `rest` into `out`, each `{{ }}` escaped for the body; what follows.
fn heredoc_bodies<'a>(mut rest: &'a str, heredocs: Vec<Heredoc>, out: &mut String) -> &'a str {
    for h in heredocs {
        while !rest.is_empty() {
            let line_end = rest.find('\n').map_or(rest.len(), |i| i + 1);
            let line = &rest[..line_end];
            rest = &rest[line_end..];
            let bare = line.trim_end_matches('\n');
            let bare = if h.tabs {
                bare.trim_start_matches('\t')
            } else {
                bare
            };
            if bare == h.delimiter {
                out.push_str(line);
                break;
            }
            let filter = if h.literal {
                IN_HEREDOC_AS_WRITTEN
            } else {
                IN_HEREDOC
            };
            let mut text = line;
            while let Some(at) = text.find('{') {
                out.push_str(&text[..at]);
                text = &text[at..];
                match tag_at(text) {
                    Some((whole, tag)) => {
                        out.push_str(&filtered(whole, tag, Some(filter)));
                        text = &text[whole.len()..];
                    }
                    None => {
                        out.push('{');
                        text = &text[1..];
                    }
                }
            }
            out.push_str(text);
        }
    }
    rest
}

/// Where `close` ends the tag `rest` starts with, past string literals.
fn tag_end(rest: &str, close: &str) -> Option<usize> {
    let mut in_string: Option<char> = None;
    let mut chars = rest.char_indices().skip(2);
    while let Some((i, c)) = chars.next() {
        match in_string {
            Some(_) if c == '\\' => {
                chars.next();
            }
            Some(q) if c == q => in_string = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => in_string = Some(c),
            None if rest[i..].starts_with(close) => return Some(i),
            None => {}
        }
    }
    None
}

fn display(v: &Value) -> String {
    if v.is_none() {
        String::new()
    } else {
        v.to_string()
    }
}

/// One shell word: unchanged when it is plain, single-quoted otherwise.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-+=/.,:@%^".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The shell line starting a job's program: one simple command is `exec`ed (so SLURM's signals
/// reach it); a compound line runs under `pipefail` (`train.py | tee log` fails with train.py).
pub fn launch_line(command: &str) -> String {
    let compound = command.contains(['\n', ';', '&', '|', '(', '`']) || command.contains("$(");
    if compound {
        return format!("set -o pipefail\n{command}");
    }
    // The words as bash reads them: assignments, then the program.
    let words = shlex::split(command).unwrap_or_default();
    let is_assignment = |w: &&String| w.split_once('=').is_some_and(|(name, _)| is_name(name));
    let assigns = words.iter().take_while(is_assignment).count();
    match words.get(assigns) {
        None => command.to_string(),
        Some(program) if is_builtin(program) => command.to_string(),
        Some(_) if assigns > 0 => format!("exec env {command}"),
        Some(_) => format!("exec {command}"),
    }
}

/// Whether bash runs `word` itself: `exec` cannot start it.
fn is_builtin(word: &str) -> bool {
    const BASH: [&str; 80] = [
        ".",
        ":",
        "[",
        "alias",
        "bg",
        "bind",
        "break",
        "builtin",
        "caller",
        "cd",
        "command",
        "compgen",
        "complete",
        "compopt",
        "continue",
        "declare",
        "dirs",
        "disown",
        "echo",
        "enable",
        "eval",
        "exec",
        "exit",
        "export",
        "false",
        "fc",
        "fg",
        "getopts",
        "hash",
        "help",
        "history",
        "jobs",
        "kill",
        "let",
        "local",
        "logout",
        "mapfile",
        "popd",
        "printf",
        "pushd",
        "pwd",
        "read",
        "readarray",
        "readonly",
        "return",
        "set",
        "shift",
        "shopt",
        "source",
        "suspend",
        "test",
        "times",
        "trap",
        "true",
        "type",
        "typeset",
        "ulimit",
        "umask",
        "unalias",
        "unset",
        "wait",
        "if",
        "then",
        "else",
        "elif",
        "fi",
        "case",
        "esac",
        "for",
        "select",
        "while",
        "until",
        "do",
        "done",
        "function",
        "time",
        "{",
        "!",
        "[[",
        "coproc",
    ];
    BASH.contains(&word)
}

/// Whether `s` is a shell variable's name.
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A one-line description of a minijinja error with its template and line.
pub fn describe(err: &Error) -> String {
    if err.kind() == ErrorKind::OutOfFuel {
        return "the template ran past the steps one render may take: a loop too long, or one without end"
            .to_string();
    }
    let mut s = err
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| err.kind().to_string());
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        s.push_str(&format!(": {inner}"));
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn scripts_quote_every_value() {
        let mut e = Engine::new();
        e.add("x.sbatch", "echo {{ a }} {{ b }} {{ c|safe }}\n")
            .unwrap();
        let out = e
            .render(
                "x.sbatch",
                &context! { a => "plain-1.0", b => "it's $(rm -rf /)", c => "$HOME" },
            )
            .unwrap();
        assert_eq!(out, "echo plain-1.0 'it'\\''s $(rm -rf /)' $HOME\n");
    }

    #[test]
    fn scripts_refuse_line_breaks_in_values() {
        let mut e = Engine::new();
        e.add("x.sbatch", "#SBATCH --job-name={{ a }}\n").unwrap();
        for bad in ["x\n#SBATCH --wrap=id", "x\r", "x\0y", "a\u{2028}b"] {
            let err = e.render("x.sbatch", &context! { a => bad }).unwrap_err();
            assert!(describe(&err).contains("one-line values only"), "{bad:?}");
        }
        // A command for `bash -c` is one quoted word, line breaks and all.
        e.add("y.sh", "bash -c {{ c|shquote }}\n").unwrap();
        let out = e.render("y.sh", &context! { c => "a\nb" }).unwrap();
        assert_eq!(out, "bash -c 'a\nb'\n");
    }

    #[test]
    fn derived_values_keep_their_type() {
        let e = Engine::new();
        let ctx =
            context! { batch_size => 2, slurm => context! { nodes => 4, gpus_per_node => 4 } };
        let v = e
            .eval("batch_size * slurm.nodes * slurm.gpus_per_node", &ctx)
            .unwrap();
        assert_eq!(v, Value::from(32));
        let s = e.eval("bs{{ batch_size }}", &ctx).unwrap();
        assert_eq!(s.as_str(), Some("bs2"));
        assert!(e.eval("nope + 1", &ctx).is_err());
    }

    #[test]
    fn only_simple_commands_are_execed_and_pipes_fail_with_their_programs() {
        assert_eq!(
            launch_line("sweep train --config 'a b'"),
            "exec sweep train --config 'a b'"
        );
        assert_eq!(
            launch_line("OMP_NUM_THREADS=4 A='x y' python3 train.py"),
            "exec env OMP_NUM_THREADS=4 A='x y' python3 train.py"
        );
        assert_eq!(launch_line("source env.sh"), "source env.sh");
        // Builtins a user puts first run as written (`exec exec …` and
        // `exec command …` fail with 127).
        for written in ["exec python3 -V", "command python3 -V"] {
            assert_eq!(launch_line(written), written);
        }
        assert_eq!(launch_line("x=1+1"), "x=1+1");
        assert_eq!(
            launch_line("A=1 exec python3 x.py"),
            "A=1 exec python3 x.py"
        );
        assert_eq!(launch_line("1=a prog"), "exec 1=a prog");
        for compound in ["echo a; exit 3", "a && b", "x | y", "a\nb"] {
            assert_eq!(
                launch_line(compound),
                format!("set -o pipefail\n{compound}")
            );
        }
        // What bash makes of them: the failing program's status, the
        // assignment seen by the program.
        let run = |command: &str| {
            std::process::Command::new("bash")
                .args(["-c", &launch_line(command)])
                .output()
                .unwrap()
        };
        assert_eq!(run("(exit 3) | cat").status.code(), Some(3));
        assert_eq!(run("true | cat").status.code(), Some(0));
        assert_eq!(run("exec sh -c 'exit 7'").status.code(), Some(7));
        assert_eq!(run("command sh -c 'exit 7'").status.code(), Some(7));
        let o = run("SWEEP_X='a b' printenv SWEEP_X");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "a b\n");
    }

    #[test]
    fn a_table_is_no_value_of_a_script() {
        let mut e = Engine::new();
        e.add("x.sh", "echo {{ run }}\n").unwrap();
        let ctx = context! { run => context! { id => "a1", name => "r" } };
        let err = describe(&e.render("x.sh", &ctx).unwrap_err());
        assert!(
            err.contains("a table of values (id, name)") && err.contains("`.id`"),
            "{err}"
        );
        e.add("y.sh", "echo {{ run.name }}\n").unwrap();
        assert_eq!(e.render("y.sh", &ctx).unwrap(), "echo r\n");
    }

    #[test]
    fn a_value_inside_quotes_is_the_text_between_them() {
        let mut e = Engine::new();
        let values = [
            "plain",
            "a b",
            "it's",
            "say \"hi\"",
            "$HOME",
            "`id`",
            "$(id)",
            "back\\slash",
            "!x",
            "x;echo injected",
            "*",
            "",
        ];
        let command = concat!(
            "# don't: a comment's apostrophe opens nothing\n",
            "printf '%s|' {{ v }} '{{ v }}' \"{{ v }}\" --x='{{ v }}' \"--y={{- v -}}\" ",
            "'pre {{ v }} post' \"{{ 'lit\"' }}{{ v }}\" \\'{{ v }}\\' {% if true %}\"{{ v|upper }}\"{% endif %} ",
            // A substitution starts afresh, inside double quotes too.
            "\"$(printf '%s' {{ v }})\" \"$(printf '%s' \"{{ v }}\")\" ",
            "\"$(printf '%s' \"$(printf '%s' '{{ v }}')\")\" \"$( (printf '%s' {{ v }}) )\""
        );
        e.add_command("command", command).unwrap();
        for v in values {
            let line = e.render("command", &context! { v => v }).unwrap();
            let out = std::process::Command::new("bash")
                .args(["-c", &line])
                .env_remove("HOME")
                .output()
                .unwrap();
            let upper = v.to_uppercase();
            // `\'{{ v }}\'`: a quote character, the value as a word, a quote.
            let want = format!(
                "{v}|{v}|{v}|--x={v}|--y={v}|pre {v} post|lit\"{v}|'{v}'|{upper}|{v}|{v}|{v}|{v}|"
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{v:?}: {line}");
        }
        // Outside quotes a value is still one shell word, and every form
        // refuses a line break.
        let line = e.render("command", &context! { v => "a b" }).unwrap();
        assert!(line.contains("printf '%s|' 'a b' 'a b'"), "{line}");
        let err = e.render("command", &context! { v => "a\nb" }).unwrap_err();
        assert!(describe(&err).contains("one-line values only"));
        // A here-document's body is no shell word: the value as its text,
        // expanded by nothing (`$(…)` there ran).
        e.add_command(
            "here",
            "cat <<EOF\n[{{ v }}]\nEOF\ncat <<-'END'; cat <<X\n\t({{ v }})\n\tEND\n<{{ v }}>\nX\necho '{{ v }}'",
        )
        .unwrap();
        for v in values {
            let line = e.render("here", &context! { v => v }).unwrap();
            let out = std::process::Command::new("bash")
                .args(["-c", &line])
                .env_remove("HOME")
                .output()
                .unwrap();
            let want = format!("[{v}]\n({v})\n<{v}>\n{v}\n");
            assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{v:?}: {line}");
        }
        // Inside backquotes no quoting holds: refused, with what to write.
        e.add_command("old", "echo \"`printf %s {{ v }}`\"")
            .unwrap();
        let err = describe(&e.render("old", &context! { v => "x" }).unwrap_err());
        assert!(
            err.contains("inside backquotes") && err.contains("$( … )"),
            "{err}"
        );
        // Lines are kept, so an error names the line the manifest has.
        e.add_command("bad", "echo ok\necho '{{ v.x.y }}'").unwrap();
        let err = e.render("bad", &context! { v => 1 }).unwrap_err();
        assert_eq!(err.line(), Some(2), "{err:?}");
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("/x/y.toml"), "/x/y.toml");
    }
}
