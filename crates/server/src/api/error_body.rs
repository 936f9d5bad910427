//! The OpenAI error envelope: `{"error": {"message", "type", "param", "code"}}`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The request parameter at fault, when one is.
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ErrorBody {
    pub fn new(
        message: impl Into<String>,
        kind: &str,
        param: Option<String>,
        code: Option<String>,
    ) -> Self {
        ErrorBody {
            error: ErrorDetail {
                message: message.into(),
                kind: kind.to_string(),
                param,
                code,
            },
        }
    }
}
