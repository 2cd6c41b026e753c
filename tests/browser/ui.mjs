// Drives the factory dashboard in headless Chromium (run by tests/ui.rs, which starts the
// daemon). Input: FACTORY_UI_FILE (the private sign-in file `factory ui` wrote, which the page
// is opened on), FACTORY_UI_URL (http://ADDR/#code=..., the URL in it), FACTORY_UI_TOKEN
// (the daemon's bearer token, for the test's own API calls), FACTORY_UI_BIG_RUN (a finished
// 4,096-agent run), FACTORY_UI_OTHER_RUN (a finished run of session `other`, not the daemon's),
// FACTORY_UI_SCREENSHOTS (a directory). Output: one JSON report on stdout.
import { api, base, check, launch, report, token, url } from './harness.mjs';
import path from 'node:path';

const bigRun = process.env.FACTORY_UI_BIG_RUN;
const otherRun = process.env.FACTORY_UI_OTHER_RUN;
const shots = process.env.FACTORY_UI_SCREENSHOTS;
const code = url.split('#code=')[1];

/** Timeline bars as the API's progress implies them: one per (attempt, label) of an agent. */
async function agentsInProgress(runId) {
  const seen = new Set();
  let after = 0, attempt = 1;
  for (;;) {
    const page = await api('GET', `/api/runs/${runId}/progress?afterSeq=${after}&limit=1000`);
    for (const e of page) {
      if (e.event === 'attemptStarted') attempt = e.attempt;
      if (['agentQueued', 'agentStarted', 'agentFinished'].includes(e.event)) seen.add(`${attempt} ${e.label}`);
    }
    if (page.length < 1000) return seen.size;
    after = page[page.length - 1].seq;
  }
}

