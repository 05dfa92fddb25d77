//! Reading `connectivity-proxy-config.yml` as the real proxy does: the proxy is a Java program whose
//! YAML library (SnakeYAML) resolves plain (unquoted) scalars by YAML 1.1 rules, so `off`, `on`,
//! `yes`, `no`, `y` and `n` are booleans, `017` is the octal integer 15, `0x1F` is hexadecimal, `1:20`
//! is the sexagesimal integer 80 and `2001-12-14` is a timestamp. Quoted scalars are always strings.
//!
//! The resolution rules are those of the oracle in `shared/src/yaml11.rs` (the tests of the
//! controller's YAML writer, after <https://yaml.org/type/>), copied here so the stand-in stays a
//! small static binary without the operator's API crate. `y` and `n` count as booleans as in PyYAML
//! and the YAML 1.1 type repository (SnakeYAML reads them as strings): the stricter reading.
//!
//! The reader covers the YAML the controller writes (`cp_api::yaml11::to_string`) and what people
//! usually write by hand: block mappings and sequences (also a sequence at its key's indentation),
//! explicit `? key` entries, plain, single- and double-quoted scalars on one line, one-line flow
//! collections (so JSON too), comments, and a leading `---`. It refuses, with the line number,
//! what it does not read (anchors, aliases, tags, block scalars `|`/`>`, multi-line scalars and
//! flow collections, several documents), duplicate keys, and keys that YAML 1.1 does not read as
//! strings (`on:` is the boolean `true` to the proxy, not the key `on`): the stand-in never guesses.
//!
//! Values YAML 1.1 reads as types JSON does not have come back as a one-key marker object, like the
//! oracle's: `{"!!timestamp": "2001-12-14"}`, `{"!!float": ".inf"}`, `{"!!int": "<too large>"}`,
//! `{"!!merge": "<<"}`, `{"!!value": "="}`, `{"!!yaml": "!"}`; the configuration checks name them.

use serde_json::{Map, Number, Value};

/// The parsed document as JSON, or what is wrong and on which line.
pub fn parse(text: &str) -> Result<Value, String> {
    let lines = split_lines(text)?;
    let mut parser = Parser { lines, pos: 0 };
    let Some(first) = parser.lines.first().copied() else {
        return Ok(Value::Null);
    };
    let value = parser.node(first.indent)?;
    if let Some(line) = parser.lines.get(parser.pos) {
        return Err(at(
            line.no,
            "unexpected content after the document's top-level node",
        ));
    }
    Ok(value)
}

/// The kind of value a plain scalar resolves to under YAML 1.1, for messages: `boolean false`,
/// `the integer 15`, `a YAML 1.1 timestamp (2001-12-14)`.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) if n.is_f64() => format!("the float {n}"),
        Value::Number(n) => format!("the integer {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(_) => "a sequence".into(),
        Value::Object(map) => match marker(map) {
            Some((tag, text)) => format!("a YAML 1.1 {tag} ({text})"),
            None => "a mapping".into(),
        },
    }
}

/// The tag and text of a marker object (`{"!!timestamp": "2001-12-14"}`).
pub fn marker(map: &Map<String, Value>) -> Option<(&str, &str)> {
    let mut entries = map.iter();
    let (key, value) = entries.next()?;
    if entries.next().is_some() {
        return None;
    }
    Some((key.strip_prefix("!!")?, value.as_str()?))
}

fn at(line: usize, message: impl std::fmt::Display) -> String {
    format!("line {line}: {message}")
}

/// One line with content: its 1-based number, its indentation in spaces and the text after it.
#[derive(Clone, Copy, Debug)]
struct Line<'a> {
    no: usize,
    indent: usize,
    text: &'a str,
}

/// Whether YAML 1.1 allows `c` raw in a document (`c-printable`). NEL, LS and PS are line breaks
/// in YAML 1.1, which this line-based reader does not split on, so they are refused too.
fn allowed_raw(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{7e}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        && !matches!(c, '\u{2028}' | '\u{2029}')
}

