//! Conversions of values from a configuration file or a command line into
//! the types of the API, failing with the same invalid-argument error
//! ([`crate::Error::InvalidArgument`], `22023`) as the API's own checks.
//! The API's types cannot hold a negative duration or permit count; these
//! say so by name when a text value does.

use std::time::Duration;

use crate::error::Error;

/// `secs` seconds as a `Duration`; `arg` names the argument in the error
/// (negative, not a number, or infinite). Zero is returned as zero: whether
/// it is allowed is the call's to say (a ttl must be positive, a wait may be
/// zero).
pub fn seconds(arg: &str, secs: f64) -> Result<Duration, Error> {
    if secs.is_nan() || secs.is_infinite() {
        return Err(Error::invalid_argument(
            format!("{arg} must be a finite number of seconds, not {secs}"),
            "Give seconds such as 30 or 0.5.",
        ));
    }
    if secs < 0.0 {
        return Err(Error::invalid_argument(
            format!("{arg} must not be negative, not {secs} s"),
            "Give seconds such as 30 or 0.5.",
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| {
        Error::invalid_argument(format!("{arg} {secs} s is out of range"), "Give seconds such as 30 or 0.5.")
    })
}

/// A permit count: at least 1.
pub fn permits(n: i64) -> Result<u32, Error> {
    if n < 1 {
        return Err(Error::invalid_argument(
            format!("permits must be at least 1, not {n}"),
            "1 is an ordinary exclusive lease; N > 1 is one of N permits.",
        ));
    }
    u32::try_from(n)
        .map_err(|_| Error::invalid_argument(format!("permits {n} is too large"), "Give at most 2^32 - 1."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_or_not_finite_values_are_invalid_arguments_naming_the_argument() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = seconds("wait", bad).unwrap_err();
            assert_eq!(e.sqlstate(), Some("22023"));
            assert!(e.to_string().contains("wait"), "{e}");
        }
        assert_eq!(seconds("ttl", 1.5).unwrap(), Duration::from_millis(1500));
        assert_eq!(seconds("ttl", 0.0).unwrap(), Duration::ZERO);
        assert!(permits(0).is_err() && permits(-3).is_err());
        assert_eq!(permits(3).unwrap(), 3);
    }
}
