/**
 * Preview ports in a real browser (issue 15): headless Chromium from Debian, driven with
 * playwright-core, opens a page served by a web server inside a confined sandbox through its
 * preview origin: refused without a link, served with the signed link (which becomes a cookie
 * of that origin), and the page's own WebSocket goes through the proxy too. A screenshot goes
 * to test-output/. Without Chromium (scripts/setup.sh installs it) this file fails.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import type { PreviewPortView } from '../../api/schemas';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

const CHROMIUM = '/usr/bin/chromium';
// Loud, never a skip.
if (!existsSync(CHROMIUM)) throw new Error(`the browser test needs Debian's chromium at ${CHROMIUM} (apt-get install chromium; scripts/setup.sh does it)`);
if (!findExecutable('bwrap')) throw new Error(`the browser test needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);

const OUT = path.join(__dirname, '..', '..', 'test-output');
const PORT = 8080;

// A page and a minimal WebSocket echo (RFC 6455 handshake, one text frame each way), in plain Node.
const APP = `
const http = require('http');
const crypto = require('crypto');
const page = '<!doctype html><html><head><title>Slipway preview</title></head><body style="font:32px sans-serif">' +
  '<h1 id="msg">Hello from the sandbox</h1><p id="ws">ws: waiting</p><script>' +
  'const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");' +
  'ws.onopen = () => ws.send("ping");' +
  'ws.onmessage = (e) => { document.getElementById("ws").textContent = "ws: " + e.data; };' +
  'ws.onerror = () => { document.getElementById("ws").textContent = "ws: error"; };' +
  '</script></body></html>';
const s = http.createServer((req, res) => { res.setHeader('content-type', 'text/html'); res.end(page); });
s.on('upgrade', (req, socket) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  socket.write('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + accept + '\\r\\n\\r\\n');
  socket.once('data', (f) => {
    const len = f[1] & 0x7f, mask = f.subarray(2, 6), data = Buffer.from(f.subarray(6, 6 + len));
    for (let i = 0; i < data.length; i++) data[i] ^= mask[i % 4];
    const reply = Buffer.from('echo ' + data.toString());
    socket.write(Buffer.concat([Buffer.from([0x81, reply.length]), reply]));
  });
});
s.listen(${PORT}, '127.0.0.1');
`;

let h: ServiceHarness;
let a: TestAccount;
let id: string;
let browser: BrowserContext;
let userData: string;
const server = new AbortController();

beforeAll(async () => {
  h = await startServiceHarness({ preview: { key: randomBytes(32), domain: 'localhost' } });
  a = await h.account();
  await a.profile({ name: 'confined' });
  id = (await a.api.create({ profile: 'confined' })).id;
  await h.waitFor(a.api, id, ['ready']);
  await a.api.writeFile(id, 'app.js', Buffer.from(APP));
  void rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, {
    token: a.token,
    body: JSON.stringify({ command: 'node', args: ['app.js'], timeout_seconds: 900 }),
    signal: server.signal,
  }).catch(() => undefined);
  userData = mkdtempSync(path.join(os.tmpdir(), 'slipway-chromium-'));
  // Playwright passes --user-data-dir itself: a fresh temporary profile.
  browser = await chromium.launchPersistentContext(userData, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

afterAll(async () => {
  await browser?.close();
  server.abort();
  await h?.stop();
  if (userData) rmSync(userData, { recursive: true, force: true });
});

it('a page served in the sandbox opens in Chromium with a signed link, and is refused without one', async () => {
  const port = (await a.api.openPort(id, { port: PORT })) as PreviewPortView;
  const page = await browser.newPage();
  // Without the link: refused, and nothing of the app is shown.
  const refused = await page.goto(port.url);
  expect(refused?.status()).toBe(401);
  expect(await page.textContent('body')).toContain('unauthorized');
  // With the link (the app may still be starting: its first answers are 502).
  let status = 0;
  const until = Date.now() + 60_000;
  while (status !== 200 && Date.now() < until) {
    status = (await page.goto(port.link))?.status() ?? 0;
    if (status !== 200) await page.waitForTimeout(200);
  }
  expect(status).toBe(200);
  // The link became a cookie: the address bar no longer carries the token.
  expect(page.url()).toBe(port.url);
  expect(await page.textContent('#msg')).toBe('Hello from the sandbox');
  await page.waitForFunction("document.getElementById('ws').textContent !== 'ws: waiting'", undefined, { timeout: 30_000 });
  expect(await page.textContent('#ws')).toBe('ws: echo ping');
  mkdirSync(OUT, { recursive: true });
  const shot = path.join(OUT, 'preview-browser.png');
  await page.screenshot({ path: shot });
  expect(statSync(shot).size).toBeGreaterThan(1000);
  // Without the cookie the browser is refused again.
  await browser.clearCookies();
  expect((await page.goto(port.url))?.status()).toBe(401);
});