/// The lines with content (not blank, not only a comment), without a leading `---` and after a
/// closing `...`.
fn split_lines(text: &str) -> Result<Vec<Line<'_>>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = Vec::new();
    let mut ended = false;
    for (i, raw) in text.split('\n').enumerate() {
        let no = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if let Some(c) = raw.chars().find(|&c| !allowed_raw(c)) {
            return Err(at(
                no,
                format!("character U+{:04X} is not allowed unescaped", u32::from(c)),
            ));
        }
        let indent = raw.len() - raw.trim_start_matches(' ').len();
        let rest = &raw[indent..];
        let content = rest.trim_start_matches([' ', '\t']);
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if ended {
            return Err(at(no, "content after the end of the document (`...`)"));
        }
        if rest.starts_with('\t') {
            return Err(at(
                no,
                "a tab in the indentation (YAML indents with spaces)",
            ));
        }
        let marker_line = |m: &str| {
            indent == 0
                && rest
                    .strip_prefix(m)
                    .is_some_and(|r| r.is_empty() || r.starts_with([' ', '\t']))
        };
        if marker_line("---") {
            if !lines.is_empty() {
                return Err(at(no, "a second document (`---`): the file must hold one"));
            }
            let after = rest[3..].trim_start_matches([' ', '\t']);
            if !(after.is_empty() || after.starts_with('#')) {
                return Err(at(no, "content on the `---` line is not supported"));
            }
            continue;
        }
        if marker_line("...") {
            ended = true;
            continue;
        }
        if indent == 0 && rest.starts_with('%') {
            return Err(at(no, "YAML directives (`%`) are not supported"));
        }
        lines.push(Line {
            no,
            indent,
            text: rest.trim_end_matches([' ', '\t']),
        });
    }
    Ok(lines)
}

/// Whether `text` starts a block sequence item (`-` followed by a space or nothing).
fn is_item(text: &str) -> bool {
    text == "-" || text.starts_with("- ") || text.starts_with("-\t")
}

/// Whether the rest of a line is empty or a comment.
fn is_blank(rest: &str) -> bool {
    let rest = rest.trim_start_matches([' ', '\t']);
    rest.is_empty() || rest.starts_with('#')
}

struct Parser<'a> {
    lines: Vec<Line<'a>>,
    pos: usize,
}

