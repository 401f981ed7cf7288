//! The object rule: an object schema that lists `properties` and says nothing of
//! `additionalProperties` admits no other keys, as llama.cpp's JSON-schema grammars (so
//! Ollama's `format`) and vLLM's xgrammar read it. JSON Schema itself (and llguidance)
//! would admit any further key, and a small model given room invents keys until its
//! token limit. `additionalProperties: true` (or a schema) keeps them allowed.
//!
//! The members of an `allOf`, and the definitions they `$ref`, stay open: each lists only
//! its share of the properties, and closed they would refuse each other's keys.

use serde_json::Value;

/// How deep a schema is walked; deeper subschemas are left as they are (a schema this
/// deep is hostile input, and llguidance's own limits refuse it).
const MAX_DEPTH: usize = 64;

/// Keys whose value is one subschema.
const ONE: &[&str] = &["items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains"];
/// Keys whose value is a list of subschemas.
const LIST: &[&str] = &["anyOf", "oneOf", "prefixItems", "items"];
/// Keys whose value maps names to subschemas.
const MAP: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

/// `schema` with `additionalProperties: false` added to every object schema that has
/// `properties` and no `additionalProperties` of its own (see the module's rule).
pub fn close_objects(mut schema: Value) -> Value {
    let mut open = Vec::new();
    allof_refs(&schema, 0, &mut open);
    close(&mut schema, "#", &open, false, 0);
    schema
}

fn close(schema: &mut Value, pointer: &str, open: &[String], in_allof: bool, depth: usize) {
    let Value::Object(map) = schema else { return };
    if depth > MAX_DEPTH {
        return;
    }
    if !in_allof && !open.iter().any(|p| p == pointer) && map.contains_key("properties") {
        map.entry("additionalProperties").or_insert(Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        let at = |name: &str| format!("{pointer}/{}", escape(key)) + &name_part(name);
        match value {
            Value::Object(sub) if MAP.contains(&key.as_str()) => {
                for (name, v) in sub.iter_mut() {
                    close(v, &at(name), open, false, depth + 1);
                }
            }
            Value::Array(items) if LIST.contains(&key.as_str()) || key == "allOf" => {
                for (i, v) in items.iter_mut().enumerate() {
                    close(v, &at(&i.to_string()), open, key == "allOf", depth + 1);
                }
            }
            v @ Value::Object(_) if ONE.contains(&key.as_str()) => close(v, &at(""), open, false, depth + 1),
            _ => {}
        }
    }
}

/// The `$ref`s that are members of an `allOf` (their targets stay open).
fn allof_refs(schema: &Value, depth: usize, out: &mut Vec<String>) {
    let Value::Object(map) = schema else { return };
    if depth > MAX_DEPTH {
        return;
    }
    if let Some(Value::Array(items)) = map.get("allOf") {
        out.extend(items.iter().filter_map(|v| v.get("$ref")).filter_map(Value::as_str).map(str::to_string));
    }
    for value in map.values() {
        match value {
            Value::Object(_) => allof_refs(value, depth + 1, out),
            Value::Array(items) => items.iter().for_each(|v| allof_refs(v, depth + 1, out)),
            _ => {}
        }
    }
}

/// `/name`, escaped as a JSON pointer segment (empty for no name).
fn name_part(name: &str) -> String {
    match name {
        "" => String::new(),
        n => format!("/{}", escape(n)),
    }
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_with_properties_close_unless_they_say_otherwise() {
        let schema = json!({
            "type": "object",
            "properties": {
                "answer": {"enum": ["yes", "no"]},
                "where": {"type": "object", "properties": {"city": {"type": "string"}}},
                "extra": {"type": "object", "properties": {"a": {}}, "additionalProperties": true},
                "typed": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "number"}},
                "any": {"type": "object"},
                "list": {"type": "array", "items": {"properties": {"x": {}}}},
                "either": {"anyOf": [{"properties": {"y": {}}}, {"type": "null"}]}
            },
            "$defs": {"point": {"properties": {"x": {}, "y": {}}}}
        });
        let got = close_objects(schema);
        assert_eq!(got["additionalProperties"], json!(false));
        let props = &got["properties"];
        assert_eq!(props["where"]["additionalProperties"], json!(false));
        assert_eq!(props["extra"]["additionalProperties"], json!(true));
        assert_eq!(props["typed"]["additionalProperties"], json!({"type": "number"}));
        assert!(props["any"].get("additionalProperties").is_none(), "an object without properties stays open");
        assert_eq!(props["list"]["items"]["additionalProperties"], json!(false));
        assert_eq!(props["either"]["anyOf"][0]["additionalProperties"], json!(false));
        assert_eq!(got["$defs"]["point"]["additionalProperties"], json!(false));
    }

    #[test]
    fn allof_members_and_their_refs_stay_open() {
        let schema = json!({
            "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}],
            "$defs": {"base": {"properties": {"a": {}}}, "other": {"properties": {"c": {}}}}
        });
        let got = close_objects(schema);
        assert!(got["allOf"][1].get("additionalProperties").is_none());
        assert!(got["$defs"]["base"].get("additionalProperties").is_none());
        assert_eq!(got["$defs"]["other"]["additionalProperties"], json!(false));
    }

    #[test]
    fn a_deep_schema_is_walked_to_a_bound_without_failing() {
        let mut schema = json!({"properties": {}});
        for _ in 0..500 {
            schema = json!({"properties": {"a": schema}});
        }
        let got = close_objects(schema);
        assert_eq!(got["additionalProperties"], json!(false));
    }
}
