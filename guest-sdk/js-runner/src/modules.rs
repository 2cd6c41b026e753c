//! The runner's module loader: which module a specifier names and what its text is.
//!
//! `"factory"`, the Copilot-SDK specifiers and the Node client's (`"@factory/client"`: an
//! extension module it registers imports it) are the runtime module (the prelude's API);
//! the entry module is the source the host gave (`script.source`); every other import is
//! the host's to answer: `script.resolve` maps (specifier, referrer) to a module name (its
//! path inside the factory's directory) and `script.load` gives that module's text. The
//! host confines both to the factory's directory and records what a run loaded, so this
//! side keeps no state beyond which names are modules (QuickJS loads each name once, which
//! makes import cycles work as ES modules do).

use crate::bindings::agent::factory::script;
use rquickjs::loader::{ImportAttributes, Loader, Resolver};
use rquickjs::module::Declared;
use rquickjs::{Ctx, Error, Module};
use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

/// The module specifiers that resolve to the runtime module.
const RUNTIME_SPECIFIERS: &[&str] =
    &["factory", "@github/copilot-sdk/extension", "@github/copilot-sdk", "@factory/client"];

/// The runtime module's name (no file of the factory's directory can have it: module names
/// the host returns are relative paths with an extension).
const RUNTIME: &str = "factory";

/// The runtime module's text.
const RUNTIME_TEXT: &str = "export const { defineFactory, defineWorkflow, joinSession } = globalThis.__factory_api;";

/// Resolves and loads the modules of one engine (the same value is the runtime's resolver
/// and its loader).
#[derive(Clone)]
pub struct Modules {
    /// The entry module's name and text.
    entry: Rc<(String, String)>,
    /// Names of the modules of the factory (the entry and every name the host resolved):
    /// an import from one of them is the factory's; any other referrer is the prelude's.
    known: Rc<RefCell<HashSet<String>>>,
}

impl Modules {
    /// The loader of a factory whose entry module is `file_name` with `text`.
    pub fn new(file_name: String, text: String) -> Self {
        let known = HashSet::from([file_name.clone()]);
        Modules { entry: Rc::new((file_name, text)), known: Rc::new(RefCell::new(known)) }
    }
}

impl Resolver for Modules {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        if RUNTIME_SPECIFIERS.contains(&name) {
            return Ok(RUNTIME.into());
        }
        let from_factory = self.known.borrow().contains(base);
        if !from_factory {
            // The prelude imports the entry by its name; nothing else.
            return if name == self.entry.0 {
                Ok(name.into())
            } else {
                Err(Error::new_resolving_message(base, name, "not a module of this factory"))
            };
        }
        match script::resolve(name, base) {
            Ok(resolved) => {
                self.known.borrow_mut().insert(resolved.clone());
                Ok(resolved)
            }
            Err(message) => Err(Error::new_resolving_message(base, name, message)),
        }
    }
}

impl Loader for Modules {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js, Declared>> {
        if name == RUNTIME {
            return Module::declare(ctx.clone(), RUNTIME, RUNTIME_TEXT);
        }
        if name == self.entry.0 {
            return Module::declare(ctx.clone(), name, self.entry.1.clone());
        }
        if !self.known.borrow().contains(name) {
            return Err(Error::new_loading_message(name, "not a module of this factory"));
        }
        match script::load(name) {
            Ok(text) => Module::declare(ctx.clone(), name, text),
            Err(message) => Err(Error::new_loading_message(name, message)),
        }
    }
}
