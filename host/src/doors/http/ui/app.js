// The factory dashboard: a small ES module over the JSON API (no framework, no build step).
// Every string from the server is inserted as text (textContent / text nodes), never as HTML:
// factory names, labels and log lines are chosen by guest code.
// The token never rides in a URL: `factory ui` opens `/#code=...` with a one-time code, which
// the page takes off its URL at once and exchanges, once, for a dashboard session token of its
// own (POST /api/ui/exchange); that token is kept in sessionStorage and sent only in the
// Authorization header. "Sign out" ends the session on the server (POST /api/ui/signout).
// An approval checkbox names the sha256 of what it approves. Starts waiting for the owner's
// approval (an untrusted factory started over the API) are listed above every view, with the
// question's facts and Approve once / Approve always / Decline (GET /api/approvals, polled).
// The API's token is the user's: the runs list shows every session's runs, with a session
// column and a filter; runs started here go in the daemon's session (shown in the header).
// The Storage view shows where the store's bytes go, by part and by table (GET /api/stats),
// and collects garbage by a retention policy: a dry run lists the runs that would go, a
// second button deletes them (POST /api/gc).

const TOKEN_KEY = 'factory.token';
const LOG_TAIL = 100; // log entries shown at first
const RUNS_PAGE = 1000; // the most runs the service lists in one page of GET /api/runs
const $ = (id) => document.getElementById(id);

/** The token: exchanged for the one-time code in the URL, else the one kept from before. */
async function takeToken() {
  const match = location.hash.match(/^#code=([0-9A-Za-z]+)/);
  if (!match) return sessionStorage.getItem(TOKEN_KEY);
  history.replaceState(null, '', location.pathname + '#/runs');
  let response;
  try {
    response = await fetch('/api/ui/exchange', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ code: match[1] }), cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `the daemon does not answer (${e.message})`);
  }
  const value = await response.json().catch(() => ({}));
  if (!response.ok || typeof value.token !== 'string') {
    throw new ApiError(response.status, value.code || 'invalid_code', value.message || 'the sign-in code was refused');
  }
  sessionStorage.setItem(TOKEN_KEY, value.token);
  return value.token;
}
let token = null;

/** End this page's dashboard session on the server and forget its token. */
async function signOut() {
  if (token) {
    try { await api('POST', '/api/ui/signout'); } catch (e) { /* already ended: nothing to undo */ }
  }
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  view?.stop?.();
  view = null;
  $('signout').hidden = true;
  $('live').textContent = '○ offline';
  $('live').classList.remove('on');
  $('main').replaceChildren();
  $('approvals').replaceChildren();
  $('approvals').hidden = true;
  approvalsShown = '';
  showError({ code: 'signed_out', message: 'signed out: run `factory ui` to sign in again' });
}

/** The approval checkbox's label: what it approves, by sha256. */
function approvalLabel(hash, script) {
  const what = script ? `script sha256 ${script}, runner sha256 ${hash}` : `sha256 ${hash}`;
  return hash ? `approve this untrusted component (${what})` : 'approve an untrusted component';
}

// ---- DOM helpers -------------------------------------------------------------------------

/** An element with attributes/properties and children (strings become text nodes). */
/** A time axis tick at `t` ms with ticks `step` ms apart: milliseconds below a tenth of a
 *  second a step, else seconds with as many decimals as the step needs. */
function tickLabel(t, step) {
  if (step < 100) return `${Math.round(t)}ms`;
  return `${(t / 1000).toFixed(step < 1000 ? 1 : 0)}s`;
}

/** Replace `el`'s children with `children`, leaving out the absent ones (`null`, `undefined`,
 *  `false`): the DOM's own `replaceChildren` would print them as text. */
function put(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'style') Object.assign(el.style, value); // CSSOM: the CSP forbids style attributes
    else if (key in el && typeof value !== 'string') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const statusBadge = (status) => h('span', { class: `status status-${status}`, dataset: { status } }, status);
const fmtTime = (rfc) => (rfc ? new Date(rfc).toLocaleString() : '');
const fmtSecs = (s) => (s >= 60 ? `${Math.floor(s / 60)}m ${Math.round(s % 60)}s` : `${(s || 0).toFixed(1)}s`);
const fmtCredits = (nano) => ((nano || 0) / 1e9).toFixed(4);
// A spend whose cost is a lower bound reads "≥ 0.1234" (one credit is US$0.01).
const fmtSpend = (nano, atLeast) => (atLeast ? `≥ ${fmtCredits(nano)}` : fmtCredits(nano));
const agentsOf = (env) => (env.accounting?.agentsSpawned || 0);

function showError(err) {
  const box = $('error');
  if (!err) { box.hidden = true; box.textContent = ''; return; }
  box.hidden = false;
  box.textContent = err.code ? `${err.code}: ${err.message}` : String(err.message || err);
}

// ---- API -----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `the daemon does not answer (${e.message})`);
  }
  const text = await response.text();
  let value = null;
  try { value = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!response.ok) {
    throw new ApiError(response.status, value?.code || `http_${response.status}`, value?.message || text);
  }
  return value;
}

/** Every progress entry after `afterSeq`, a page of 1,000 at a time. */
async function progressAfter(runId, afterSeq, onPage) {
  for (;;) {
    const page = await api('GET', `/api/runs/${encodeURIComponent(runId)}/progress?afterSeq=${afterSeq}&limit=1000`);
    if (page.length) { onPage(page); afterSeq = page[page.length - 1].seq; }
    if (page.length < 1000) return afterSeq;
  }
}

// ---- Live events (SSE read with fetch: EventSource cannot send the header) -----------------

const listeners = new Set();

async function followEvents() {
  for (let delay = 500; token; delay = Math.min(delay * 2, 10000)) {
    try {
      const response = await fetch('/api/events', { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
      if (!response.ok) throw new Error(`events: HTTP ${response.status}`);
      $('live').textContent = '● live';
      $('live').classList.add('on');
      delay = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let event = 'message', data = '';
          for (const line of block.split('\n')) {
            if (line.startsWith('event: ')) event = line.slice(7);
            else if (line.startsWith('data: ')) data += line.slice(6);
          }
          if (event === 'run_updated' && data) {
            const update = JSON.parse(data);
            for (const listener of listeners) listener(update);
          }
        }
      }
    } catch (e) { /* reconnect below */ }
    if (!token) break;
    $('live').textContent = '○ reconnecting';
    $('live').classList.remove('on');
    await new Promise((r) => setTimeout(r, delay));
  }
}

