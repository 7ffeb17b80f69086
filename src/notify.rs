//! The watch: with `fenced_lock.notify = on`, every committed grant, release,
//! force release, takeover after expiry, session end and proclaim sends
//! `NOTIFY fenced_lock` with a JSON payload `{"name", "event", "token", "mode"}`
//! (docs/reference.md, "Watching leases"). PostgreSQL queues notifications
//! with the transaction and delivers them at commit, in commit order; a
//! rolled-back change sends nothing.

use crate::mode::LeaseMode;
use serde::Serialize;
use std::ffi::CString;

pub const CHANNEL: &std::ffi::CStr = c"fenced_lock";

#[derive(Serialize)]
struct Payload<'a> {
    name: &'a str,
    event: &'a str,
    token: i64,
    mode: &'a str,
}

/// The payload of one notification.
fn payload(name: &str, event: &str, token: i64, mode: LeaseMode) -> String {
    serde_json::to_string(&Payload { name, event, token, mode: mode.as_str() })
        .expect("a payload of strings and a number serializes")
}

/// Queue the notification of `event` on lease `token` of `name`, if enabled.
pub fn event(name: &str, event: &str, token: i64, mode: LeaseMode) {
    if !crate::settings::notify() {
        return;
    }
    // A lock name has no NUL byte (text cannot hold one), so this never fails;
    // at most 512 bytes, even fully escaped it fits NOTIFY's 8000-byte limit.
    let Ok(text) = CString::new(payload(name, event, token, mode)) else { return };
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
    use crate::mode::LeaseMode;

    #[test]
    fn payload_is_json_with_name_event_and_token() {
        let p = payload("billing:leader", "grant", 42, LeaseMode::Exclusive);
        assert_eq!(p, r#"{"name":"billing:leader","event":"grant","token":42,"mode":"exclusive"}"#);
        let v: serde_json::Value =
            serde_json::from_str(&payload("a\"b\\c\n\u{1}", "release", 7, LeaseMode::Permit(3))).unwrap();
        assert_eq!(v["mode"], "permit");
        assert_eq!(v["name"], "a\"b\\c\n\u{1}");
    }

    #[test]
    fn the_longest_name_fits_the_notify_limit_even_fully_escaped() {
        assert!(payload(&"\u{1}".repeat(512), "force_release", i64::MAX, LeaseMode::Exclusive).len() < 8000);
    }
}
