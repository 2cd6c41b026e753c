//! The schema subset's parse, check and solve, on the cases the contract names.

use super::*;
use serde_json::json;

fn schema(value: Value) -> Schema {
    match Schema::from_value(value.clone()) {
        Ok(schema) => schema,
        Err(e) => panic!("schema {value} rejected: {e}"),
    }
}

/// Each row: a schema, values it must accept, values it must reject.
fn table(rows: Vec<(Value, Vec<Value>, Vec<Value>)>) {
    for (raw, good, bad) in rows {
        let s = schema(raw.clone());
        for value in good {
            if let Err(e) = s.check(&value) {
                panic!("schema {raw} should accept {value}, got: {e}");
            }
        }
        for value in bad {
            assert!(s.check(&value).is_err(), "schema {raw} should reject {value}");
        }
    }
}

fn error_of(raw: Value, value: Value) -> String {
    match schema(raw.clone()).check(&value) {
        Ok(()) => panic!("schema {raw} should reject {value}"),
        Err(e) => e.to_string(),
    }
}

fn all_kinds() -> Vec<Value> {
    vec![
        json!(null),
        json!(true),
        json!(false),
        json!(0),
        json!(-7),
        json!(2.5),
        json!(""),
        json!("text"),
        json!([]),
        json!([1, "a"]),
        json!({}),
        json!({"a": 1}),
    ]
}

fn findings() -> Value {
    json!({
        "type": "object",
        "properties": {
            "findings": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": { "title": { "type": "string" } },
                    "required": ["title"],
                },
            },
        },
        "required": ["findings"],
    })
}

fn verdict() -> Value {
    json!({ "type": "object", "properties": { "isReal": { "type": "boolean" } }, "required": ["isReal"] })
}

fn bugs() -> Value {
    json!({
        "type": "object",
        "properties": {
            "bugs": {
                "type": "array",
                "items": { "type": "object", "properties": { "title": { "type": "string" } }, "required": ["title"] },
            },
        },
        "required": ["bugs"],
    })
}

#[test]
fn type_keyword() {
    table(vec![
        (json!({"type": "object"}), vec![json!({}), json!({"a": [1]})], vec![json!([]), json!(null), json!("{}")]),
        (json!({"type": "array"}), vec![json!([]), json!([{}])], vec![json!({}), json!("[]"), json!(null)]),
        (json!({"type": "string"}), vec![json!(""), json!("3")], vec![json!(3), json!(null), json!(["a"])]),
        (
            json!({"type": "number"}),
            vec![json!(0), json!(3), json!(-3), json!(3.5), json!(u64::MAX), json!(1e300)],
            vec![json!("3"), json!(null), json!(true)],
        ),
        (
            json!({"type": "integer"}),
            vec![json!(0), json!(3), json!(3.0), json!(-3), json!(-4.0), json!(u64::MAX), json!(i64::MIN), json!(1e20)],
            vec![json!(3.5), json!(-0.1), json!("3"), json!(null)],
        ),
        (json!({"type": "boolean"}), vec![json!(true), json!(false)], vec![json!(0), json!("true"), json!(null)]),
        (json!({"type": "null"}), vec![json!(null)], vec![json!(0), json!(""), json!(false), json!({})]),
        (json!({"type": ["string", "null"]}), vec![json!("x"), json!(null)], vec![json!(0), json!({}), json!([])]),
        (
            json!({"type": ["integer", "boolean"]}),
            vec![json!(1), json!(1.0), json!(true)],
            vec![json!(1.5), json!("1")],
        ),
        (json!({"type": ["string", "string"]}), vec![json!("dup ok")], vec![json!(1)]),
    ]);
}

#[test]
fn required_keyword() {
    table(vec![
        (
            json!({"required": ["a", "b"]}),
            // Only objects are constrained; other kinds pass, as in JSON Schema.
            vec![json!({"a": 1, "b": null}), json!({"a": 1, "b": 2, "c": 3}), json!([]), json!("a"), json!(null)],
            vec![json!({}), json!({"a": 1}), json!({"b": 1})],
        ),
        (json!({"type": "object", "required": []}), vec![json!({})], vec![json!([])]),
        (json!({"type": "object", "required": ["x"]}), vec![json!({"x": null})], vec![json!({"y": 1}), json!(null)]),
    ]);
}

