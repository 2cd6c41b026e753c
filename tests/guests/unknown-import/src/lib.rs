//! A real component that imports an interface the host does not provide
//! (`test:unknown/outside`), for the loader's `UnknownImport` refusal test.

wit_bindgen::generate!({ path: "wit", world: "unknown-import" });

struct UnknownImport;

impl Guest for UnknownImport {
    fn hello() -> String {
        test::unknown::outside::phone_home("hello")
    }
}

export!(UnknownImport);
