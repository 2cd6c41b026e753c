//! `review-changed`: the spec's first example. One subagent reviews each changed file, all
//! of them at once; the reviews are then journaled as one report, so a resumed run returns
//! the same report without asking anyone again.

use factory_sdk::prelude::*;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Args {
    /// The paths to review.
    #[serde(default = "default_files")]
    files: Vec<String>,
}

/// Used when `files` is absent, so the factory also runs without arguments.
fn default_files() -> Vec<String> {
    ["src/lib.rs", "src/main.rs", "README.md"].map(String::from).to_vec()
}

#[derive(Serialize, Deserialize)]
struct Review {
    file: String,
    /// `None` (JSON `null`) when that file's reviewer failed: kept so every file shows up.
    review: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Report {
    reviews: Vec<Review>,
}

struct ReviewChanged;

impl Factory for ReviewChanged {
    type Output = Report;

    fn meta() -> Meta {
        Meta::new(
            "review-changed",
            "Review changed files and verify the findings. \
             args: { files: string[] } — the paths to review (one subagent each; \
             defaults to src/lib.rs, src/main.rs and README.md).",
        )
        .phase("Review")
        .phase("Verify")
        .max_concurrent_subagents(3)
        // One spawn per file (text calls never retry): up to 10 files, the default 3 fit.
        .max_total_subagents(10)
        .timeout_seconds(90.5)
        .max_ai_credits(5.0)
        .args_schema_for::<Args>()
    }

    async fn run(ctx: Ctx) -> Result<Report, Error> {
        let Args { files } = ctx.args()?;

        ctx.phase("Review");
        // Each file gets its own label, so two reviews never memoize into one subagent.
        let reviews = ctx
            .parallel(files.iter().map(|file| {
                let call = ctx
                    .agent(format!(
                        "Review {file}: point out bugs, risky changes and unclear code, \
                         most important first. Reply with a short list, or \"no findings\"."
                    ))
                    .label(format!("review:{file}"));
                async move { call.await.map_err(Error::from) }
            }))
            .await?;

        ctx.phase("Verify");
        let report = ctx
            .step("report", || async {
                let reviews = files
                    .iter()
                    .zip(reviews)
                    // `None` from `parallel` (the item failed) and from the agent (no reply)
                    // both mean "no review".
                    .map(|(file, review)| Review { file: file.clone(), review: review.flatten() })
                    .collect();
                Ok(Report { reviews })
            })
            .await?;
        ctx.log(format!("Completed factory run {}", ctx.run_id()));
        Ok(report)
    }
}

factory_sdk::export!(ReviewChanged);
