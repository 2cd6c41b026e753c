//! A real component of another world, for the host's "wrong world" rejection test.

wit_bindgen::generate!({ path: "wit", world: "other" });

struct Other;

impl Guest for Other {
    fn hello() -> String {
        "not a factory".to_string()
    }
}

export!(Other);
