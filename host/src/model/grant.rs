//! Where a granted directory appears: one naming rule shared by the wasm sandbox (a WASI
//! preopen) and the agent-CLI sandbox (a bind mount), so both show a run's grants at the same
//! paths. It depends on nothing, so both may use it.

/// Where the `index`-th granted directory appears inside a sandbox: `/grant/<index>`, in
/// the order the grants were given (`--allow-read A --allow-read B`: `/grant/0`, `/grant/1`).
pub fn mount_point(index: usize) -> String {
    format!("/grant/{index}")
}
