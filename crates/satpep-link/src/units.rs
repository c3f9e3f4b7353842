//! Parsing of the human units used on the command line, in config files and in traces:
//! rates (`50Mbit`), durations (`280ms`), sizes (`33KB`) and queue limits (`100p`, `150%`).
//!
//! Every parser returns an error that quotes the offending text and says what was expected,
//! because these strings come straight from users.

use std::fmt;

/// A parse error for a unit-bearing value; the message names the bad text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitError(pub String);

impl fmt::Display for UnitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for UnitError {}

fn split_number(s: &str) -> Result<(f64, &str), UnitError> {
    let t = s.trim();
    let end = t
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || ((c == 'e' || c == 'E')
                    && t[i + 1..]
                        .starts_with(|d: char| d.is_ascii_digit() || d == '-' || d == '+'))
                || ((c == '-' || c == '+') && (i == 0 || matches!(&t[i - 1..i], "e" | "E"))))
        })
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    if num.is_empty() {
        return Err(UnitError(format!("'{s}' does not start with a number")));
    }
    let v: f64 = num
        .parse()
        .map_err(|_| UnitError(format!("'{s}': '{num}' is not a number")))?;
    if !v.is_finite() {
        return Err(UnitError(format!("'{s}' is not a finite number")));
    }
    Ok((v, unit.trim()))
}

/// Parses a rate in bits per second: `50Mbit`, `1.544Mbit/s`, `500kbps`, `1G`, `8000`.
///
/// Decimal prefixes (k = 1000). Byte rates (`MB/s`) are refused rather than guessed at.
pub fn parse_rate(s: &str) -> Result<f64, UnitError> {
    let (v, unit) = split_number(s)?;
    if unit.contains('B') {
        return Err(UnitError(format!(
            "'{s}': rates are in bits per second (write e.g. 50Mbit), not bytes"
        )));
    }
    let u = unit.to_ascii_lowercase();
    let u = u
        .trim_end_matches("/s")
        .trim_end_matches("ps")
        .trim_end_matches("bit")
        .trim_end_matches('b');
    let mult = match u {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => {
            return Err(UnitError(format!(
                "'{s}': unknown rate unit '{unit}' (use bit, kbit, Mbit or Gbit)"
            )))
        }
    };
    Ok(v * mult)
}

/// Parses a duration and returns nanoseconds: `280ms`, `0.28s`, `250us`, `2min`.
///
/// A bare number is refused: `--delay 280` is too easy to mean milliseconds and get seconds.
pub fn parse_duration_ns(s: &str) -> Result<u64, UnitError> {
    let (v, unit) = split_number(s)?;
    let mult = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        "min" | "m" => 60e9,
        "h" => 3600e9,
        "" => {
            return Err(UnitError(format!(
                "'{s}': a duration needs a unit (write e.g. {s}ms or {s}s)"
            )))
        }
        _ => {
            return Err(UnitError(format!(
                "'{s}': unknown time unit '{unit}' (use ns, us, ms, s, min or h)"
            )))
        }
    };
    if v < 0.0 {
        return Err(UnitError(format!("'{s}': a duration cannot be negative")));
    }
    Ok((v * mult).round() as u64)
}

/// Parses a size in bytes: `33KB` (1000), `64KiB` (1024), `1MB`, `1500`, `1500B`.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (v, unit) = split_number(s)?;
    let mult = match unit {
        "" | "B" | "byte" | "bytes" => 1.0,
        "KB" | "kB" | "k" | "K" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(UnitError(format!(
                "'{s}': unknown size unit '{unit}' (use B, KB, MB, GB, KiB, MiB or GiB)"
            )))
        }
    };
    if v < 0.0 {
        return Err(UnitError(format!("'{s}': a size cannot be negative")));
    }
    Ok((v * mult).round() as u64)
}

/// A bottleneck queue limit as the user wrote it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueueSpec {
    /// At most this many bytes of frames waiting or on the wire.
    Bytes(u64),
    /// At most this many frames waiting or on the wire.
    Packets(u64),
    /// This percentage of the direction's bandwidth-delay product (rate × round-trip delay).
    BdpPercent(f64),
}