#[test]
fn enum_keyword() {
    table(vec![
        (
            json!({"enum": ["a", 1, null, {"x": [1, 2]}, [true]]}),
            vec![json!("a"), json!(1), json!(1.0), json!(null), json!({"x": [1.0, 2]}), json!([true])],
            vec![
                json!("b"),
                json!(2),
                json!(1.5),
                json!(false),
                json!({"x": [2, 1]}),
                json!({"x": [1, 2], "y": 0}),
                json!([]),
            ],
        ),
        (json!({"type": "string", "enum": ["a", 1]}), vec![json!("a")], vec![json!(1), json!("b")]),
    ]);
}

#[test]
fn const_keyword() {
    table(vec![
        (json!({"const": 1}), vec![json!(1), json!(1.0)], vec![json!(1.5), json!("1"), json!(true), json!(null)]),
        (json!({"const": 2.0}), vec![json!(2), json!(2.0)], vec![json!(3)]),
        (json!({"const": null}), vec![json!(null)], vec![json!(0), json!(false)]),
        (json!({"const": "x"}), vec![json!("x")], vec![json!("X"), json!(["x"])]),
        (
            json!({"const": {"a": [1, {"b": 2}]}}),
            vec![json!({"a": [1.0, {"b": 2.0}]})],
            vec![json!({"a": [1, {"b": 3}]}), json!({"a": [1]}), json!({"a": [1, {"b": 2}], "c": 0}), json!({})],
        ),
        (json!({"const": u64::MAX}), vec![json!(u64::MAX)], vec![json!(u64::MAX - 1)]),
        (json!({"const": -1}), vec![json!(-1), json!(-1.0)], vec![json!(1), json!(u64::MAX)]),
    ]);
}

#[test]
fn properties_and_items_recurse() {
    table(vec![
        (
            json!({"properties": {"a": {"type": "string"}, "b": {"properties": {"c": {"type": "integer"}}}}}),
            // Absent properties are fine unless required.
            vec![json!({}), json!({"a": "x"}), json!({"b": {"c": 3}}), json!({"b": 5}), json!({"z": 1}), json!(7)],
            vec![json!({"a": 1}), json!({"b": {"c": "3"}}), json!({"a": "x", "b": {"c": 1.5}})],
        ),
        (
            json!({"items": {"type": "integer"}}),
            vec![json!([]), json!([1, 2, 3.0]), json!({"not": "an array"}), json!("s")],
            vec![json!([1, "2"]), json!([1.5])],
        ),
        (
            json!({"type": "array", "items": {"type": "array", "items": {"enum": [1, 2]}}}),
            vec![json!([]), json!([[], [1, 2, 2]])],
            vec![json!([[1], [3]]), json!([1])],
        ),
        (
            findings(),
            vec![json!({"findings": []}), json!({"findings": [{"title": "t", "extra": 1}]})],
            vec![
                json!({}),
                json!({"findings": {}}),
                json!({"findings": [{"title": "t"}, {}]}),
                json!({"findings": [{"title": null}]}),
            ],
        ),
    ]);
}

#[test]
fn combinators() {
    table(vec![
        (
            json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}),
            vec![json!("a"), json!(3)],
            vec![json!(3.5), json!(null), json!({})],
        ),
        (
            // Both branches match 5: oneOf is anyOf here, so it still passes.
            json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
            vec![json!(5), json!(5.5)],
            vec![json!("5")],
        ),
        (
            json!({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}),
            vec![json!({"a": 1}), json!({"b": 1}), json!({"a": 1, "b": 2})],
            vec![json!({}), json!({"c": 1})],
        ),
        (
            json!({"allOf": [{"type": "object", "required": ["a"]}, {"required": ["b"]}, {"properties": {"a": {"type": "string"}}}]}),
            vec![json!({"a": "x", "b": 0})],
            vec![json!({"a": "x"}), json!({"b": 0}), json!({"a": 1, "b": 0}), json!([])],
        ),
        (
            json!({"type": "object", "anyOf": [{"required": ["a"]}], "oneOf": [{"required": ["b"]}, {"required": ["c"]}]}),
            vec![json!({"a": 1, "b": 1}), json!({"a": 1, "c": 1})],
            vec![json!({"a": 1}), json!({"b": 1}), json!({"b": 1, "c": 1})],
        ),
        (
            json!({"allOf": [{"anyOf": [{"const": 1}, {"const": 2}]}, {"anyOf": [{"const": 2}, {"const": 3}]}]}),
            vec![json!(2)],
            vec![json!(1), json!(3)],
        ),
    ]);
}

