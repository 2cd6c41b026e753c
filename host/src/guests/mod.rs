//! The guest languages: building a Rust crate into a component ([`rust`]), building a
//! Python factory with componentize-py ([`python`]), both inside a bubblewrap sandbox, and
//! script factories — JavaScript and TypeScript run by the embedded JS runner ([`script`],
//! [`typescript`]).

pub mod modules;
pub mod python;
pub mod rust;
pub mod script;
pub(crate) mod typescript;
