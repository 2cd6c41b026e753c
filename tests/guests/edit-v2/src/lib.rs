//! `edit` v2: the edited version of `edit-v1` (same name): the same first two calls and
//! step, then a new call, and it completes.

use factory_sdk::prelude::*;

struct Edit;

impl Factory for Edit {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("edit", "Resume-after-edit test factory, version 2.")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let a = ctx.agent("first question").label("a").await?;
        let b = ctx.agent("second question").label("b").await?;
        let plan: String = ctx.step("plan", || async { Ok("plan from v2".to_string()) }).await?;
        let c = ctx.agent("third question").label("c").await?;
        Ok(json!({ "a": a, "b": b, "plan": plan, "c": c }))
    }
}

factory_sdk::export!(Edit);
