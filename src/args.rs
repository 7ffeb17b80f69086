//! Argument validation: plain Rust, no PostgreSQL needed.
//!
//! Each check returns the value the caller goes on with, or the error
//! docs/reference.md lists for it (22004, 22023), naming the function and
//! the lock.

use crate::errors::{quote_name, sqlstate, FlError, MAX_HOLDER_BYTES, MAX_NAME_BYTES};

pub const USECS_PER_SEC: i64 = 1_000_000;
const USECS_PER_DAY: i128 = 86_400 * USECS_PER_SEC as i128;
/// PostgreSQL's own convention for intervals in absolute time: a month is 30 days.
const DAYS_PER_MONTH: i128 = 30;

/// The three fields of a PostgreSQL `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalValue {
    pub months: i32,
    pub days: i32,
    pub micros: i64,
}

impl IntervalValue {
    #[cfg(test)]
    pub fn from_micros(micros: i64) -> Self {
        IntervalValue { months: 0, days: 0, micros }
    }

    /// Length in microseconds, without overflow (a month is 30 days, a day 24 hours).
    pub fn total_micros(&self) -> i128 {
        self.months as i128 * DAYS_PER_MONTH * USECS_PER_DAY
            + self.days as i128 * USECS_PER_DAY
            + self.micros as i128
    }
}

/// A lock name: non-empty, at most 512 bytes.
pub fn check_name(function: &str, name: &str) -> Result<(), FlError> {
    if name.is_empty() {
        Err(FlError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("{function}: lock name \"\" is empty"))
            .hint("A lock name is non-empty text of at most 512 bytes."))
    } else if name.len() > MAX_NAME_BYTES {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: lock name {} is {} bytes long, more than {MAX_NAME_BYTES}",
                quote_name(name),
                name.len()
            ),
        )
        .hint("Use a shorter lock name, for example a hash of the long one."))
    } else {
        Ok(())
    }
}

/// A required argument is NULL. `name` is the lock, when it is known.
pub fn null_argument(function: &str, argument: &str, name: Option<&str>) -> FlError {
    let on = name.map(|n| format!(" (lock {})", quote_name(n))).unwrap_or_default();
    FlError::new(
        sqlstate::NULL_VALUE_NOT_ALLOWED,
        format!("{function}: argument \"{argument}\" must not be NULL{on}"),
    )
    .hint(format!("Pass a value for \"{argument}\"."))
}

/// Unwrap a required argument or fail with 22004.
pub fn required<T>(v: Option<T>, function: &str, argument: &str, name: Option<&str>) -> Result<T, FlError> {
    v.ok_or_else(|| null_argument(function, argument, name))
}

/// A holder: NULL or at most 512 bytes.
pub fn check_holder(function: &str, name: &str, holder: Option<&str>) -> Result<(), FlError> {
    match holder {
        Some(h) if h.len() > MAX_HOLDER_BYTES => Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: holder for lock {} is {} bytes long, more than {MAX_HOLDER_BYTES}",
                quote_name(name),
                h.len()
            ),
        )
        .hint("A holder is a short worker id; use at most 512 bytes.")),
        _ => Ok(()),
    }
}

/// A ttl: positive and at most `max_seconds`. Returns it in microseconds.
pub fn check_ttl(
    function: &str,
    name: &str,
    ttl: IntervalValue,
    shown: impl Fn() -> String,
    max_seconds: i64,
) -> Result<i64, FlError> {
    let micros = ttl.total_micros();
    if micros <= 0 {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: ttl {} for lock {} is not positive", shown(), quote_name(name)),
        )
        .hint("Pass a ttl greater than zero, such as '30 seconds'."))
    } else if micros > max_seconds as i128 * USECS_PER_SEC as i128 {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: ttl {} for lock {} exceeds fenced_lock.max_ttl ({max_seconds} s)",
                shown(),
                quote_name(name)
            ),
        )
        .hint("Use a shorter ttl and renew the lease, or ask a superuser to raise fenced_lock.max_ttl."))
    } else {
        Ok(micros as i64)
    }
}

