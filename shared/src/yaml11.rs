//! A small YAML writer whose output means the same thing to a YAML 1.1 reader as to a YAML 1.2 one.
//!
//! The Connectivity Proxy is a Java program that reads `connectivity-proxy-config.yml` with
//! SnakeYAML, which resolves plain scalars by YAML 1.1 rules: `off`, `on`, `yes`, `no`, `y` and `n`
//! are booleans, `017` is octal, `1:20` is sexagesimal and `2001-12-14` is a timestamp. serde_norway
//! (like serde_yaml, its deprecated original) writes YAML 1.2, so it leaves
//! `highAvailabilityMode: off` unquoted and the proxy reads the boolean `false`; the legacy
//! installation's file therefore quoted `"off"`.
//!
//! [`to_string`] writes a string plain (unquoted) only when it is provably a string under both
//! versions, and double-quotes everything else, so reading the output back under YAML 1.1 yields
//! exactly the JSON value that was written.

use serde_json::{Map, Number, Value};
use std::fmt::Write as _;

/// Plain scalars a YAML 1.1 reader resolves to a boolean or null although they consist only of the
/// characters [`to_string`] otherwise writes plain. YAML 1.2's core schema words are a subset.
const RESERVED_WORDS: [&str; 25] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false",
    "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL",
];

/// Whether a plain scalar `s` is a boolean to a YAML 1.1 reader but a string to a YAML 1.2 one
/// (`yes`, `No`, `OFF`, `y`, ...): a YAML 1.2 writer leaves such strings unquoted.
pub fn is_yaml11_only_boolean(s: &str) -> bool {
    const YAML_1_2_CORE: [&str; 9] = [
        "true", "True", "TRUE", "false", "False", "FALSE", "null", "Null", "NULL",
    ];
    RESERVED_WORDS.contains(&s) && !YAML_1_2_CORE.contains(&s)
}

/// A mapping key longer than this (as written) is written as an explicit `? key` entry: YAML
/// limits implicit keys to 1024 characters.
const MAX_IMPLICIT_KEY_CHARS: usize = 1000;

/// Renders `value` as a block-style YAML document that a YAML 1.1 reader (SnakeYAML, PyYAML) and a
/// YAML 1.2 reader both read back as exactly `value`.
///
/// Mappings are written `key: value` in the map's iteration order with nested collections indented
/// by two spaces, sequences as `- item` (a mapping item as `- a: 1` followed by `  b: 2`), empty
/// collections as `{}` and `[]`, `null`, `true` and `false` as such, integers as JSON writes them and
/// floats with a `.` and a signed exponent (`1.0e+16`), the form YAML 1.1 requires of a float.
/// Strings and keys are plain only when they match `[A-Za-z_][A-Za-z0-9_./-]*` and are none of
/// YAML 1.1's boolean and null words; all others are double-quoted with JSON-style escapes.
/// The output ends with a newline.
pub fn to_string(value: &Value) -> String {
    render(value, &mut |_| {})
}

/// Whether `s` can be written as a plain scalar: it starts with an ASCII letter or `_`, continues
/// with ASCII letters, digits, `_`, `.`, `-` and `/`, and is not a YAML 1.1 boolean or null word.
///
/// No YAML 1.1 or 1.2 int, float, timestamp, merge or value form starts with a letter or `_`, and
/// these characters never end or comment a plain scalar, so such a string reads back as itself.
fn is_plain_safe(s: &str) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
        && !RESERVED_WORDS.contains(&s)
}

/// [`to_string`], calling `on_plain` with every string written plain (tests check those).
fn render(value: &Value, on_plain: &mut dyn FnMut(&str)) -> String {
    let mut emitter = Emitter {
        out: String::new(),
        on_plain,
    };
    emitter.block(value, 0, false);
    emitter.out
}

struct Emitter<'a> {
    out: String,
    on_plain: &'a mut dyn FnMut(&str),
}

/// Whether `value` is written in block style (a non-empty collection) rather than on one line.
fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

