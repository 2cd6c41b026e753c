// Drives the factory dashboard's Pause, Resume and Answer buttons (run by tests/ui.rs, which
// starts the daemon with a rate-limited backend `local` as its default and the probe
// registered): a running fan-out is paused and resumed to its end; a run that waits at its
// checkpoint shows the key, and the Answer box resumes it with the JSON typed there.
// Input: FACTORY_UI_URL (http://ADDR/#code=...), FACTORY_UI_TOKEN (the daemon's bearer
// token, for the test's own API calls). Output: one JSON report on stdout.
import { api, base, check, launch, openDashboard, report } from './harness.mjs';


// Evaluated in the page (serialized there: it may use nothing of this module).
const statusIs = (status) => document.getElementById('run-status')?.textContent === status;

const browser = await launch();
try {
  const { page, errors } = await openDashboard(browser);

  // A fan-out paced at 2 requests a second: still running when Pause is clicked.
  const started = await api('POST', '/api/runs', { name: 'probe', args: { case: 'fanout', n: 12 } });
  report.fanout = started.runId;
  await page.goto(`${base}/#/run/${encodeURIComponent(started.runId)}`);
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'running' && !document.getElementById('pause')?.disabled, null, { timeout: 60000 });
  await page.click('#pause');
  await page.waitForFunction(statusIs, 'paused', { timeout: 60000 });
  const paused = await api('GET', `/api/runs/${started.runId}/envelope`);
  check('the run is paused by a caller', paused.status === 'paused' && paused.failure?.kind === 'caller', paused);
  check('no checkpoint panel for a caller pause', (await page.$('#checkpoint')) === null);
  check('no Pause or Cancel once paused', (await page.$('#pause')) === null && (await page.$('#cancel')) === null);
  await page.click('#resume');
  await page.waitForFunction(statusIs, 'completed', { timeout: 120000 });
  const done = await api('GET', `/api/runs/${started.runId}/envelope`);
  check('resumed to completion under the same id', done.result?.done === 12 && done.attempts === 2, done);

  // A run waiting at its checkpoint: the key, and an answer typed as JSON.
  const waiting = await api('POST', '/api/runs', { name: 'probe', args: { case: 'checkpoint' } });
  report.checkpoint = waiting.runId;
  await page.goto(`${base}/#/run/${encodeURIComponent(waiting.runId)}`);
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'paused' && document.getElementById('checkpoint-key'), null, { timeout: 60000 });
  check('the checkpoint key is shown', (await page.textContent('#checkpoint-key')) === 'approve');
  await page.fill('#answer-input', '{"approved": true, "by": "dashboard"}');
  await page.click('#answer');
  await page.waitForFunction(statusIs, 'completed', { timeout: 120000 });
  const answered = await api('GET', `/api/runs/${waiting.runId}/envelope`);
  check('the body got the answer', JSON.stringify(answered.result?.answer) === JSON.stringify({ approved: true, by: 'dashboard' }), answered);
  check('no page errors', errors.length === 0, errors);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
