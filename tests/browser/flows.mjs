// Drives the factory dashboard's run view while the run's calls wait in its backend's flow
// (run by tests/ui.rs, which starts the daemon with a rate-limited backend `local` as its
// default). Input: FACTORY_UI_URL (http://ADDR/#code=...), FACTORY_UI_TOKEN (the daemon's
// bearer token, for the test's own API calls). Output: one JSON report on stdout.
import { api, base, check, launch, openDashboard, report } from './harness.mjs';


const browser = await launch();
try {
  const { page, errors } = await openDashboard(browser);
  // A fan-out paced at 2 requests a second by its backend: most of its calls wait.
  const started = await api('POST', '/api/runs', { name: 'probe', args: { case: 'fanout', n: 60 } });
  await page.goto(`${base}/#/run/${encodeURIComponent(started.runId)}`);
  // A line per flow, while calls wait: how many, in flight, the rate, why.
  const line = '#flows .flow[data-backend="local"]';
  // Taken in the page at the moment it holds (the view re-renders every second).
  const waiting = await page.waitForFunction((sel) => {
    const el = document.querySelector(sel);
    const queued = Number(el?.dataset.queued);
    if (!(queued > 0) || !el.textContent.includes('waiting for')) return false;
    return { queued, text: el.textContent, hidden: document.getElementById('flows').hidden };
  }, line, { timeout: 60000 });
  const shown = await waiting.jsonValue();
  check('the flow panel is shown', !shown.hidden, shown);
  check('it says how many calls wait, the rate and why', /^local \d+ queued, \d+ in flight \(limit \d+\), 2 req\/s, waiting for request rate, \d+ throttled/.test(shown.text), shown.text);
  // Read again while calls wait: the count shown moves (a timeout fails the test).
  // (Or it emptied and the panel went away with the run, on a machine slow enough.)
  await page.waitForFunction(([sel, n]) => {
    const q = Number(document.querySelector(sel)?.dataset.queued);
    return (Number.isFinite(q) && q < n) || document.getElementById('run-status')?.textContent === 'completed';
  }, [line, shown.queued], { timeout: 60000 });
  check('the queue moves', true);
  // The run ends: no flow is shown for it any more.
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'completed', null, { timeout: 120000 });
  check('no flow shown once the run ended', await page.$eval('#flows', (el) => el.hidden));
  check('no page errors', errors.length === 0, errors);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