const browser = await launch();
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  const requests = [];
  page.on('request', (r) => requests.push({ url: r.url(), auth: r.headers().authorization }));
  const consoleErrors = [];
  page.on('pageerror', (e) => consoleErrors.push(String(e)));

  // The code leaves the URL at once and is exchanged, once, for a session token of the
  // page's own (not the daemon's token), kept in sessionStorage.
  check('the URL holds a code, not the token', code && !url.includes(token), url);
  // The browser is opened on the private file, which sends it on to the dashboard with the code.
  await page.goto(`file://${process.env.FACTORY_UI_FILE}`);
  await page.waitForSelector('#runs');
  check('the sign-in file led to the dashboard', page.url().startsWith(base), page.url());
  check('code removed from the URL', !page.url().includes(code), page.url());
  const session = await page.evaluate(() => sessionStorage.getItem('factory.token'));
  check('a session token kept in sessionStorage', /^[0-9a-f]{64}$/.test(session) && session !== token, session);
  await page.waitForFunction(() => document.getElementById('session').textContent === 'default', null, { timeout: 10000 })
    .catch(() => {});
  check('session shown', (await page.textContent('#session')) === 'default', await page.textContent('#session'));
  await page.evaluate(() => { window.__sameDocument = true; });

  // A run with latency in flight appears in the list, and its row updates live.
  const started = await api('POST', '/api/runs', {
    name: 'probe', args: { case: 'fanout', n: 40 }, limits: { maxConcurrentSubagents: 2 },
  });
  const id = started.runId;
  const row = `tr[data-run-id="${id}"]`;
  await page.waitForSelector(row, { timeout: 10000 });
  const firstAgents = Number(await page.textContent(`${row} td.agents`));
  await page.waitForFunction(([sel, n]) => Number(document.querySelector(`${sel} td.agents`)?.textContent) > n + 2, [row, firstAgents], { timeout: 10000 });
  check('runs list updates live without a reload', await page.evaluate(() => window.__sameDocument === true));
  check('status shown as running', (await page.getAttribute(row, 'data-status')) === 'running'
    && (await page.textContent(`${row} td.status-cell`)) === 'running', await page.textContent(`${row} td.status-cell`));

  // The owner's view: every session's runs, each with its session; the filter narrows the table.
  const otherRow = `tr[data-run-id="${otherRun}"]`;
  await page.waitForSelector(otherRow, { timeout: 10000 });
  const sessionsShown = () => page.$$eval('#runs tbody tr', (rows) => rows.map((r) => [r.dataset.runId, r.querySelector('td.session-cell').textContent]));
  const all = await sessionsShown();
  check("a session column with each run's session", all.length === 3
    && all.find(([runId]) => runId === otherRun)?.[1] === 'other' && all.find(([runId]) => runId === id)?.[1] === 'default'
    && all.find(([runId]) => runId === bigRun)?.[1] === 'default', all);
  const offered = await page.$$eval('#session-filter option', (options) => options.map((o) => o.value));
  check('the filter offers the sessions of the runs', JSON.stringify(offered) === JSON.stringify(['', 'default', 'other']), offered);
  await page.selectOption('#session-filter', 'other');
  await page.waitForFunction((sel) => !document.querySelector(sel), row, { timeout: 5000 }).catch(() => {});
  const onlyOther = await sessionsShown();
  check('filtered to session other', JSON.stringify(onlyOther) === JSON.stringify([[otherRun, 'other']]), onlyOther);
  await page.selectOption('#session-filter', 'default');
  await page.waitForSelector(row, { timeout: 5000 }).catch(() => {});
  const onlyDefault = await sessionsShown();
  check('filtered to session default', onlyDefault.length === 2 && onlyDefault.every(([, s]) => s === 'default')
    && onlyDefault.some(([runId]) => runId === id) && onlyDefault.some(([runId]) => runId === bigRun), onlyDefault);
  await page.selectOption('#session-filter', '');
  await page.waitForSelector(otherRow, { timeout: 5000 }).catch(() => {});
  check('every session again', (await sessionsShown()).length === 3, await sessionsShown());
  await page.screenshot({ path: path.join(shots, 'runs.png') });

  // Open it: the timeline fills in while it runs.
  await page.click(row);
  await page.waitForSelector('#timeline[data-bars]');
  await page.waitForFunction(() => Number(document.getElementById('timeline').dataset.bars) >= 6, null, { timeout: 10000 });
  await page.waitForSelector('#phases li.current', { timeout: 5000 });
  check('current phase marked', (await page.textContent('#phases li.current')) === 'Probe');

  check('the run\'s session shown', (await page.textContent('#run-session')) === 'default', await page.textContent('#run-session'));

  // Cancel with the button.
  await page.click('#cancel');
  const badge = '#main .actions .status[data-status]';
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === 'cancelled', badge, { timeout: 10000 })
    .catch(() => {});
  // The button really cancelled the run (the host says so), the status badge the page shows
  // says so, and so does the run's status cell in the runs list.
  const afterCancel = await api('GET', `/api/runs/${id}`);
  const shownBadge = await page.textContent(badge);
  check('cancelled (host and the page\'s badge)', afterCancel.status === 'cancelled' && shownBadge === 'cancelled',
    { host: afterCancel.status, page: shownBadge });
  await page.goto(`${base}/#/runs`);
  await page.waitForFunction((sel) => document.querySelector(sel)?.textContent === 'cancelled', `${row} td.status-cell`, { timeout: 10000 })
    .catch(() => {});
  const cell = await page.textContent(`${row} td.status-cell`);
  check('cancelled in the run\'s status cell', cell === 'cancelled' && (await page.getAttribute(row, 'data-status')) === 'cancelled', cell);
  await page.goto(`${base}/#/run/${encodeURIComponent(id)}`);
  await page.waitForSelector('#resume-command');
  check('resume command shown', (await page.textContent('#resume-command')) === `factory resume ${id}`);
  const expected = await agentsInProgress(id);
  await page.waitForFunction((n) => Number(document.getElementById('timeline').dataset.bars) === n, expected, { timeout: 5000 })
    .catch(() => {});
  const barsAtCancel = Number(await page.getAttribute('#timeline', 'data-bars'));
  check('timeline bars == agents (cancelled attempt)', barsAtCancel === expected && expected > 0, { barsAtCancel, expected });

  // Resume with the button: it completes, every agent finished ok exactly once.
  await page.click('#resume');
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'completed', null, { timeout: 30000 });
  const done = await api('GET', `/api/runs/${id}`);
  const expectedAll = await agentsInProgress(id);
  // The status can read `completed` a refresh before the last agents' ends reach the
  // timeline: wait for every bar, and for the 40 of them that ended ok.
  await page.waitForFunction((n) => Number(document.getElementById('timeline').dataset.bars) === n
      && Number(document.querySelector('#legend [data-kind=ok]')?.dataset.count) === 40, expectedAll, { timeout: 10000 })
    .catch(() => {});
  const bars = Number(await page.getAttribute('#timeline', 'data-bars'));
  const okBars = Number(await page.getAttribute('#legend [data-kind=ok]', 'data-count'));
  check('completed', done.status === 'completed' && done.result.done === 40, done.status);
  check('timeline bars == agents (whole run)', bars === expectedAll, { bars, expectedAll });
  check('40 ok bars', okBars === 40, okBars);
  check('no resume form on a completed run', !(await page.isVisible('#resume-form')));
  // The spend as the host accounts it: "at least" (≥) exactly when the host says it is a
  // lower bound (calls cut off by the cancel make it one), and the cache breakdown.
  const atLeast = done.accounting.aiCreditsAtLeast;
  const creditsText = await page.textContent('#ai-credits');
  check('AI credits flagged as the host says', typeof atLeast === 'boolean'
    && (await page.getAttribute('#ai-credits', 'data-at-least')) === String(atLeast)
    && creditsText.includes('≥') === atLeast && creditsText.includes('at least') === atLeast, { creditsText, accounting: done.accounting });
  check('cache tokens shown', (await page.textContent('#accounting')).includes(`cache read / write${done.accounting.cacheReadTokens} / ${done.accounting.cacheWriteTokens}`),
    await page.textContent('#accounting'));
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: path.join(shots, 'run.png'), fullPage: true, clip: { x: 0, y: 0, width: 1100, height: 1000 } });
  report.liveRun = { runId: id, bars, okBars, barsAtCancel };

  // Hover shows the label (and nothing of a prompt).
  const box = await page.locator('#timeline').boundingBox();
  const rowH = Number(await page.getAttribute('#timeline', 'data-row-height'));
  const axisH = Number(await page.getAttribute('#timeline', 'data-axis-height'));
  await page.mouse.move(box.x + box.width / 2, box.y + axisH + rowH / 2);
  const tip = await page.textContent('.tip');
  check('hover shows the label', /^t:\d+\n/.test(tip) && !tip.includes('task'), tip);

  // Reopened (the token survives a reload in sessionStorage), the log shows the latest
  // entries; older pages come via beforeSeq.
  await page.reload();
  await page.waitForFunction(() => document.getElementById('timeline')?.dataset.loadMs, null, { timeout: 10000 });
  check('reload keeps the token', Number(await page.getAttribute('#timeline', 'data-bars')) === bars);
  const firstSeq = Number(await page.getAttribute('#log div:first-child', 'data-seq'));
  if (firstSeq > 1) {
    await page.click('#older');
    await page.waitForFunction((s) => Number(document.querySelector('#log div:first-child').dataset.seq) < s, firstSeq);
  }
  report.liveRun.logFirstSeq = firstSeq;
  check('log pages back to older entries', firstSeq > 1, firstSeq);

  // Start a run from the form (probe declares no args schema: a JSON textarea).
  await page.goto(`${base}/#/start`);
  await page.selectOption('#factory', 'probe');
  await page.fill('#args-json', '{"case": "fanout", "n": 3}');
  await page.click('#start');
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'completed', null, { timeout: 15000 })
    .catch(() => {});
  // The run the form started is the one shown, and the host has it completed with its result.
  const formRun = decodeURIComponent(new URL(page.url()).hash.replace(/^#\/run\//, ''));
  const formDone = formRun ? await api('GET', `/api/runs/${formRun}`) : {};
  check('a run started from the form completes', formDone.status === 'completed' && formDone.result?.done === 3
    && (await page.textContent('#run-status')) === 'completed', { formRun, status: formDone.status, result: formDone.result });
  // A settled run offers no Cancel or Pause; the legend says nothing of `null`; a run shorter
  // than a second has its time axis in distinct milliseconds, not `0.0s` at every tick.
  check('no Cancel or Pause on a completed run', !(await page.isVisible('#cancel')) && !(await page.isVisible('#pause')));
  await page.waitForFunction(() => document.getElementById('timeline')?.dataset.ticks, null, { timeout: 5000 });
  const legendText = await page.textContent('#legend');
  check('the legend has no null', !legendText.includes('null'), legendText);
  const headText = await page.textContent('#run-head');
  check('the run\'s head has no null', !headText.includes('null'), headText);
  const spanMs = Number(await page.getAttribute('#timeline', 'data-span-ms'));
  const ticks = (await page.getAttribute('#timeline', 'data-ticks')).split(' ');
  check('the axis of a sub-second run reads milliseconds', spanMs >= 1000
    || (ticks.length > 1 && ticks.every((t) => t.endsWith('ms')) && new Set(ticks).size === ticks.length), { spanMs, ticks });
  report.fastRun = { spanMs, ticks };
  await page.screenshot({ path: path.join(shots, 'fast-run.png'), fullPage: true, clip: { x: 0, y: 0, width: 1100, height: 700 } });
  // A bad one shows the API's error code.
  await page.goto(`${base}/#/start`);
  await page.selectOption('#factory', 'probe');
  await page.fill('#args-json', '{"case": "fanout", "n": 3}');
  await page.fill('input[name=maxTotalSubagents]', '0');
  await page.click('#start');
  await page.waitForSelector('#error:not([hidden])');
  check('errors show their code', (await page.textContent('#error')).startsWith('invalid_limits:'), await page.textContent('#error'));

  // The approval checkbox names what it approves by sha256.
  const registered = await api('GET', '/api/factories/hostile-ui');

  // A form built from an args schema; guest text (description, phase, log line, label) is
  // shown as text, never as markup.
  await page.goto(`${base}/#/start`);
  await page.selectOption('#factory', 'hostile-ui');
  await page.waitForSelector('#start-form');
  const approvalText = await page.textContent('#start-approval');
  check('the approval names the sha256 approved', approvalText.includes(registered.hash)
    && (!registered.script || approvalText.includes(registered.script.sha256)), { approvalText, hash: registered.hash });
  check('schema form: a text input (required)', await page.getAttribute('input[name=topic]', 'required') !== null);
  check('schema form: a number input', (await page.getAttribute('input[name=count]', 'type')) === 'number');
  check('schema form: a checkbox', (await page.getAttribute('input[name=loud]', 'type')) === 'checkbox');
  check('schema form: a list', await page.isVisible('textarea[name=tags]'));
  check('schema form: no JSON box', !(await page.isVisible('#args-json')));
  await page.fill('input[name=topic]', 'cats');
  await page.fill('input[name=count]', '3');
  await page.check('input[name=loud]');
  await page.fill('textarea[name=tags]', 'a\nb\n');
  await page.check('input[name=approved]');
  await page.click('#start');
  await page.waitForFunction(() => document.getElementById('run-status')?.textContent === 'completed', null, { timeout: 15000 });
  const hostileId = decodeURIComponent(page.url().split('#/run/')[1]);
  const hostile = await api('GET', `/api/runs/${hostileId}`);
  check('schema form: typed args', hostile.result?.topic === 'cats' && hostile.result.count === 3 && hostile.result.loud === true
    && JSON.stringify(hostile.result.tags) === '["a","b"]', hostile.result);
  await page.waitForFunction(() => document.getElementById('log').textContent.includes('<img src=x'));
  check('markup in a log line is text', await page.evaluate(() => !document.querySelector('main img, main script, #phases b, #log b') && window.__pwned === undefined));
  check('phases: entered and declared', (await page.textContent('#phases li.done')) === '<b>Write</b>'
    && (await page.textContent('#phases li.pending')) === 'Later');
  const hbox = await page.locator('#timeline').boundingBox();
  const hrow = Number(await page.getAttribute('#timeline', 'data-row-height'));
  await page.mouse.move(hbox.x + hbox.width / 2, hbox.y + Number(await page.getAttribute('#timeline', 'data-axis-height')) + hrow / 2);
  check('a label with markup is text on hover', (await page.textContent('.tip')).startsWith('<script>window.__pwned=1</script>\n'));

  // Another session's run opens like any other (the owner's view), naming its session.
  await page.goto(`${base}/#/run/${otherRun}`);
  await page.waitForFunction(() => document.getElementById('run-session')?.textContent, null, { timeout: 10000 });
  check('another session\'s run opens', (await page.textContent('#run-session')) === 'other'
    && (await page.textContent('#main .actions .status')) === 'completed', await page.textContent('#run-session'));

  // 4,096 agents: every one drawn (how long that takes is the bench's, section 9).
  await page.goto(`${base}/#/run/${bigRun}`);
  await page.waitForFunction(() => document.getElementById('timeline')?.dataset.loadMs, null, { timeout: 30000 });
  const big = await page.evaluate(() => {
    const c = document.getElementById('timeline');
    return { bars: Number(c.dataset.bars), entries: Number(c.dataset.entries) };
  });
  report.bigRun = big;
  check('4,096 bars', big.bars === 4096, big.bars);

  // The tokens went only in headers: never in a URL the page requested.
  check('tokens never in a request URL', requests.every((r) => !r.url.split('#')[0].includes(token) && !r.url.split('#')[0].includes(session)));
  const exchanges = requests.filter((r) => r.url.endsWith('/api/ui/exchange'));
  check('one code exchange, without a token', exchanges.length === 1 && !exchanges[0].auth, exchanges);
  check('API requests carry the session token', requests.filter((r) => r.url.includes('/api/') && !r.url.endsWith('/api/ui/exchange')).every((r) => r.auth === `Bearer ${session}`));
  check('no page errors', consoleErrors.length === 0, consoleErrors);

  // The code works once only; presented again, it ends the session it gave.
  const again = await fetch(`${base}/api/ui/exchange`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ code }) });
  check('the code works once only', again.status === 401, again.status);
  const ended = await fetch(`${base}/api/session`, { headers: { Authorization: `Bearer ${session}` } });
  check('a code presented twice ends its session', ended.status === 401, ended.status);

  // Signing out ends the page's dashboard session on the server too.
  const page2 = await browser.newPage();
  const code2 = process.env.FACTORY_UI_CODE2;
  await page2.goto(`${base}/#code=${code2}`);
  await page2.waitForSelector('#runs');
  const session2 = await page2.evaluate(() => sessionStorage.getItem('factory.token'));
  await page2.click('#signout');
  await page2.waitForFunction(() => document.getElementById('error').textContent.startsWith('signed_out:'));
  const afterSignout = await fetch(`${base}/api/session`, { headers: { Authorization: `Bearer ${session2}` } });
  check('signing out ends the session on the server', afterSignout.status === 401, afterSignout.status);
  check('signed out: the token is forgotten', (await page2.evaluate(() => sessionStorage.getItem('factory.token'))) === null);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
