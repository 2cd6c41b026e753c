//! `meta-spin`: a factory whose `meta` never returns (it spins without calling the host),
//! so the loader's bound on `meta` is tested: under a small fuel budget `meta` traps, under
//! a short `meta_timeout_ms` it times out; either way loading fails with a typed error and
//! the host goes on.

use factory_sdk::prelude::*;
use std::hint::black_box;

struct MetaSpin;

impl Factory for MetaSpin {
    type Output = Value;

    fn meta() -> Meta {
        let mut x: u64 = 0;
        loop {
            x = black_box(x.wrapping_add(1));
        }
    }

    async fn run(_ctx: Ctx) -> Result<Value, Error> {
        Ok(json!({ "unreachable": true }))
    }
}

factory_sdk::export!(MetaSpin);