/** Call `fn` once triggers pause for `ms`, but at least every `maxMs` while they keep coming
 *  (a busy run announces many revisions a second). */
function debounce(fn, ms, maxMs = 1000) {
  let timer = null, first = 0;
  return () => {
    const now = performance.now();
    if (timer === null) first = now;
    clearTimeout(timer);
    timer = setTimeout(() => { timer = null; fn(); }, Math.max(0, Math.min(ms, first + maxMs - now)));
  };
}

// ---- Views ---------------------------------------------------------------------------------

let view = null; // { stop() } of the view shown
let sessionFilter = ''; // the session the runs list shows ('': every session)

function route() {
  view?.stop?.();
  view = null;
  if (!token) return;
  showError(null);
  const main = $('main');
  main.replaceChildren();
  const hash = location.hash || '#/runs';
  const runMatch = hash.match(/^#\/run\/([^/?#]+)$/);
  for (const a of document.querySelectorAll('header nav a')) a.classList.toggle('active', a.getAttribute('href') === hash);
  if (runMatch) view = runView(main, decodeURIComponent(runMatch[1]));
  else if (hash === '#/start' || hash.startsWith('#/start/')) view = startView(main, decodeURIComponent(hash.slice(8)));
  else if (hash === '#/storage') view = storageView(main);
  else view = runsView(main);
}

function runsView(main) {
  const body = h('tbody');
  const table = h('table', { id: 'runs' },
    h('thead', {}, h('tr', {}, h('th', {}, 'run'), h('th', {}, 'session'), h('th', {}, 'factory'), h('th', {}, 'status'),
      h('th', {}, 'started'), h('th', { class: 'num' }, 'active'), h('th', { class: 'num' }, 'agents'), h('th', { class: 'num' }, 'credits'))),
    body);
  const empty = h('p', { class: 'muted', id: 'runs-empty', hidden: true });
  // The sessions to filter by are those of the runs listed (every session's: the owner's view).
  const filter = h('select', { id: 'session-filter', name: 'session', onchange: () => { sessionFilter = filter.value; show(); } });
  main.append(h('h1', {}, 'Runs'), h('div', { class: 'actions' }, h('label', { class: 'check' }, 'session', filter)), table, empty);
  let stopped = false;
  let runs = [];
  let offered = null; // the sessions the filter offers, joined (rebuilt only when they change)
  const show = () => {
    const sessions = [...new Set(runs.map((run) => run.session ?? ''))].sort();
    if (sessionFilter && !sessions.includes(sessionFilter)) sessions.push(sessionFilter);
    if (offered !== sessions.join('\n')) {
      offered = sessions.join('\n');
      filter.replaceChildren(h('option', { value: '' }, 'all sessions'), ...sessions.map((s) => h('option', { value: s }, s)));
    }
    filter.value = sessionFilter;
    const shown = runs.filter((run) => !sessionFilter || run.session === sessionFilter);
    body.replaceChildren(...shown.map((run) => h('tr', {
      class: 'run-row', dataset: { runId: run.runId, status: run.status, revision: run.revision, session: run.session ?? '' },
      onclick: () => { location.hash = `#/run/${encodeURIComponent(run.runId)}`; },
    },
    h('td', { class: 'mono' }, h('a', { href: `#/run/${encodeURIComponent(run.runId)}`, title: run.runId }, `…${run.runId.slice(-12)}`)),
    h('td', { class: 'session-cell mono' }, run.session ?? ''), h('td', {}, run.factory), h('td', { class: 'status-cell' }, statusBadge(run.status)),
    h('td', {}, fmtTime(run.createdAt)),
    h('td', { class: 'num' }, fmtSecs(run.accounting.activeSeconds)),
    h('td', { class: 'num agents' }, agentsOf(run)),
    h('td', { class: 'num credits', dataset: { atLeast: String(!!run.accounting.aiCreditsAtLeast) } },
      fmtSpend(run.accounting.aiCreditsNano, run.accounting.aiCreditsAtLeast)))));
    empty.hidden = shown.length > 0;
    empty.replaceChildren(sessionFilter ? `No runs in session ${sessionFilter}. ` : 'No runs yet. ', h('a', { href: '#/start' }, 'Start one.'));
  };
  const load = async () => {
    try {
      // The service lists a page of summaries at a time: ask page after page.
      const listed = [];
      for (;;) {
        const after = listed.length > 0 ? `&after=${encodeURIComponent(listed[listed.length - 1].runId)}` : '';
        const page = await api('GET', `/api/runs?limit=${RUNS_PAGE}${after}`);
        listed.push(...page);
        if (stopped || page.length < RUNS_PAGE) break;
      }
      if (stopped) return;
      runs = listed.reverse(); // newest first
      show();
    } catch (e) { showError(e); }
  };
  const refresh = debounce(load, 150);
  listeners.add(refresh);
  load();
  return { stop() { stopped = true; listeners.delete(refresh); } };
}

// ---- The agent timeline --------------------------------------------------------------------

const COLORS = { ok: '#2e9e5b', failed: '#d64545', cached: '#7a6fd6', aborted: '#e0a030', running: '#4a90d9', queued: '#c3c8d0' };

/** Agent bars built from progress entries: queued (q) → started (s) → finished (f). */
class Timeline {
  constructor() {
    this.bars = [];         // { label, attempt, q, s, f, status }
    this.open = new Map();  // label → bars not finished, oldest first
    this.attempt = 1;
    this.replayed = 0;      // agent calls answered from the journal on resume (counted per attempt)
  }
  openOf(label) {
    let list = this.open.get(label);
    if (!list) { list = []; this.open.set(label, list); }
    return list;
  }
  add(entry) {
    const at = entry.atMs;
    switch (entry.event) {
      case 'attemptStarted': this.attempt = entry.attempt; break;
      case 'agentQueued': {
        const bar = { label: entry.label, attempt: this.attempt, q: at, s: null, f: null, status: null };
        this.bars.push(bar);
        this.openOf(entry.label).push(bar);
        break;
      }
      case 'agentStarted': {
        const list = this.openOf(entry.label);
        const waiting = list.find((b) => b.s === null);
        if (entry.attempt > 0) {
          // A schema retry of a call already started: its re-queue is not another agent.
          if (waiting && list.some((b) => b.s !== null)) {
            list.splice(list.indexOf(waiting), 1);
            this.bars.splice(this.bars.lastIndexOf(waiting), 1);
          }
          break;
        }
        if (waiting) waiting.s = at;
        else {
          const bar = { label: entry.label, attempt: this.attempt, q: at, s: at, f: null, status: null };
          this.bars.push(bar);
          list.push(bar);
        }
        break;
      }
      case 'agentFinished': {
        const status = entry.cached ? 'cached' : entry.status;
        const list = this.openOf(entry.label);
        let bar = entry.cached ? null : (list.find((b) => b.s !== null) || list[0]);
        if (bar) list.splice(list.indexOf(bar), 1);
        else {
          bar = { label: entry.label, attempt: this.attempt, q: at - (entry.millis || 0), s: at - (entry.millis || 0), f: null, status: null };
          this.bars.push(bar);
        }
        bar.f = at;
        bar.status = status;
        bar.millis = entry.millis;
        break;
      }
      case 'attemptEnded': {
        // Calls still open when their attempt ended were aborted (cancel, limit, shutdown).
        for (const list of this.open.values()) {
          for (const bar of list) { bar.f = at; bar.status = 'aborted'; if (bar.s === null) bar.s = at; }
          list.length = 0;
        }
        this.replayed += entry.replayed || 0;
        break;
      }
      default: break;
    }
  }
  counts() {
    const c = { ok: 0, failed: 0, cached: 0, aborted: 0, running: 0, queued: 0 };
    for (const b of this.bars) c[b.status || (b.s === null ? 'queued' : 'running')] += 1;
    return c;
  }
}

/** Draw the bars on the canvas; returns the milliseconds it took. */
function drawTimeline(canvas, timeline, now) {
  const t0 = performance.now();
  const bars = timeline.bars;
  const n = bars.length;
  const rowH = Math.max(2, Math.min(14, Math.floor(480 / Math.max(n, 1))));
  const axisH = 18;
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.parentElement.clientWidth || 800;
  const height = axisH + Math.max(n, 1) * rowH;
  canvas.style.height = `${height}px`;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  let start = Infinity, end = -Infinity;
  for (const b of bars) {
    if (b.q < start) start = b.q;
    const e = b.f ?? now;
    if (e > end) end = e;
  }
  if (!n) { start = 0; end = 1; }
  const span = Math.max(end - start, 1);
  const x = (t) => ((t - start) / span) * (width - 2) + 1;
  // Time axis (our own numbers, not server text).
  ctx.fillStyle = '#6b7280';
  ctx.font = '11px system-ui, sans-serif';
  const step = niceStep(span / 8);
  const ticks = [];
  for (let t = 0; t <= span; t += step) {
    const px = x(start + t);
    ctx.fillRect(px, axisH - 4, 1, 4);
    ticks.push(tickLabel(t, step));
    ctx.fillText(ticks[ticks.length - 1], Math.min(px + 2, width - 30), 11);
  }
  canvas.dataset.ticks = ticks.join(' ');
  canvas.dataset.spanMs = String(Math.round(span));
  // Bars, one colour at a time: queued part, then the running/finished part.
  const gap = rowH > 3 ? 1 : 0;
  ctx.fillStyle = COLORS.queued;
  for (let i = 0; i < n; i++) {
    const b = bars[i];
    const s = b.s ?? now;
    if (s > b.q) ctx.fillRect(x(b.q), axisH + i * rowH, Math.max(x(s) - x(b.q), 1), rowH - gap);
  }
  for (const status of ['ok', 'failed', 'cached', 'aborted', 'running']) {
    ctx.fillStyle = COLORS[status];
    for (let i = 0; i < n; i++) {
      const b = bars[i];
      if ((b.status || (b.s === null ? 'queued' : 'running')) !== status) continue;
      const s = b.s ?? b.q, e = b.f ?? now;
      ctx.fillRect(x(s), axisH + i * rowH, Math.max(x(e) - x(s), 2), rowH - gap);
    }
  }
  canvas.dataset.bars = String(n);
  canvas.dataset.rowHeight = String(rowH);
  canvas.dataset.axisHeight = String(axisH);
  canvas.dataset.start = String(start);
  canvas.dataset.span = String(span);
  const ms = performance.now() - t0;
  canvas.dataset.renderMs = ms.toFixed(2);
  return ms;
}

function niceStep(raw) {
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

// ---- Cost chart ----------------------------------------------------------------------------

// What a run's agents spent, by the phase they finished in and by the model they asked for,
// summed from its `agentFinished` progress entries (replayed calls cost nothing). Drawn as
// horizontal bars: AI credits when any call has a known cost, else tokens (in + out).
class Costs {
  constructor() { this.phase = new Map(); this.model = new Map(); this.credits = 0; }
  add(e) {
    if (e.event !== 'agentFinished' || e.cached) return;
    const spend = { nano: e.creditsNano || 0, atLeast: !!e.creditsAtLeast, tokens: (e.inputTokens || 0) + (e.outputTokens || 0) };
    this.credits += spend.nano;
    for (const [map, key] of [[this.phase, e.phase || '(no phase)'], [this.model, e.model || '(default model)']]) {
      const sum = map.get(key) || { nano: 0, atLeast: false, tokens: 0 };
      map.set(key, { nano: sum.nano + spend.nano, atLeast: sum.atLeast || spend.atLeast, tokens: sum.tokens + spend.tokens });
    }
  }
  draw(box) {
    const byCredits = this.credits > 0;
    const value = (s) => (byCredits ? s.nano : s.tokens);
    const group = (title, kind, map) => {
      const rows = [...map.entries()].sort((a, b) => value(b[1]) - value(a[1]));
      const max = Math.max(1, ...rows.map(([, s]) => value(s)));
      return h('div', { class: 'cost-group', dataset: { group: kind } }, h('h3', {}, title),
        ...rows.map(([key, s]) => h('div', { class: 'cost-row', dataset: { key, creditsNano: s.nano, tokens: s.tokens } },
          h('span', { class: 'cost-key', title: key }, key),
          h('span', { class: 'cost-bar' }, h('i', { style: { width: `${(100 * value(s)) / max}%` } })),
          h('span', { class: 'cost-value' }, byCredits ? fmtSpend(s.nano, s.atLeast) : `${s.tokens} tokens`))));
    };
    if (!this.phase.size) { put(box, h('span', { class: 'muted' }, 'no agent has finished yet')); return; }
    box.dataset.unit = byCredits ? 'credits' : 'tokens';
    put(box, h('div', { class: 'muted' }, byCredits ? 'AI credits spent' : 'tokens used (no call has a known cost)'),
      group('by phase', 'phase', this.phase), group('by model', 'model', this.model));
  }
}

// ---- Run view ------------------------------------------------------------------------------

function runView(main, runId) {
  let stopped = false;
  let detail = null;
  let declared; // declared phases of the factory (null when it is not registered)
  let lastSeq = 0;     // the timeline has every entry up to here
  let loading = null;
  const timeline = new Timeline();
  const costs = new Costs();
  const costChart = h('div', { class: 'panel costs', id: 'costs' });

  const title = h('h1', {}, 'Run ', h('span', { class: 'mono' }, runId));
  const head = h('div', { class: 'panel', id: 'run-head' });
  const failure = h('div', { class: 'panel failure', id: 'failure', hidden: true });
  const accounting = h('div', { class: 'panel grid', id: 'accounting' });
  const flows = h('div', { class: 'panel', id: 'flows', hidden: true });
  const phases = h('ul', { class: 'phases', id: 'phases' });
  const canvas = h('canvas', { class: 'timeline', id: 'timeline' });
  const tip = h('div', { class: 'tip', hidden: true });
  const legend = h('div', { class: 'legend', id: 'legend' });
  const log = h('div', { class: 'log', id: 'log' });
  const follow = h('input', { type: 'checkbox', id: 'follow', checked: true });
  const older = h('button', { id: 'older', onclick: () => loadOlder() }, 'Older entries');
  let logOldest = null, logNewest = 0;

  main.append(title, head, failure, flows, accounting,
    h('h2', {}, 'Phases'), phases, h('h2', {}, 'Cost'), costChart,
    h('h2', {}, 'Agent timeline'), legend, h('div', { class: 'timeline-wrap' }, canvas), tip,
    h('h2', {}, 'Progress'), h('div', { class: 'actions' }, older, h('label', { class: 'check' }, follow, 'follow')), log);

  // Hover: the bar's label, status and times (never a prompt: the API has none).
  canvas.addEventListener('mousemove', (ev) => {
    const rect = canvas.getBoundingClientRect();
    const row = Math.floor((ev.clientY - rect.top - Number(canvas.dataset.axisHeight)) / Number(canvas.dataset.rowHeight));
    const bar = timeline.bars[row];
    if (!bar) { tip.hidden = true; return; }
    const status = bar.status || (bar.s === null ? 'queued' : 'running');
    const waited = bar.s !== null ? ((bar.s - bar.q) / 1000).toFixed(2) : '…';
    const ran = bar.f !== null && bar.s !== null ? ((bar.f - bar.s) / 1000).toFixed(2) : '…';
    tip.textContent = `${bar.label}\n${status} · attempt ${bar.attempt} · queued ${waited}s · ran ${ran}s`;
    tip.style.left = `${ev.clientX + 12}px`;
    tip.style.top = `${ev.clientY + 12}px`;
    tip.hidden = false;
  });
  canvas.addEventListener('mouseleave', () => { tip.hidden = true; });

  const logLine = (e) => {
    let text = '';
    switch (e.event) {
      case 'log': text = e.message; break;
      case 'phase': text = e.title; break;
      case 'agentQueued': text = e.label; break;
      case 'agentStarted': text = e.attempt ? `${e.label} (retry ${e.attempt})` : e.label; break;
      case 'agentFinished': {
        const spent = e.cached ? '' : `, ${fmtSpend(e.creditsNano, e.creditsAtLeast)} credits, tokens ${e.inputTokens ?? 0} in / ${e.outputTokens ?? 0} out / ${e.cacheReadTokens ?? 0} cache read / ${e.cacheWriteTokens ?? 0} cache write`;
        text = `${e.label}: ${e.cached ? 'replayed' : e.status} in ${e.millis} ms${spent}`;
        break;
      }
      case 'attemptStarted': text = `attempt ${e.attempt}`; break;
      case 'attemptEnded': text = `${e.status}${e.replayed ? `, ${e.replayed} replayed` : ''}`; break;
      default: text = '';
    }
    return h('div', { dataset: { seq: e.seq } }, h('span', { class: 'seq' }, `#${e.seq}`), h('span', { class: 'ev' }, e.event), text);
  };

  const appendLog = (entries) => {
    const fresh = entries.filter((e) => e.seq > logNewest);
    if (!fresh.length) return;
    if (logOldest === null) logOldest = fresh[0].seq;
    logNewest = fresh[fresh.length - 1].seq;
    log.append(...fresh.map(logLine));
    while (log.childElementCount > 2000) { log.firstElementChild.remove(); logOldest = Number(log.firstElementChild.dataset.seq); }
    if (follow.checked) log.scrollTop = log.scrollHeight;
  };

  async function loadOlder() {
    if (logOldest === null || logOldest <= 1) return;
    try {
      const page = await api('GET', `/api/runs/${encodeURIComponent(runId)}/progress?beforeSeq=${logOldest}&limit=200`);
      if (!page.length) { older.disabled = true; return; }
      follow.checked = false;
      log.prepend(...page.map(logLine));
      logOldest = page[0].seq;
      older.disabled = logOldest <= 1;
    } catch (e) { showError(e); }
  }

  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      drawTimeline(canvas, timeline, Date.now());
      costs.draw(costChart);
      const c = timeline.counts();
      const parts = [...Object.entries(c).map(([k, v]) =>
        h('span', { dataset: { kind: k, count: v } }, h('i', { style: { background: COLORS[k] } }), `${k === 'cached' ? 'replayed/cached' : k} ${v}`)),
      h('span', { class: 'muted' }, `${timeline.bars.length} agents`),
      timeline.replayed ? h('span', { class: 'muted' }, `${timeline.replayed} calls replayed from the journal on resume`) : null];
      put(legend, parts);
    });
  };

  function renderHead() {
    const env = detail;
    const running = env.status === 'running' || env.status === 'pending';
    const cancel = h('button', { class: 'danger', id: 'cancel', disabled: !running, onclick: async () => {
      cancel.disabled = true;
      try { await api('POST', `/api/runs/${encodeURIComponent(runId)}/cancel`); } catch (e) { showError(e); }
      refresh();
    } }, 'Cancel');
    const pause = h('button', { id: 'pause', disabled: env.status !== 'running', onclick: async () => {
      pause.disabled = true;
      try { await api('POST', `/api/runs/${encodeURIComponent(runId)}/pause`); } catch (e) { showError(e); }
      refresh();
    } }, 'Pause');
    const limitInputs = [
      ['maxConcurrentSubagents', 'max concurrent', 1], ['maxTotalSubagents', 'max total agents', 1],
      ['timeoutSeconds', 'timeout (s)', 'any'], ['maxAiCredits', 'max credits', 'any'],
    ].map(([key, text, step]) => h('label', {}, text,
      h('input', { type: 'number', name: key, min: 0, step, placeholder: env.limits?.[key] ?? '' })));
    const approved = h('input', { type: 'checkbox', name: 'approved' });
    const resume = h('form', { class: 'limits', id: 'resume-form', hidden: running || env.status === 'completed', onsubmit: async (ev) => {
      ev.preventDefault();
      const limits = {};
      for (const input of resume.querySelectorAll('input[type=number]')) if (input.value !== '') limits[input.name] = Number(input.value);
      try {
        await api('POST', `/api/runs/${encodeURIComponent(runId)}/resume`, { limits, approved: approved.checked });
        showError(null);
      } catch (e) { showError(e); }
      refresh();
    } }, ...limitInputs,
    h('label', { class: 'check', id: 'resume-approval' }, approved,
      approvalLabel(env.componentHashes?.at(-1), env.scripts?.at(-1)?.sha256)),
    h('button', { class: 'primary', id: 'resume', type: 'submit' }, 'Resume'));
    // A run paused at a checkpoint: its key, and an answer (JSON) its `ctx.pause(key)` returns.
    const waiting = env.status === 'paused' && env.checkpoint != null;
    const answerText = h('textarea', { id: 'answer-input', rows: 3, placeholder: '{"approved": true}' });
    const answer = h('button', { class: 'primary', id: 'answer', type: 'button', onclick: async () => {
      let input;
      try { input = JSON.parse(answerText.value); } catch (e) { showError(new Error(`the answer is not JSON: ${e.message}`)); return; }
      answer.disabled = true;
      try {
        await api('POST', `/api/runs/${encodeURIComponent(runId)}/resume`, { input, approved: approved.checked });
        showError(null);
      } catch (e) { showError(e); }
      refresh();
    } }, 'Answer');
    const checkpoint = waiting ? h('div', { class: 'panel checkpoint', id: 'checkpoint' },
      h('div', {}, 'Waits at checkpoint ', h('code', { id: 'checkpoint-key' }, env.checkpoint),
        ': answer it (JSON, what ctx.pause returns), or Resume below to continue without an answer.'),
      answerText, answer) : null;
    put(head,
      h('div', { class: 'actions' }, h('b', {}, env.factory), statusBadge(env.status), h('span', { id: 'run-status', hidden: true }, env.status),
        h('span', { class: 'muted' }, 'session ', h('span', { id: 'run-session' }, env.session ?? '')),
        h('span', { class: 'muted' }, `attempt ${env.attempts} · started ${fmtTime(env.createdAt)} · updated ${fmtTime(env.updatedAt)}`),
        env.backend ? h('span', { class: 'muted' }, `backend ${env.backend.name ?? JSON.stringify(env.backend)}`) : null,
        // A settled run has nothing to pause or cancel.
        running ? pause : null, running ? cancel : null),
      checkpoint, resume);
    if (env.failure || env.error) {
      // The CLI is the owner: it resumes a run of any session by its id.
      const cmd = `factory resume ${runId}`;
      failure.hidden = false;
      put(failure,
        h('b', {}, env.failure ? `${env.failure.type}${env.failure.kind ? ` (${env.failure.kind})` : ''}` : 'error'),
        h('div', {}, env.failure?.message ?? env.error),
        env.status === 'completed' ? null : h('div', {}, 'Resume it here with raised limits, or: ', h('code', { id: 'resume-command' }, cmd)));
    } else failure.hidden = true;
    // The backend's flows while the run executes: a line per flow (shared with other runs).
    const flowLine = (f) => {
      const rate = f.requestsPerSecond != null ? `${+f.requestsPerSecond.toFixed(1)} req/s` : 'no rate limit known';
      const why = f.queued > 0 && f.waitingFor ? `, waiting for ${f.waitingFor.replace('_', ' ')}` : '';
      return h('div', { class: 'flow', dataset: { backend: f.backend, queued: f.queued, throttled: f.throttled } },
        h('b', {}, f.backend), ` ${f.queued} queued, ${f.inFlight} in flight (limit ${f.limit}), ${rate}${why}, `
          + `${f.throttled} throttled (429/529/503), waited ${fmtSecs(f.waitSeconds)} in all`);
    };
    flows.hidden = !running || !(env.flows?.length);
    flows.replaceChildren(h('span', { class: 'muted' }, 'backend flow'), ...(running ? env.flows ?? [] : []).map(flowLine));
    const a = env.accounting;
    const cell = (k, v) => h('div', {}, h('span', {}, k), v);
    accounting.replaceChildren(cell('agents spawned', a.agentsSpawned), cell('replayed (cache hits)', a.agentCacheHits),
      cell('active time', fmtSecs(a.activeSeconds)),
      h('div', { id: 'ai-credits', dataset: { atLeast: String(!!a.aiCreditsAtLeast) },
        title: a.aiCreditsAtLeast ? 'a lower bound: some spend has no known cost' : 'one credit is US$0.01' },
        h('span', {}, a.aiCreditsAtLeast ? 'AI credits (at least)' : 'AI credits'), fmtSpend(a.aiCreditsNano, a.aiCreditsAtLeast)),
      cell('tokens in / out', `${a.inputTokens} / ${a.outputTokens}`),
      cell('cache read / write', `${a.cacheReadTokens ?? 0} / ${a.cacheWriteTokens ?? 0}`),
      cell('attempts', env.attempts), cell('revision', env.revision));
    const entered = env.phases || [];
    const current = running ? entered[entered.length - 1] : null;
    const names = declared ? declared.map((p) => p.title) : [];
    for (const p of entered) if (!names.includes(p)) names.push(p);
    phases.replaceChildren(...names.map((p) => {
      const state = p === current ? 'current' : entered.includes(p) ? 'done' : 'pending';
      return h('li', { class: state, dataset: { state }, title: state }, p);
    }));
    if (!names.length) phases.replaceChildren(h('li', { class: 'pending' }, 'no phase entered'));
  }

  async function load() {
    const d = await api('GET', `/api/runs/${encodeURIComponent(runId)}`);
    if (stopped) return;
    detail = d;
    if (declared === undefined) {
      declared = await api('GET', `/api/factories/${encodeURIComponent(d.factory)}`).then((r) => r.meta.phases).catch(() => null);
    }
    renderHead();
    // The timeline takes every entry; the log starts with the latest LOG_TAIL (older pages
    // on demand, via beforeSeq).
    const fresh = [];
    lastSeq = await progressAfter(runId, lastSeq, (page) => {
      for (const e of page) { timeline.add(e); costs.add(e); }
      fresh.push(...page);
      if (fresh.length > 4 * LOG_TAIL) fresh.splice(0, fresh.length - LOG_TAIL);
    });
    if (stopped) return;
    appendLog(logNewest === 0 ? fresh.slice(-LOG_TAIL) : fresh);
    older.disabled = logOldest === null || logOldest <= 1;
    redraw();
  }

  // One load at a time; a trigger while loading runs once more afterwards.
  let again = false;
  async function refresh() {
    if (loading) { again = true; return; }
    loading = load().catch(showError);
    await loading;
    loading = null;
    if (again && !stopped) { again = false; refresh(); }
  }
  const refreshSoon = debounce(refresh, 100);
  const onUpdate = (u) => { if (u.runId === runId) refreshSoon(); };
  listeners.add(onUpdate);
  // While calls wait in the backend's flow, nothing the run journals says how the queue
  // moves: the detail is read again every second then.
  const ticker = setInterval(() => {
    if (detail?.status !== 'running') return;
    redraw();
    if (detail.flows?.some((f) => f.queued > 0)) refreshSoon();
  }, 1000);
  const resized = () => redraw();
  window.addEventListener('resize', resized);

  (async () => {
    const opened = performance.now();
    await refresh();
    // After the frame that draws it (its callback was queued first).
    await new Promise((resolve) => requestAnimationFrame(resolve));
    canvas.dataset.entries = String(lastSeq);
    canvas.dataset.loadMs = (performance.now() - opened).toFixed(1);
  })();
  return { stop() { stopped = true; listeners.delete(onUpdate); clearInterval(ticker); window.removeEventListener('resize', resized); } };
}

