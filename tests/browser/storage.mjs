// The Storage view (issue 54): where the store's bytes go, by part and by table, as GET
// /api/stats says, and garbage collected from the page: a dry run lists the runs the policy
// would delete, the confirm button deletes them, and the figures shown follow the store.
// Input: FACTORY_UI_URL (http://ADDR/#code=...), FACTORY_UI_TOKEN, FACTORY_UI_RUNS (the store's
// runs, oldest first, space-separated), FACTORY_UI_SCREENSHOTS (where to write storage.png).
// Output: one JSON report on stdout.
import path from 'node:path';
import { api, base, check, launch, openDashboard, report } from './harness.mjs';

const runs = process.env.FACTORY_UI_RUNS.split(' ');
const shots = process.env.FACTORY_UI_SCREENSHOTS;

/** What the page shows: the summary's facts, each part's figures, each table's row. */
const shown = (page) => page.evaluate(() => ({
  facts: Object.fromEntries([...document.querySelectorAll('#storage-summary [data-fact]')].map((b) => [b.dataset.fact, Number(b.dataset.bytes)])),
  fileText: document.querySelector('#storage-summary [data-fact=fileBytes]')?.textContent,
  parts: [...document.querySelectorAll('#storage-parts .size-row')].map((r) => ({
    part: r.dataset.part, bytes: Number(r.querySelector('.size-bytes').textContent.replaceAll(',', '')), rows: Number(r.dataset.rows),
  })),
  tables: Object.fromEntries([...document.querySelectorAll('#storage-tables tbody tr')].map((r) => {
    const cells = [...r.querySelectorAll('td')].map((td) => td.textContent.replaceAll(',', ''));
    return [r.dataset.table, { entries: Number(cells[1]), storedBytes: Number(cells[2]), bytes: Number(cells[3]) }];
  })),
}));

/** The figures the API gives, in the page's shape. */
async function expected() {
  const stats = await api('GET', '/api/stats');
  return {
    stats,
    parts: stats.parts.map((p) => ({ part: p.part, bytes: p.bytes, rows: p.rows })),
    tables: Object.fromEntries(stats.tables.map((t) => [t.name,
      { entries: t.entries, storedBytes: t.storedBytes, bytes: t.storedBytes + t.fragmentedBytes + t.metadataBytes }])),
  };
}

/** Check that the page shows exactly the API's figures (`when`: which state). */
async function figuresMatch(page, when) {
  // The store may still be settling (a compaction after a deletion): read the page between
  // two equal answers of the API, reloading the view until the store holds still.
  let seen, want;
  for (let attempt = 0; ; attempt++) {
    const first = await expected();
    await page.reload();
    await page.waitForFunction(() => document.querySelectorAll('#storage-parts .size-row').length > 0, null, { timeout: 30000 });
    seen = await shown(page);
    want = await expected();
    if (JSON.stringify(first.stats) === JSON.stringify(want.stats) || attempt === 20) break;
  }
  report[when] = { seen, api: want.stats };
  check(`${when}: the file's size is the API's`, seen.facts.fileBytes === want.stats.fileBytes && seen.facts.diskBytes === want.stats.diskBytes
    && seen.facts.allocatedPages === want.stats.allocatedPages, { seen: seen.facts, api: want.stats });
  check(`${when}: the exact byte count is shown`, seen.fileText.includes(want.stats.fileBytes.toLocaleString('en-US')), seen.fileText);
  check(`${when}: every part, in the API's order, with its bytes and rows`, JSON.stringify(seen.parts) === JSON.stringify(want.parts),
    { seen: seen.parts, api: want.parts });
  check(`${when}: the parts add up to the file`, seen.parts.reduce((s, p) => s + p.bytes, 0) === want.stats.fileBytes);
  check(`${when}: every table with its rows and bytes`, JSON.stringify(Object.entries(seen.tables).sort())
    === JSON.stringify(Object.entries(want.tables).sort()), { seen: seen.tables, api: want.tables });
  return want.stats;
}

const browser = await launch();
try {
  const { page, errors } = await openDashboard(browser, 900);
  await page.click('#nav-storage');
  await page.waitForFunction(() => document.querySelectorAll('#storage-parts .size-row').length > 0, null, { timeout: 30000 });
  const before = await figuresMatch(page, 'before');
  const journal = before.parts.find((p) => p.part.startsWith('journal values'));
  check('the runs\' journal values are there', journal && journal.bytes > 0 && journal.rows >= runs.length, before.parts);
  check('the runs table holds the runs', before.tables.find((t) => t.name === 'runs')?.entries === runs.length, before.tables);
  await page.screenshot({ path: path.join(shots, 'storage.png'), fullPage: true });

  // Keep the newest of the factory: the dry run lists every older run, and deletes nothing.
  await page.fill('#gc input[name=keepLast]', '1');
  await page.click('#gc-preview');
  await page.waitForSelector('#gc-list li');
  const listed = await page.$$eval('#gc-list li', (items) => items.map((li) => li.dataset.runId));
  check('the dry run lists the older runs', JSON.stringify(listed) === JSON.stringify(runs.slice(0, -1)), listed);
  check('a dry run deletes nothing', (await api('GET', '/api/runs')).length === runs.length);
  await page.screenshot({ path: path.join(shots, 'storage-gc.png'), fullPage: true });
  await page.click('#gc-confirm');
  await page.waitForSelector('#gc-done');
  const removed = (await page.getAttribute('#gc-done', 'data-removed')).split(' ');
  check('the confirm deletes what the dry run listed', JSON.stringify(removed) === JSON.stringify(listed), removed);
  const said = await page.textContent('#gc-done');
  check('the page says what went and what is left', said === `deleted ${listed.length} runs; 1 left in the store`, said);
  const left = (await api('GET', '/api/runs')).map((r) => r.runId);
  check('only the newest run is left', JSON.stringify(left) === JSON.stringify(runs.slice(-1)), left);
  // The view reloads: one run record left, and the figures are the API's again.
  await page.waitForFunction(() => document.querySelector('#storage-tables tr[data-table=runs] td:nth-child(2)')?.textContent === '1', null,
    { timeout: 30000 });
  await figuresMatch(page, 'after');
  check('no page errors', errors.length === 0, errors);
  report.ok = true;
} catch (e) {
  report.error = String(e.stack || e);
} finally {
  await browser.close();
  process.stdout.write(JSON.stringify(report) + '\n');
}