impl Emitter<'_> {
    /// Writes `value` at column `indent`; with `inline` its first line continues the current line
    /// (after `- `), otherwise it starts with the indentation.
    fn block(&mut self, value: &Value, indent: usize, mut inline: bool) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, item) in map {
                    if !inline {
                        self.pad(indent);
                    }
                    inline = false;
                    let key = self.string(key);
                    if key.chars().count() > MAX_IMPLICIT_KEY_CHARS {
                        self.out.push_str("? ");
                        self.out.push_str(&key);
                        self.out.push('\n');
                        self.pad(indent);
                    } else {
                        self.out.push_str(&key);
                    }
                    self.out.push(':');
                    if is_block(item) {
                        self.out.push('\n');
                        self.block(item, indent + 2, false);
                    } else {
                        self.out.push(' ');
                        self.line(item);
                    }
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    if !inline {
                        self.pad(indent);
                    }
                    inline = false;
                    self.out.push_str("- ");
                    if is_block(item) {
                        self.block(item, indent + 2, true);
                    } else {
                        self.line(item);
                    }
                }
            }
            _ => self.line(value),
        }
    }

    /// Writes a scalar or an empty collection and ends the line.
    fn line(&mut self, value: &Value) {
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => write_number(&mut self.out, n),
            Value::String(s) => {
                let s = self.string(s);
                self.out.push_str(&s);
            }
            Value::Array(_) => self.out.push_str("[]"),
            Value::Object(_) => self.out.push_str("{}"),
        }
        self.out.push('\n');
    }

    /// `s` as a scalar: plain when that is safe, double-quoted otherwise.
    fn string(&mut self, s: &str) -> String {
        if is_plain_safe(s) {
            (self.on_plain)(s);
            s.to_owned()
        } else {
            quoted(s)
        }
    }

    fn pad(&mut self, indent: usize) {
        self.out.extend(std::iter::repeat_n(' ', indent));
    }
}

/// Writes an integer as JSON does and a float so that YAML 1.1 resolves it as a float: with a `.`
/// in the mantissa and a sign on the exponent (`1e16` would be a string in YAML 1.1).
fn write_number(out: &mut String, n: &Number) {
    let text = n.to_string();
    if !n.is_f64() {
        out.push_str(&text);
        return;
    }
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (text.as_str(), None),
    };
    out.push_str(mantissa);
    if !mantissa.contains('.') {
        out.push_str(".0");
    }
    if let Some(exponent) = exponent {
        out.push('e');
        if !exponent.starts_with(['-', '+']) {
            out.push('+');
        }
        out.push_str(exponent);
    }
}