/// A wait: zero or more. Returns it in microseconds, capped at i64::MAX
/// (an interval that long is "forever" for every practical purpose).
pub fn check_wait(
    function: &str,
    name: &str,
    wait: IntervalValue,
    shown: impl Fn() -> String,
) -> Result<i64, FlError> {
    let micros = wait.total_micros();
    if micros < 0 {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: wait {} for lock {} is negative", shown(), quote_name(name)),
        )
        .hint("Pass a wait of zero or more, or NULL to wait until granted."))
    } else {
        Ok(micros.min(i64::MAX as i128) as i64)
    }
}

/// A token: greater than zero.
pub fn check_token(function: &str, name: &str, token: i64) -> Result<(), FlError> {
    if token <= 0 {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: token {token} for lock {} is not positive", quote_name(name)),
        )
        .hint("Fencing tokens are greater than zero; pass the token your acquire returned."))
    } else {
        Ok(())
    }
}

/// The most names one call may take at once.
pub const MAX_NAMES: usize = 1000;
/// The longest value `fenced_lock_proclaim` publishes, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;

/// A `names text[]` argument: a one-dimensional array of 1 to `MAX_NAMES`
/// distinct lock names, none NULL. `dims`: the array's dimensions when it
/// is not one-dimensional.
pub fn check_names(function: &str, names: Result<Vec<Option<String>>, i32>) -> Result<Vec<String>, FlError> {
    let names = names.map_err(|dims| {
        FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: argument \"names\" has {dims} dimensions; it is a list of lock names"),
        )
        .hint("Pass a one-dimensional text array, such as ARRAY['a', 'b'].")
    })?;
    if names.is_empty() {
        return Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: argument \"names\" is an empty array"),
        )
        .hint("Pass at least one lock name."));
    }
    if names.len() > MAX_NAMES {
        return Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: argument \"names\" has {} names, more than {MAX_NAMES}", names.len()),
        )
        .hint("Take the locks in several calls, or guard the rows with fewer lock names."));
    }
    let mut out = Vec::with_capacity(names.len());
    for (i, name) in names.into_iter().enumerate() {
        let name = name.ok_or_else(|| {
            FlError::new(
                sqlstate::NULL_VALUE_NOT_ALLOWED,
                format!("{function}: element {} of argument \"names\" is NULL", i + 1),
            )
            .hint("Every element of \"names\" must be a lock name.")
        })?;
        check_name(function, &name)?;
        out.push(name);
    }
    let mut sorted: Vec<&String> = out.iter().collect();
    sorted.sort();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: lock {} appears more than once in argument \"names\"", quote_name(w[0])),
        )
        .hint("List each lock name once."));
    }
    Ok(out)
}

/// The `tokens bigint[]` of `fenced_lock_release_all`, one per name.
pub fn check_tokens(
    function: &str,
    names: &[String],
    tokens: Result<Vec<Option<i64>>, i32>,
) -> Result<Vec<i64>, FlError> {
    let tokens = tokens.map_err(|dims| {
        FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: argument \"tokens\" has {dims} dimensions; it is a list of tokens"),
        )
        .hint("Pass a one-dimensional bigint array, one token per name.")
    })?;
    if tokens.len() != names.len() {
        return Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{function}: {} names but {} tokens", names.len(), tokens.len()),
        )
        .hint("Pass one token per name, in the same order."));
    }
    tokens
        .into_iter()
        .zip(names)
        .map(|(token, name)| {
            let token = required(token, function, "tokens", Some(name))?;
            check_token(function, name, token)?;
            Ok(token)
        })
        .collect()
}