#[test]
fn boolean_schemas_accept_anything() {
    for raw in [
        json!(true),
        json!(false),
        json!({"properties": {"a": false}}),
        json!({"items": false}),
        json!({"anyOf": [false, {"type": "string"}]}),
        json!({"allOf": [false, true]}),
        json!({"oneOf": [false]}),
    ] {
        let s = schema(raw.clone());
        for value in all_kinds().into_iter().chain([json!({"a": 1}), json!([1, 2])]) {
            assert!(s.check(&value).is_ok(), "{raw} should accept {value}");
        }
    }
    // A boolean property schema still lets `required` apply.
    table(vec![(json!({"properties": {"a": false}, "required": ["a"]}), vec![json!({"a": 1})], vec![json!({})])]);
}

#[test]
fn ignored_keywords_are_not_enforced() {
    let rows = vec![
        (json!({"type": "object", "additionalProperties": false}), json!({"extra": 1})),
        (json!({"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}), json!({"x": 1})),
        (json!({"type": "string", "pattern": "^a+$"}), json!("bbb")),
        (json!({"type": "string", "minLength": 5}), json!("ab")),
        (json!({"type": "string", "maxLength": 1}), json!("abc")),
        (json!({"type": "number", "minimum": 10}), json!(1)),
        (json!({"type": "number", "maximum": 0}), json!(5)),
        (json!({"type": "number", "exclusiveMinimum": 5, "exclusiveMaximum": 5}), json!(5)),
        (json!({"type": "integer", "multipleOf": 3}), json!(4)),
        (json!({"type": "string", "format": "email"}), json!("not an email")),
        (json!({"type": "array", "minItems": 3}), json!([])),
        (json!({"type": "array", "maxItems": 0, "uniqueItems": true}), json!([1, 1])),
        (json!({"type": "array", "contains": {"const": 9}}), json!([1])),
        (json!({"type": "object", "minProperties": 2}), json!({})),
        (
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "title": "T", "description": "D", "type": "string"}),
            json!("x"),
        ),
        (json!({"$ref": "#/definitions/n", "definitions": {"n": {"type": "number"}}}), json!("not a number")),
        (json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "strng"}}}), json!(1)),
        (json!({"not": {"type": "string"}}), json!("string")),
        (json!({"if": {"type": "string"}, "then": {"const": "a"}}), json!("b")),
        (json!({"patternProperties": {"^x": {"type": "string"}}}), json!({"x1": 1})),
        (json!({"dependentRequired": {"a": ["b"]}, "dependencies": {"a": ["b"]}}), json!({"a": 1})),
        (json!({"propertyNames": {"maxLength": 1}}), json!({"long": 1})),
        (json!({"type": "array", "items": [{"type": "string"}, "garbage"]}), json!([1, 2])),
        (json!({"type": "array", "additionalItems": false, "prefixItems": [{"type": "string"}]}), json!([1])),
        (json!({"type": "string", "nullable": true, "default": 3, "examples": [1]}), json!("x")),
        // Unhonoured keywords with nonsense values are never inspected.
        (json!({"minLength": "five", "additionalProperties": "nope", "format": 12, "pattern": ["x"]}), json!(null)),
    ];
    for (raw, value) in rows {
        let s = schema(raw.clone());
        if let Err(e) = s.check(&value) {
            panic!("{raw} should accept {value} (keyword ignored), got: {e}");
        }
    }
}