// ---- Start a run ---------------------------------------------------------------------------

function startView(main, preselected) {
  let stopped = false;
  const select = h('select', { id: 'factory', name: 'factory' });
  const fields = h('div', { id: 'args-fields', class: 'panel' });
  const describe = h('p', { class: 'muted' });
  main.append(h('h1', {}, 'Start a run'), h('label', {}, 'factory', select), describe, fields);
  let factories = [];

  async function showForm(name) {
    fields.replaceChildren();
    if (!name) return;
    let registration;
    try { registration = await api('GET', `/api/factories/${encodeURIComponent(name)}`); } catch (e) { showError(e); return; }
    if (stopped) return;
    const meta = registration.meta;
    describe.textContent = meta.description;
    const schema = meta.argsSchema;
    const props = schema?.type === 'object' ? schema.properties || {} : null;
    const simple = props && Object.values(props).every((p) => ['string', 'number', 'integer', 'boolean'].includes(p.type)
      || (p.type === 'array' && p.items?.type === 'string'));
    const required = new Set(schema?.required || []);
    const inputs = [];
    if (simple) {
      for (const [key, p] of Object.entries(props)) {
        let input;
        if (p.type === 'boolean') input = h('input', { type: 'checkbox', name: key, checked: p.default === true });
        else if (Array.isArray(p.enum)) input = h('select', { name: key }, required.has(key) ? null : h('option', { value: '' }, ''), ...p.enum.map((v) => h('option', { value: String(v) }, String(v))));
        else if (p.type === 'array') input = h('textarea', { name: key, placeholder: 'one per line' });
        else input = h('input', { type: p.type === 'string' ? 'text' : 'number', name: key, step: p.type === 'integer' ? 1 : 'any', required: required.has(key), value: p.default ?? '' });
        inputs.push([key, p, input]);
        fields.append(h('label', { class: p.type === 'boolean' ? 'check' : '' }, p.type === 'boolean' ? input : null,
          `${key}${required.has(key) ? ' *' : ''}${p.description ? ` — ${p.description}` : ''}`, p.type === 'boolean' ? null : input));
      }
    }
    const json = h('textarea', { name: 'args', id: 'args-json', placeholder: '{ }' });
    if (!simple) fields.append(h('label', {}, schema ? 'args (JSON, must match the schema below)' : 'args (JSON)', json),
      schema ? h('pre', { class: 'mono muted' }, JSON.stringify(schema, null, 2)) : null);
    const limitInputs = ['maxConcurrentSubagents', 'maxTotalSubagents', 'timeoutSeconds', 'maxAiCredits'].map((key) =>
      h('label', {}, key, h('input', { type: 'number', name: key, min: 0, step: 'any', placeholder: meta.limits?.[key] ?? '' })));
    const approved = h('input', { type: 'checkbox', name: 'approved' });
    const form = h('form', { class: 'start', id: 'start-form', onsubmit: async (ev) => {
      ev.preventDefault();
      let args;
      try {
        if (simple) {
          args = {};
          for (const [key, p, input] of inputs) {
            if (p.type === 'boolean') args[key] = input.checked;
            else if (input.value === '') continue;
            else if (p.type === 'array') args[key] = input.value.split('\n').map((s) => s.trim()).filter(Boolean);
            else if (p.type === 'string') args[key] = input.value;
            else args[key] = Number(input.value);
          }
        } else if (json.value.trim()) args = JSON.parse(json.value);
      } catch (e) { showError({ code: 'invalid_args', message: `args are not JSON: ${e.message}` }); return; }
      const limits = {};
      for (const input of form.querySelectorAll('.limits input')) if (input.value !== '') limits[input.name] = Number(input.value);
      try {
        // Not trusted and not approved here: it waits in the approvals above, not in this request.
        const started = await api('POST', '/api/runs', { name, args, limits, approved: approved.checked, approvalWaitSeconds: 0 });
        if (started.status === 'pending_approval') { await loadApprovals(); return; }
        location.hash = `#/run/${encodeURIComponent(started.runId)}`;
      } catch (e) { showError(e); }
    } }, h('div', { class: 'limits actions' }, ...limitInputs),
    h('label', { class: 'check', id: 'start-approval' }, approved, approvalLabel(registration.hash, registration.script?.sha256)),
    h('div', {}, h('button', { class: 'primary', id: 'start', type: 'submit' }, 'Start')));
    fields.append(form);
  }

  (async () => {
    try { factories = await api('GET', '/api/factories'); } catch (e) { showError(e); return; }
    if (stopped) return;
    select.replaceChildren(h('option', { value: '' }, factories.length ? 'choose a factory' : 'no registered factories (factory add ...)'),
      ...factories.map((f) => h('option', { value: f.meta.name }, f.meta.name)));
    select.addEventListener('change', () => showForm(select.value));
    if (preselected) { select.value = preselected; showForm(preselected); }
  })();
  return { stop() { stopped = true; } };
}

