//! The Rust guest SDK for `factory` agent factories.
//!
//! A factory is a type implementing [`Factory`], exported with [`export!`], built for
//! `wasm32-unknown-unknown` and componentized (`factory build <crate-dir>` does both).
//!
//! ```ignore
//! use factory_sdk::prelude::*;
//!
//! struct Hello;
//!
//! impl Factory for Hello {
//!     type Output = serde_json::Value;
//!     fn meta() -> Meta {
//!         Meta::new("hello", "Greets someone. args: { name?: string }").phase("Greet")
//!     }
//!     async fn run(ctx: Ctx) -> Result<Self::Output, Error> {
//!         ctx.phase("Greet");
//!         let reply = ctx.agent("Say hello").label("greeter").await?;
//!         Ok(serde_json::json!({ "reply": reply }))
//!     }
//! }
//!
//! factory_sdk::export!(Hello);
//! ```
//!
//! To derive schemas with `#[derive(JsonSchema)]`, either depend on `schemars = "1"` yourself
//! or add `#[schemars(crate = "factory_sdk::schemars")]` to the type (the derive macro
//! refers to the `schemars` crate by name).
//!
//! Everything the guest can do goes through [`Ctx`]: subagents ([`Ctx::agent`]), the journal
//! ([`Ctx::step`]), progress ([`Ctx::phase`], [`Ctx::log`]) and the combinators
//! [`Ctx::parallel`] and [`Ctx::pipeline`].

mod agent;
mod combinators;
mod ctx;
mod error;
mod meta;
mod waiting;

pub use agent::{AgentCall, AgentFuture};
pub use combinators::{Pipeline, MAX_ITEMS};
pub use ctx::Ctx;
pub use error::{Abort, Error, LimitKind};
pub use meta::Meta;
/// Re-exported so factories can derive schemas without naming the crate themselves.
pub use schemars::{self, JsonSchema};
pub use serde_json::{self, json, Value};

/// The usual imports for writing a factory.
pub mod prelude {
    pub use crate::{json, Abort, Ctx, Error, Factory, JsonSchema, Meta, Value};
    pub use serde::{Deserialize, Serialize};
}

/// A factory: its metadata and its workflow.
pub trait Factory {
    /// The run's result; serialized to JSON. `()` means "no result"; any other type is the
    /// result even when it serializes to `null` (`Value::Null`, `None`): the run completes
    /// with the JSON value `null`.
    type Output: serde::Serialize + 'static;

    /// Name, description, phases, limits and args schema. Must be cheap and pure.
    fn meta() -> Meta;

    /// The workflow. Propagate [`Abort`]s with `?`; any other error ends the attempt with
    /// status `error` and the error's message.
    fn run(ctx: Ctx) -> impl core::future::Future<Output = Result<Self::Output, Error>>;
}

#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "factory",
        pub_export_macro: true,
        export_macro_name: "__export_factory_world",
        default_bindings_module: "factory_sdk::__bindings",
        generate_all,
    });
}

#[doc(hidden)]
pub mod __private {
    use crate::__bindings::agent::factory::types as wit;

    pub fn meta<F: crate::Factory>() -> wit::Meta {
        F::meta().into_wit()
    }

    pub async fn run<F: crate::Factory>(args: String) -> Result<Option<String>, String> {
        // A panic traps the guest; its message goes to the run's log first (a wasm32 guest
        // has no stderr), so the trap has a reason to read.
        std::panic::set_hook(Box::new(|info| {
            use crate::__bindings::agent::factory::{ctx as hooks, types::LogLevel};
            hooks::log_at(LogLevel::Error, &format!("the factory panicked: {info}"));
        }));
        let ctx = crate::Ctx::new(args);
        match F::run(ctx).await {
            // `()` is "completed with no result"; a `null` of any other type is a result.
            Ok(_) if core::any::TypeId::of::<F::Output>() == core::any::TypeId::of::<()>() => Ok(None),
            Ok(output) => match serde_json::to_value(&output) {
                Ok(value) => Ok(Some(value.to_string())),
                Err(e) => Err(format!("the factory's result is not JSON: {e}")),
            },
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Export a [`Factory`] implementation as the component's `meta` and `run`.
#[macro_export]
macro_rules! export {
    ($factory:ty) => {
        #[doc(hidden)]
        struct __FactoryExport;

        impl $crate::__bindings::Guest for __FactoryExport {
            fn meta() -> $crate::__bindings::Meta {
                $crate::__private::meta::<$factory>()
            }
            async fn run(args: ::std::string::String) -> ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                ::std::string::String,
            > {
                $crate::__private::run::<$factory>(args).await
            }
        }

        $crate::__bindings::__export_factory_world!(__FactoryExport with_types_in $crate::__bindings);
    };
}