#[test]
fn mismatch_messages_name_the_path() {
    let value = json!({"findings": [{"title": "a"}, {"title": "b"}, {"title": 3}]});
    assert_eq!(error_of(findings(), value), "$.findings[2].title: expected string, got number");

    let e = schema(findings()).check(&json!({"findings": [{"title": "a"}, {}]}));
    assert_eq!(
        e,
        Err(Mismatch {
            path: "$.findings[1]".to_owned(),
            expected: "required property \"title\"".to_owned(),
            got: "an object without it".to_owned(),
        })
    );
    assert_eq!(error_of(findings(), json!([])), "$: expected object, got array");
    assert_eq!(error_of(json!({"type": "integer"}), json!(2.5)), "$: expected integer, got number 2.5");
    assert_eq!(
        error_of(json!({"type": ["string", "integer", "null"]}), json!(true)),
        "$: expected string, integer or null, got boolean"
    );
    assert_eq!(error_of(json!({"const": "yes"}), json!("no")), "$: expected \"yes\", got \"no\"");
    assert_eq!(error_of(json!({"enum": [1, "a"]}), json!(2)), "$: expected one of [1,\"a\"], got 2");
    assert_eq!(
        error_of(json!({"properties": {"a b": {"properties": {"c.d": {"type": "null"}}}}}), json!({"a b": {"c.d": 0}})),
        "$[\"a b\"][\"c.d\"]: expected null, got number"
    );
    assert_eq!(
        error_of(json!({"items": {"items": {"type": "string"}}}), json!([[], ["x", 1]])),
        "$[1][1]: expected string, got number"
    );
    assert_eq!(
        error_of(json!({"anyOf": [{"type": "string"}, {"properties": {"a": {"type": "string"}}}]}), json!({"a": 1})),
        "$: expected a value matching at least one anyOf branch, got one matching none \
         (branch 0: $: expected string, got object; branch 1: $.a: expected string, got number)"
    );
    // A single-branch anyOf reports the branch's own mismatch.
    assert_eq!(
        error_of(json!({"properties": {"x": {"oneOf": [{"type": "string"}]}}}), json!({"x": 1})),
        "$.x: expected string, got number"
    );
    assert_eq!(
        error_of(json!({"properties": {"x": {"allOf": [{"type": "number"}, {"type": "integer"}]}}}), json!({"x": 1.5})),
        "$.x: expected integer, got number 1.5"
    );
    // Long values are cut short in messages.
    let long = "x".repeat(500);
    assert!(error_of(json!({"const": 1}), json!(long)).len() < 200);
}