// ---- Storage --------------------------------------------------------------------------------

/** `n` bytes for a reader: B, KiB, MiB, GiB. */
function fmtBytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}
const fmtCount = (n) => Number(n).toLocaleString('en-US');
/** A table's bytes in the file: its rows, the room its pages leave unused, its branches. */
const tableBytes = (t) => t.storedBytes + t.fragmentedBytes + t.metadataBytes;

function storageView(main) {
  let stopped = false;
  const summary = h('div', { class: 'panel grid', id: 'storage-summary' });
  const parts = h('div', { class: 'panel', id: 'storage-parts' });
  const tables = h('tbody');
  const byTable = h('table', { id: 'storage-tables' },
    h('thead', {}, h('tr', {}, h('th', {}, 'table'), h('th', { class: 'num' }, 'rows'), h('th', { class: 'num' }, 'stored bytes'),
      h('th', { class: 'num' }, 'bytes in the file'), h('th', { class: 'num' }, ''))), tables);
  const gc = h('div', { class: 'panel', id: 'gc' });
  main.append(h('h1', {}, 'Storage'), summary, h('h2', {}, 'By part'), parts, h('h2', {}, 'By table'), byTable,
    h('h2', {}, 'Collect garbage'), gc);

  async function load() {
    let stats;
    try { stats = await api('GET', '/api/stats'); } catch (e) { showError(e); return; }
    if (stopped) return;
    if (stats === null) {
      put(summary, h('p', { class: 'muted' }, 'this store does not measure itself'));
      put(parts); put(tables);
      return;
    }
    const fact = (name, key, value, text) => h('div', {}, h('span', {}, name), h('b', { dataset: { fact: key, bytes: value } }, text));
    put(summary, fact('file', 'fileBytes', stats.fileBytes, `${fmtBytes(stats.fileBytes)} (${fmtCount(stats.fileBytes)} bytes)`),
      fact('on disk', 'diskBytes', stats.diskBytes, fmtBytes(stats.diskBytes)),
      fact('page size', 'pageSize', stats.pageSize, fmtBytes(stats.pageSize)),
      fact('pages in use', 'allocatedPages', stats.allocatedPages, fmtCount(stats.allocatedPages)));
    const max = Math.max(1, ...stats.parts.map((p) => p.bytes));
    put(parts, stats.parts.map((p) => h('div', { class: 'size-row', dataset: { part: p.part, bytes: p.bytes, rows: p.rows } },
      h('span', { class: 'size-key', title: p.part }, p.part),
      h('span', { class: 'cost-bar' }, h('i', { style: { width: `${(100 * p.bytes) / max}%` } })),
      h('span', { class: 'size-value', title: `${fmtCount(p.bytes)} bytes` }, fmtBytes(p.bytes)),
      h('span', { class: 'size-bytes' }, fmtCount(p.bytes)),
      h('span', { class: 'size-rows muted' }, p.rows ? `${fmtCount(p.rows)} rows` : ''))));
    const sorted = [...stats.tables].sort((a, b) => tableBytes(b) - tableBytes(a) || a.name.localeCompare(b.name));
    put(tables, sorted.map((t) => h('tr', { dataset: { table: t.name } }, h('td', { class: 'mono' }, t.name),
      h('td', { class: 'num' }, fmtCount(t.entries)), h('td', { class: 'num' }, fmtCount(t.storedBytes)),
      h('td', { class: 'num' }, fmtCount(tableBytes(t))), h('td', { class: 'num muted' }, fmtBytes(tableBytes(t))))));
  }

  // Collect garbage: the policy, a dry run listing what would go, then the deletion.
  const keepDays = h('input', { type: 'number', name: 'keepDays', min: 0, step: 1, placeholder: 'none' });
  const keepLast = h('input', { type: 'number', name: 'keepLast', min: 0, step: 1, placeholder: 'none' });
  const outcome = h('div', { id: 'gc-outcome' });
  const policy = () => {
    const body = {};
    if (keepDays.value !== '') body.keepDays = Number(keepDays.value);
    if (keepLast.value !== '') body.keepLast = Number(keepLast.value);
    return body;
  };
  const preview = async () => {
    showError(null);
    const body = policy();
    let dry;
    try { dry = await api('POST', '/api/gc', { ...body, dryRun: true }); } catch (e) { showError(e); return; }
    if (stopped) return;
    if (dry.removed.length === 0) {
      put(outcome, h('p', { class: 'muted', id: 'gc-none' }, `nothing to collect: the policy keeps every run (${dry.kept} in the store)`));
      return;
    }
    const confirm = h('button', { class: 'danger', id: 'gc-confirm', type: 'button', onclick: async () => {
      confirm.disabled = true;
      let done;
      try { done = await api('POST', '/api/gc', { ...body, dryRun: false }); } catch (e) { showError(e); confirm.disabled = false; return; }
      if (stopped) return;
      put(outcome, h('p', { id: 'gc-done', dataset: { removed: done.removed.join(' ') } },
        `deleted ${done.removed.length} run${done.removed.length === 1 ? '' : 's'}; ${done.kept} left in the store`));
      await load();
    } }, `Delete ${dry.removed.length} run${dry.removed.length === 1 ? '' : 's'}`);
    put(outcome, h('p', {}, `These ended runs would go (of ${dry.kept} in the store):`),
      h('ul', { class: 'mono', id: 'gc-list' }, dry.removed.map((id) => h('li', { dataset: { runId: id } }, id))),
      h('div', { class: 'actions' }, confirm));
  };
  put(gc, h('p', { class: 'muted' }, 'Deletes ended runs (completed, error, cancelled) of every session that the policy no longer keeps: '
    + 'those last updated more than the days given ago and not among the newest of their factory. Give at least one.'),
  h('div', { class: 'actions' }, h('label', {}, 'keep days', keepDays), h('label', {}, 'keep last per factory', keepLast),
    h('button', { class: 'primary', id: 'gc-preview', type: 'button', onclick: preview }, 'Show what would go')), outcome);

  load();
  return { stop() { stopped = true; } };
}