/// `s` as a double-quoted scalar. Only `\"`, `\\`, `\n`, `\t`, `\r` and `\uXXXX` are used, which
/// JSON, YAML 1.1 and YAML 1.2 share; `\uXXXX` covers every character YAML does not allow raw
/// (controls, DEL, C1 controls, U+FFFE/U+FFFF) and the YAML 1.1 line breaks NEL, U+2028 and U+2029,
/// and the byte order mark.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => {
                // Every character that needs an escape is in the Basic Multilingual Plane.
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn needs_escape(c: char) -> bool {
    let printable = matches!(c,
        '\u{20}'..='\u{7e}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..);
    !printable || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

/// Test inputs shared by this module's unit tests and the PyYAML integration test. Not an API.
#[doc(hidden)]
pub mod testgen {
    use super::{Map, Number, Value};

    /// xorshift64: deterministic and dependency-free.
    pub struct XorShift(u64);

    impl XorShift {
        pub fn new(seed: u64) -> Self {
            Self(seed | 1)
        }

        pub fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        /// A number in `0..n` (0 when `n` is 0).
        pub fn below(&mut self, n: usize) -> usize {
            if n == 0 {
                0
            } else {
                (self.next_u64() % n as u64) as usize
            }
        }
    }

    /// Strings that some YAML reader takes for something other than a string, or that break
    /// plain-scalar syntax.
    pub const TRICKY: &[&str] = &[
        "off",
        "on",
        "yes",
        "no",
        "y",
        "n",
        "true",
        "~",
        "null",
        "NULL",
        "0x1F",
        "0o17",
        "017",
        "1_000",
        "1:20",
        "1.5",
        ".inf",
        "-.inf",
        ".NaN",
        "2001-12-14",
        "2001-12-14t21:59:43.10-05:00",
        "<<",
        "=",
        "-",
        "- a",
        "a: b",
        "a #b",
        "#x",
        "&a",
        "*a",
        "!x",
        "|",
        ">",
        "%x",
        "@x",
        "`x",
        "[x",
        "{x",
        "'x",
        "\"x",
        " leading",
        "trailing ",
        "",
        "Off",
        "OFF",
        "On",
        "ON",
        "Yes",
        "YES",
        "No",
        "NO",
        "Y",
        "N",
        "True",
        "TRUE",
        "False",
        "FALSE",
        "false",
        "Null",
        "0b101",
        "0x_1f",
        "+12",
        "-0",
        "0",
        "1e5",
        "1.0e+5",
        ".5",
        "1.",
        "190:20:30.15",
        "2001-12-14 21:59:43.10 -5",
        "2001-12-14T21:59:43Z",
        "---",
        "...",
        "?",
        "? a",
        ":",
        "a:",
        "a:b",
        "a,b",
        "a]",
        "!",
        "&",
        "*",
        ",",
        "?x",
        "off ",
        "\toff",
        "off\n",
        "\u{85}",
        "\u{2028}",
        "\u{feff}x",
        "\u{0}",
        "\u{ffff}",
        "😀",
        "a\\b",
        "C:\\dir",
        "highAvailabilityMode",
        "cp.example.com",
        "a/b-c_d.e",
        "_x",
        "on_off",
        "yess",
    ];

    /// Pieces random strings are made of.
    const ALPHABET: &[&str] = &[
        "a", "b", "z", "A", "Q", "0", "1", "7", "9", "y", "Y", "n", "N", "~", ":", "#", "-", ".",
        "_", "/", " ", "'", "\"", "\\", "\n", "\t", "\r", "0x", "e", "E", "é", "\u{7f}", "\u{85}",
        "\u{2028}", "\u{feff}", "\u{1}", "😀", "[", "{", "}", ",", "&", "*", "!", "|", ">", "%",
        "@", "`", "?", "<", "=", "+", "on", "off", "yes", "no", "null", "true",
    ];

    /// A string of up to eight random pieces of [`ALPHABET`].
    pub fn random_string(rng: &mut XorShift) -> String {
        let len = rng.below(9);
        (0..len)
            .filter_map(|_| ALPHABET.get(rng.below(ALPHABET.len())).copied())
            .collect()
    }

    /// [`TRICKY`], two keys too long to be implicit, then random strings: `count` strings in all
    /// (at least the fixed ones).
    pub fn strings(count: usize, seed: u64) -> Vec<String> {
        let mut rng = XorShift::new(seed);
        let mut out: Vec<String> = TRICKY.iter().map(|s| (*s).to_owned()).collect();
        out.push("k".repeat(1100));
        out.push("é ".repeat(600));
        while out.len() < count {
            out.push(random_string(&mut rng));
        }
        out
    }

    /// A random JSON number: integers across the whole range and finite floats, large and small.
    pub fn random_number(rng: &mut XorShift) -> Value {
        let bits = rng.next_u64();
        let number = match rng.below(5) {
            0 => Some(Number::from(bits)),
            1 => Some(Number::from(bits as i64)),
            2 => Number::from_f64(f64::from_bits(bits)),
            3 => Number::from_f64((rng.below(2001) as f64 - 1000.0) / 8.0),
            _ => Number::from_f64(10f64.powi(rng.below(40) as i32 - 20)),
        };
        number.map_or(Value::Null, Value::Number)
    }

    /// A small configuration-like object holding `s` as values and as keys.
    pub fn config(s: &str, rng: &mut XorShift) -> Value {
        let obj = |pairs: Vec<(&str, Value)>| {
            Value::Object(
                pairs
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>(),
            )
        };
        let text = || Value::String(s.to_owned());
        obj(vec![
            ("highAvailabilityMode", text()),
            (
                "servers",
                obj(vec![(
                    "businessDataTunnel",
                    obj(vec![("externalHost", text()), ("externalPort", 443.into())]),
                )]),
            ),
            (
                "list",
                Value::Array(vec![
                    text(),
                    obj(vec![(s, text()), ("n", random_number(rng))]),
                    Value::Array(vec![text(), Value::Array(vec![])]),
                    obj(vec![]),
                ]),
            ),
            (s, obj(vec![(s, Value::Array(vec![text()]))])),
            (
                "flags",
                obj(vec![
                    ("enabled", true.into()),
                    ("ratio", random_number(rng)),
                    ("none", Value::Null),
                ]),
            ),
        ])
    }

    /// One [`config`] per string of [`strings`].
    pub fn cases(count: usize, seed: u64) -> Vec<Value> {
        let mut rng = XorShift::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        strings(count, seed)
            .iter()
            .map(|s| config(s, &mut rng))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{render, testgen, to_string};
    use crate::yaml11_types::resolve_plain as resolve_plain_yaml11;
    use serde_json::{Value, json};

    /// A conservative check that `s` is a single plain scalar in block and flow context, as a key
    /// and as a value.
    fn is_valid_plain(s: &str) -> bool {
        let Some(first) = s.chars().next() else {
            return false;
        };
        !"-?:,[]{}#&*!|>'\"%@`".contains(first)
            && !s.contains(": ")
            && !s.contains(" #")
            && !s.ends_with(':')
            && !s.contains([',', '[', ']', '{', '}'])
            && s.trim() == s
            && s.chars().all(|c| c.is_ascii_graphic() || c == ' ')
    }

    fn plains(value: &Value) -> Vec<String> {
        let mut out = Vec::new();
        render(value, &mut |s| out.push(s.to_owned()));
        out
    }

    #[test]
    fn oracle_knows_yaml11_types() {
        for s in ["y", "Yes", "on", "ON", "true"] {
            assert_eq!(resolve_plain_yaml11(s), Value::Bool(true), "{s}");
        }
        for s in ["n", "NO", "off", "Off", "false"] {
            assert_eq!(resolve_plain_yaml11(s), Value::Bool(false), "{s}");
        }
        for s in ["~", "null", "NULL", ""] {
            assert_eq!(resolve_plain_yaml11(s), Value::Null, "{s}");
        }
        for (s, tag) in [
            ("0x1F", "int"),
            ("017", "int"),
            ("0b101", "int"),
            ("1_000", "int"),
            ("-0", "int"),
            ("1:20", "int"),
            ("190:20:30", "int"),
            ("1.5", "float"),
            ("1.0e+5", "float"),
            (".5", "float"),
            ("190:20:30.15", "float"),
            (".inf", "float"),
            ("-.inf", "float"),
            (".NaN", "float"),
            (".nan", "float"),
            ("2001-12-14", "timestamp"),
            ("2001-12-14t21:59:43.10-05:00", "timestamp"),
            ("2001-12-14 21:59:43.10 -5", "timestamp"),
            ("2001-12-14T21:59:43Z", "timestamp"),
            ("<<", "merge"),
            ("=", "value"),
        ] {
            assert_eq!(
                resolve_plain_yaml11(s),
                json!({ format!("!!{tag}"): s }),
                "{s}"
            );
        }
        for s in [
            "0o17",
            "1e5",
            "1:60",
            "0x",
            "offf",
            "yess",
            ".Nan",
            "2001-1-14",
            "abc",
        ] {
            assert_eq!(resolve_plain_yaml11(s), Value::String(s.to_owned()), "{s}");
        }
    }

    #[test]
    fn every_plain_scalar_reads_back_as_the_string() {
        let cases = testgen::cases(20_000, 0x5eed_2024);
        let mut plain = 0;
        for case in &cases {
            for p in plains(case) {
                plain += 1;
                assert_eq!(resolve_plain_yaml11(&p), Value::String(p.clone()), "{p:?}");
                assert!(is_valid_plain(&p), "not a plain scalar: {p:?}");
            }
        }
        // The fixed keys are plain; so must be some of the random strings.
        assert!(plain > 10 * cases.len(), "only {plain} plain scalars");
    }

    #[test]
    fn tricky_words_are_quoted() {
        for word in testgen::TRICKY {
            let yaml = to_string(&json!({ "k": word }));
            let written = yaml.strip_prefix("k: ").unwrap_or_default().trim_end();
            if resolve_plain_yaml11(word) != Value::String((*word).to_owned())
                || !is_valid_plain(word)
            {
                assert!(written.starts_with('"'), "{word:?} written as {written}");
            }
        }
    }

    #[test]
    fn proxy_config_renders_as_expected() {
        let config = json!({
            "highAvailabilityMode": "off",
            "servers": {
                "businessDataTunnel": {"externalHost": "cp.example.com", "externalPort": 443}
            },
            "subaccountId": "3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f",
            "tenantMode": "dedicated"
        });
        assert_eq!(
            to_string(&config),
            "highAvailabilityMode: \"off\"\n\
             servers:\n  businessDataTunnel:\n    externalHost: cp.example.com\n    externalPort: 443\n\
             subaccountId: \"3f1c0d6e-8a2b-4c7d-9e10-5b6a7c8d9e0f\"\n\
             tenantMode: dedicated\n"
        );
    }

    #[test]
    fn collections_scalars_and_numbers() {
        let value = json!({
            "a": [{"x": 1, "y": [true, null]}, [], {}, ["p", ["q"]]],
            "e": {},
            "f": [1.0, 1e16, -2.5e-7, 0.1, -0.0, 18446744073709551615u64, -9223372036854775808i64],
            "s": "tab\there \"q\" \\ \u{7f}\u{85}\u{2028}é😀\n",
        });
        assert_eq!(
            to_string(&value),
            "a:\n  - x: 1\n    \"y\":\n      - true\n      - null\n  - []\n  - {}\n  - - p\n    - - q\n\
             e: {}\n\
             f:\n  - 1.0\n  - 1.0e+16\n  - -2.5e-7\n  - 0.1\n  - -0.0\n  - 18446744073709551615\n  - -9223372036854775808\n\
             s: \"tab\\there \\\"q\\\" \\\\ \\u007F\\u0085\\u2028é😀\\n\"\n"
        );
        assert_eq!(to_string(&json!({})), "{}\n");
        assert_eq!(to_string(&json!("on")), "\"on\"\n");
        assert_eq!(to_string(&Value::Null), "null\n");
    }

    #[test]
    fn long_keys_are_explicit() {
        let key = "k".repeat(1100);
        let yaml = to_string(&json!({ key.clone(): {"a": 1} }));
        assert_eq!(yaml, format!("? {key}\n:\n  a: 1\n"));
    }
}
