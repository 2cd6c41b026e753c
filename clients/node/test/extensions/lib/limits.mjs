// How many files imports-local.mjs reviews by default.
export const TOP = 2;
