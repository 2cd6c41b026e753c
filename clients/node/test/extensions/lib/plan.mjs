// A local module of imports-local.mjs: which files to review, and the report.
import { TOP } from "./limits.mjs";

/** The first `top` files (default TOP) of `files`, sorted, and the ones left out. */
export function plan(files, top = TOP) {
    const sorted = [...files].sort();
    return { chosen: sorted.slice(0, top), dropped: sorted.slice(top) };
}

/** The report of the reviews, by file. */
export function summarize(files, reviews) {
    return { reviewed: Object.fromEntries(files.map((file, i) => [file, reviews[i]])) };
}
