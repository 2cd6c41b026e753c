//! Loading factories: a component file or bytes, a script on the built-in JS runner, what the
//! store holds under a hash, and reading each one's checked `meta` in a store of its own.

use super::{Factory, Host};
use crate::capabilities::stop::StopSignal;
use crate::engine::run::{self, AttemptSetup, Capabilities};
use crate::engine::state::{self, LoadedComponent, RunStore};
use crate::error::Error;
use crate::guests::script::{Script, ScriptError, ScriptRef};
use crate::model::envelope::Accounting;
use crate::model::limits::Limits;
use crate::store::journal::Journal;
use futures::FutureExt;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

impl Host {
    /// Load a component file, or a script factory (`.js`, `.mjs`, `.ts`, `.mts`; a file
    /// offering several factories as `file.js#name`), and read its metadata.
    pub async fn load_file(&self, path: &Path) -> Result<Factory, Error> {
        if !path.exists() {
            if let Some(text) = path.to_str() {
                if let (file, Some(entry)) = crate::guests::script::split_entry(text) {
                    let script = Script::read(Path::new(file), Some(entry.to_string()))?;
                    return self.load_script(script).await;
                }
            }
        }
        if crate::guests::script::is_script(path) {
            let script = Script::read(path, None)?;
            return self.load_script(script).await;
        }
        let component = self.loader.load_file(&self.linker, path)?.into();
        let factory = self.with_meta(component).await?;
        self.loaded.keep(&factory.component.hash, factory.clone());
        Ok(factory)
    }

    /// Load a script factory: the built-in JS runner with `script` as its source. Fails
    /// with [`Error::Script`] when the source does not define a runnable factory (a syntax
    /// error names `file:line:col`).
    pub async fn load_script(&self, script: Script) -> Result<Factory, Error> {
        let runner = self.runner()?;
        self.with_meta(runner.with_script(script)).await
    }

    /// The built-in JS runner component (compiled once per host; the compile cache keeps
    /// its artifact across processes).
    pub fn runner(&self) -> Result<LoadedComponent, Error> {
        let mut runner = self.runner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(loaded) = runner.as_ref() {
            return Ok(loaded.clone());
        }
        let loaded: LoadedComponent =
            self.loader.load_bytes_for(&self.script_linker, crate::guests::script::RUNNER, true)?.into();
        *runner = Some(loaded.clone());
        Ok(loaded)
    }

    /// A script factory from a stored runner and a stored source (what a run or a
    /// registration recorded).
    pub async fn load_stored_script(&self, runner_hash: &str, script: &ScriptRef) -> Result<Factory, Error> {
        self.load_recorded_script(runner_hash, script, None).await
    }

    /// [`Host::load_stored_script`] with the modules `run_id` recorded (when given and it
    /// recorded any), else those of `script`'s own record: a recorded module is served as
    /// recorded, whatever its file holds now.
    pub(super) async fn load_recorded_script(
        &self,
        runner_hash: &str,
        script: &ScriptRef,
        run_id: Option<&str>,
    ) -> Result<Factory, Error> {
        let text = self
            .store
            .blob(&script.sha256)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no stored source with sha256 {}", script.sha256)))?;
        crate::sandbox::admission::check_bytes("script source", &script.sha256, &text)?;
        let text = String::from_utf8(text).map_err(|_| ScriptError::NotText(script.file_name.clone()))?;
        let runner = match self.runner() {
            Ok(runner) if runner.hash == runner_hash => runner,
            _ => {
                let bytes = self
                    .store
                    .blob(runner_hash)
                    .await?
                    .ok_or_else(|| Error::NotRegistered(format!("no stored runner with sha256 {runner_hash}")))?;
                crate::sandbox::admission::check_bytes("JS runner", runner_hash, &bytes)?;
                self.loader.load_bytes_for(&self.script_linker, &bytes, true)?.into()
            }
        };
        let mut loaded = Script::from_source(script.file_name.clone(), text, script.entry.clone())?;
        let recorded = match run_id {
            Some(id) => self.store.run_modules(id).await?,
            None => None,
        };
        let manifest = match recorded {
            Some(manifest) => Some(manifest),
            None => match &script.modules {
                Some(hash) => {
                    let bytes =
                        self.store.blob(hash).await?.ok_or_else(|| {
                            Error::NotRegistered(format!("no stored module record with sha256 {hash}"))
                        })?;
                    let manifest = serde_json::from_slice(&bytes)
                        .map_err(|e| crate::guests::modules::ModuleError::Record {
                            name: script.file_name.clone(),
                            problem: crate::guests::modules::RecordProblem::Manifest(Arc::new(e)),
                        })
                        .map_err(ScriptError::Module)?;
                    Some(manifest)
                }
                None => None,
            },
        };
        if let Some(manifest) = manifest {
            // The recorded texts, read first (the set is built synchronously).
            let mut texts = HashMap::new();
            for hash in manifest.modules.values() {
                if !texts.contains_key(hash) {
                    texts.insert(hash.clone(), self.store.blob(hash).await);
                }
            }
            let modules = crate::guests::modules::ModuleSet::recorded(loaded.file_name.clone(), &manifest, |hash| {
                texts.remove(hash).unwrap_or(Ok(None))
            })
            .map_err(ScriptError::Module)?;
            loaded = loaded.with_modules(modules);
        }
        self.with_meta(runner.with_script(loaded)).await
    }

