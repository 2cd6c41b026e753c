//! `multi-stage-review`: the spec's "Multi-stage review" pattern. One reviewer per dimension
//! (bugs, performance, security) lists findings, and an adversarial verifier checks each
//! finding; only confirmed findings are returned. The stages form a pipeline, so each
//! dimension is verified as soon as its own review lands: a slow reviewer never holds up
//! the others.

use factory_sdk::prelude::*;
use std::rc::Rc;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Args {
    /// The diff to review; without it, the repository's uncommitted changes.
    #[serde(default)]
    diff: Option<String>,
}

/// A reviewer's reply (the spec's FINDINGS schema).
#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Findings {
    findings: Vec<Finding>,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Finding {
    /// One line: what is wrong, and where.
    title: String,
}

/// A verifier's reply (the spec's VERDICT schema).
#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
#[serde(rename_all = "camelCase")]
struct Verdict {
    /// True only if the finding survived the attempt to refute it.
    is_real: bool,
}

struct Dimension {
    key: &'static str,
    focus: &'static str,
}

const DIMENSIONS: &[Dimension] = &[
    Dimension { key: "bugs", focus: "correctness bugs" },
    Dimension { key: "perf", focus: "performance issues" },
    Dimension { key: "security", focus: "security vulnerabilities" },
];

/// Findings verified per dimension; the rest are dropped (and logged). Together with the
/// schema retry this bounds the run to 3 + 3 × 8 subagents, twice that with retries.
const MAX_FINDINGS: usize = 8;

#[derive(Serialize)]
struct Confirmed {
    dimension: &'static str,
    title: String,
}

#[derive(Serialize)]
struct Output {
    confirmed: Vec<Confirmed>,
    dimensions: usize,
}

struct MultiStageReview;

impl Factory for MultiStageReview {
    type Output = Output;

    fn meta() -> Meta {
        Meta::new(
            "multi-stage-review",
            "Review a diff along several dimensions (bugs, perf, security) and adversarially \
             verify every finding; returns the confirmed ones. \
             args: { diff?: string } — the diff to review (default: the uncommitted changes).",
        )
        .phase_with_detail("Review", "one reviewer per dimension, each verified as it lands")
        .max_concurrent_subagents(4)
        .max_total_subagents(60)
        .timeout_seconds(900.0)
        .args_schema_for::<Args>()
    }

    async fn run(ctx: Ctx) -> Result<Output, Error> {
        let Args { diff } = ctx.args()?;
        // Shared by every stage closure, which must own what it uses.
        let changes: Rc<str> = match diff {
            Some(diff) => format!("The changes:\n```diff\n{diff}\n```"),
            None => "The changes are the repository's uncommitted ones (`git diff HEAD`).".into(),
        }
        .into();

        ctx.phase("Review"); // Run-global: set it before the fan-out, never inside a stage.
        let per_dimension = ctx
            .pipeline(DIMENSIONS)
            .stage({
                let (ctx, changes) = (ctx.clone(), changes.clone());
                move |d: &'static Dimension, _, _| {
                    let call = ctx
                        .agent(format!(
                            "Review the changes for {}. Report each distinct issue as one \
                             finding whose title says what is wrong and where; return an \
                             empty list when there is none.\n\n{changes}",
                            d.focus
                        ))
                        .label(format!("review:{}", d.key));
                    async move { call.json::<Findings>().await.map_err(Error::from) }
                }
            })
            .stage(move |review, d, _| {
                let (ctx, changes) = (ctx.clone(), changes.clone());
                async move { verify(&ctx, &changes, d, review).await }
            })
            .await?;

        Ok(Output {
            // A dimension whose stage failed is `None`: it confirmed nothing.
            confirmed: per_dimension.into_iter().flatten().flatten().collect(),
            dimensions: DIMENSIONS.len(),
        })
    }
}

/// The second stage: verify each finding of one dimension, keep the confirmed ones.
async fn verify(
    ctx: &Ctx,
    changes: &str,
    d: &'static Dimension,
    review: Option<Findings>,
) -> Result<Vec<Confirmed>, Error> {
    let Some(Findings { mut findings }) = review else {
        ctx.log(format!("review:{} produced nothing", d.key));
        return Ok(Vec::new());
    };
    if findings.is_empty() {
        ctx.log(format!("review:{} found no {}", d.key, d.focus));
        return Ok(Vec::new());
    }
    if findings.len() > MAX_FINDINGS {
        // No silent caps: say what goes unverified.
        let dropped: Vec<_> = findings.drain(MAX_FINDINGS..).map(|f| f.title).collect();
        ctx.log(format!(
            "review:{}: verifying the first {MAX_FINDINGS} findings, dropped {}: {dropped:?}",
            d.key,
            dropped.len()
        ));
    }

    let verdicts = ctx
        .parallel(findings.iter().enumerate().map(|(i, f)| {
            let call = ctx
                .agent(format!(
                    "Adversarially verify this {} finding: \"{}\". Try to refute it against \
                     the code; answer isReal: true only if it holds up, false when unsure.\
                     \n\n{changes}",
                    d.focus, f.title
                ))
                .label(format!("verify:{}:{i}", d.key));
            async move { call.json::<Verdict>().await.map_err(Error::from) }
        }))
        .await?;

    Ok(findings
        .into_iter()
        .zip(verdicts)
        // A failed verifier (`None`) does not confirm anything.
        .filter(|(_, verdict)| matches!(verdict, Some(Some(Verdict { is_real: true }))))
        .map(|(f, _)| Confirmed { dimension: d.key, title: f.title })
        .collect())
}

factory_sdk::export!(MultiStageReview);
