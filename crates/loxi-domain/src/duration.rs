//! Durations as operators write them in flags, annotations and pool settings.

use std::time::Duration;

/// Parses durations such as `500ms`, `5s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 500ms, 5s, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    // `try_`: a number past what a Duration holds (about 5.8e11 years) is an error, not a
    // panic (annotations and pool settings are read with this).
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is not a valid duration"))
}

/// The delay before the next try after `failures` failures in a row (at least 1): 0.5 s,
/// doubling, at most 5 minutes. How the controller backs off a Service, a Node, and an item
/// loxilb refused.
pub fn retry_delay(failures: u32) -> Duration {
    Duration::from_millis(500)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(10))
        .min(Duration::from_secs(300))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_half_a_second_to_five_minutes() {
        let delays: Vec<u64> = (1..=12)
            .map(|n| retry_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [
                500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000
            ]
        );
        assert_eq!(retry_delay(0), Duration::from_millis(500));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        // Past what a Duration holds: refused, never a panic.
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("99999999999999999999").is_err());
        assert!(parse_duration(&"9".repeat(400)).is_err());
    }
}