impl Parser<'_> {
    /// The block node starting at the current line, whose indentation is `indent`.
    fn node(&mut self, indent: usize) -> Result<Value, String> {
        let Some(line) = self.lines.get(self.pos).copied() else {
            return Ok(Value::Null);
        };
        if is_item(line.text) {
            return self.sequence(indent);
        }
        if line.text == "?" || line.text.starts_with("? ") || entry(line.text, line.no)?.is_some() {
            return self.mapping(indent);
        }
        self.pos += 1;
        inline_value(line.text, line.no)
    }

    /// The value after a `key:` or `- ` whose line has indentation `indent`; `rest` is what follows
    /// the indicator on that line (the caller has moved past the line).
    fn value_after(
        &mut self,
        rest: &str,
        indent: usize,
        no: usize,
        compact_sequence: bool,
    ) -> Result<Value, String> {
        if !is_blank(rest) {
            return inline_value(rest.trim_start_matches([' ', '\t']), no);
        }
        match self.lines.get(self.pos).copied() {
            Some(next) if next.indent > indent => self.node(next.indent),
            Some(next) if compact_sequence && next.indent == indent && is_item(next.text) => {
                self.sequence(indent)
            }
            _ => Ok(Value::Null),
        }
    }

    fn mapping(&mut self, indent: usize) -> Result<Value, String> {
        let mut map = Map::new();
        while let Some(line) = self.lines.get(self.pos).copied() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                return Err(at(line.no, "unexpected indentation"));
            }
            if is_item(line.text) {
                return Err(at(
                    line.no,
                    "a sequence item where a mapping key was expected",
                ));
            }
            self.pos += 1;
            let (key, value) = if let Some(key_text) = line
                .text
                .strip_prefix('?')
                .filter(|r| r.is_empty() || r.starts_with([' ', '\t']))
            {
                // An explicit key: `? key` then `: value` at the same indentation.
                if is_blank(key_text) {
                    return Err(at(line.no, "complex (multi-line) keys are not supported"));
                }
                let key = key_string(inline_value(key_text.trim_start(), line.no)?, line.no)?;
                let value = match self.lines.get(self.pos).copied() {
                    Some(next)
                        if next.indent == indent
                            && (next.text == ":"
                                || next.text.starts_with(": ")
                                || next.text.starts_with(":\t")) =>
                    {
                        self.pos += 1;
                        self.value_after(&next.text[1..], indent, next.no, true)?
                    }
                    _ => Value::Null,
                };
                (key, value)
            } else {
                let Some((key, rest)) = entry(line.text, line.no)? else {
                    return Err(at(line.no, "expected a `key: value` entry"));
                };
                (key, self.value_after(rest, indent, line.no, true)?)
            };
            if map.contains_key(&key) {
                return Err(at(line.no, format!("duplicate key {key:?}")));
            }
            map.insert(key, value);
        }
        Ok(Value::Object(map))
    }

    fn sequence(&mut self, indent: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        while let Some(line) = self.lines.get(self.pos).copied() {
            if line.indent < indent {
                break;
            }
            if line.indent > indent {
                return Err(at(line.no, "unexpected indentation"));
            }
            if !is_item(line.text) {
                break;
            }
            let after = &line.text[1..];
            let content = after.trim_start_matches([' ', '\t']);
            if is_blank(content) {
                self.pos += 1;
                items.push(self.value_after("", indent, line.no, false)?);
            } else {
                // The item's content starts a node of its own at its column: `- a: 1` continues
                // with `  b: 2`, `- - x` is a nested sequence.
                if after.trim_start_matches(' ').starts_with('\t') {
                    return Err(at(line.no, "a tab after `-` (YAML indents with spaces)"));
                }
                let column = indent + 1 + (after.len() - content.len());
                if let Some(slot) = self.lines.get_mut(self.pos) {
                    *slot = Line {
                        no: line.no,
                        indent: column,
                        text: content,
                    };
                }
                items.push(self.node(column)?);
            }
        }
        Ok(Value::Array(items))
    }
}

/// The key and the rest of the line when `text` is a `key: value` entry with an implicit key,
/// `None` when it is not (a scalar or flow node on a line of its own).
fn entry(text: &str, no: usize) -> Result<Option<(String, &str)>, String> {
    let colon_follows = |rest: &str| -> Option<usize> {
        let trimmed = rest.trim_start_matches([' ', '\t']);
        let skipped = rest.len() - trimmed.len();
        let after = trimmed.strip_prefix(':')?;
        (after.is_empty() || after.starts_with([' ', '\t'])).then_some(skipped + 1)
    };
    match text.chars().next() {
        Some('"' | '\'') => {
            let (key, end) = quoted(text, no)?;
            let rest = &text[end..];
            Ok(colon_follows(rest).map(|n| (key, &rest[n..])))
        }
        Some('[' | '{') | None => Ok(None),
        Some(_) => {
            let bytes = text.as_bytes();
            for (i, c) in text.char_indices() {
                if c == '#' && i > 0 && matches!(bytes.get(i - 1), Some(b' ' | b'\t')) {
                    return Ok(None);
                }
                if c == ':' && matches!(bytes.get(i + 1), None | Some(b' ' | b'\t')) {
                    let key_text = text[..i].trim_end_matches([' ', '\t']);
                    if key_text.is_empty() {
                        return Err(at(no, "an empty key"));
                    }
                    check_plain_start(key_text, no)?;
                    let key = key_string(resolve_plain(key_text), no)?;
                    return Ok(Some((key, &text[i + 1..])));
                }
            }
            Ok(None)
        }
    }
}

