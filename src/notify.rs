//! The watch: with `fenced_lock.notify = on`, every committed grant, release,
//! force release, takeover after expiry and session end sends
//! `NOTIFY fenced_lock` with a JSON payload `{"name", "event", "token"}`
//! (docs/reference.md, "Watching leases"). PostgreSQL queues notifications
//! with the transaction and delivers them at commit, in commit order; a
//! rolled-back change sends nothing.

use serde::Serialize;
use std::ffi::CString;

pub const CHANNEL: &std::ffi::CStr = c"fenced_lock";

#[derive(Serialize)]
struct Payload<'a> {
    name: &'a str,
    event: &'a str,
    token: i64,
}

/// The payload of one notification.
fn payload(name: &str, event: &str, token: i64) -> String {
    serde_json::to_string(&Payload { name, event, token })
        .expect("a payload of strings and a number serializes")
}

/// Queue the notification of `event` on lease `token` of `name`, if enabled.
pub fn event(name: &str, event: &str, token: i64) {
    if !crate::settings::notify() {
        return;
    }
    // A lock name has no NUL byte (text cannot hold one), so this never fails;
    // at most 512 bytes, even fully escaped it fits NOTIFY's 8000-byte limit.
    let Ok(text) = CString::new(payload(name, event, token)) else { return };
    // SAFETY: Async_Notify copies both strings into transaction memory.
    unsafe { Async_Notify(CHANNEL.as_ptr(), text.as_ptr()) };
}

unsafe extern "C-unwind" {
    // commands/async.h (the same in every supported major); not in pgrx's bindings.
    fn Async_Notify(channel: *const std::ffi::c_char, payload: *const std::ffi::c_char);
}

#[cfg(test)]
mod tests {
    use super::payload;

    #[test]
    fn payload_is_json_with_name_event_and_token() {
        let p = payload("billing:leader", "grant", 42);
        assert_eq!(p, r#"{"name":"billing:leader","event":"grant","token":42}"#);
        let v: serde_json::Value = serde_json::from_str(&payload("a\"b\\c\n\u{1}", "release", 7)).unwrap();
        assert_eq!(v["name"], "a\"b\\c\n\u{1}");
    }

    #[test]
    fn the_longest_name_fits_the_notify_limit_even_fully_escaped() {
        assert!(payload(&"\u{1}".repeat(512), "force_release", i64::MAX).len() < 8000);
    }
}