#[test]
fn invalid_schemas_are_rejected_with_a_path() {
    let rows = [
        (
            r#"{"properties": {"findings": {"items": {"type": "strng"}}}}"#,
            r#"properties.findings.items.type: unknown type "strng""#,
        ),
        (r#"{"type": "Object"}"#, r#"type: unknown type "Object""#),
        (r#"{"type": 5}"#, "type: expected a type name or a non-empty array of type names, got number"),
        (r#"{"type": []}"#, "type: expected a type name or a non-empty array of type names, got an empty array"),
        (r#"{"type": ["string", 1]}"#, "type[1]: expected a type name, got number"),
        (r#"{"type": ["string", "float"]}"#, r#"type[1]: unknown type "float""#),
        (r#"{"required": "a"}"#, "required: expected an array of property names, got string"),
        (r#"{"required": ["a", 2]}"#, "required[1]: expected a property name (string), got number"),
        (r#"{"enum": "a"}"#, "enum: expected a non-empty array, got string"),
        (r#"{"enum": []}"#, "enum: expected a non-empty array, got an empty array"),
        (r#"{"properties": []}"#, "properties: expected an object of schemas, got array"),
        (r#"{"properties": {"a": "string"}}"#, "properties.a: expected a schema (object or boolean), got string"),
        (r#"{"properties": {"a.b": {"type": "x"}}}"#, r#"properties["a.b"].type: unknown type "x""#),
        (r#"{"items": "string"}"#, "items: expected a schema (object or boolean), got string"),
        (r#"{"items": {"required": {}}}"#, "items.required: expected an array of property names, got object"),
        (r#"{"anyOf": {"type": "string"}}"#, "anyOf: expected a non-empty array of schemas, got object"),
        (r#"{"anyOf": []}"#, "anyOf: expected a non-empty array of schemas, got an empty array"),
        (r#"{"oneOf": [{"type": "string"}, 3]}"#, "oneOf[1]: expected a schema (object or boolean), got number"),
        (
            r#"{"allOf": [true, {"properties": {"x": {"type": ["nul"]}}}]}"#,
            r#"allOf[1].properties.x.type[0]: unknown type "nul""#,
        ),
        (r#""object""#, "(root): expected a schema (object or boolean), got string"),
        (r#"null"#, "(root): expected a schema (object or boolean), got null"),
        (r#"[{"type": "string"}]"#, "(root): expected a schema (object or boolean), got array"),
    ];
    for (text, message) in rows {
        match Schema::parse(text) {
            Ok(_) => panic!("{text} should be rejected"),
            Err(e) => {
                assert_eq!(e.to_string(), message, "for {text}");
                assert!(e.path().is_some());
            }
        }
    }
    for text in ["", "{", "{\"type\": \"string\",}", "not json"] {
        let e = Schema::parse(text).err();
        assert!(matches!(e, Some(SchemaError::InvalidJson(_))), "{text:?} -> {e:?}");
        assert!(e.is_some_and(|e| e.to_string().starts_with("schema is not valid JSON: ")));
    }
}

#[test]
fn parse_and_from_value_agree() {
    let text = findings().to_string();
    let parsed = Schema::parse(&text).expect("valid");
    assert_eq!(parsed.as_value(), &findings());
    let good = json!({"findings": [{"title": "t"}]});
    assert!(parsed.check(&good).is_ok());
    assert!(schema(findings()).check(&good).is_ok());
}

#[test]
fn replies_tolerate_whitespace_and_one_code_fence() {
    let s = schema(verdict());
    let want = json!({"isReal": true});
    for reply in [
        r#"{"isReal": true}"#,
        "  \n\t{\"isReal\": true}\n\n",
        "```json\n{\"isReal\": true}\n```",
        "```JSON\n{\"isReal\": true}\n```\n",
        "\n```\n{\"isReal\": true}\n```  ",
        "```json\r\n{\"isReal\": true}\r\n```",
        "```json\n{\n  \"isReal\": true\n}",
        "```{\"isReal\": true}```",
        "```json {\"isReal\": true}```",
        "```\n{\"isReal\":\ntrue}\n```",
    ] {
        match s.parse_reply(reply) {
            Ok(value) => assert_eq!(value, want, "for {reply:?}"),
            Err(e) => panic!("{reply:?} should parse: {e}"),
        }
    }
    // Scalars inside a fence, with and without a tag.
    let any = schema(json!({}));
    assert_eq!(any.parse_reply("```\ntrue\n```"), Ok(json!(true)));
    assert_eq!(any.parse_reply("```true```"), Ok(json!(true)));
    assert_eq!(any.parse_reply("```json 12```"), Ok(json!(12)));
    assert_eq!(any.parse_reply("```\n\"a ``` b\"\n```"), Ok(json!("a ``` b")));

    // Not JSON, or text around the fence: a parse failure at `$`.
    for reply in [
        "",
        "sure! {\"isReal\": true}",
        "Here:\n```json\n{\"isReal\": true}\n```",
        "```json\n{\"isReal\": tru}\n```",
        "{\"isReal\": true} {}",
    ] {
        match s.parse_reply(reply) {
            Ok(value) => panic!("{reply:?} should fail, got {value}"),
            Err(e) => {
                assert_eq!(e.path, "$");
                assert_eq!(e.expected, "a JSON value");
                assert!(e.got.starts_with("text that is not JSON ("), "{e}");
            }
        }
    }
    // JSON that does not match.
    assert_eq!(
        s.parse_reply("```json\n{\"isReal\": \"yes\"}\n```").map_err(|e| e.to_string()),
        Err("$.isReal: expected boolean, got string".to_owned())
    );
}

#[test]
fn minimal_instances() {
    let rows = [
        (findings(), json!({"findings": []})),
        (verdict(), json!({"isReal": false})),
        (bugs(), json!({"bugs": []})),
        (
            json!({"type": "object", "properties": {"real": {"type": "boolean"}}, "required": ["real"]}),
            json!({"real": false}),
        ),
        (json!(true), json!(null)),
        (json!(false), json!(null)),
        (json!({}), json!(null)),
        (json!({"type": "string"}), json!("")),
        (json!({"type": "integer"}), json!(0)),
        (json!({"type": "number"}), json!(0)),
        (json!({"type": "boolean"}), json!(false)),
        (json!({"type": "array", "items": {"type": "string"}}), json!([])),
        (json!({"type": ["string", "null"]}), json!("")),
        (json!({"type": ["null", "string"]}), json!(null)),
        (json!({"const": {"k": 1.5}}), json!({"k": 1.5})),
        (json!({"enum": ["b", "a"]}), json!("b")),
        (json!({"type": "integer", "enum": ["a", 2.5, 3]}), json!(3)),
        (
            json!({"type": "object", "required": ["a", "b"], "properties": {"a": {"type": "string"}}}),
            json!({"a": "", "b": null}),
        ),
        (json!({"required": ["a"]}), json!(null)),
        (json!({"anyOf": [{"type": "string"}, {"type": "integer"}]}), json!("")),
        (json!({"type": "integer", "anyOf": [{"type": "string"}, {"type": "integer"}]}), json!(0)),
        (json!({"oneOf": [{"const": "x"}, {"type": "number"}], "type": "number"}), json!(0)),
        (
            json!({"allOf": [{"type": "object", "required": ["a"]}, {"required": ["b"], "properties": {"b": {"type": "array"}}}]}),
            json!({"a": null, "b": []}),
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "allOf": [{"properties": {"a": {"enum": [1, "x"]}}}], "required": ["a"]}),
            json!({"a": "x"}),
        ),
        (
            json!({"type": "object", "required": ["kind"], "anyOf": [
                {"properties": {"kind": {"const": "a"}}, "required": ["x"]},
                {"properties": {"kind": {"const": "b"}}}
            ], "properties": {"kind": {"type": "string"}}}),
            json!({"kind": "a", "x": null}),
        ),
        (
            json!({"type": "object", "required": ["kind"], "anyOf": [
                {"properties": {"kind": {"const": 1}}},
                {"properties": {"kind": {"const": "b"}}}
            ], "properties": {"kind": {"type": "string"}}}),
            json!({"kind": "b"}),
        ),
        (
            json!({"type": "object", "required": ["n"], "properties": {"n": {"allOf": [{"type": ["string", "number"]}, {"type": "integer"}]}}}),
            json!({"n": 0}),
        ),
        (
            json!({"type": "object", "required": ["deep"], "properties": {"deep": {"type": "object", "required": ["deeper"],
                "properties": {"deeper": {"type": ["array", "null"], "items": {"type": "string"}}}}}}),
            json!({"deep": {"deeper": []}}),
        ),
        (json!({"type": "string", "minLength": 3, "pattern": "^a"}), json!("")),
        (json!({"$ref": "#/definitions/x", "definitions": {"x": {"type": "string"}}}), json!(null)),
    ];
    for (raw, want) in rows {
        let s = schema(raw.clone());
        let got = s.minimal_instance();
        assert_eq!(got, want, "minimal instance of {raw}");
        if let Err(e) = s.check(&got) {
            panic!("minimal instance {got} of {raw} fails its own schema: {e}");
        }
    }
}

#[test]
fn minimal_instance_of_unsatisfiable_schema_is_null() {
    for raw in [
        json!({"type": "string", "const": 1}),
        json!({"allOf": [{"type": "string"}, {"type": "number"}]}),
        json!({"enum": [1, 2], "const": 3}),
        json!({"type": "object", "required": ["a"], "properties": {"a": {"allOf": [{"const": 1}, {"const": 2}]}}}),
    ] {
        let s = schema(raw.clone());
        assert_eq!(s.minimal_instance(), json!(null), "{raw}");
        assert!(s.check(&json!(null)).is_err());
    }
}

#[test]
fn minimal_instance_search_is_bounded() {
    // 2^30 branch combinations in front of a contradiction: the budget stops the search.
    let choice = json!({"anyOf": [{"title": "a"}, {"title": "b"}]});
    let mut parts = vec![json!({"type": "string"}), json!({"type": "number"})];
    parts.extend(std::iter::repeat_n(choice, 30));
    let s = schema(json!({"allOf": parts}));
    let started = std::time::Instant::now();
    assert_eq!(s.minimal_instance(), json!(null));
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn the_exhaustive_search_is_a_typed_error() {
    let choice = json!({"anyOf": [{"title": "a"}, {"title": "b"}]});
    let mut parts = vec![json!({"type": "string"}), json!({"type": "number"})];
    parts.extend(std::iter::repeat_n(choice, 30));
    let s = schema(json!({"allOf": parts}));
    assert_eq!(s.solve(), Err(SolveExhausted { limit: SOLVE_BUDGET }));
    // An unsatisfiable schema the search exhausts within budget is null, not an error.
    assert_eq!(schema(json!({"type": "string", "const": 1})).solve(), Ok(json!(null)));
}

/// A full binary tree of `anyOf` nodes `depth` levels deep with `leaf` at the bottom, as text.
fn any_of_tree(depth: usize, leaf: &str) -> String {
    let mut text = leaf.to_owned();
    for _ in 0..depth {
        text = format!(r#"{{"anyOf":[{text},{text}]}}"#);
    }
    text
}

#[test]
fn a_schema_with_too_many_sub_schemas_is_refused_at_parse() {
    // 2^21 - 1 nodes, ~30 MB of text, the shape that took 7 GB to check before.
    let text = any_of_tree(20, r#"{"type":"string"}"#);
    assert!(text.len() > 16 << 20);
    match Schema::parse(&text) {
        Err(SchemaError::TooLarge { limit }) => assert_eq!(limit, MAX_NODES),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // One node over: still refused; at the cap: accepted.
    let flat = |n: usize| {
        let props: Vec<String> = (0..n).map(|i| format!(r#""p{i}":{{"type":"string"}}"#)).collect();
        format!(r#"{{"type":"object","properties":{{{}}}}}"#, props.join(","))
    };
    assert!(Schema::parse(&flat(MAX_NODES - 1)).is_ok());
    assert!(matches!(Schema::parse(&flat(MAX_NODES)), Err(SchemaError::TooLarge { .. })));
}

#[test]
fn nested_any_of_mismatches_stay_small() {
    // 8191 nodes, every branch fails: the explanation does not multiply per level.
    let s = Schema::parse(&any_of_tree(12, r#"{"type":"string"}"#)).expect("under the cap");
    let failure = s.check(&json!(1)).expect_err("no branch takes a number");
    let text = failure.to_string();
    assert!(text.len() < 4 << 10, "{} bytes: {}", text.len(), &text[..200]);
    assert!(text.contains("at least one anyOf branch"), "{text}");
}

#[test]
fn a_check_past_its_budget_is_a_mismatch_that_says_so() {
    // 999 failing branches before the one that fits, for each of 2000 elements: ~2M visits.
    let mut branches = vec![json!({"type": "string"}); 999];
    branches.push(json!({"type": "number"}));
    let s = schema(json!({"type": "array", "items": {"anyOf": branches}}));
    assert!(s.check(&json!([1, 2, 3])).is_ok());
    let failure = s.check(&Value::Array(vec![json!(1); 2000])).expect_err("over budget");
    assert!(failure.expected.contains(&format!("checkable within {CHECK_BUDGET}")), "{failure}");
    // A reply check reports it as a mismatch (the caller retries, then answers null).
    let reply = Value::Array(vec![json!(1); 2000]).to_string();
    assert!(s.parse_reply(&reply).is_err());
}

#[test]
fn big_enums_and_consts_are_weighed_and_quoted_briefly() {
    let values: Vec<Value> = (0..5000).map(|i| json!(format!("value-{i}"))).collect();
    let s = schema(json!({"type": "array", "items": {"enum": values}}));
    // 5000 comparisons per element: 300 elements is over the budget.
    let failure = s.check(&Value::Array(vec![json!("value-4999"); 300])).expect_err("over budget");
    assert!(failure.expected.contains("checkable within"), "{failure}");
    let failure = s.check(&json!(["nope"])).expect_err("not in the enum");
    assert!(failure.to_string().len() < 400, "{failure}");
    let huge = Value::Array(vec![json!("x".repeat(1000)); 10_000]);
    let failure = schema(json!({"const": 1})).check(&huge).expect_err("not 1");
    assert!(failure.got.len() < 400, "{}", failure.got.len());
    assert!(failure.got.ends_with('…'));
}

#[test]
fn the_dry_run_solver_is_bounded_on_deep_nests() {
    // A nest of allOf/anyOf under the node cap: the search answers or fails typed.
    let text = any_of_tree(11, r#"{"allOf":[{"type":"string"},{"type":"number"}]}"#);
    let s = Schema::parse(&text).expect("under the cap");
    match s.solve() {
        Ok(value) => assert_eq!(value, json!(null)),
        Err(e) => assert_eq!(e.limit, SOLVE_BUDGET),
    }
}

#[test]
fn json_equality_compares_numbers_by_value() {
    assert!(json_eq(&json!(1), &json!(1.0)));
    assert!(json_eq(&json!(-0.0), &json!(0)));
    assert!(json_eq(&json!([1, {"a": 2}]), &json!([1.0, {"a": 2.0}])));
    assert!(!json_eq(&json!(u64::MAX), &json!(i64::MAX)));
    assert!(!json_eq(&json!({"a": 1}), &json!({"b": 1})));
    assert!(!json_eq(&json!([1]), &json!([1, 1])));
    assert!(!json_eq(&json!("1"), &json!(1)));
}
