//! `GET /v1/models` bodies.

use serde::Serialize;

use crate::api::error::ServerError;

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Longest context (prompt + completion) in tokens (vLLM's extension).
    pub max_model_len: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// The names the model is served under (`--served-model-name`, several as in vLLM):
/// requests may send any of them, replies and metrics report the first, and
/// `/v1/models` lists them all. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedNames(Vec<String>);

impl ServedNames {
    /// `names`, or `fallback` alone when there are none.
    pub fn new(names: &[String], fallback: String) -> Self {
        let mut list: Vec<String> = Vec::new();
        for name in names.iter().filter(|n| !n.is_empty()) {
            if !list.contains(name) {
                list.push(name.clone());
            }
        }
        if list.is_empty() {
            list.push(fallback);
        }
        ServedNames(list)
    }

    /// The name replies report.
    pub fn primary(&self) -> &str {
        self.0.first().map_or("", String::as_str)
    }

    pub fn all(&self) -> &[String] {
        &self.0
    }

    /// Whether a request may name the model `name`.
    pub fn accepts(&self, name: &str) -> bool {
        self.0.iter().any(|n| n == name)
    }

    /// `Ok` when a request may name the model `name`, else the 404 that lists the
    /// served names.
    pub fn check(&self, name: &str) -> Result<(), ServerError> {
        if self.accepts(name) {
            return Ok(());
        }
        Err(ServerError::ModelNotFound {
            requested: name.to_string(),
            served: self.listing(),
        })
    }

    /// The names as a 404 lists them: `` `a` `` or `` `a` (also `b`, `c`) ``.
    pub fn listing(&self) -> String {
        let mut text = format!("`{}`", self.primary());
        if self.0.len() > 1 {
            let others: Vec<String> = self.0[1..].iter().map(|n| format!("`{n}`")).collect();
            text.push_str(&format!(" (also {})", others.join(", ")));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_name_is_reported_and_every_one_accepted() {
        let names = ServedNames::new(&["a".into(), "b".into(), "a".into()], "stem".into());
        assert_eq!(names.primary(), "a");
        assert!(names.accepts("b") && !names.accepts("stem"));
        assert_eq!(names.listing(), "`a` (also `b`)");
        let names = ServedNames::new(&[], "stem".into());
        assert_eq!(names.all(), ["stem"]);
        assert_eq!(names.listing(), "`stem`");
    }
}
