// The run view's cost chart (issue 52): a finished run of `costly` (two phases, agents asking
// for two models whose calls cost 3 and 1 AI credits on the test's script backend) shows what
// it spent by phase and by model, as the host accounts it, and a screenshot of it is written.
// Input: FACTORY_UI_URL (http://ADDR/#code=...), FACTORY_UI_TOKEN, FACTORY_UI_COST_RUN (the
// run), FACTORY_UI_SCREENSHOTS (where to write costs.png). Output: one JSON report on stdout.
import path from 'node:path';
import { api, base, check, launch, openDashboard, report } from './harness.mjs';

const runId = process.env.FACTORY_UI_COST_RUN;
const shots = process.env.FACTORY_UI_SCREENSHOTS;

const browser = await launch();
try {
  const { page, errors } = await openDashboard(browser);
  await page.goto(`${base}/#/run/${encodeURIComponent(runId)}`);
  await page.waitForFunction(() => document.querySelectorAll('#costs .cost-row').length >= 4, null, { timeout: 30000 });
  const rows = await page.$$eval('#costs .cost-group', (groups) => Object.fromEntries(groups.map((g) => [g.dataset.group,
    [...g.querySelectorAll('.cost-row')].map((r) => ({ key: r.dataset.key, nano: Number(r.dataset.creditsNano), text: r.querySelector('.cost-value').textContent,
      width: parseFloat(r.querySelector('.cost-bar i').style.width) }))])));
  report.rows = rows;
  const pairs = (group) => (rows[group] || []).map((r) => [r.key, r.nano]);
  check('by phase, largest first', JSON.stringify(pairs('phase')) === JSON.stringify([['Build', 5e9], ['Plan', 3e9]]), rows.phase);
  check('by model, largest first', JSON.stringify(pairs('model')) === JSON.stringify([['big', 6e9], ['small', 2e9]]), rows.model);
  check('values read as credits', rows.phase[0].text === '5.0000' && rows.model[1].text === '2.0000', rows);
  check('bars are proportional', rows.phase[0].width === 100 && rows.phase[1].width === 60 && Math.abs(rows.model[1].width - 100 / 3) < 0.01, rows);
  // The chart sums what the host accounted for the run.
  const detail = await api('GET', `/api/runs/${encodeURIComponent(runId)}`);
  const sum = (group) => rows[group].reduce((total, r) => total + r.nano, 0);
  check('the chart adds up to the run\'s AI credits', sum('phase') === detail.accounting.aiCreditsNano && sum('model') === detail.accounting.aiCreditsNano,
    detail.accounting);
  check('the unit is credits', (await page.getAttribute('#costs', 'data-unit')) === 'credits');
  await page.locator('#costs').scrollIntoViewIfNeeded();
  await page.locator('#costs').screenshot({ path: path.join(shots, 'costs.png') });
  await page.screenshot({ path: path.join(shots, 'run-costs.png'), fullPage: true, clip: { x: 0, y: 0, width: 1100, height: 900 } });
  check('no page errors', errors.length === 0, errors);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
