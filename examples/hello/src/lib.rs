//! `hello`: the smallest factory. One subagent greets the name given in `args`.

use factory_sdk::prelude::*;

#[derive(Deserialize, Default)]
struct Args {
    #[serde(default)]
    name: Option<String>,
}

struct Hello;

impl Factory for Hello {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("hello", "Greets someone through one subagent. args: { name?: string }")
            .phase("Greet")
            .max_total_subagents(2)
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let args: Args = ctx.args()?;
        let name = args.name.unwrap_or_else(|| "world".to_string());
        ctx.phase("Greet");
        let greeting = ctx.agent(format!("Write a one-line greeting for {name}.")).label("greeter").await?;
        ctx.log(format!("greeted {name}"));
        Ok(json!({ "name": name, "greeting": greeting, "runId": ctx.run_id() }))
    }
}

factory_sdk::export!(Hello);