    /// Store what a run or registration of `factory` needs to load it again: the component
    /// bytes and, for a script factory, the source text.
    pub(super) fn put_blobs(&self, factory: &Factory) -> Result<(), Error> {
        self.store.put_blob(&factory.component.hash, &factory.component.bytes)?;
        if let Some(script) = &factory.component.script {
            let text: Arc<[u8]> = Arc::from(script.text.as_bytes());
            self.store.put_blob(&script.hash, &text)?;
            if !script.modules.is_empty() {
                for (_, hash, text) in script.modules.texts() {
                    self.store.put_blob(&hash, &Arc::from(text.as_bytes()))?;
                }
                let manifest = script.modules.manifest();
                let json: Arc<[u8]> = crate::guests::script::manifest_json(&manifest).into();
                self.store.put_blob(&crate::guests::script::manifest_hash(&manifest), &json)?;
            }
        }
        Ok(())
    }

    /// Load a component from bytes and read its metadata.
    pub async fn load_bytes(&self, bytes: &[u8]) -> Result<Factory, Error> {
        let component = self.loader.load_bytes(&self.linker, bytes)?.into();
        let factory = self.with_meta(component).await?;
        self.loaded.keep(&factory.component.hash, factory.clone());
        Ok(factory)
    }

    /// Load a component stored under its sha256: the factory this host loaded from it, if it
    /// keeps one (see [`crate::engine::loaded`]), else read from the store and loaded.
    pub async fn load_stored(&self, hash: &str) -> Result<Factory, Error> {
        if let Some(factory) = self.loaded.get(hash) {
            return Ok(factory);
        }
        let bytes = self
            .store
            .blob(hash)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no stored component with sha256 {hash}")))?;
        // Hashed again before anything of it is compiled or run: the store may have been
        // written by someone else (a shared database).
        crate::sandbox::admission::check_bytes("component", hash, &bytes)?;
        self.load_bytes(&bytes).await
    }

