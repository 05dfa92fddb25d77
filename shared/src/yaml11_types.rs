//! How a YAML 1.1 reader (the proxy, a Java program; PyYAML) types a plain scalar, after the regexes of
//! <https://yaml.org/type/>: the one implementation of those rules, used by the writer's tests (the
//! oracle that [`crate::yaml11::to_string`] quotes whatever would not read back as a string) and by the
//! stand-in proxy image of the test node.

use serde_json::{Value, json};

/// What a YAML 1.1 reader makes of the plain scalar `s`: booleans and null as such, every other
/// non-string type as a `{"!!tag": s}` marker, and anything else as the string itself.
pub fn resolve_plain(s: &str) -> Value {
    const TRUE: [&str; 11] = [
        "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
    ];
    const FALSE: [&str; 11] = [
        "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
    ];
    let tag = |t: &str| json!({ format!("!!{t}"): s });
    if TRUE.contains(&s) {
        Value::Bool(true)
    } else if FALSE.contains(&s) {
        Value::Bool(false)
    } else if matches!(s, "" | "~" | "null" | "Null" | "NULL") {
        Value::Null
    } else if is_yaml11_int(s) {
        tag("int")
    } else if is_yaml11_float(s) {
        tag("float")
    } else if is_yaml11_timestamp(s) {
        tag("timestamp")
    } else if s == "<<" {
        tag("merge")
    } else if s == "=" {
        tag("value")
    } else if matches!(s, "!" | "&" | "*") {
        tag("yaml")
    } else {
        Value::String(s.to_owned())
    }
}

/// A cursor over a scalar for hand-written versions of YAML 1.1's resolution regexes.
struct Cur {
    chars: Vec<char>,
    at: usize,
}

impl Cur {
    fn new(s: &str) -> Self {
        Self {
            chars: s.chars().collect(),
            at: 0,
        }
    }
    fn eat(&mut self, f: impl Fn(char) -> bool) -> bool {
        match self.chars.get(self.at) {
            Some(&c) if f(c) => {
                self.at += 1;
                true
            }
            _ => false,
        }
    }
    fn ch(&mut self, c: char) -> bool {
        self.eat(|x| x == c)
    }
    fn word(&mut self, w: &str) -> bool {
        let start = self.at;
        if w.chars().all(|c| self.ch(c)) {
            true
        } else {
            self.at = start;
            false
        }
    }
    fn many(&mut self, f: impl Fn(char) -> bool) -> usize {
        let mut n = 0;
        while self.eat(&f) {
            n += 1;
        }
        n
    }
    fn sign(&mut self) {
        self.eat(|c| c == '-' || c == '+');
    }
    fn end(&self) -> bool {
        self.at == self.chars.len()
    }
    /// `(:[0-5]?[0-9])+`
    fn sexagesimal(&mut self) -> bool {
        let mut groups = 0;
        while self.ch(':') {
            let two = matches!(
                (self.chars.get(self.at), self.chars.get(self.at + 1)),
                (Some('0'..='5'), Some('0'..='9'))
            );
            if two {
                self.at += 2;
            } else if !self.eat(digit) {
                return false;
            }
            groups += 1;
        }
        groups > 0
    }
    /// `[0-9][0-9]?`
    fn one_or_two_digits(&mut self) -> bool {
        self.eat(digit) && {
            self.eat(digit);
            true
        }
    }
    fn digits(&mut self, n: usize) -> bool {
        (0..n).all(|_| self.eat(digit))
    }
}

fn digit(c: char) -> bool {
    c.is_ascii_digit()
}

fn matches(s: &str, pattern: impl Fn(&mut Cur) -> bool) -> bool {
    let mut cur = Cur::new(s);
    pattern(&mut cur) && cur.end()
}

/// Whether `s` matches YAML 1.1's int regex (<https://yaml.org/type/int.html>).
pub fn is_yaml11_int(s: &str) -> bool {
    let binary = |c: &mut Cur| {
        c.sign();
        c.word("0b") && c.many(|x| matches!(x, '0' | '1' | '_')) > 0
    };
    let octal = |c: &mut Cur| {
        c.sign();
        c.ch('0') && c.many(|x| matches!(x, '0'..='7' | '_')) > 0
    };
    let decimal = |c: &mut Cur| {
        c.sign();
        c.ch('0')
            || (c.eat(|x| matches!(x, '1'..='9')) && {
                c.many(|x| digit(x) || x == '_');
                true
            })
    };
    let hex = |c: &mut Cur| {
        c.sign();
        c.word("0x") && c.many(|x| x.is_ascii_hexdigit() || x == '_') > 0
    };
    let sexagesimal = |c: &mut Cur| {
        c.sign();
        c.eat(|x| matches!(x, '1'..='9')) && {
            c.many(|x| digit(x) || x == '_');
            c.sexagesimal()
        }
    };
    matches(s, binary)
        || matches(s, octal)
        || matches(s, decimal)
        || matches(s, hex)
        || matches(s, sexagesimal)
}

/// Whether `s` matches YAML 1.1's float regex (<https://yaml.org/type/float.html>).
pub fn is_yaml11_float(s: &str) -> bool {
    let base10 = |c: &mut Cur| {
        c.sign();
        if c.eat(digit) {
            c.many(|x| digit(x) || x == '_');
        }
        c.ch('.') && {
            c.many(|x| digit(x) || x == '.');
            !c.eat(|x| x == 'e' || x == 'E')
                || (c.eat(|x| x == '-' || x == '+') && c.many(digit) > 0)
        }
    };
    let sexagesimal = |c: &mut Cur| {
        c.sign();
        c.eat(digit) && {
            c.many(|x| digit(x) || x == '_');
            c.sexagesimal() && c.ch('.') && {
                c.many(|x| digit(x) || x == '_');
                true
            }
        }
    };
    let inf = |c: &mut Cur| {
        c.sign();
        c.word(".inf") || c.word(".Inf") || c.word(".INF")
    };
    let nan = |c: &mut Cur| c.word(".nan") || c.word(".NaN") || c.word(".NAN");
    matches(s, base10) || matches(s, sexagesimal) || matches(s, inf) || matches(s, nan)
}

/// Whether `s` matches YAML 1.1's timestamp regex (<https://yaml.org/type/timestamp.html>).
pub fn is_yaml11_timestamp(s: &str) -> bool {
    let ymd = |c: &mut Cur| c.digits(4) && c.ch('-') && c.digits(2) && c.ch('-') && c.digits(2);
    let full = |c: &mut Cur| {
        let date =
            c.digits(4) && c.ch('-') && c.one_or_two_digits() && c.ch('-') && c.one_or_two_digits();
        let separator = c.eat(|x| x == 'T' || x == 't') || c.many(|x| x == ' ' || x == '\t') > 0;
        let time = c.one_or_two_digits() && c.ch(':') && c.digits(2) && c.ch(':') && c.digits(2);
        if !(date && separator && time) {
            return false;
        }
        if c.ch('.') {
            c.many(digit);
        }
        // The spec's regex allows blanks only before `Z`, its own example and PyYAML also before
        // an offset: accept both.
        c.many(|x| x == ' ' || x == '\t');
        if c.ch('Z') {
            return true;
        }
        if c.eat(|x| x == '-' || x == '+') {
            return c.one_or_two_digits() && (!c.ch(':') || c.digits(2));
        }
        true
    };
    matches(s, ymd) || matches(s, full)
}