/// Parses a queue limit: `33KB`, `100p` (packets), `150%` (of the bandwidth-delay product).
pub fn parse_queue(s: &str) -> Result<QueueSpec, UnitError> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix("%bdp").or_else(|| t.strip_suffix('%')) {
        let (v, rest) = split_number(p)?;
        if !rest.is_empty() || v <= 0.0 {
            return Err(UnitError(format!(
                "'{s}': a BDP share must be a positive percentage like 150%"
            )));
        }
        return Ok(QueueSpec::BdpPercent(v));
    }
    let (v, unit) = split_number(t)?;
    if matches!(unit, "p" | "pkt" | "pkts" | "packets" | "frames") {
        if v < 1.0 || v.fract() != 0.0 {
            return Err(UnitError(format!(
                "'{s}': a packet limit must be a whole number ≥ 1"
            )));
        }
        return Ok(QueueSpec::Packets(v as u64));
    }
    let b = parse_size(t)?;
    if b == 0 {
        return Err(UnitError(format!(
            "'{s}': a queue of 0 bytes drops everything"
        )));
    }
    Ok(QueueSpec::Bytes(b))
}

/// Formats a rate for people: `50 Mbit/s`, `1.544 Mbit/s`, `500 kbit/s`.
pub fn fmt_rate(bps: f64) -> String {
    let (v, u) = if bps >= 1e9 {
        (bps / 1e9, "Gbit/s")
    } else if bps >= 1e6 {
        (bps / 1e6, "Mbit/s")
    } else if bps >= 1e3 {
        (bps / 1e3, "kbit/s")
    } else {
        (bps, "bit/s")
    };
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {u}")
}

/// Formats nanoseconds as milliseconds with up to three decimals.
pub fn fmt_ms(ns: u64) -> String {
    let s = format!("{:.3}", ns as f64 / 1e6);
    format!("{} ms", s.trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50Mbit").unwrap(), 50e6);
        assert_eq!(parse_rate("1.544Mbit/s").unwrap(), 1.544e6);
        assert_eq!(parse_rate("500kbps").unwrap(), 500e3);
        assert_eq!(parse_rate("1G").unwrap(), 1e9);
        assert_eq!(parse_rate("8000").unwrap(), 8000.0);
        assert_eq!(parse_rate("1e6").unwrap(), 1e6);
        assert!(parse_rate("10MB/s").unwrap_err().0.contains("bits"));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10 furlongs")
            .unwrap_err()
            .0
            .contains("furlongs"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("280ms").unwrap(), 280_000_000);
        assert_eq!(parse_duration_ns("0.28s").unwrap(), 280_000_000);
        assert_eq!(parse_duration_ns("250us").unwrap(), 250_000);
        assert_eq!(parse_duration_ns("1min").unwrap(), 60_000_000_000);
        assert!(parse_duration_ns("280")
            .unwrap_err()
            .0
            .contains("needs a unit"));
        assert!(parse_duration_ns("-5ms").is_err());
    }

    #[test]
    fn sizes_and_queues() {
        assert_eq!(parse_size("33KB").unwrap(), 33_000);
        assert_eq!(parse_size("64KiB").unwrap(), 65_536);
        assert_eq!(parse_queue("100p").unwrap(), QueueSpec::Packets(100));
        assert_eq!(parse_queue("150%").unwrap(), QueueSpec::BdpPercent(150.0));
        assert_eq!(parse_queue("85%bdp").unwrap(), QueueSpec::BdpPercent(85.0));
        assert_eq!(parse_queue("33KB").unwrap(), QueueSpec::Bytes(33_000));
        assert!(parse_queue("0").is_err());
        assert!(parse_queue("1.5p").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_rate(1.544e6), "1.544 Mbit/s");
        assert_eq!(fmt_rate(500e3), "500 kbit/s");
        assert_eq!(fmt_ms(280_000_000), "280 ms");
    }
}
