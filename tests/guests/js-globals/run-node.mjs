// Runs checks.js in real Node (the reference the JS runner's globals are compared against):
// `node run-node.mjs checks.js` prints the JSON of `await checks()`.
import fs from "node:fs";
const source = fs.readFileSync(process.argv[2], "utf8");
const checks = new Function(`${source}\nreturn checks;`)();
// Node unrefs AbortSignal.timeout's timer: keep the loop alive until the checks are done.
const keepAlive = setInterval(() => {}, 1000);
console.log(JSON.stringify(await checks()));
clearInterval(keepAlive);
