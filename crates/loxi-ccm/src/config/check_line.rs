//! One line of `loxi-ccm check`'s report: what was checked and how it went. Its own module,
//! as the checks that write lines live in several files (`check`, `queues`).

use std::fmt;

/// One check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    pub ok: bool,
    pub name: String,
    pub detail: String,
}

impl fmt::Display for CheckLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.ok { "OK  " } else { "FAIL" };
        write!(f, "{status} {}: {}", self.name, self.detail)
    }
}
