// What every dashboard script run by tests/ui.rs shares: the dashboard's address and token
// from the environment (FACTORY_UI_URL, http://ADDR/#code=...; FACTORY_UI_TOKEN, the
// daemon's bearer token for the script's own API calls), a report of named checks that
// throws on the first that fails, the API from Node, and headless Chromium.
import { chromium } from 'playwright-core';

export const url = process.env.FACTORY_UI_URL;
export const token = process.env.FACTORY_UI_TOKEN;
export const base = url.split('/#')[0];
export const report = { ok: false, checks: [] };

/** Record check `name`; a false `value` ends the script's run with `detail`. */
export const check = (name, value, detail) => {
  report.checks.push({ name, ok: !!value, detail });
  if (!value) throw new Error(`check failed: ${name} ${detail === undefined ? '' : JSON.stringify(detail)}`);
};

/** The API from Node (the script's own client, not the page's). */
export async function api(method, p, body) {
  const response = await fetch(base + p, {
    method,
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const value = await response.json();
  if (!response.ok) throw new Error(`${method} ${p}: ${response.status} ${JSON.stringify(value)}`);
  return value;
}

/** Debian's Chromium, headless. */
export function launch() {
  return chromium.launch({
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
}

/** A page of the dashboard, opened and loaded (its runs list drawn), and the errors its
 * scripts throw meanwhile. */
export async function openDashboard(browser, height = 760) {
  const page = await browser.newPage({ viewport: { width: 1100, height } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(url);
  await page.waitForSelector('#runs');
  return { page, errors };
}
