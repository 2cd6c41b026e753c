// Drives the factory dashboard's pending approvals (run by tests/ui.rs, which starts the
// daemon with `hello` registered and not trusted): a start over the API waits for the
// owner's approval; the dashboard lists it with the question's facts (its sha256 among them)
// and Approve once starts the run, which completes; a second start declined with the
// Decline button leaves no run and its waiter is told `declined`.
// Input: FACTORY_UI_URL (http://ADDR/#code=...), FACTORY_UI_TOKEN (the daemon's bearer
// token, for the test's own API calls), FACTORY_UI_SHA256 (hello's), FACTORY_UI_SCREENSHOTS
// (where the screenshots go). Output: one JSON report on stdout.
import { api, base, check, launch, openDashboard, report, token } from './harness.mjs';

const shots = process.env.FACTORY_UI_SCREENSHOTS;
const sha256 = process.env.FACTORY_UI_SHA256;

const browser = await launch();
try {
  const { page, errors } = await openDashboard(browser);

  // A start that waits for the owner, answered at once with a pending envelope.
  const pending = await api('POST', '/api/runs', { name: 'hello', approvalWaitSeconds: 0 });
  check('the start waits for approval', pending.status === 'pending_approval' && typeof pending.approvalId === 'string', pending);
  const panel = `.approval[data-approval-id="${pending.approvalId}"]`;
  await page.waitForSelector(panel, { timeout: 30000 });
  const facts = await page.$$eval(`${panel} dd`, (dds) => Object.fromEntries(dds.map((dd) => [dd.dataset.fact, dd.textContent])));
  check('the dashboard shows what is asked', facts.factory === 'hello' && facts.sha256 === sha256 && facts.operation === 'run', facts);
  await page.screenshot({ path: `${shots}/approval.png`, fullPage: true });
  await page.click(`${panel} button.approve-once`);
  // Approved: the page goes to the run, which completes.
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'completed', null, { timeout: 120000 });
  const approval = await api('GET', `/api/approvals/${pending.approvalId}`);
  check('approved once, with its run', approval.state?.status === 'approved' && approval.state.always === false, approval);
  const run = await api('GET', `/api/runs/${approval.state.runId}/envelope`);
  check('the approved run completed', run.status === 'completed', run);
  report.approvedRun = run.runId;
  check('the panel is gone', (await page.$(panel)) === null);

  // A start whose caller waits; declined from the dashboard: its request is told, no run.
  const before = (await api('GET', '/api/runs')).length;
  const waiter = fetch(`${base}/api/runs`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: 'hello', approvalWaitSeconds: 60 }),
  });
  await page.waitForSelector('.approval', { timeout: 30000 });
  await page.click('.approval button.decline');
  const refused = await waiter;
  const answer = await refused.json();
  check('the waiting caller is told it was declined', refused.status === 403 && answer.code === 'declined', answer);
  await page.waitForFunction(() => document.getElementById('approvals').hidden, null, { timeout: 30000 });
  const after = await api('GET', '/api/runs');
  check('a declined start leaves no run', after.length === before, after.map((r) => r.runId));
  await page.screenshot({ path: `${shots}/approval-declined.png`, fullPage: true });
  check('no page errors', errors.length === 0, errors);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
