//! The loxilb token, held so that it can be replaced while the controller runs and can never
//! be printed by accident.

use std::sync::{Arc, RwLock};

/// The token sent verbatim in `Authorization` (loxilb wants no `Bearer ` prefix,
/// docs/loxilb-api.md#authentication). One cell is shared by every client built from one
/// configuration: whoever re-reads the token's source calls [`Token::set`] and the next
/// request of every client carries the new value.
///
/// `Debug` shows only whether a token is set; there is no `Display`.
#[derive(Clone, Default)]
pub struct Token(Arc<RwLock<Option<Arc<str>>>>);

impl Token {
    /// A cell holding `value` (`None` or an empty text: no token).
    pub fn new(value: Option<&str>) -> Token {
        let token = Token::default();
        token.set(value);
        token
    }

    /// Replaces the value; `true` when it changed. Surrounding whitespace is not part of a
    /// token (a file written with `echo` ends in a newline).
    pub fn set(&self, value: Option<&str>) -> bool {
        let value: Option<Arc<str>> = value
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(Arc::from);
        let mut current = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *current == value {
            return false;
        }
        *current = value;
        true
    }

    /// The current value, for the `Authorization` header only.
    pub fn get(&self) -> Option<Arc<str>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn is_set(&self) -> bool {
        self.get().is_some()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() {
            "Token(<redacted>)"
        } else {
            "Token(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value_and_clones_share_it() {
        let token = Token::new(Some(" s3cret\n"));
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
        assert!(!format!("{:?}", Some(token.clone())).contains("s3cret"));
        let clone = token.clone();
        assert!(token.set(Some("n3w")));
        assert!(!token.set(Some("n3w\n")), "same value after trimming");
        assert_eq!(clone.get().as_deref(), Some("n3w"));
        assert!(clone.set(Some("  ")));
        assert!(!token.is_set());
        assert_eq!(format!("{token:?}"), "Token(none)");
    }
}
