//! `loop-until-dry`: the spec's "Loop until dry" pattern. Each round, three finders hunt for
//! bugs; every bug not seen before is judged through three lenses (correctness, security,
//! repro) and kept when at least two judges call it real. The hunt stops after two rounds
//! in a row surface nothing new, or after `maxRounds` rounds.

use factory_sdk::prelude::*;
use std::collections::HashSet;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
#[serde(rename_all = "camelCase")]
struct Args {
    /// What to hunt bugs in (default: the repository).
    #[serde(default)]
    target: Option<String>,
    /// The most rounds to run (default 20).
    #[serde(default)]
    max_rounds: Option<u32>,
}

/// A finder's reply (the spec's BUGS schema).
#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Bugs {
    bugs: Vec<Bug>,
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Bug {
    /// One line: what is wrong, and where.
    title: String,
}

/// A judge's reply (the spec's VERDICT schema).
#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "factory_sdk::schemars")]
struct Verdict {
    real: bool,
}

const FINDERS: usize = 3;
const DRY_ROUNDS: u32 = 2;
const DEFAULT_MAX_ROUNDS: u32 = 20;
/// Distinct lenses rather than identical skeptics: the prompts differ, so the judges stay
/// independent, and each looks at the claim from another side.
const LENSES: [(&str, &str); 3] = [
    ("correctness", "Read the code: does it really behave wrongly as claimed?"),
    ("security", "Who can trigger it, and what does it expose or break?"),
    ("repro", "Work out a concrete input or sequence of steps that triggers it."),
];

#[derive(Serialize)]
struct Output {
    confirmed: Vec<Bug>,
    rounds: u32,
}

struct LoopUntilDry;

impl Factory for LoopUntilDry {
    type Output = Output;

    fn meta() -> Meta {
        Meta::new(
            "loop-until-dry",
            "Hunt for bugs in rounds of three finders until two rounds in a row find nothing \
             new; each new bug is judged by three lenses and kept on a majority. \
             args: { target?: string, maxRounds?: number } — what to search (default: the \
             repository) and the most rounds to run (default 20).",
        )
        .phase("Find")
        .phase("Judge")
        // The declared limits are the safety ceiling; the dry-round rule is the control.
        .max_concurrent_subagents(6)
        .max_total_subagents(150)
        .timeout_seconds(1800.0)
        .args_schema_for::<Args>()
    }

    async fn run(ctx: Ctx) -> Result<Output, Error> {
        let args: Args = ctx.args()?;
        let target = args.target.unwrap_or_else(|| "this repository".to_string());
        let max_rounds = args.max_rounds.unwrap_or(DEFAULT_MAX_ROUNDS);

        // Dedupe against everything *seen*, not just what was kept, or rejected bugs would
        // resurface every round. `known` keeps the titles in order for the finder prompt:
        // prompts must be deterministic so a resumed run replays its journaled calls.
        let mut seen = HashSet::new();
        let mut known: Vec<String> = Vec::new();
        let mut confirmed = Vec::new();
        let (mut dry, mut round) = (0, 0);

        while dry < DRY_ROUNDS && round < max_rounds {
            ctx.phase("Find");
            // The label and the list of known bugs make every finder a fresh subagent.
            let skip = if known.is_empty() { String::new() } else { format!(" Skip these known ones: {known:?}.") };
            let prompt = |i| {
                format!(
                    "Find bugs in {target} (finder {i}, round {round}). Report each bug once, \
                     its title saying what is wrong and where.{skip} Return an empty list \
                     when you find nothing new."
                )
            };
            let found = ctx
                .parallel((0..FINDERS).map(|i| {
                    let call = ctx.agent(prompt(i)).label(format!("find:{round}:{i}"));
                    async move { call.json::<Bugs>().await.map_err(Error::from) }
                }))
                .await?;

            let mut fresh = Vec::new();
            // A failed finder (`None`) simply contributes nothing.
            for bug in found.into_iter().flatten().flatten().flat_map(|r| r.bugs) {
                if seen.insert(bug.title.trim().to_lowercase()) {
                    known.push(bug.title.clone());
                    fresh.push(bug);
                }
            }

            if fresh.is_empty() {
                dry += 1;
                ctx.log(format!("round {round}: 0 fresh, 0 confirmed (dry {dry}/{DRY_ROUNDS})"));
                round += 1;
                continue;
            }
            dry = 0;

            ctx.phase("Judge");
            let verdicts =
                ctx.parallel(fresh.iter().enumerate().map(|(i, bug)| judge(&ctx, &target, round, i, bug))).await?;
            let (fresh_count, before) = (fresh.len(), confirmed.len());
            confirmed
                .extend(fresh.into_iter().zip(verdicts).filter(|(_, real)| *real == Some(true)).map(|(bug, _)| bug));
            ctx.log(format!("round {round}: {fresh_count} fresh, {} confirmed", confirmed.len() - before));
            round += 1;
        }

        ctx.log(if dry >= DRY_ROUNDS {
            format!("stopped after {round} rounds: {DRY_ROUNDS} dry rounds in a row")
        } else {
            format!("stopped at the round limit ({max_rounds}) while still finding bugs")
        });
        Ok(Output { confirmed, rounds: round })
    }
}

/// Three judges, one per lens; the bug is real when at least two of them say so. A judge
/// that failed (`None`) counts as a "no".
async fn judge(ctx: &Ctx, target: &str, round: u32, i: usize, bug: &Bug) -> Result<bool, Error> {
    let votes = ctx
        .parallel(LENSES.iter().map(|(lens, question)| {
            let call = ctx
                .agent(format!(
                    "Judge a reported bug in {target} through the {lens} lens. {question} \
                     Answer real: true only if it is a real defect, false when unsure.\
                     \n\nThe report: \"{}\"",
                    bug.title
                ))
                .label(format!("judge:{round}:{i}:{lens}"));
            async move { call.json::<Verdict>().await.map_err(Error::from) }
        }))
        .await?;
    let yes = votes.into_iter().flatten().flatten().filter(|v| v.real).count();
    Ok(yes >= 2)
}

factory_sdk::export!(LoopUntilDry);
