//! Registered factories: registering a loaded one (for everyone or in one session's scope),
//! authoring one from its `meta` and `run` body, and loading or listing them by name.

use super::{Factory, Host};
use crate::error::Error;
use crate::store::Registration;

impl Host {
    /// Register a factory given in the authoring form — `meta` as JSON and a `run` body that
    /// is one self-contained async function expression — without running it. The
    /// registration stores the runner and the generated source; `run <name>` runs it.
    pub async fn author(&self, meta: &serde_json::Value, run: &str) -> Result<Registration, Error> {
        let script = crate::guests::script::author(meta, run)?;
        let factory = self.load_script(script).await?;
        self.register(&factory).await
    }

    /// [`Host::author`] in `session`'s own scope: only that session lists and runs it (it
    /// wins over a factory of the same name registered for everyone).
    pub async fn author_in(&self, session: &str, meta: &serde_json::Value, run: &str) -> Result<Registration, Error> {
        let script = crate::guests::script::author(meta, run)?;
        let factory = self.load_script(script).await?;
        self.register_as(&factory, Some(session.to_string())).await
    }

    /// Load a registered factory by name.
    pub async fn load_registered(&self, name: &str) -> Result<Factory, Error> {
        let registration = self
            .store
            .factory(name)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no factory named `{name}`")))?;
        self.load_registration(&registration).await
    }

    /// Load factory `name` as `session` sees it (its own authored one first).
    pub async fn load_registered_for(&self, session: &str, name: &str) -> Result<Factory, Error> {
        let registration = self
            .store
            .factory_in(session, name)
            .await?
            .ok_or_else(|| Error::NotRegistered(format!("no factory named `{name}`")))?;
        self.load_registration(&registration).await
    }

    pub(super) async fn load_registration(&self, registration: &Registration) -> Result<Factory, Error> {
        match &registration.script {
            Some(script) => self.load_stored_script(&registration.hash, script).await,
            None => self.load_stored(&registration.hash).await,
        }
    }

    /// Register a factory under its meta name (replacing an earlier registration).
    pub async fn register(&self, factory: &Factory) -> Result<Registration, Error> {
        self.register_as(factory, None).await
    }

    /// Register a factory under its meta name: for everyone (`None`), or in `session`'s own
    /// scope only (it shadows one of the same name registered for everyone).
    pub async fn register_in(&self, factory: &Factory, session: Option<String>) -> Result<Registration, Error> {
        self.register_as(factory, session).await
    }

    pub(super) async fn register_as(&self, factory: &Factory, session: Option<String>) -> Result<Registration, Error> {
        let registration = Registration {
            session,
            meta: factory.meta.clone(),
            hash: factory.component.hash.clone(),
            script: factory.component.script.as_ref().map(|s| s.reference()),
            added_at: crate::store::records_timestamp(),
        };
        self.put_blobs(factory)?;
        self.store.register(&registration, &factory.component.bytes).await?;
        Ok(registration)
    }

    /// Factories registered for everyone, by name.
    pub async fn registered(&self) -> Result<Vec<Registration>, Error> {
        Ok(self.store.factories().await?.into_iter().filter(|r| r.session.is_none()).collect())
    }

    /// Whether the component or script source `key` (a sha256) is a factory `session`
    /// authored itself: it runs in the sandbox without consent, as the spec's authoring does.
    pub async fn authored_in(&self, session: &str, key: &str) -> Result<bool, Error> {
        Ok(self
            .store
            .factories()
            .await?
            .iter()
            .any(|r| r.session.as_deref() == Some(session) && r.script.as_ref().is_some_and(|s| s.sha256 == key)))
    }

    /// The factories `session` can run: its own authored ones, then those registered for
    /// everyone that it does not shadow.
    pub async fn registered_for(&self, session: &str) -> Result<Vec<Registration>, Error> {
        let all = self.store.factories().await?;
        let own: Vec<Registration> = all.iter().filter(|r| r.session.as_deref() == Some(session)).cloned().collect();
        let shared = all.into_iter().filter(|r| r.session.is_none() && !own.iter().any(|o| o.meta.name == r.meta.name));
        Ok(own.iter().cloned().chain(shared).collect())
    }
}
