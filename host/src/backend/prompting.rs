//! How a schema call is put to a model that is only prompted (plain prompting, agent CLIs,
//! and the system message of every structured-output request): the instruction text.

/// The instruction that asks for a single JSON value matching `schema`.
pub(crate) fn schema_instruction(schema: &serde_json::Value) -> String {
    format!(
        "Reply with a single JSON value that matches the JSON Schema below, and nothing else: \
         no prose, no code fences.\nJSON Schema: {schema}"
    )
}

/// The prompt with the schema instruction appended, for backends that take one text.
pub(crate) fn prompt_with_schema(prompt: &str, schema: Option<&serde_json::Value>) -> String {
    match schema {
        Some(schema) => format!("{prompt}\n\n{}", schema_instruction(schema)),
        None => prompt.to_string(),
    }
}

/// The user prompt of a request: the prompt, plus on a schema retry why the previous reply
/// was rejected.
pub(crate) fn user_prompt(request: &super::AgentRequest) -> String {
    match &request.feedback {
        None => request.prompt.clone(),
        Some(why) => format!(
            "{}\n\nYour previous reply was rejected: {why}. Reply again, following the instructions exactly.",
            request.prompt
        ),
    }
}
