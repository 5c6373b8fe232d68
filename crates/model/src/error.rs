use std::fmt;

/// Input that the model refuses, naming the field at fault so an API client can point at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// Path of the offending field, e.g. `domains[2]` or `health_check.path`.
    pub field: String,
    /// Human-readable reason, without the field name.
    pub message: String,
}

impl ValidationError {
    /// An error for `field` with a reason.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The same error, reported under a parent field (`backends` + `[1]` → `backends[1]`).
    pub fn under(self, parent: &str) -> Self {
        let field = if self.field.is_empty() {
            parent.to_string()
        } else if self.field.starts_with('[') {
            format!("{parent}{}", self.field)
        } else {
            format!("{parent}.{}", self.field)
        };
        Self { field, ..self }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ValidationError {}
