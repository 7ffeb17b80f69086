//! What both conformance examples share: JSON lines on stdout (and only
//! there), the error event, and the command line.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;

/// Exit status: done.
pub const DONE: u8 = 0;
/// Exit status: any other failure (after the error event).
pub const FAILED: u8 = 1;
/// Exit status: bad command line.
pub const USAGE: u8 = 2;
/// Exit status: the lease was lost.
pub const LOST: u8 = 3;

/// A JSON string literal.
pub fn js(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// One JSON object on one line of stdout, flushed at once (the tests read
/// the lines as they come).
pub fn emit(fields: &[(&str, String)]) {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{}:{}", js(k), v)).collect();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{{{}}}", body.join(","));
    let _ = out.flush();
}

/// `{"event":"error","sqlstate":S,"message":M}`.
pub fn emit_error(e: &fenced_lock::Error) {
    let sqlstate = e.sqlstate().map(js).unwrap_or_else(|| "null".into());
    let message = e.sql().map(|s| s.message().to_string()).unwrap_or_else(|| e.to_string());
    emit(&[("event", js("error")), ("sqlstate", sqlstate), ("message", js(&message))]);
    eprintln!("error: {e}");
}

/// `--key value` options and `--flag` switches; `Err` for anything else.
pub struct CommandLine {
    values: HashMap<String, String>,
    switches: Vec<String>,
}

impl CommandLine {
    pub fn parse(valued: &[&str], switches: &[&str]) -> Result<CommandLine, String> {
        let mut cl = CommandLine { values: HashMap::new(), switches: Vec::new() };
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let key = a.strip_prefix("--").ok_or_else(|| format!("unexpected argument {a:?}"))?;
            if valued.contains(&key) {
                let v = args.next().ok_or_else(|| format!("--{key} needs a value"))?;
                if cl.values.insert(key.to_string(), v).is_some() {
                    return Err(format!("--{key} given twice"));
                }
            } else if switches.contains(&key) {
                cl.switches.push(key.to_string());
            } else {
                return Err(format!("unknown option --{key}"));
            }
        }
        Ok(cl)
    }

    pub fn required(&self, key: &str) -> Result<&str, String> {
        self.values.get(key).map(String::as_str).ok_or_else(|| format!("--{key} is required"))
    }

    pub fn optional(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    pub fn switch(&self, key: &str) -> bool {
        self.switches.iter().any(|s| s == key)
    }

    pub fn number<T: std::str::FromStr>(&self, key: &str, v: &str) -> Result<T, String> {
        v.parse().map_err(|_| format!("--{key}: {v:?} is not a number"))
    }
}
