// Triage (TypeScript): classify each issue with a schema call, then route the urgent ones to
// a second agent that proposes a first step. The types are stripped when the file is read
// (not checked then; tests/js_types.rs checks them with tsc against guest-sdk/js); lines and
// columns stay the file's own, so errors point here.
//
//   factory run examples/js/triage.ts --args '{"issues":["Crash on start","Typo in README"]}'
import { defineFactory } from "factory";

interface TriageArgs {
    issues?: string[];
    /** Severities that get a proposed first step. */
    escalate?: Severity[];
}

type Severity = "critical" | "major" | "minor";

// Type aliases, not interfaces: a step value and the result must be JSON, and TypeScript
// proves that only for aliases (an interface may gain non-JSON members by merging).
type Classification = {
    severity: Severity;
    area: string;
};

type Triaged = Classification & {
    issue: string;
    firstStep: string | null;
};

const CLASSIFICATION = {
    type: "object",
    properties: {
        severity: { type: "string", enum: ["critical", "major", "minor"] },
        area: { type: "string" },
    },
    required: ["severity", "area"],
} as const;

function isClassification(value: unknown): value is Classification {
    const v = value as Partial<Classification> | null;
    return v !== null && typeof v === "object" && typeof v.severity === "string" && typeof v.area === "string";
}

// `defineFactory<Args>`: the args' type (the host forwards them verbatim, so the defaults
// below still guard what a caller leaves out).
export default defineFactory<TriageArgs>({
    meta: {
        name: "triage",
        description: "Classify issues by severity and propose a first step for the urgent ones. " +
            "args: { issues?: string[], escalate?: (\"critical\" | \"major\" | \"minor\")[] }",
        phases: [{ title: "Classify" }, { title: "Escalate" }],
        limits: { maxConcurrentSubagents: 4, maxTotalSubagents: 50 },
    },
    run: async ({ args, agent, parallel, phase, step }) => {
        const { issues = ["(no issue given)"], escalate = ["critical", "major"] } = args;

        phase("Classify");
        const classified = await parallel(
            issues.map((issue: string, i: number) => async (): Promise<Classification> => {
                const reply: unknown = await agent(
                    `Classify this issue. Return JSON {severity, area}.\n\n${issue}`,
                    { label: `classify:${i}`, schema: CLASSIFICATION },
                );
                // A dry run or an unparsable reply: count it as minor rather than dropping it.
                return isClassification(reply) ? reply : { severity: "minor", area: "unknown" };
            }),
        );

        phase("Escalate");
        const triaged = await parallel(
            issues.map((issue, i) => async (): Promise<Triaged> => {
                const c = classified[i] ?? { severity: "minor" as Severity, area: "unknown" };
                const firstStep = escalate.includes(c.severity)
                    ? await agent(`Propose the first step for this ${c.severity} issue:\n\n${issue}`, {
                        label: `escalate:${i}`,
                    })
                    : null;
                return { issue, ...c, firstStep };
            }),
        );

        const counts: Record<Severity, number> = { critical: 0, major: 0, minor: 0 };
        for (const t of triaged) counts[t!.severity] += 1;
        return step("report", () => ({ counts, triaged }));
    },
});