/// A value to publish: at most `MAX_VALUE_BYTES`.
pub fn check_value(function: &str, name: &str, value: &str) -> Result<(), FlError> {
    if value.len() > MAX_VALUE_BYTES {
        Err(FlError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{function}: value for lock {} is {} bytes long, more than {MAX_VALUE_BYTES}",
                quote_name(name),
                value.len()
            ),
        )
        .hint("Publish something short (an address, a term) and keep the rest elsewhere."))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::sqlstate::*;

    #[test]
    fn null_arguments_name_the_argument_and_the_lock() {
        let e = required::<i64>(None, "fenced_lock_renew", "token", Some("job:1")).unwrap_err();
        assert_eq!(e.sqlstate, NULL_VALUE_NOT_ALLOWED);
        assert!(e.message.contains("\"token\"") && e.message.contains("\"job:1\""), "{}", e.message);
        assert_eq!(required(Some(5), "f", "token", None), Ok(5));
    }

    const DAY: i64 = 86_400;

    fn secs(s: i64) -> IntervalValue {
        IntervalValue::from_micros(s * USECS_PER_SEC)
    }

    #[test]
    fn names_must_be_non_empty_and_at_most_512_bytes() {
        assert_eq!(check_name("f", "").unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        assert!(check_name("f", &"a".repeat(512)).is_ok());
        assert_eq!(check_name("f", &"a".repeat(513)).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        // bytes, not characters: 256 two-byte characters are 512 bytes
        assert!(check_name("f", &"é".repeat(256)).is_ok());
        assert!(check_name("f", &format!("{}a", "é".repeat(256))).is_err());
    }

    #[test]
    fn ttl_must_be_positive_and_within_max_ttl() {
        assert_eq!(
            check_ttl("f", "n", secs(0), || "0".to_string(), DAY).unwrap_err().sqlstate,
            INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            check_ttl("f", "n", secs(-1), || "-1".to_string(), DAY).unwrap_err().sqlstate,
            INVALID_PARAMETER_VALUE
        );
        assert_eq!(check_ttl("f", "n", secs(30), || "30".to_string(), DAY), Ok(30 * USECS_PER_SEC));
        assert_eq!(check_ttl("f", "n", secs(DAY), || "1 day".to_string(), DAY), Ok(DAY * USECS_PER_SEC));
        assert!(check_ttl("f", "n", secs(DAY + 1), || "x".to_string(), DAY).is_err());
        let one_microsecond = IntervalValue::from_micros(1);
        assert_eq!(check_ttl("f", "n", one_microsecond, || "1us".to_string(), DAY), Ok(1));
    }

    #[test]
    fn interval_fields_are_combined_without_overflow() {
        let huge = IntervalValue { months: i32::MAX, days: i32::MAX, micros: i64::MAX };
        assert!(huge.total_micros() > i64::MAX as i128);
        assert!(check_ttl("f", "n", huge, || "huge".to_string(), i32::MAX as i64).is_err());
        let negative_months = IntervalValue { months: -1, days: 31, micros: 0 };
        assert_eq!(negative_months.total_micros(), USECS_PER_DAY);
        assert_eq!(check_wait("f", "n", huge, || "huge".to_string()), Ok(i64::MAX));
    }

    #[test]
    fn wait_may_be_zero_but_not_negative() {
        assert_eq!(check_wait("f", "n", secs(0), || "0".to_string()), Ok(0));
        assert_eq!(
            check_wait("f", "n", secs(-5), || "-5".to_string()).unwrap_err().sqlstate,
            INVALID_PARAMETER_VALUE
        );
    }

    #[test]
    fn tokens_must_be_positive() {
        assert!(check_token("f", "n", 1).is_ok());
        assert!(check_token("f", "n", i64::MAX).is_ok());
        for bad in [0, -1, i64::MIN] {
            assert_eq!(check_token("f", "n", bad).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        }
    }

    #[test]
    fn a_list_of_names_is_one_dimensional_non_empty_distinct_and_has_no_null() {
        let some = |v: &[&str]| Ok(v.iter().map(|s| Some(s.to_string())).collect::<Vec<_>>());
        assert_eq!(check_names("f", some(&["b", "a"])).unwrap(), vec!["b", "a"], "order kept");
        assert_eq!(check_names("f", some(&[])).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        assert_eq!(check_names("f", some(&["a", "b", "a"])).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        assert_eq!(check_names("f", some(&["a", ""])).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        assert_eq!(check_names("f", Err(2)).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
        let with_null = Ok(vec![Some("a".to_string()), None]);
        let e = check_names("f", with_null).unwrap_err();
        assert_eq!(e.sqlstate, NULL_VALUE_NOT_ALLOWED);
        assert!(e.message.contains("element 2"), "{}", e.message);
        let many: Vec<String> = (0..=MAX_NAMES).map(|i| i.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(check_names("f", some(&many)).unwrap_err().sqlstate, INVALID_PARAMETER_VALUE);
    }

    #[test]
    fn tokens_come_one_per_name_positive_and_not_null() {
        let names = vec!["a".to_string(), "b".to_string()];
        assert_eq!(check_tokens("f", &names, Ok(vec![Some(1), Some(2)])), Ok(vec![1, 2]));
        assert_eq!(
            check_tokens("f", &names, Ok(vec![Some(1)])).unwrap_err().sqlstate,
            INVALID_PARAMETER_VALUE
        );
        assert_eq!(
            check_tokens("f", &names, Ok(vec![Some(1), None])).unwrap_err().sqlstate,
            NULL_VALUE_NOT_ALLOWED
        );
        assert_eq!(
            check_tokens("f", &names, Ok(vec![Some(1), Some(0)])).unwrap_err().sqlstate,
            INVALID_PARAMETER_VALUE
        );
    }

    #[test]
    fn holders_are_optional_and_bounded() {
        assert!(check_holder("f", "n", None).is_ok());
        assert!(check_holder("f", "n", Some("")).is_ok());
        assert!(check_holder("f", "n", Some(&"h".repeat(512))).is_ok());
        assert!(check_holder("f", "n", Some(&"h".repeat(513))).is_err());
    }

    mod properties {
        use super::super::*;
        use crate::errors::sqlstate::INVALID_PARAMETER_VALUE;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn a_name_is_accepted_exactly_when_it_has_1_to_512_bytes(name in ".{0,300}") {
                let ok = !name.is_empty() && name.len() <= 512;
                match check_name("f", &name) {
                    Ok(()) => prop_assert!(ok),
                    Err(e) => {
                        prop_assert!(!ok);
                        prop_assert_eq!(e.sqlstate, INVALID_PARAMETER_VALUE);
                        prop_assert!(e.message.len() < 300, "messages quote long names cut short");
                    }
                }
            }

            #[test]
            fn a_ttl_is_accepted_exactly_when_positive_and_within_max(
                months in any::<i32>(), days in any::<i32>(), micros in any::<i64>(), max in 1i64..=i32::MAX as i64
            ) {
                let iv = IntervalValue { months, days, micros };
                let total = iv.total_micros();
                match check_ttl("f", "n", iv, || "x".to_string(), max) {
                    Ok(m) => {
                        prop_assert!(total > 0 && total <= max as i128 * 1_000_000);
                        prop_assert_eq!(m as i128, total);
                    }
                    Err(e) => {
                        prop_assert!(total <= 0 || total > max as i128 * 1_000_000);
                        prop_assert_eq!(e.sqlstate, INVALID_PARAMETER_VALUE);
                    }
                }
            }

            #[test]
            fn a_wait_is_accepted_exactly_when_not_negative(months in any::<i32>(), days in any::<i32>(), micros in any::<i64>()) {
                let iv = IntervalValue { months, days, micros };
                match check_wait("f", "n", iv, || "x".to_string()) {
                    Ok(w) => prop_assert!(iv.total_micros() >= 0 && w >= 0),
                    Err(e) => {
                        prop_assert!(iv.total_micros() < 0);
                        prop_assert_eq!(e.sqlstate, INVALID_PARAMETER_VALUE);
                    }
                }
            }

            #[test]
            fn a_token_is_accepted_exactly_when_positive(token in any::<i64>()) {
                prop_assert_eq!(check_token("f", "n", token).is_ok(), token > 0);
            }

            #[test]
            fn a_holder_is_accepted_exactly_when_at_most_512_bytes(holder in proptest::option::of(".{0,300}")) {
                let ok = holder.as_ref().is_none_or(|h| h.len() <= 512);
                prop_assert_eq!(check_holder("f", "n", holder.as_deref()).is_ok(), ok);
            }
        }
    }
}