// ---- Pending approvals ---------------------------------------------------------------------

const APPROVALS_POLL_MS = 2000;
let approvalsShown = ''; // the ids shown, joined (the panel is rebuilt only when they change)

/** One pending approval: the question's facts and its three answers. */
function approvalPanel(approval) {
  const q = approval.question;
  const fact = (name, value) => [h('dt', {}, name), h('dd', { class: 'mono', dataset: { fact: name } }, value)];
  const limits = Object.entries(q.limits || {}).filter(([, v]) => v !== null && typeof v !== 'object')
    .map(([k, v]) => `${k} ${v}`).join(', ') || 'none';
  const answer = async (path, body) => {
    try {
      const answered = await api('POST', `/api/approvals/${encodeURIComponent(approval.id)}/${path}`, body);
      await loadApprovals();
      if (answered.state?.status === 'approved') location.hash = `#/run/${encodeURIComponent(answered.state.runId)}`;
    } catch (e) { showError(e); loadApprovals(); }
  };
  return h('div', { class: 'panel approval', dataset: { approvalId: approval.id } },
    h('b', {}, `${q.operation === 'resume' ? 'Resume' : 'Run'} factory ${q.factory}?`),
    h('span', { class: 'muted' }, ` It is not trusted on this machine${approval.session ? ` (asked in session ${approval.session})` : ''}.`),
    h('dl', { class: 'facts' }, fact('factory', q.factory), fact('sha256', q.sha256), fact('operation', q.operation),
      fact('backend', q.backend || 'default'), fact('limits', limits), fact('phases', (q.phases || []).join(', ') || 'none declared'),
      fact('grants', (q.grants || []).join(', ') || 'none'), fact('expires', new Date(approval.expiresAtMs).toLocaleTimeString())),
    h('div', { class: 'actions' },
      h('button', { class: 'primary approve-once', type: 'button', onclick: () => answer('approve', { always: false }) }, 'Approve once'),
      h('button', { class: 'approve-always', type: 'button', title: `trust sha256 ${q.sha256} from now on`, onclick: () => answer('approve', { always: true }) }, 'Approve always'),
      h('button', { class: 'danger decline', type: 'button', onclick: () => answer('decline') }, 'Decline')));
}