    /// Call the script runner's export `name` (it takes nothing) in a store of its own, within
    /// the sandbox's meta time limit; `what` says what it reads, for the timeout's message.
    pub(super) async fn call_runner<R>(&self, component: &LoadedComponent, name: &str, what: &str) -> Result<R, Error>
    where
        R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift + Send + Sync + 'static,
    {
        let mut store = self.meta_store(component)?;
        let instance = component
            .pre
            .instance_pre()
            .instantiate_async(&mut store)
            .await
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
        let export = instance
            .get_typed_func::<(), R>(&mut store, name)
            .map_err(|e| Error::MetaCall(format!("the JS runner has no `{name}`: {e:#}")))?;
        let limit = Duration::from_millis(self.config.sandbox.meta_timeout_ms);
        tokio::time::timeout(limit, export.call_async(&mut store, ()))
            .await
            .map_err(|_| Error::MetaCall(format!("{what} did not finish within {limit:?}")))?
            .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))
    }

    /// A store to call `meta` (or a script runner's `describe`) in: no run, no journal.
    pub(super) fn meta_store(&self, component: &LoadedComponent) -> Result<RunStore, Error> {
        let setup = AttemptSetup {
            run_id: String::new(),
            limits: Limits::default(),
            sandbox: self.config.sandbox.clone(),
            journal: Arc::new(NoJournal),
            backend: self.config.backend.clone(),
            prior: Accounting::default(),
            next_seq: 0,
            events: None,
            updates: broadcast::channel(1).0,
            record_writes: 0,
            stop: StopSignal::new(),
            host_pending_bytes: self.pending_bytes.clone(),
            span: tracing::Span::none(),
            agent_limits: Default::default(),
            answers: Default::default(),
        };
        let shared = Capabilities::new(setup, Default::default());
        state::new_store(&self.engine, &self.config.sandbox, shared, component, &[])
            .map_err(|e| Error::MetaCall(format!("{e:#}")))
    }

    pub(super) async fn with_meta(&self, component: LoadedComponent) -> Result<Factory, Error> {
        let meta = if component.script.is_some() {
            // A script runner's `describe` is `meta` that can say why the source is no factory.
            let described: (Result<crate::sandbox::contract::agent::factory::types::Meta, String>,) =
                self.call_runner(&component, "describe", "reading the factory's meta").await?;
            // A module the source imports that could not be loaded is said as itself.
            let modules = component.script.as_ref().and_then(|s| s.modules.take_error()).filter(|_| {
                matches!(&described.0, Err(m) if m.contains("Error resolving module") || m.contains("Error loading module"))
            });
            described.0.map_err(|message| modules.map_or(ScriptError::Invalid(message), ScriptError::Module))?
        } else {
            let mut store = self.meta_store(&component)?;
            let instance = component
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?;
            // `meta` must be cheap: a guest that spins in it runs out of time, not forever.
            let limit = Duration::from_millis(self.config.sandbox.meta_timeout_ms);
            tokio::time::timeout(limit, instance.call_meta(&mut store))
                .await
                .map_err(|_| Error::MetaCall(format!("`meta` did not return within {limit:?}")))?
                .map_err(|e| Error::MetaCall(run::classify_trap(&e).message))?
        };
        let meta = crate::sandbox::contract::meta_from_wit(meta)?;
        Ok(Factory { component, meta })
    }

    /// The names of every factory the script `path` offers (each loadable as `path#name`),
    /// read by the JS runner without running any: what `factory add` registers for a file
    /// that offers several.
    pub async fn script_factories(&self, path: &Path) -> Result<Vec<String>, Error> {
        let component = self.runner()?.with_script(Script::read(path, None)?);
        let listed: (Result<Vec<String>, String>,) =
            self.call_runner(&component, "factories", "reading the factories' names").await?;
        Ok(listed.0.map_err(ScriptError::Invalid)?)
    }
}

/// The journal of `meta` calls, which journal nothing.
pub(super) struct NoJournal;

impl Journal for NoJournal {
    fn load<'a>(
        &'a self,
        _: &'a str,
        _: usize,
    ) -> futures::future::BoxFuture<
        'a,
        Result<crate::store::journal::JournalSnapshot, crate::store::journal::JournalError>,
    > {
        futures::future::ready(Ok(Default::default())).boxed()
    }
    fn get_step<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<String>, crate::store::journal::JournalError>> {
        futures::future::ready(Ok(None)).boxed()
    }
    fn get_agent<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<Option<String>>, crate::store::journal::JournalError>> {
        futures::future::ready(Ok(None)).boxed()
    }
    fn put_step(&self, _: &str, _: &str, _: &str, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_agent(&self, _: &str, _: &str, _: Option<&str>, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_progress(&self, _: &str, _: u64, _: Vec<u8>, _: u64) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn put_accounting(&self, _: &str, _: &Accounting) -> Result<(), crate::store::journal::JournalError> {
        Ok(())
    }
    fn flush(&self) -> futures::future::BoxFuture<'_, Result<(), crate::store::journal::JournalError>> {
        Box::pin(async { Ok(()) })
    }
}
