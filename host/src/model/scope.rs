//! [`Scope`]: whose runs a caller may see and control. A session is an owner scope: a
//! caller in a session sees only that session's runs; the owner of the state directory
//! (the local user: the CLI, the HTTP API whose token is the user's) sees every session's.
//! Starting a run or authoring a factory always happens in a concrete session; a scope is
//! about reading and controlling runs that exist.

use serde::{Deserialize, Serialize};

/// Whose runs a read or control request is about. On the wire: `{"session": "NAME"}` or
/// `"owner"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    /// One session's runs only (an MCP connection, a pinned `--session`).
    Session(String),
    /// Every session's runs: the state directory's owner.
    Owner,
}

impl Scope {
    /// Whether a caller of this scope sees a run owned by `run_session`.
    pub fn sees(&self, run_session: &str) -> bool {
        match self {
            Scope::Session(session) => session == run_session,
            Scope::Owner => true,
        }
    }

    /// The session, for a session scope (`None`: the owner).
    pub fn session(&self) -> Option<&str> {
        match self {
            Scope::Session(session) => Some(session),
            Scope::Owner => None,
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Session(session) => write!(f, "session `{session}`"),
            Scope::Owner => f.write_str("the owner"),
        }
    }
}

/// A session name is the scope of that session.
impl From<&str> for Scope {
    fn from(session: &str) -> Self {
        Scope::Session(session.to_string())
    }
}

/// A session name is the scope of that session.
impl From<String> for Scope {
    fn from(session: String) -> Self {
        Scope::Session(session)
    }
}

/// A session name is the scope of that session.
impl From<&String> for Scope {
    fn from(session: &String) -> Self {
        Scope::Session(session.clone())
    }
}

impl From<&Scope> for Scope {
    fn from(scope: &Scope) -> Self {
        scope.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_sees_its_own_runs_and_the_owner_every_run() {
        let a = Scope::from("a");
        assert!(a.sees("a"));
        assert!(!a.sees("b"));
        assert!(!a.sees(""));
        assert!(Scope::Owner.sees("a") && Scope::Owner.sees("mcp:x"));
        assert_eq!((a.session(), Scope::Owner.session()), (Some("a"), None));
    }

    #[test]
    fn the_wire_form_is_stable_and_strict() {
        assert_eq!(serde_json::to_string(&Scope::from("a")).unwrap(), r#"{"session":"a"}"#);
        assert_eq!(serde_json::to_string(&Scope::Owner).unwrap(), r#""owner""#);
        assert_eq!(serde_json::from_str::<Scope>(r#"{"session":"a"}"#).unwrap(), Scope::from("a"));
        assert_eq!(serde_json::from_str::<Scope>(r#""owner""#).unwrap(), Scope::Owner);
        for text in [r#""all""#, r#"{"session":"a","owner":true}"#, r#""session""#, r#"{"session":1}"#, "null"] {
            assert!(serde_json::from_str::<Scope>(text).is_err(), "{text} was accepted");
        }
    }
}