/** Show the pending approvals (none: the section is hidden). */
async function loadApprovals() {
  if (!token) return;
  let pending;
  try { pending = await api('GET', '/api/approvals'); } catch (e) { return; }
  const ids = pending.map((a) => a.id).join(',');
  if (ids === approvalsShown) return;
  approvalsShown = ids;
  const section = $('approvals');
  section.hidden = pending.length === 0;
  put(section, pending.length ? h('h2', {}, `Waiting for your approval (${pending.length})`) : null, pending.map(approvalPanel));
}

async function pollApprovals() {
  while (token) {
    await loadApprovals();
    await new Promise((r) => setTimeout(r, APPROVALS_POLL_MS));
  }
}

// ---- Start ---------------------------------------------------------------------------------

async function main() {
  try { token = await takeToken(); } catch (e) { showError(e); return; }
  if (!token) {
    showError({ code: 'unauthorized', message: 'not signed in: open the URL `factory ui` prints (it carries a one-time code)' });
    return;
  }
  $('signout').hidden = false;
  $('signout').addEventListener('click', signOut);
  try { $('session').textContent = (await api('GET', '/api/session')).session; } catch (e) { showError(e); }
  window.addEventListener('hashchange', route);
  route();
  followEvents();
  pollApprovals();
}

main();