/// A key as the string it must be: YAML 1.1 reads `on:` as the boolean key `true`, which no field
/// of the proxy's configuration is.
fn key_string(key: Value, no: usize) -> Result<String, String> {
    match key {
        Value::String(s) => Ok(s),
        other => Err(at(
            no,
            format!(
                "a key that YAML 1.1 reads as {}, not a string (quote it)",
                describe(&other)
            ),
        )),
    }
}

/// Refuses the indicators that start constructs this reader does not support.
fn check_plain_start(s: &str, no: usize) -> Result<(), String> {
    let mut chars = s.chars();
    let first = chars.next();
    let second = chars.next();
    match first {
        Some('&' | '*' | '!') => Err(at(
            no,
            format!("anchors, aliases and tags are not supported: {s:?}"),
        )),
        Some('|' | '>') => Err(at(
            no,
            format!("block scalars (`|`, `>`) are not supported: {s:?}"),
        )),
        Some(c @ ('%' | '@' | '`')) => {
            Err(at(no, format!("a plain scalar cannot start with {c:?}")))
        }
        Some(c @ ('-' | '?' | ':')) if second.is_none_or(|c| c == ' ' || c == '\t') => Err(at(
            no,
            format!("{c:?} followed by a space is not a scalar here"),
        )),
        Some(',' | ']' | '}') => Err(at(no, format!("unexpected {s:?}"))),
        _ => Ok(()),
    }
}

/// One node that fills the rest of a line: a quoted scalar, a flow collection or a plain scalar,
/// optionally followed by a comment.
fn inline_value(text: &str, no: usize) -> Result<Value, String> {
    match text.chars().next() {
        Some('"' | '\'') => {
            let (s, end) = quoted(text, no)?;
            expect_end(&text[end..], no)?;
            Ok(Value::String(s))
        }
        Some('[' | '{') => {
            let mut flow = Flow { text, at: 0, no };
            let value = flow.node()?;
            expect_end(&text[flow.at..], no)?;
            Ok(value)
        }
        _ => {
            let bytes = text.as_bytes();
            let end = text
                .char_indices()
                .find(|&(i, c)| c == '#' && i > 0 && matches!(bytes.get(i - 1), Some(b' ' | b'\t')))
                .map_or(text.len(), |(i, _)| i);
            let s = text[..end].trim_end_matches([' ', '\t']);
            check_plain_start(s, no)?;
            if s.contains(": ") || s.contains(":\t") || s.ends_with(':') {
                return Err(at(no, format!("a mapping is not allowed here: {s:?}")));
            }
            Ok(resolve_plain(s))
        }
    }
}

/// Only blanks and a comment may follow a node.
fn expect_end(rest: &str, no: usize) -> Result<(), String> {
    let trimmed = rest.trim_start_matches([' ', '\t']);
    if trimmed.is_empty() || (trimmed.starts_with('#') && trimmed.len() < rest.len()) {
        Ok(())
    } else {
        Err(at(no, format!("unexpected {trimmed:?} after a value")))
    }
}

/// The quoted scalar at the start of `text` and the byte offset after its closing quote.
fn quoted(text: &str, no: usize) -> Result<(String, usize), String> {
    let mut chars = text.char_indices();
    let Some((_, quote)) = chars.next() else {
        return Err(at(no, "expected a quoted scalar"));
    };
    let unterminated = || {
        at(
            no,
            "an unterminated quoted scalar (multi-line quoted scalars are not supported)",
        )
    };
    let mut out = String::new();
    if quote == '\'' {
        let mut chars = chars.peekable();
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().is_some_and(|&(_, n)| n == '\'') {
                    chars.next();
                    out.push('\'');
                } else {
                    return Ok((out, i + 1));
                }
            } else {
                out.push(c);
            }
        }
        return Err(unterminated());
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, i + 1)),
            '\\' => {
                let Some((_, e)) = chars.next() else {
                    return Err(unterminated());
                };
                let hex =
                    |chars: &mut std::str::CharIndices<'_>, n: usize| -> Result<char, String> {
                        let digits: String = chars.by_ref().take(n).map(|(_, c)| c).collect();
                        u32::from_str_radix(&digits, 16)
                            .ok()
                            .filter(|_| digits.len() == n)
                            .and_then(char::from_u32)
                            .ok_or_else(|| at(no, format!("an invalid escape \\{e}{digits}")))
                    };
                out.push(match e {
                    '0' => '\0',
                    'a' => '\u{7}',
                    'b' => '\u{8}',
                    't' | '\t' => '\t',
                    'n' => '\n',
                    'v' => '\u{b}',
                    'f' => '\u{c}',
                    'r' => '\r',
                    'e' => '\u{1b}',
                    ' ' => ' ',
                    '"' => '"',
                    '/' => '/',
                    '\\' => '\\',
                    'N' => '\u{85}',
                    '_' => '\u{a0}',
                    'L' => '\u{2028}',
                    'P' => '\u{2029}',
                    'x' => hex(&mut chars, 2)?,
                    'u' => hex(&mut chars, 4)?,
                    'U' => hex(&mut chars, 8)?,
                    other => return Err(at(no, format!("an unknown escape \\{other}"))),
                });
            }
            c => out.push(c),
        }
    }
    Err(unterminated())
}

