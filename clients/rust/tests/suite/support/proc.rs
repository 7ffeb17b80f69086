//! Child processes (the conformance examples), always killed at the end,
//! and the JSON lines they print.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

pub(super) fn kill_all_children() {
    for pid in CHILDREN.lock().unwrap().drain(..) {
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
    }
}

/// A flat JSON object, as the examples print.
#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Str(String),
    Num(f64),
    Bool(bool),
    Null,
}

impl J {
    pub fn as_i64(&self) -> i64 {
        match self {
            J::Num(n) => *n as i64,
            other => panic!("not a number: {other:?}"),
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            J::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
}

pub type Event = HashMap<String, J>;

/// Parses one line of `{"k":v,...}` with string, number, boolean and null
/// values (all the examples print); `None` if it is not that.
pub fn parse_line(line: &str) -> Option<Event> {
    let mut chars = line.trim().chars().peekable();
    let mut out = HashMap::new();
    fn string(c: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<String> {
        if c.next()? != '"' {
            return None;
        }
        let mut s = String::new();
        loop {
            match c.next()? {
                '"' => return Some(s),
                '\\' => match c.next()? {
                    'n' => s.push('\n'),
                    't' => s.push('\t'),
                    'r' => s.push('\r'),
                    'u' => {
                        let hex: String = (0..4).filter_map(|_| c.next()).collect();
                        s.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                    }
                    other => s.push(other),
                },
                ch => s.push(ch),
            }
        }
    }
    if chars.next()? != '{' {
        return None;
    }
    loop {
        match chars.peek()? {
            '}' => {
                chars.next();
                return if chars.next().is_none() { Some(out) } else { None };
            }
            ',' => {
                chars.next();
            }
            _ => {}
        }
        let key = string(&mut chars)?;
        if chars.next()? != ':' {
            return None;
        }
        let v = match chars.peek()? {
            '"' => J::Str(string(&mut chars)?),
            _ => {
                let mut raw = String::new();
                while let Some(&ch) = chars.peek() {
                    if ch == ',' || ch == '}' {
                        break;
                    }
                    raw.push(ch);
                    chars.next();
                }
                match raw.as_str() {
                    "true" => J::Bool(true),
                    "false" => J::Bool(false),
                    "null" => J::Null,
                    n => J::Num(n.parse().ok()?),
                }
            }
        };
        out.insert(key, v);
    }
}

/// A running example, its stdout read line by line (stamped with when each
/// line arrived), killed with SIGKILL when dropped.
pub struct Proc {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
    pub events: Vec<(Instant, Event)>,
    pub label: String,
}

impl Proc {
    pub fn spawn(program: PathBuf, args: &[&str], label: &str) -> Proc {
        let mut cmd = Command::new(&program);
        // Killed by the kernel if the thread that started it dies: nothing
        // outlives a suite that was itself killed.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
        CHILDREN.lock().unwrap().push(child.id());
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        // Diagnostics go to stderr; keep them, prefixed, for a failing run.
        let stderr = child.stderr.take().unwrap();
        let tag = label.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("  [{tag}] {line}");
            }
        });
        Proc { child, lines: rx, events: Vec::new(), label: label.to_string() }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        let r = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.pid());
    }

    /// The next line, parsed (every line must be a JSON object).
    pub async fn next(&mut self, within: Duration) -> Option<(Instant, Event)> {
        let deadline = Instant::now() + within;
        loop {
            match self.lines.try_recv() {
                Ok((t, line)) => {
                    let ev = parse_line(&line).unwrap_or_else(|| {
                        panic!("{}: stdout line is not a JSON object: {line:?}", self.label)
                    });
                    self.events.push((t, ev.clone()));
                    return Some((t, ev));
                }
                Err(mpsc::TryRecvError::Disconnected) => return None,
                Err(mpsc::TryRecvError::Empty) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }

    /// Reads until an event named `name` (bounded); returns it.
    pub async fn until(&mut self, name: &str, within: Duration) -> (Instant, Event) {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some((t, ev)) if ev.get("event") == Some(&J::Str(name.into())) => return (t, ev),
                Some(_) => continue,
                None => panic!("{}: no {name:?} event within {within:?}; saw {:?}", self.label, self.names()),
            }
        }
    }

    /// Waits (bounded) for the process to exit and for all its lines.
    pub async fn finish(&mut self, within: Duration) -> i32 {
        let deadline = Instant::now() + within;
        let code = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status.code().unwrap_or(-1);
            }
            if Instant::now() >= deadline {
                panic!("{}: still running after {within:?}; saw {:?}", self.label, self.names());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        while self.next(Duration::from_secs(2)).await.is_some() {}
        code
    }

    pub fn names(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|(_, e)| e.get("event").map(|j| format!("{j:?}")).unwrap_or_default())
            .collect()
    }

    pub fn of(&self, name: &str) -> Vec<&Event> {
        self.events.iter().map(|(_, e)| e).filter(|e| e.get("event") == Some(&J::Str(name.into()))).collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        CHILDREN.lock().unwrap().retain(|p| *p != self.child.id());
    }
}
