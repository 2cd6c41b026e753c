// How long the factory dashboard takes to draw one run's timeline in headless Chromium (run by
// the bench, host/benches/factory.rs, section 9). Input: FACTORY_UI_URL (http://ADDR/#code=...,
// a one-time code from `factory ui`), FACTORY_UI_RUN (a finished run), FACTORY_UI_TIMES (how
// many times to open it; default 5). Output: one JSON line on stdout, { bars, renderMs: [...],
// loadMs: [...] }, as the page measures them (data-render-ms, data-load-ms of #timeline).
import { chromium } from 'playwright-core';

const url = process.env.FACTORY_UI_URL;
const run = process.env.FACTORY_UI_RUN;
const times = Math.max(1, Number(process.env.FACTORY_UI_TIMES || 5));
const base = url.split('/#')[0];

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
});
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
  // The code is exchanged once for the page's session token (kept in sessionStorage).
  await page.goto(url);
  await page.waitForSelector('#runs');
  const report = { bars: 0, renderMs: [], loadMs: [] };
  for (let i = 0; i < times; i++) {
    // A page away first, so each opening draws the run afresh.
    await page.goto(`${base}/#/`);
    await page.waitForSelector('#runs');
    await page.goto(`${base}/#/run/${run}`);
    await page.waitForFunction(() => document.getElementById('timeline')?.dataset.loadMs, null, { timeout: 60000 });
    const drawn = await page.evaluate(() => {
      const c = document.getElementById('timeline');
      return { bars: Number(c.dataset.bars), renderMs: Number(c.dataset.renderMs), loadMs: Number(c.dataset.loadMs) };
    });
    report.bars = drawn.bars;
    report.renderMs.push(drawn.renderMs);
    report.loadMs.push(drawn.loadMs);
  }
  console.log(JSON.stringify(report));
} finally {
  await browser.close();
}
