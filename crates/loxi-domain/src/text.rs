//! Text from outside (annotation values, names) as it appears in messages for people, and
//! messages cut to what the Kubernetes API accepts.

/// Values longer than this many bytes are shown cut, with their size.
const SHOWN_MAX_BYTES: usize = 64;

/// `value` quoted once for a message: `"ipv5"`. Quotes, backslashes and control characters
/// are escaped (JSON style), everything else is shown as it is; a long value is cut, with
/// its size: `"aaaa…" (40000 bytes)`.
pub fn shown(value: &str) -> String {
    if value.len() <= SHOWN_MAX_BYTES {
        return quote(value);
    }
    format!(
        "{} ({} bytes)",
        quote(&cut_to_bytes(value, SHOWN_MAX_BYTES)),
        value.len()
    )
}

/// How a message names one entry of a comma-separated list: `it` when the list is that
/// entry alone (the message shows the value already), else the entry itself.
pub fn entry_of(list: &str, entry: &str) -> String {
    if list.trim() == entry {
        "it".to_string()
    } else {
        shown(entry)
    }
}

fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` in at most `max` bytes (`max` of at least 3, the mark's size), cut at a character
/// boundary and ending with `…` when cut.
pub fn cut_to_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_by_bytes_at_a_character_boundary() {
        assert_eq!(cut_to_bytes("short", 10), "short");
        let e = "é".repeat(600); // 1,200 bytes
        let cut = cut_to_bytes(&e, 1024);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
        let emoji = "🙂".repeat(300);
        for max in 1020..1025 {
            let cut = cut_to_bytes(&emoji, max);
            assert!(cut.len() <= max);
        }
    }

    #[test]
    fn values_are_quoted_once_and_long_ones_cut_with_their_size() {
        assert_eq!(shown("ipv5"), "\"ipv5\"");
        assert_eq!(shown("a\"b\n"), "\"a\\\"b\\u000a\"");
        assert_eq!(shown("zero\u{200b}width"), "\"zero\u{200b}width\"");
        let long = "a".repeat(40_000);
        let s = shown(&long);
        assert!(s.ends_with("…\" (40000 bytes)"), "{s}");
        assert!(s.len() < 100, "{s}");
        assert_eq!(entry_of("not-an-ip", "not-an-ip"), "it");
        assert_eq!(entry_of("1.2.3.4, x", "x"), "\"x\"");
    }
}
