//! What this machine trusts to run without asking: the components this process built
//! ([`target::built_here`]) and those approved in the trust store ([`store`]), kept in the
//! state directory or, for a project-local one, the user's own. The service of every door
//! checks a start against it ([`trust_check`]); the command line's consent questions
//! (`cli::trust`) read and record it.

use crate::doors::args::GlobalArgs;
use crate::doors::cli::target;
use anyhow::Result;
use factory_host::trust::TrustStore;

/// The trust store: in the state directory, or the user-level one when the state directory
/// is project-local (see [`GlobalArgs::trust_dir`]).
pub fn store(g: &GlobalArgs) -> Result<TrustStore> {
    Ok(TrustStore::in_state_dir(&g.trust_dir()?))
}

/// The service's own trust check: a component built by this process or approved in the
/// trust store runs without consent in the request.
pub fn trust_check(g: &GlobalArgs) -> factory_host::service::TrustCheck {
    let store = store(g).ok();
    std::sync::Arc::new(move |hash: &str| {
        target::built_here().iter().any(|(built, _)| built == hash)
            || store.as_ref().is_some_and(|s| s.is_trusted(hash).unwrap_or(false))
    })
}
