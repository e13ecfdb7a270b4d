//! Go-style durations (`30s`, `1h30m`, `"0"`), the spelling the pipeline format uses.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};

/// A duration as written in a pipeline. Negative values decode (so the
/// validator can name them) but are never valid where a limit is meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration {
    nanos: i128,
}

impl Duration {
    pub const ZERO: Duration = Duration { nanos: 0 };

    pub fn from_secs(s: u64) -> Self {
        Duration { nanos: s as i128 * 1_000_000_000 }
    }
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }
    pub fn is_positive(&self) -> bool {
        self.nanos > 0
    }
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }
    pub fn to_std(&self) -> Option<std::time::Duration> {
        u64::try_from(self.nanos).ok().map(std::time::Duration::from_nanos)
    }

    /// Parses `[-+]?(\d+(\.\d*)?(ns|us|µs|ms|s|m|h))+` or a bare `0`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let err = || format!("\"{text}\" is not a duration (write it like 30s, 5m or 1h30m)");
        let (neg, mut rest) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        if rest == "0" {
            return Ok(Duration::ZERO);
        }
        if rest.is_empty() {
            return Err(err());
        }
        let mut total: f64 = 0.0;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(err)?;
            if num_len == 0 {
                return Err(err());
            }
            let n: f64 = rest[..num_len].parse().map_err(|_| err())?;
            rest = &rest[num_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" | "μs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(err()),
            };
            rest = &rest[unit_len..];
            total += n * scale;
        }
        let nanos = total.round() as i128;
        Ok(Duration { nanos: if neg { -nanos } else { nanos } })
    }
}

/// A wait the way messages say it (`1m30s`, `2.5s`), as Go prints a duration.
pub fn show(d: std::time::Duration) -> String {
    Duration { nanos: i128::try_from(d.as_nanos()).unwrap_or(i128::MAX) }.to_string()
}

impl fmt::Display for Duration {
    /// Go's `time.Duration.String` shape: `1h30m0s`, `30m0s`, `1.5s`, `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0s");
        }
        if self.nanos < 0 {
            f.write_str("-")?;
        }
        let n = self.nanos.unsigned_abs();
        if n < 1_000_000_000 {
            return if n < 1_000 {
                write!(f, "{n}ns")
            } else if n < 1_000_000 {
                write!(f, "{}µs", trim(n as f64 / 1e3))
            } else {
                write!(f, "{}ms", trim(n as f64 / 1e6))
            };
        }
        let h = n / 3_600_000_000_000;
        let m = (n / 60_000_000_000) % 60;
        let s = (n % 60_000_000_000) as f64 / 1e9;
        if h > 0 {
            write!(f, "{h}h{m}m{}s", trim(s))
        } else if m > 0 {
            write!(f, "{m}m{}s", trim(s))
        } else {
            write!(f, "{}s", trim(s))
        }
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 30s, 5m or 1h30m")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
                Duration::parse(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Duration, E> {
                Duration::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Duration, E> {
                Duration::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Duration, E> {
                Duration::parse(&v.to_string()).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A Go-style duration: 30s, 5m, 1h30m; \"0\" where a limit may be switched off.",
            "type": ["string", "integer"],
            "pattern": "^[-+]?(0|([0-9]+(\\.[0-9]*)?(ns|us|µs|ms|s|m|h))+)$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(Duration::parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(Duration::parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(Duration::parse("1.5s").unwrap().as_nanos(), 1_500_000_000);
        assert_eq!(Duration::parse("0").unwrap(), Duration::ZERO);
        assert!(Duration::parse("-5s").unwrap().as_nanos() < 0);
        assert!(Duration::parse("5").is_err());
        assert!(Duration::parse("5 minutes").is_err());
        assert!(Duration::parse("").is_err());
    }

    #[test]
    fn prints_like_go() {
        assert_eq!(Duration::from_secs(1800).to_string(), "30m0s");
        assert_eq!(Duration::from_secs(5400).to_string(), "1h30m0s");
        assert_eq!(Duration::parse("1.5s").unwrap().to_string(), "1.5s");
        assert_eq!(Duration::parse("250ms").unwrap().to_string(), "250ms");
        assert_eq!(Duration::ZERO.to_string(), "0s");
    }
}