/// A flow collection on one line (`[a, b]`, `{a: 1}`, JSON).
struct Flow<'a> {
    text: &'a str,
    at: usize,
    no: usize,
}

impl<'a> Flow<'a> {
    fn rest(&self) -> &'a str {
        self.text.get(self.at..).unwrap_or("")
    }
    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }
    fn skip_blanks(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start_matches([' ', '\t']).len();
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn err(&self, message: impl std::fmt::Display) -> String {
        at(self.no, message)
    }

    fn node(&mut self) -> Result<Value, String> {
        self.skip_blanks();
        match self.peek() {
            Some('[') => self.sequence(),
            Some('{') => self.mapping(),
            Some('"' | '\'') => {
                let (s, end) = quoted(self.rest(), self.no)?;
                self.at += end;
                Ok(Value::String(s))
            }
            None => Err(self.err(
                "an unterminated flow collection (multi-line flow collections are not supported)",
            )),
            _ => Ok(resolve_plain(self.plain()?)),
        }
    }

    /// A plain scalar in flow context: up to a flow indicator, `: ` or ` #`.
    fn plain(&mut self) -> Result<&'a str, String> {
        let rest = self.rest();
        let bytes = rest.as_bytes();
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            let next = bytes.get(i + 1).copied();
            let stop = matches!(c, ',' | '[' | ']' | '{' | '}')
                || (c == ':' && matches!(next, None | Some(b' ' | b'\t' | b',' | b']' | b'}')))
                || (c == '#' && i > 0 && matches!(bytes.get(i - 1), Some(b' ' | b'\t')));
            if stop {
                end = i;
                break;
            }
        }
        let s = rest[..end].trim_end_matches([' ', '\t']);
        if s.is_empty() {
            return Err(self.err(format!("expected a value at {rest:?}")));
        }
        check_plain_start(s, self.no)?;
        self.at += end;
        Ok(s)
    }

    fn sequence(&mut self) -> Result<Value, String> {
        self.eat('[');
        let mut items = Vec::new();
        loop {
            self.skip_blanks();
            if self.eat(']') {
                return Ok(Value::Array(items));
            }
            items.push(self.node()?);
            self.skip_blanks();
            if self.eat(']') {
                return Ok(Value::Array(items));
            }
            if !self.eat(',') {
                return Err(self.err("expected `,` or `]` in a flow sequence (multi-line flow collections are not supported)"));
            }
        }
    }

    fn mapping(&mut self) -> Result<Value, String> {
        self.eat('{');
        let mut map = Map::new();
        loop {
            self.skip_blanks();
            if self.eat('}') {
                return Ok(Value::Object(map));
            }
            let key = match self.peek() {
                Some('"' | '\'') => {
                    let (s, end) = quoted(self.rest(), self.no)?;
                    self.at += end;
                    s
                }
                Some('[' | '{') => return Err(self.err("collection keys are not supported")),
                _ => {
                    let text = self.plain()?;
                    key_string(resolve_plain(text), self.no)?
                }
            };
            self.skip_blanks();
            let value = if self.eat(':') {
                self.skip_blanks();
                if matches!(self.peek(), Some(',' | '}')) {
                    Value::Null
                } else {
                    self.node()?
                }
            } else {
                Value::Null
            };
            if map.contains_key(&key) {
                return Err(self.err(format!("duplicate key {key:?}")));
            }
            map.insert(key, value);
            self.skip_blanks();
            if self.eat('}') {
                return Ok(Value::Object(map));
            }
            if !self.eat(',') {
                return Err(self.err("expected `,` or `}` in a flow mapping (multi-line flow collections are not supported)"));
            }
        }
    }
}

