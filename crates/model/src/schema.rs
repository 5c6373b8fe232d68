//! The JSON Schema of an app file (`GET /v1/schema/app.json`, `switchyard apps schema`,
//! docs/reference/app.schema.json), for editors to check app files as they are written.
//!
//! Derived (schemars) from the very types serde stores an app as, so a field, its type,
//! its enum values and its description (the field's doc) cannot drift from the code. Made
//! fit for input, which the admin API takes more loosely than it stores: every field may be
//! left out where the API has a default (it names a missing one itself), a backend may be
//! written `"ip:port"` or `"ip:port=WEIGHT"`, and `name` may be left out (the URL's; a
//! file as `apps get --output` writes it has it). Unknown fields are flagged, as the API
//! refuses them.

use serde_json::{json, Value};

use crate::{App, BackendAddress};

/// The schema of an app file. Self-contained (every part inlined, no `$defs`), so it can
/// stand inside another document, as the admin API's OpenAPI one, unchanged.
pub fn app_file_schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<App>()).unwrap_or(Value::Null);
    fit_for_input(&mut schema);
    if let Some(fields) = schema.as_object_mut() {
        fields.insert(
            "title".to_string(),
            json!("A Switchyard app (PUT /v1/apps/{name}, switchyard apps put -f)"),
        );
    }
    if let Some(backends) = schema.pointer_mut("/properties/backends/items") {
        let object = backends.take();
        *backends = json!({"anyOf": [
            object,
            {
                "type": "string",
                "description": "ip:port, host:port or srv:NAME, optionally =WEIGHT",
                "pattern": BackendAddress::PATTERN,
            }
        ]});
    }
    schema
}

/// The schema of `PUT /v1/apps/{name}/backends`' body: an app file's `backends`, alone.
pub fn backends_body_schema() -> Value {
    let backends = app_file_schema()
        .pointer("/properties/backends")
        .cloned()
        .unwrap_or(Value::Null);
    json!({
        "type": "object",
        "description": "The app's new backends, replacing the old; the rest of the app stays",
        "properties": {"backends": backends},
        "required": ["backends"],
        "additionalProperties": false,
    })
}

/// Every object schema: no field required, no unknown field allowed.
fn fit_for_input(schema: &mut Value) {
    match schema {
        Value::Object(fields) => {
            fields.remove("required");
            if fields.contains_key("properties") && !fields.contains_key("additionalProperties") {
                fields.insert("additionalProperties".to_string(), Value::Bool(false));
            }
            for value in fields.values_mut() {
                fit_for_input(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(fit_for_input),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_names_every_option_and_takes_the_short_forms() {
        let schema = app_file_schema();
        let properties = schema["properties"].as_object().expect("properties");
        for field in [
            "domains", "backends", "limits", "cache", "mirror", "waf", "compress",
        ] {
            assert!(properties.contains_key(field), "{field} missing");
        }
        // Optional, as every field: what `apps get --output` writes back carries it.
        assert!(properties.contains_key("name"));
        assert_eq!(schema["additionalProperties"], false);
        assert!(schema["properties"]["backends"]["items"]["anyOf"].is_array());
        assert!(schema.get("required").is_none());
        assert!(
            schema.get("$defs").is_none(),
            "inlined, to stand in other documents"
        );
        assert_eq!(
            backends_body_schema()["properties"]["backends"],
            schema["properties"]["backends"]
        );
    }
}
