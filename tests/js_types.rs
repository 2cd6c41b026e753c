//! The JS runtime's TypeScript declarations (`guest-sdk/js`) are precise, checked with the
//! real TypeScript compiler (npm `typescript`, pinned in `tests/ts/package-lock.json`):
//! every example under `examples/js` (the `.js` ones with `// @ts-check`) type-checks against
//! them, and `tests/ts/types/precise.ts` holds type equalities plus wrong usages, each
//! marked `@ts-expect-error`, so declarations loosened until a wrong usage passes fail too.

use std::path::Path;
use std::process::Command;

#[test]
fn the_examples_and_the_type_level_suite_type_check_with_the_pinned_compiler() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ts");
    let tsc = dir.join("node_modules/typescript/bin/tsc");
    assert!(
        tsc.is_file(),
        "no TypeScript compiler in {}: run ./test (it runs `npm ci` there), or `cd tests/ts && npm ci`",
        dir.display()
    );
    let version = Command::new("node").arg(&tsc).arg("--version").output().unwrap_or_else(|e| {
        panic!("cannot run node ({e}): install Node.js (Debian/Ubuntu: apt-get install -y nodejs npm), or run ./test")
    });
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    assert!(version.contains("7.0.2"), "tests/ts pins typescript 7.0.2, found {version}");
    let out = Command::new("node").arg(&tsc).args(["-p", "."]).current_dir(&dir).output().expect("tsc runs");
    assert!(
        out.status.success(),
        "tsc -p tests/ts failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