/// What a YAML 1.1 reader makes of the plain scalar `s`: the type rules of
/// [`cp_api::yaml11_types::resolve_plain`], with ints and floats as JSON numbers where they fit.
pub fn resolve_plain(s: &str) -> Value {
    match cp_api::yaml11_types::resolve_plain(s) {
        Value::Object(m) if m.contains_key("!!int") => {
            int_value(s).map_or(Value::Object(m), Value::Number)
        }
        Value::Object(m) if m.contains_key("!!float") => {
            float_value(s).map_or(Value::Object(m), Value::Number)
        }
        other => other,
    }
}

/// The value of a YAML 1.1 int (binary, octal with a leading `0`, decimal, hexadecimal,
/// sexagesimal; `_` ignored) when it fits a JSON integer.
fn int_value(s: &str) -> Option<Number> {
    let (negative, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let body: String = body.chars().filter(|&c| c != '_').collect();
    let magnitude: u128 = if let Some(b) = body.strip_prefix("0b") {
        u128::from_str_radix(b, 2).ok()?
    } else if let Some(h) = body.strip_prefix("0x") {
        u128::from_str_radix(h, 16).ok()?
    } else if body.contains(':') {
        body.split(':').try_fold(0u128, |acc, part| {
            acc.checked_mul(60)?.checked_add(part.parse::<u128>().ok()?)
        })?
    } else if body.len() > 1 && body.starts_with('0') {
        u128::from_str_radix(&body[1..], 8).ok()?
    } else {
        body.parse().ok()?
    };
    let value = i128::try_from(magnitude).ok()?;
    let value = if negative { -value } else { value };
    if let Ok(v) = i64::try_from(value) {
        Some(Number::from(v))
    } else {
        u64::try_from(value).ok().map(Number::from)
    }
}

/// The value of a finite YAML 1.1 float (`_` ignored, sexagesimal allowed).
fn float_value(s: &str) -> Option<Number> {
    let body: String = s.chars().filter(|&c| c != '_').collect();
    let value = if body.contains(':') {
        let (negative, digits) = match body.strip_prefix('-') {
            Some(b) => (true, b),
            None => (false, body.strip_prefix('+').unwrap_or(&body)),
        };
        let v = digits.split(':').try_fold(0f64, |acc, part| {
            Some(acc * 60.0 + part.parse::<f64>().ok()?)
        })?;
        if negative { -v } else { v }
    } else {
        body.parse::<f64>().ok()?
    };
    Number::from_f64(value)
}

#[cfg(test)]
mod tests {
    use super::{parse, resolve_plain};
    use serde_json::{Value, json};

    #[test]
    fn plain_scalars_resolve_by_yaml11_rules() {
        for s in ["y", "Yes", "on", "ON", "true"] {
            assert_eq!(resolve_plain(s), Value::Bool(true), "{s}");
        }
        for s in ["n", "NO", "off", "Off", "false"] {
            assert_eq!(resolve_plain(s), Value::Bool(false), "{s}");
        }
        for s in ["~", "null", "NULL", ""] {
            assert_eq!(resolve_plain(s), Value::Null, "{s}");
        }
        for (s, n) in [
            ("017", json!(15)),
            ("0x1F", json!(31)),
            ("0b101", json!(5)),
            ("1_000", json!(1000)),
            ("-0", json!(0)),
            ("1:20", json!(80)),
            ("190:20:30", json!(685_230)),
            ("-017", json!(-15)),
            ("18446744073709551615", json!(18_446_744_073_709_551_615u64)),
            ("1.5", json!(1.5)),
            ("1.0e+5", json!(100_000.0)),
            (".5", json!(0.5)),
            ("190:20:30.15", json!(685_230.15)),
        ] {
            assert_eq!(resolve_plain(s), n, "{s}");
        }
        for (s, tag) in [
            ("2001-12-14", "timestamp"),
            ("2001-12-14t21:59:43.10-05:00", "timestamp"),
            (".inf", "float"),
            (".NaN", "float"),
            ("99999999999999999999999", "int"),
            ("<<", "merge"),
            ("=", "value"),
        ] {
            assert_eq!(resolve_plain(s), json!({ format!("!!{tag}"): s }), "{s}");
        }
        for s in [
            "0o17",
            "1e5",
            "1:60",
            "offf",
            "yess",
            "09",
            "abc",
            "cp.example.com",
        ] {
            assert_eq!(resolve_plain(s), Value::String(s.to_owned()), "{s}");
        }
    }

    #[test]
    fn reads_block_and_flow_yaml() {
        let text = "---\n# comment\nhighAvailabilityMode: off   # unquoted\nquoted: \"off\"\nsingle: 'it''s'\n\
                    servers:\n  proxy:\n    http: {enabled: yes, port: 020003}\n  list:\n  - a\n  - b: 1\n    c: [1, \"x\", {}]\n  - - q\n  -\n    deep: true\n\
                    empty:\n? explicit\n: 5\njson: {\"a\": [1, 2.5, null, true]}\n...\n# trailing\n";
        assert_eq!(
            parse(text).expect("parse"),
            json!({
                "highAvailabilityMode": false,
                "quoted": "off",
                "single": "it's",
                "servers": {
                    "proxy": {"http": {"enabled": true, "port": 8195}},
                    "list": ["a", {"b": 1, "c": [1, "x", {}]}, ["q"], {"deep": true}]
                },
                "empty": null,
                "explicit": 5,
                "json": {"a": [1, 2.5, null, true]}
            })
        );
        assert_eq!(parse("").expect("empty"), Value::Null);
        assert_eq!(
            parse("- 1\n- \"\\u00e9\\x41\\n\"\n").expect("seq"),
            json!([1, "éA\n"])
        );
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        for (text, needle) in [
            ("a: 1\na: 2\n", "duplicate key"),
            ("on: 1\n", "boolean true"),
            ("a: &x 1\n", "anchors"),
            ("a: |\n  text\n", "block scalars"),
            ("a: \"open\n", "unterminated"),
            ("a: 1\n  b: 2\n", "unexpected indentation"),
            ("a: b: c\n", "mapping is not allowed"),
            ("a: 1\n---\nb: 2\n", "second document"),
            ("a: [1,\n  2]\n", "multi-line flow"),
            ("a: [1\n", "multi-line flow"),
            ("a:\n\t- 1\n", "tab"),
            ("a: \"x\" y\n", "after a value"),
            ("a: \u{85}\n", "U+0085"),
            ("- a\nb: 1\n", "unexpected content"),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err}");
            assert!(err.starts_with("line "), "{text:?}: {err}");
        }
    }

    /// Everything the controller's writer produces reads back as the value it wrote: the writer's
    /// own test corpus (tricky strings as keys and values, random numbers, nesting, long keys).
    #[test]
    fn reads_back_what_the_controller_writes() {
        let cases = cp_api::yaml11::testgen::cases(3000, 0x5eed_2024);
        for case in &cases {
            let yaml = cp_api::yaml11::to_string(case);
            assert_eq!(parse(&yaml).as_ref(), Ok(case), "{yaml}");
        }
        for value in [json!({}), json!([]), json!("on"), Value::Null, json!(17)] {
            assert_eq!(parse(&cp_api::yaml11::to_string(&value)), Ok(value));
        }
    }
}
