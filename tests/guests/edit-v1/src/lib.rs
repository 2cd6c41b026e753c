//! `edit` v1: two journaled agent calls and a step, then it gives up. Its successor
//! (`edit-v2`, same factory name) repeats them and adds one call, so a resume with the
//! edited component must replay the first two for free.

use factory_sdk::prelude::*;

struct Edit;

impl Factory for Edit {
    type Output = Value;

    fn meta() -> Meta {
        Meta::new("edit", "Resume-after-edit test factory, version 1.")
    }

    async fn run(ctx: Ctx) -> Result<Value, Error> {
        let a = ctx.agent("first question").label("a").await?;
        let b = ctx.agent("second question").label("b").await?;
        let _: String = ctx.step("plan", || async { Ok("plan from v1".to_string()) }).await?;
        ctx.log(format!("v1 got {} and {}", a.is_some(), b.is_some()));
        Err(Error::msg("v1 stops here"))
    }
}

factory_sdk::export!(Edit);
