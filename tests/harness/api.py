"""The SQL API as a role is granted it: every function an application may
call, by signature (docs/reference.md, "Functions"), so that every suite
grants the same thing."""

# What an application role calls; force release is for operators.
LEASE_FUNCTIONS = [
    "fenced_lock_try_acquire(text, interval, text, boolean, boolean, integer)",
    "fenced_lock_acquire(text, interval, interval, text, boolean, boolean, integer)",
    "fenced_lock_renew(text, bigint, interval)",
    "fenced_lock_release(text, bigint)",
    "fenced_lock_validate(text, bigint)",
    "fenced_lock_assert(text, bigint)",
]
FORCE_RELEASE = "fenced_lock_force_release(text)"
GUARD = "fenced_lock_guard()"
