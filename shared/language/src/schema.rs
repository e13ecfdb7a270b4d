//! The JSON Schema of the pipeline format, derived from the model types.

use crate::model::Pipeline;

/// The schema as pretty JSON, for editors (`# yaml-language-server: $schema=…`).
pub fn pipeline_schema_json() -> String {
    let schema = schemars::schema_for!(Pipeline);
    serde_json::to_string_pretty(&schema).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}
