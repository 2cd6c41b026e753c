//! The vocabulary every layer shares: the run [`envelope`], [`progress`] entries, factory
//! [`limits`] and [`meta`], the owner [`scope`] of a request, agent memo keys ([`agent_key`]), the [`schema`] subset, what an author expects of a run ([`expect`]: `factory test`'s test files), and
//! guest JSON kept as text inside host records ([`json`]), what a run records of its
//! backend ([`recorded`]) and of a script factory's code ([`script`]), how a backend's flow stands ([`flow`]), the sandbox's limits ([`sandbox_limits`]), a subagent call's agent, reasoning effort and context tier ([`tuning`]), and where grants appear in a sandbox ([`grant`]). Plain data: nothing here runs
//! a guest, opens a store or calls a backend.

pub mod agent_key;
pub mod envelope;
pub mod expect;
pub mod flow;
pub mod grant;
pub mod json;
pub mod limits;
pub mod meta;
pub mod progress;
pub mod recorded;
pub mod retention;
pub mod sandbox_limits;
pub mod schema;
pub mod scope;
pub mod script;
pub mod tuning;
