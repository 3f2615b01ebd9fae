// The console's pages driven against the real service (lib/sdktest's
// TestConsole starts it and sets RATCHET_TEST_BASE_URL): each test does
// what an operator would, through the page's own forms and buttons, and
// checks the outcome through the API.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import { document, MemoryStorage } from './fakedom.mjs';
import * as app from '../static/console.js';

const base = process.env.RATCHET_TEST_BASE_URL;
const KEY_ITEM = 'ratchet.console.key';

if (!base) throw new Error('RATCHET_TEST_BASE_URL is not set: run these tests through go test ./lib/sdktest -run TestConsole');

async function api(method, path, key, body) {
	const res = await fetch(base + '/api/v1' + path, {
		method,
		headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
		body: body === undefined ? undefined : JSON.stringify(body),
	});
	const text = await res.text();
	return { status: res.status, body: text ? JSON.parse(text) : null };
}

// registerWorker makes a WORKER key of workspace key for tool name@version
// and registers a worker with it: the worker's secret and its workerId.
async function registerWorker(key, name, version) {
	const worker = (await api('POST', '/keys', key, { name: 'w', preset: 'WORKER', tools: [`${name}@${version}`] })).body.secret;
	const workerId = (await api('POST', '/workers/register', worker, { tools: [{ name, version }] })).body.workerId;
	return { worker, workerId };
}

let workspaces = 0;
async function signup() {
	const res = await fetch(base + '/api/v1/workspaces', {
		method: 'POST',
		headers: { 'Content-Type': 'application/json' },
		body: JSON.stringify({ name: `console-${process.pid}-${++workspaces}` }),
	});
	assert.equal(res.status, 201);
	return (await res.json()).key.secret;
}

// mount starts the console in a fresh page, signed in with key when given.
// rewrite, when given, may replace the service's answer to each request
// the page makes: rewrite(url, response) answers the response to use.
async function mount(key, hash = '', rewrite) {
	const root = document.createElement('div');
	const storage = new MemoryStorage();
	if (key) storage.setItem(KEY_ITEM, key);
	let onHash = () => {};
	const ui = {
		root,
		storage,
		confirms: [],
		confirmAnswer: true,
		timers: [],
		requests: [],
		// idempotencyKeys: the Idempotency-Key each request sent (or undefined).
		idempotencyKeys: [],
		// signupTokens: the Ratchet-Signup-Token each request sent (or undefined).
		signupTokens: [],
		// pageHide: what the page does as it is hidden (left, or put in the
		// back/forward cache).
		pageHide: null,
		location: {
			_hash: hash,
			get hash() {
				return this._hash;
			},
			set hash(v) {
				const changed = v !== this._hash;
				this._hash = v;
				if (changed) onHash();
			},
		},
	};
	await app.start({
		document,
		root,
		storage,
		location: ui.location,
		fetch: async (url, init) => {
			ui.requests.push(`${init.method} ${url}`);
			ui.idempotencyKeys.push(init.headers && init.headers['Idempotency-Key']);
			ui.signupTokens.push(init.headers && init.headers['Ratchet-Signup-Token']);
			// offline: every request fails, as fetch fails (with ui.offline
			// itself when it is an error).
			if (ui.offline) throw ui.offline instanceof Error ? ui.offline : new TypeError('Failed to fetch');
			// loseAnswer: the request is served, its answer lost on the way back.
			if (ui.loseAnswer) {
				ui.loseAnswer = false;
				await (await fetch(base + url, init)).text();
				throw new TypeError('Failed to fetch');
			}
			const res = fetch(base + url, init);
			return rewrite ? res.then((r) => rewrite(url, r)) : res;
		},
		confirm: (m) => {
			ui.confirms.push(m);
			return ui.confirmAnswer;
		},
		onHashChange: (fn) => (onHash = fn),
		onPageHide: (fn) => (ui.pageHide = fn),
		setTimeout: (fn, ms) => ui.timers.push({ fn, ms }),
	});
	await app.rendered();
	return ui;
}

async function go(ui, hash) {
	ui.location.hash = hash;
	await app.rendered();
}

function button(el, label) {
	const found = el.querySelectorAll('button').filter((b) => b.textContent === label);
	assert.ok(found.length, `no "${label}" button in: ${el.textContent.slice(0, 400)}`);
	return found[0];
}

function formOf(el) {
	while (el && el.tagName !== 'FORM') el = el.parentNode;
	assert.ok(el, 'not in a form');
	return el;
}

function field(form, name) {
	const el = form.querySelectorAll('input, select, textarea').find((e) => e.name === name);
	assert.ok(el, `no field ${name}`);
	return el;
}

// submit fills the form holding the button labelled label and submits it.
async function submit(el, label, values = {}) {
	const form = formOf(button(el, label));
	for (const [name, v] of Object.entries(values)) field(form, name).value = v;
	await form.dispatch('submit');
	await app.rendered();
	return form;
}

// fillSubscribe fills the webhooks page's Subscribe form with url and
// events (those ticked, the others not), and answers the form.
function fillSubscribe(ui, url, events) {
	const f = formOf(button(ui.root, 'Subscribe'));
	field(f, 'url').value = url;
	for (const box of f.querySelectorAll('input').filter((i) => i.name === 'events')) box.checked = events.includes(box.value);
	return f;
}

async function click(el, label) {
	await button(el, label).dispatch('click');
	await app.rendered();
}

function row(ui, containing) {
	const found = ui.root.querySelectorAll('tr').filter((r) => r.textContent.includes(containing));
	assert.equal(found.length, 1, `rows holding ${containing}: ${found.length}`);
	return found[0];
}

// time is a time as the console shows it.
function time(s) {
	return String(s).replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC');
}

// cells is a table row as {column title: text}.
function cells(tr) {
	return Object.fromEntries(tr.querySelectorAll('td').map((td) => [td.getAttribute('data-label'), td.textContent]));
}

// fieldValue is the text of a page's field labelled label (its dl.fields).
function fieldValue(ui, label) {
	const items = ui.root.querySelectorAll('dl.fields').flatMap((dl) => dl.children);
	const i = items.findIndex((el) => el.tagName === 'DT' && el.textContent === label);
	assert.ok(i >= 0, `no field ${label} in: ${ui.root.textContent.slice(0, 400)}`);
	return items[i + 1].textContent;
}

// notices are the texts of a page's notes (p.notice).
function notices(ui) {
	return ui.root.querySelectorAll('p.notice').map((p) => p.textContent);
}

// replayRows are the rows of a step's replays.
function replayRows(ui) {
	return ui.root.querySelectorAll('tr').filter((r) => r.querySelector('td[data-label="Replayed"]'));
}

function alerts(ui) {
	return ui.root.querySelectorAll('div.error').map((e) => e.textContent);
}

test('a new workspace: its key shown once, then the console signed in with it', async () => {
	const ui = await mount(null);
	assert.match(ui.root.textContent, /Sign in with a key/);
	// The field takes what the API takes (console QA: 200 characters, and
	// the API refused anything past 100).
	assert.equal(field(formOf(button(ui.root, 'Create workspace')), 'name').getAttribute('maxlength'), '100');
	const f = await submit(ui.root, 'Create workspace', { name: 'console-signup-' + process.pid });
	const secret = f.querySelector('input.secret-value').value;
	assert.match(secret, /^rk_/);
	assert.equal(ui.storage.getItem(KEY_ITEM), null, 'not signed in before the operator continues');
	await click(f, 'Continue with this key');
	assert.equal(ui.storage.getItem(KEY_ITEM), secret);
	assert.equal(ui.location.hash, '#/approvals');
	assert.match(ui.root.textContent, /No approval is pending\./);
	// The key is real: it reads the workspace's starter policies.
	const policies = await api('GET', '/policies', secret);
	assert.equal(policies.status, 200);
});

// A server with SIGNUP_MODE=token takes a workspace only with its token:
// the form sends one when given (trimmed, as the server compares it), none
// when the field is left empty, and refuses, sending nothing, one no header
// can carry, without repeating it (console QA: the form had no token field,
// and on such a server every workspace it asked for was refused 401). This
// test's server is open, which takes a token and ignores it.
test('the create-workspace form sends the signup token it is given', async () => {
	const ui = await mount(null);
	const tokenField = field(formOf(button(ui.root, 'Create workspace')), 'token');
	assert.deepEqual([tokenField.type, tokenField.getAttribute('autocomplete')], ['password', 'one-time-code']);
	const sent = ui.requests.length;
	await submit(ui.root, 'Create workspace', { name: 'console-token-' + process.pid, token: 'bad\ntoken-secret' });
	assert.equal(ui.requests.length, sent, 'nothing sent');
	assert.match(ui.root.textContent, /That is not a signup token/);
	assert.doesNotMatch(ui.root.textContent, /token-secret/);
	const f = await submit(ui.root, 'Create workspace', { name: 'console-token-' + process.pid, token: '  let-me-in \t' });
	assert.equal(ui.requests.at(-1), 'POST /api/v1/workspaces');
	assert.equal(ui.signupTokens.at(-1), 'let-me-in');
	assert.match(f.querySelector('input.secret-value').value, /^rk_/);

	const bare = await mount(null);
	await submit(bare.root, 'Create workspace', { name: 'console-token-' + process.pid, token: ' ' });
	assert.equal(bare.requests.at(-1), 'POST /api/v1/workspaces');
	assert.equal(bare.signupTokens.at(-1), undefined, 'no token field filled, no header');
});

test('a refused key is forgotten and the sign-in says so; a narrow key signs in and is told what it lacks', async () => {
	const ui = await mount(null);
	// Masked, and marked a one-time code, which password managers neither
	// save nor fill (they ignore autocomplete="off" on a password field):
	// README's "kept in sessionStorage only".
	const keyField = field(formOf(button(ui.root, 'Sign in')), 'key');
	assert.deepEqual([keyField.type, keyField.getAttribute('autocomplete')], ['password', 'one-time-code']);
	await submit(ui.root, 'Sign in', { key: 'rk_nope_0000' });
	assert.equal(ui.storage.getItem(KEY_ITEM), null);
	assert.match(ui.root.textContent, /refused this key/);
	assert.match(ui.root.textContent, /Sign in with a key/);

	const operator = await signup();
	const agent = (await api('POST', '/keys', operator, { name: 'agent', preset: 'AGENT' })).body.secret;
	await submit(ui.root, 'Sign in', { key: agent });
	assert.equal(ui.storage.getItem(KEY_ITEM), agent);
	assert.equal(ui.location.hash, '#/approvals');
	const [message] = alerts(ui);
	assert.match(message, /forbidden/);
	assert.match(message, /approvals:write/);
	// A page any one of several scopes opens names them all (console QA:
	// only the first, as if no other would do).
	const approver = (await api('POST', '/keys', operator, { name: 'approver', scopes: ['approvals:write'] })).body.secret;
	const narrow = await mount(approver, '#/groups/grp_01m8y2j4yz1069spgexm29w4c8');
	assert.match(alerts(narrow).join(), /This key holds none of the scopes effects:read, effects:begin; any one of them would do\./);

	// A key the service refuses later (revoked, say) signs the console out.
	const stale = await mount('rk_01m8y2j4yz1069spgexm29w4c8_' + '0'.repeat(64), '#/effects');
	assert.equal(stale.storage.getItem(KEY_ITEM), null);
	assert.match(stale.root.textContent, /refused this key/);
	assert.match(stale.root.textContent, /Sign in with a key/);
	// On the page it was on: a sign-in with a good key returns there.
	assert.equal(stale.location.hash, '#/effects');
	await submit(stale.root, 'Sign in', { key: operator });
	assert.equal(stale.location.hash, '#/effects');
	assert.match(stale.root.querySelector('h1').textContent, /Effects/);
});

// A 401 refuses the key it was sent with: one answering a key signed out
// since (revoked meanwhile, its page still loading) does not sign out the
// key signed in after it (review: it forgot whichever key was signed in).
test('a refusal of a key signed out since leaves the key signed in after it', async () => {
	const operator = await signup();
	const first = (await api('POST', '/keys', operator, { name: 'first', preset: 'OPERATOR' })).body;
	let reached;
	const stopRead = new Promise((r) => (reached = r));
	let release;
	const released = new Promise((r) => (release = r));
	let holding = false;
	const ui = await mount(first.secret, '#/effects', async (url, res) => {
		if (!holding || !url.endsWith('/circuits/stop')) return res;
		holding = false;
		reached();
		await released;
		// Answered as the service answers the key now: revoked, 401.
		return fetch(base + url, { headers: { Authorization: 'Bearer ' + first.secret } });
	});
	holding = true;
	ui.location._hash = '#/circuits';
	const loading = app.render();
	await stopRead;
	await click(ui.root, 'Sign out');
	await submit(ui.root, 'Sign in', { key: operator });
	assert.ok(ui.storage.getItem(KEY_ITEM) === operator, 'signed in with the other key');
	assert.equal((await api('DELETE', `/keys/${first.id}`, operator)).status, 200);
	release();
	await loading;
	await app.rendered();
	// Compared, not printed: a failure would show the secret.
	assert.ok(ui.storage.getItem(KEY_ITEM) === operator, 'the key signed in since is kept');
	assert.doesNotMatch(ui.root.textContent, /refused this key|Sign in with a key/);
	assert.match(ui.root.querySelector('h1').textContent, /Approvals/);
});

test('approve and reject a held effect, with notes; a declined confirmation sends nothing', async () => {
	const key = await signup();
	assert.equal((await api('PUT', '/policies/payment.charge', key, { mode: 'require_approval' })).status, 200);
	const held = [];
	for (const k of ['c1', 'c2']) {
		const r = await api('POST', '/effects/begin', key, {
			effect_type: 'payment.charge',
			idempotency_key: k,
			payload: { amount: 5 },
			cost_micros: 5_000_000,
		});
		assert.equal(r.body.decision, 'approval_required');
		held.push(r.body);
	}
	const ui = await mount(key, '#/approvals');
	assert.equal(document.title, 'Approvals — Ratchet console');
	const first = row(ui, held[0].effect_id);
	assert.match(first.textContent, /payment\.charge/);
	// The row names what is approved: its key and its cost (console QA:
	// neither was shown, and Approve was one unconfirmed click).
	assert.match(first.textContent, /c1.*\$5\.00/);
	// Each row's controls are named by their effect (console QA: every row's
	// were "Approve", "Reject" and "Note" to a screen reader).
	assert.equal(button(first, 'Approve').getAttribute('aria-label'), `Approve payment.charge ${held[0].effect_id}`);
	assert.equal(button(row(ui, held[1].effect_id), 'Reject').getAttribute('aria-label'), `Reject payment.charge ${held[1].effect_id}`);
	assert.equal(field(formOf(button(first, 'Approve')), 'note').getAttribute('aria-label'), `Note approving ${held[0].effect_id}`);
	ui.confirmAnswer = false;
	await submit(first, 'Approve', { note: 'not yet' });
	assert.match(ui.confirms.at(-1), new RegExp(`^Approve payment\\.charge ${held[0].effect_id} for \\$5\\.00 \\(idempotency key "c1"\\)\\?`));
	assert.equal((await api('GET', `/approvals/${held[0].approval_id}`, key)).body.state, 'pending', 'declined: nothing sent');
	ui.confirmAnswer = true;
	await submit(first, 'Approve', { note: 'checked with finance' });
	let a = await api('GET', `/approvals/${held[0].approval_id}`, key);
	assert.equal(a.body.state, 'approved');
	assert.equal(a.body.note, 'checked with finance');
	assert.ok(!ui.root.querySelectorAll('tr').some((r) => r.textContent.includes(held[0].effect_id)), 'approved one left the pending list');
	// Said in words, naming which (console QA, in a browser: the row just
	// left the list).
	assert.deepEqual(notices(ui), [`Approved: payment.charge ${held[0].effect_id} — checked with finance.`]);

	ui.confirmAnswer = false;
	await submit(row(ui, held[1].effect_id), 'Reject', { note: 'no' });
	assert.equal(ui.confirms.length, 3);
	a = await api('GET', `/approvals/${held[1].approval_id}`, key);
	assert.equal(a.body.state, 'pending', 'declined: nothing sent');

	ui.confirmAnswer = true;
	await submit(row(ui, held[1].effect_id), 'Reject', { note: 'duplicate order' });
	a = await api('GET', `/approvals/${held[1].approval_id}`, key);
	assert.equal(a.body.state, 'rejected');
	assert.match(ui.root.textContent, /No approval is pending\./);
	assert.deepEqual(notices(ui), [`Rejected: payment.charge ${held[1].effect_id} — duplicate order.`]);

	// The next begins follow the decisions.
	const again = await api('POST', '/effects/begin', key, { effect_type: 'payment.charge', idempotency_key: 'c1', payload: { amount: 5 }, cost_micros: 5_000_000 });
	assert.equal(again.body.decision, 'execute');
	const denied = await api('POST', '/effects/begin', key, { effect_type: 'payment.charge', idempotency_key: 'c2', payload: { amount: 5 }, cost_micros: 5_000_000 });
	assert.equal(denied.body.decision, 'denied');

	// Every approval, decided ones included, under state "any". A decided
	// row costs no request of its own (the page redraws every 15 s and GETs
	// count against the key's rate limit: review); its key and cost are what
	// an earlier draw read (none for one decided elsewhere before any draw).
	const unseen = await api('POST', '/effects/begin', key, { effect_type: 'payment.charge', idempotency_key: 'c9', payload: { amount: 9 }, cost_micros: 9_000_000 });
	assert.equal(unseen.body.decision, 'approval_required');
	assert.equal((await api('POST', `/approvals/${unseen.body.approval_id}/approve`, key, {})).status, 200);
	const sent = ui.requests.length;
	await submit(ui.root, 'Filter', { state: 'any' });
	assert.equal(ui.location.hash, '#/approvals?state=any');
	assert.match(row(ui, held[0].effect_id).textContent, /approved/);
	assert.match(row(ui, held[0].effect_id).textContent, /c1.*\$5\.00/);
	assert.deepEqual(ui.requests.slice(sent).filter((r) => r.startsWith('GET /api/v1/effects/')), [], 'no effect read a row');
	assert.doesNotMatch(row(ui, unseen.body.effect_id).textContent, /\$9\.00/, 'not read for its row');
	await submit(ui.root, 'Filter', { state: 'rejected' });
	assert.equal(ui.location.hash, '#/approvals?state=rejected');
	assert.match(row(ui, held[1].effect_id).textContent, /duplicate order/);
});

// A yes given while a breaker holds the type carries the key through it
// (API.md: an approval answers every reason that holds when it is given):
// the console says so where the decision is shown (console QA: the
// approval read only "held: policy_requires_approval").
test('an approval given under a breaker shows what else it answers', async () => {
	const key = await signup();
	assert.equal((await api('PUT', '/policies/payment.charge', key, { mode: 'require_approval' })).status, 200);
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'payment.charge', idempotency_key: 'a1', payload: {}, cost_micros: 1_000_000 })).body;
	assert.equal(held.decision, 'approval_required');
	assert.equal((await api('POST', '/circuits/payment.charge/open', key, { action: 'require_approval' })).status, 200);
	const yes = await api('POST', `/approvals/${held.approval_id}/approve`, key, {});
	assert.deepEqual(yes.body.answers, ['policy_requires_approval', 'circuit_open']);
	const ui = await mount(key, '#/approvals?state=any');
	assert.match(row(ui, held.effect_id).textContent, /approved.*\(also answers circuit_open\)/);
	await go(ui, '#/effects/' + held.effect_id);
	assert.match(ui.root.textContent, /held: policy_requires_approval; also answers circuit_open/);
});

test("another key signed in is shown none of the first key's effects", async () => {
	const key = await signup();
	assert.equal((await api('PUT', '/policies/payment.charge', key, { mode: 'require_approval' })).status, 200);
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'payment.charge', idempotency_key: 'order-K1', payload: {}, cost_micros: 5_000_000 })).body;
	let ui = await mount(key, '#/approvals');
	assert.match(row(ui, held.effect_id).textContent, /order-K1.*\$5\.00/);
	// A key that decides approvals but may not read effects.
	const approver = (await api('POST', '/keys', key, { name: 'approver', scopes: ['approvals:write'] })).body.secret;
	ui = await mount(approver, '#/approvals');
	assert.doesNotMatch(row(ui, held.effect_id).textContent, /order-K1|\$5\.00/, 'nothing kept from the other key');
});

test('an unknown outcome: found by its filter, resolved from its page; bad JSON sends nothing', async () => {
	const key = await signup();
	const begun = await api('POST', '/effects/begin', key, {
		effect_type: 'email.send',
		idempotency_key: 'welcome:<b>user</b>',
		payload: { to: 'user@example.com' },
		lease_seconds: 1,
	});
	assert.equal(begun.body.decision, 'execute');
	await new Promise((r) => setTimeout(r, 1200));
	const ui = await mount(key, '#/effects');
	await submit(ui.root, 'Filter', { state: 'indeterminate', effect_type: 'email.send' });
	assert.equal(ui.location.hash, '#/effects?state=indeterminate&effect_type=email.send');
	const r = row(ui, begun.body.effect_id);
	assert.match(r.textContent, /welcome:<b>user<\/b>/, 'a key is shown as the text it is');

	await go(ui, '#/effects/' + begun.body.effect_id);
	assert.match(ui.root.textContent, /indeterminate/);
	assert.match(ui.root.textContent, /"to": "<string>"/, 'the payload as its redacted preview');
	assert.ok(!ui.root.textContent.includes('user@example.com'));

	// Nothing is chosen for the operator: an outcome left unchosen is
	// refused before anything is asked or sent.
	const before = ui.requests.length;
	await submit(ui.root, 'Resolve', { note: 'found at the vendor' });
	assert.match(alerts(ui).join(), /Choose the outcome/);
	await submit(ui.root, 'Resolve', { outcome: 'succeeded', result: '{"message_id": ', note: 'found at the vendor' });
	assert.match(alerts(ui).join(), /not valid JSON/);
	assert.equal(ui.confirms.length, 0, 'refused before the confirmation');
	assert.equal(ui.requests.length, before, 'nothing sent');
	assert.equal((await api('GET', `/effects/${begun.body.effect_id}`, key)).body.state, 'indeterminate');

	await submit(ui.root, 'Resolve', { outcome: 'succeeded', result: '{"message_id": "m_1"}', note: 'found at the vendor' });
	assert.match(ui.confirms[0], new RegExp(`Record email\\.send ${begun.body.effect_id} \\(attempt 1\\) as SUCCEEDED at the vendor`));
	const e = (await api('GET', `/effects/${begun.body.effect_id}`, key)).body;
	assert.equal(e.state, 'succeeded');
	assert.equal(e.attempts[0].resolve_note, 'found at the vendor');
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Resolve'), 'resolved: no form');
	// The attempt says when, by which key and why it was resolved (console
	// QA: not by whom).
	const keyId = 'key_' + /^rk_([a-z0-9]+)_/.exec(key)[1];
	assert.equal(e.attempts[0].resolved_by_key_id, keyId);
	assert.equal(ui.root.querySelector('td[data-label="Resolved"]').textContent, `${time(e.attempts[0].resolved_at)} by ${keyId} — found at the vendor`);
	// Said in words, not only by the state the page now shows (console QA).
	const said = ui.root.querySelectorAll('p').filter((p) => p.getAttribute('role') === 'status').map((p) => p.textContent);
	assert.ok(said.includes('Resolved: recorded as succeeded.'), said.join(' | '));
	const dup = await api('POST', '/effects/begin', key, { effect_type: 'email.send', idempotency_key: 'welcome:<b>user</b>', payload: { to: 'user@example.com' } });
	assert.equal(dup.body.decision, 'duplicate');
	assert.deepEqual(dup.body.result, { message_id: 'm_1' });
});

// The resolve form names the attempt it shows (resolve QA: a resolve sent
// from a page left open, after that attempt was resolved elsewhere and the
// key ran again and lapsed, recorded the new attempt failed, though nobody
// had checked whether it acted): the service refuses it, naming the attempt
// unknown now, and nothing changes.
test('a resolve from a stale page names its attempt and cannot settle a later one', async () => {
	const key = await signup();
	const body = { effect_type: 'email.send', idempotency_key: 'stale-resolve', payload: {}, lease_seconds: 1 };
	const begun = (await api('POST', '/effects/begin', key, body)).body;
	assert.equal(begun.decision, 'execute');
	const id = begun.effect_id;
	const lapsed = async () => {
		for (let i = 0; i < 300 && (await api('GET', `/effects/${id}`, key)).body.state !== 'indeterminate'; i++) {
			await new Promise((r) => setTimeout(r, 50));
		}
		assert.equal((await api('GET', `/effects/${id}`, key)).body.state, 'indeterminate', 'the lease never lapsed');
	};
	await lapsed();
	const ui = await mount(key, '#/effects/' + id);
	assert.match(ui.root.textContent, /This records attempt 1, the one whose outcome is unknown/);

	// Meanwhile attempt 1 is resolved failed elsewhere, the key runs again
	// and attempt 2 lapses.
	assert.equal((await api('POST', `/effects/${id}/resolve`, key, { outcome: 'failed', attempt: 1 })).status, 200);
	assert.equal((await api('POST', '/effects/begin', key, body)).body.attempt, 2);
	await lapsed();
	// What a resolve would change (a sweep may record the lapse meanwhile).
	const settled = async () => {
		const e = (await api('GET', `/effects/${id}`, key)).body;
		return [e.state, e.attempts.map((a) => [a.attempt, a.outcome, a.resolved_at, a.resolve_note])];
	};
	const before = await settled();

	await submit(ui.root, 'Resolve', { outcome: 'failed', note: 'stale page' });
	assert.match(ui.confirms.at(-1), new RegExp(`Record email\\.send ${id} \\(attempt 1\\) as FAILED at the vendor`));
	assert.match(alerts(ui).join(), /names attempt 1, but the attempt whose outcome is unknown now is attempt 2/);
	assert.deepEqual(await settled(), before, 'nothing changed');
	assert.equal(before[0], 'indeterminate');

	// The page read again shows attempt 2, and resolves it.
	const again = await mount(key, '#/effects/' + id);
	assert.match(again.root.textContent, /This records attempt 2, the one whose outcome is unknown/);
	await submit(again.root, 'Resolve', { outcome: 'succeeded' });
	const e = (await api('GET', `/effects/${id}`, key)).body;
	assert.equal(e.state, 'succeeded');
	assert.equal(e.attempts[1].outcome, 'succeeded');
});

test('circuits: open and close a breaker by hand, then the emergency stop and its release', async () => {
	const key = await signup();
	await api('POST', '/effects/begin', key, { effect_type: 'sms.send', idempotency_key: 's1', payload: {} });
	const ui = await mount(key, '#/circuits');
	assert.deepEqual(ui.requests.sort(), ['GET /api/v1/circuits/stop', 'GET /api/v1/circuits?limit=200', 'GET /api/v1/keys/current']);
	await submit(row(ui, 'sms.send'), 'Open', { action: 'deny', reason: 'loop in the agent' });
	let c = (await api('GET', '/circuits', key)).body.data.find((x) => x.effect_type === 'sms.send');
	assert.deepEqual([c.state, c.opened_by, c.action, c.reason], ['open', 'manual', 'deny', 'loop in the agent']);
	const refused = await api('POST', '/effects/begin', key, { effect_type: 'sms.send', idempotency_key: 's2', payload: {} });
	assert.equal(refused.body.error.code, 'circuit_open');

	await click(row(ui, 'sms.send'), 'Close');
	c = (await api('GET', '/circuits', key)).body.data.find((x) => x.effect_type === 'sms.send');
	assert.equal(c.state, 'closed');

	assert.match(ui.root.textContent, /The emergency stop is off\./);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Release the stop'), 'nothing to release while it is off');
	await submit(ui.root, 'Stop every effect type', { action: 'deny', reason: 'incident 42' });
	let all = (await api('GET', '/circuits', key)).body.data;
	assert.ok(all.length > 1 && all.every((x) => x.state === 'open' && x.opened_by === 'stop'), JSON.stringify(all));
	assert.match(ui.root.textContent, /The emergency stop is ON since .* \(deny\): incident 42/);
	// While it is on, the form holds the stop as it is: pulled again, it
	// says it replaces it, and changes only what was edited (console QA: it
	// replaced a deny with require_approval and wiped the reason).
	const stopForm = formOf(button(ui.root, 'Stop every effect type'));
	assert.deepEqual([field(stopForm, 'action').value, field(stopForm, 'reason').value], ['deny', 'incident 42']);
	await submit(ui.root, 'Stop every effect type', {});
	assert.match(ui.confirms.at(-1), /^Replace the current emergency stop \(deny: incident 42\) with deny: incident 42\?/);
	const stop = (await api('GET', '/circuits/stop', key)).body;
	assert.deepEqual([stop.state, stop.action, stop.reason], ['open', 'deny', 'incident 42']);
	all = (await api('GET', '/circuits', key)).body.data;
	// A type the stop holds is not closed by its own Close (which the API
	// answers without lifting the stop): the row says where to look.
	assert.match(row(ui, 'sms.send').textContent, /incident 42.*Held by the emergency stop/);
	assert.ok(!row(ui, 'sms.send').querySelectorAll('button').length);
	// With every type held by a stricter breaker of its own, the list shows
	// none held by the stop; the banner still says it is on.
	await submit(ui.root, 'Stop every effect type', { action: 'monitor', reason: 'watching' });
	for (const x of all) await api('POST', `/circuits/${x.effect_type}/open`, key, { action: 'deny' });
	await go(ui, '#/approvals');
	await go(ui, '#/circuits');
	assert.ok(!ui.root.querySelectorAll('td').some((td) => /Held by the emergency stop/.test(td.textContent)));
	assert.match(ui.root.textContent, /The emergency stop is ON since .* \(monitor\): watching/);
	for (const x of all) await api('POST', `/circuits/${x.effect_type}/close`, key, {});
	await go(ui, '#/approvals');
	await go(ui, '#/circuits');
	await click(ui.root, 'Release the stop');
	assert.ok((await api('GET', '/circuits', key)).body.data.every((x) => x.state === 'closed'));
	assert.match(ui.root.textContent, /The emergency stop is off\./);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Release the stop'));
	assert.deepEqual([field(formOf(button(ui.root, 'Stop every effect type')), 'action').value, field(formOf(button(ui.root, 'Stop every effect type')), 'reason').value], ['require_approval', '']);
	assert.equal(ui.confirms.length, 6);

	// A key that may only read them sees the breakers and the stop, and is
	// offered none of their changes (console QA: the page was refused whole).
	await api('POST', '/circuits/sms.send/open', key, { action: 'deny', reason: 'read me' });
	await api('POST', '/circuits/stop', key, { action: 'monitor', reason: 'read me too' });
	const reader = (await api('POST', '/keys', key, { name: 'reader', scopes: ['policies:read'] })).body.secret;
	const read = await mount(reader, '#/circuits');
	assert.deepEqual(alerts(read), []);
	assert.match(row(read, 'sms.send').textContent, /deny.*read me/);
	assert.match(read.root.textContent, /The emergency stop is ON since .* \(monitor\): read me too/);
	assert.match(read.root.textContent, /Changing a breaker or the emergency stop needs the scope policies:write, which this key lacks/);
	assert.deepEqual(read.root.querySelectorAll('button').filter((b) => ['Open', 'Close', 'Stop every effect type', 'Release the stop'].includes(b.textContent)), []);
});

test('a policy edited from its page; an edit made meanwhile elsewhere is refused, not overwritten', async () => {
	const key = await signup();
	const ui = await mount(key, '#/policies');
	await submit(ui.root, 'Open policy', { effect_type: 'crm.update' });
	assert.equal(ui.location.hash, '#/policies/crm.update');
	const area = field(formOf(button(ui.root, 'Save policy')), 'policy');
	assert.equal(area.getAttribute('aria-label'), 'Policy of crm.update (JSON)');
	assert.equal(document.title, 'Policy crm.update — Ratchet console');
	const policy = JSON.parse(area.value);
	assert.equal(policy.mode, 'allow');
	assert.ok(!('last_reconciled_at' in policy), 'read-only: shown, not offered for editing');
	assert.match(ui.root.textContent, /Last reconciled/);
	await submit(ui.root, 'Save policy', { policy: JSON.stringify({ ...policy, mode: 'deny', max_attempts: 2 }) });
	let p = (await api('GET', '/policies/crm.update', key)).body;
	assert.deepEqual([p.mode, p.max_attempts], ['deny', 2]);
	assert.deepEqual(alerts(ui), []);
	assert.equal(ui.root.querySelector('p.notice').textContent, `Saved (version ${p.version}).`);

	// Someone else saves while this page is open.
	const version = p.version;
	assert.equal((await api('PUT', '/policies/crm.update', key, { mode: 'allow', expected_version: version })).status, 200);
	await submit(ui.root, 'Save policy', { policy: JSON.stringify({ mode: 'require_approval' }) });
	assert.match(alerts(ui).join(), /version_conflict/);
	p = (await api('GET', '/policies/crm.update', key)).body;
	assert.equal(p.mode, 'allow');

	// A refused field is named.
	await go(ui, '#/policies');
	await go(ui, '#/policies/crm.update');
	await submit(ui.root, 'Save policy', { policy: JSON.stringify({ lease_seconds: 1 }) });
	assert.match(alerts(ui).join(), /lease_seconds/);
	await go(ui, '#/policies');
	assert.match(row(ui, 'crm.update').textContent, /allow/);
});

test('a policy amount beyond 2^53 is kept as stored, and one the page cannot send exactly is refused', async () => {
	// Console QA: a budget of 123456789012345678 micros read as …680, and
	// saving the untouched policy wrote that back.
	const key = await signup();
	const raw = async () => (await fetch(base + '/api/v1/policies/big.budget', { headers: { Authorization: 'Bearer ' + key } })).text();
	const put = await fetch(base + '/api/v1/policies/big.budget', {
		method: 'PUT',
		headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
		body: '{"daily_budget_micros":123456789012345678}',
	});
	assert.equal(put.status, 200);
	const ui = await mount(key, '#/policies/big.budget');
	assert.match(ui.root.textContent, /daily_budget_micros: beyond what this page shows exactly/);
	const area = field(formOf(button(ui.root, 'Save policy')), 'policy');
	await submit(ui.root, 'Save policy', { policy: area.value });
	assert.match(alerts(ui).join(), /Nothing changed/);
	await submit(ui.root, 'Save policy', { policy: JSON.stringify({ ...JSON.parse(area.value), mode: 'deny' }) });
	assert.deepEqual(alerts(ui), []);
	assert.match(await raw(), /"daily_budget_micros":123456789012345678[,}]/, 'kept exactly');
	assert.match(await raw(), /"mode":"deny"/);

	await go(ui, '#/policies');
	await go(ui, '#/policies/big.budget');
	for (const typed of ['9007199254740993', '1e400']) {
		await submit(ui.root, 'Save policy', { policy: `{"daily_budget_micros": ${typed}}` });
		assert.match(alerts(ui).join(), /cannot send exactly/, typed);
	}
	assert.match(await raw(), /"daily_budget_micros":123456789012345678[,}]/, 'nothing sent');

	// A key that may only read it is told it is rounded too (console QA:
	// shown as if stored so).
	const reader = (await api('POST', '/keys', key, { name: 'reader', scopes: ['policies:read'] })).body.secret;
	const read = await mount(reader, '#/policies/big.budget');
	assert.match(read.root.textContent, /Editing a policy needs the scope policies:write/);
	assert.match(read.root.textContent, /daily_budget_micros: beyond what this page shows exactly \(2\^53\), shown rounded\./);

	const keys = await mount(key, '#/keys');
	await submit(keys.root, 'Create key', { name: 'capped', preset: 'AGENT', ceiling: '9007199254740993', rate: '' });
	assert.match(alerts(keys).join(), /ceiling must be a whole number/);
	assert.ok(!(await api('GET', '/keys', key)).body.data.some((k) => k.name === 'capped'), 'no key minted');
});

test('tools: a contract published from the page, the next one drafted from it, a refused one named, a test job enqueued', async () => {
	const key = await signup();
	const tool = 'send_<b>mail</b>';
	const ui = await mount(key, '#/tools');
	await submit(ui.root, 'Open tool', { name: tool });
	assert.equal(ui.location.hash, '#/tools/' + encodeURIComponent(tool));
	assert.match(ui.root.textContent, /No contract is published/);
	const draft = JSON.parse(field(formOf(button(ui.root, 'Publish')), 'contract').value);
	assert.equal(field(formOf(button(ui.root, 'Publish')), 'contract').getAttribute('aria-label'), `New contract version of ${tool} (JSON)`);
	// The test job's input is labelled on screen, as every other field is.
	const testInput = field(formOf(button(ui.root, 'Enqueue test job')), 'input');
	assert.equal(testInput.parentNode.tagName, 'LABEL');
	assert.match(testInput.parentNode.textContent, /^Input \(JSON\)/);
	assert.deepEqual(draft, { handlerVersion: '1', inputSchema: { type: 'object' }, outputSchema: true, timeoutMs: 30000, retryPreset: 'STANDARD', status: 'ACTIVE' });
	const schema = { type: 'object', required: ['to'], properties: { to: { type: 'string' } } };
	// Its answer lost, published again: one contract version, not two.
	ui.loseAnswer = true;
	await submit(ui.root, 'Publish', { contract: JSON.stringify({ ...draft, inputSchema: schema, timeoutMs: 5000 }) });
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	await submit(ui.root, 'Publish', {});
	assert.deepEqual(alerts(ui), []);
	let list = (await api('GET', `/tools/${encodeURIComponent(tool)}/contracts`, key)).body.data;
	assert.deepEqual(list.map((c) => [c.contractVersion, c.handlerVersion, c.timeoutMs]), [[1, '1', 5000]]);
	assert.match(row(ui, '5000 ms').textContent, /ACTIVE/);
	assert.match(row(ui, '5000 ms').textContent, /"required"/);

	// The next version's draft is the newest contract; a refused one is
	// named and publishes nothing; a declined confirmation sends nothing.
	const next = JSON.parse(field(formOf(button(ui.root, 'Publish')), 'contract').value);
	assert.deepEqual([next.inputSchema, next.timeoutMs], [schema, 5000]);
	await submit(ui.root, 'Publish', { contract: JSON.stringify({ ...next, handlerVersion: '2', timeoutMs: 0 }) });
	assert.match(alerts(ui).join(), /timeoutMs/);
	ui.confirmAnswer = false;
	await submit(ui.root, 'Publish', { contract: JSON.stringify({ ...next, handlerVersion: '2' }) });
	ui.confirmAnswer = true;
	await submit(ui.root, 'Publish', { contract: '[1]' });
	assert.match(alerts(ui).join(), /must be a JSON object/);
	list = (await api('GET', `/tools/${encodeURIComponent(tool)}/contracts`, key)).body.data;
	assert.equal(list.length, 1);

	// A test job: input the contract refuses is named; one it takes is
	// enqueued, with links to its step and run.
	await submit(ui.root, 'Enqueue test job', { version: '1', input: JSON.stringify({ to: 7 }) });
	assert.match(alerts(ui).join(), /input/);
	// Its answer lost, enqueued again: one test job, not two.
	ui.loseAnswer = true;
	await submit(ui.root, 'Enqueue test job', { version: '1', input: JSON.stringify({ to: 'a@example.com' }) });
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	const f = await submit(ui.root, 'Enqueue test job', {});
	assert.equal((await api('GET', '/runs', key)).body.data.length, 1, 'one test job, not two');
	const step = f.querySelectorAll('a').find((a) => a.getAttribute('href').startsWith('#/steps/'));
	assert.ok(step, f.textContent);
	const s = (await api('GET', '/' + step.getAttribute('href').slice(2), key)).body;
	assert.deepEqual([s.name, s.version, s.durableJob.maxAttempts], [tool, '1', 1]);
	await submit(ui.root, 'Enqueue test job', { version: '1', input: '{"to":' });
	assert.match(alerts(ui).join(), /not valid JSON/);
	// Asked before each send, not for what the page refused itself.
	assert.equal(ui.confirms.length, 7);

	// The queue page links each tool to its page.
	await go(ui, '#/queue');
	const link = ui.root.querySelectorAll('a').find((a) => a.textContent === tool);
	assert.equal(link.getAttribute('href'), '#/tools/' + encodeURIComponent(tool));
});

test('keys: one minted with its secret shown once, then revoked', async () => {
	const key = await signup();
	const ui = await mount(key, '#/keys');
	assert.match(row(ui, 'operator').textContent, /this console’s key/);
	const f = await submit(ui.root, 'Create key', { name: 'mailer', preset: 'WORKER', tools: 'send_email@1, send_sms@2', ceiling: '', rate: '120' });
	const secret = f.querySelector('input.secret-value').value;
	assert.match(row(ui, 'mailer').textContent, /jobs:work/, 'listed beside its secret, before Done');
	// The second click of a double click creates nothing: the secret on
	// screen stays the only one, until the form is edited.
	await f.dispatch('submit');
	await app.rendered();
	assert.equal(f.querySelector('input.secret-value').value, secret);
	assert.equal((await api('GET', '/keys', key)).body.data.filter((k) => k.name === 'mailer').length, 1);
	assert.equal(button(f, 'Create key').disabled, true);
	await f.dispatch('input');
	assert.equal(button(f, 'Create key').disabled, false, 'an edit allows another');
	const listed = (await api('GET', '/keys', key)).body.data.find((k) => k.name === 'mailer');
	assert.deepEqual(listed.tools, ['send_email@1', 'send_sms@2']);
	assert.deepEqual(listed.scopes, ['jobs:work']);
	assert.equal(listed.rate_limit_per_minute, 120);
	assert.equal((await api('POST', '/workers/register', secret, { tools: [{ name: 'send_email', version: '1' }] })).status, 201);

	await click(f, 'Done');
	assert.equal(ui.root.querySelector('input.secret-value'), null, 'the secret is gone once done');
	await click(row(ui, 'mailer'), 'Revoke');
	assert.doesNotMatch(ui.confirms.at(-1), /signed in with/);
	assert.ok((await api('GET', '/keys', key)).body.data.find((k) => k.name === 'mailer').revoked_at);
	assert.match(row(ui, 'mailer').textContent, /revoked/);
	assert.equal((await api('POST', '/workers/register', secret, { tools: [{ name: 'send_email', version: '1' }] })).status, 401);

	// The console's own key revoked signs it out, as asked, saying so
	// (console QA: its redraw was refused, and the sign-in read "refused
	// this key (revoked, or mistyped)").
	const own = (await api('POST', '/keys', key, { name: 'console', preset: 'OPERATOR' })).body;
	const mine = await mount(own.secret, '#/keys');
	await click(row(mine, 'this console’s key'), 'Revoke');
	assert.match(mine.confirms.at(-1), /the key this console is signed in with: the console signs out/);
	assert.ok((await api('GET', '/keys', key)).body.data.find((k) => k.id === own.id).revoked_at);
	assert.equal(mine.storage.getItem(KEY_ITEM), null);
	assert.match(mine.root.textContent, new RegExp(`This console’s key \\(${own.id}\\) is revoked: sign in with another key\\.`));
	assert.doesNotMatch(mine.root.textContent, /refused this key/);
	assert.match(mine.root.textContent, /Sign in with a key/);
});

test('a key created again after its answer was lost is the same key; an edit or a success makes the next one new', async () => {
	// Review: the create sent no Idempotency-Key, so a click sent again
	// after a lost answer minted a second key, the first one live with a
	// secret nobody saw.
	const key = await signup();
	const named = async (name) => (await api('GET', '/keys', key)).body.data.filter((k) => k.name === name && !k.revoked_at);
	const ui = await mount(key, '#/keys');
	const fill = { name: 'lost', preset: 'AGENT', tools: '', ceiling: '', rate: '' };
	ui.loseAnswer = true;
	let f = await submit(ui.root, 'Create key', fill);
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	assert.equal(f.querySelector('input.secret-value'), null);
	const [made] = await named('lost');
	assert.ok(made, 'made, its answer lost');
	f = await submit(ui.root, 'Create key', fill);
	assert.deepEqual(alerts(ui), []);
	const secret = f.querySelector('input.secret-value').value;
	assert.deepEqual((await named('lost')).map((k) => k.id), [made.id], 'one key, not two');
	assert.equal((await api('GET', '/keys/current', secret)).body.id, made.id, 'the secret shown is the key made');
	const sent = ui.idempotencyKeys.filter((_, i) => ui.requests[i] === 'POST /api/v1/keys');
	assert.equal(sent.length, 2);
	assert.ok(sent[0] && sent[0] === sent[1], 'sent again under the same Idempotency-Key');

	// Its answer read, the form edited and sent: another key, even of the
	// same values.
	await f.dispatch('input');
	f = await submit(ui.root, 'Create key', fill);
	assert.deepEqual(alerts(ui), []);
	assert.equal((await named('lost')).length, 2, 'a success makes the next create new');
	assert.notEqual(f.querySelector('input.secret-value').value, secret);

	// A lost answer, then the form changed: a key of its own, not refused
	// as the first key's Idempotency-Key reused with another body.
	await f.dispatch('input');
	ui.loseAnswer = true;
	f = await submit(ui.root, 'Create key', { ...fill, name: 'first-try' });
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	f = await submit(ui.root, 'Create key', { ...fill, name: 'second-try' });
	assert.deepEqual(alerts(ui), []);
	assert.equal((await named('first-try')).length, 1);
	assert.equal((await api('GET', '/keys/current', f.querySelector('input.secret-value').value)).body.name, 'second-try');
});

test('a secret shown once, and a key typed in the sign-in, are cleared as the page is hidden (the back/forward cache)', async () => {
	// Review: the page is Cache-Control: no-cache, so a browser may restore
	// it from its back/forward cache still showing a secret shown once.
	const key = await signup();
	const ui = await mount(key, '#/keys');
	const f = await submit(ui.root, 'Create key', { name: 'hidden', preset: 'AGENT', tools: '', ceiling: '', rate: '' });
	const secret = f.querySelector('input.secret-value').value;
	assert.match(secret, /^rk_/);
	ui.pageHide();
	assert.equal(ui.root.querySelector('input.secret-value'), null);
	assert.ok(!ui.root.querySelectorAll('input').some((i) => i.value === secret), 'no field holds it');
	assert.match(f.textContent, /The secret shown here was cleared when you left the page/);
	assert.match(row(ui, 'hidden').textContent, /effects:begin/, 'the key made still listed');

	await go(ui, '#/webhooks');
	const w = fillSubscribe(ui, 'https://example.com/hidden', ['run.finished']);
	await w.dispatch('submit');
	await app.rendered();
	const signing = w.querySelector('input.secret-value').value;
	assert.match(signing, /\S{16,}/);
	ui.pageHide();
	assert.equal(ui.root.querySelector('input.secret-value'), null);
	assert.ok(!ui.root.querySelectorAll('input').some((i) => i.value === signing), 'no field holds it');

	const out = await mount(null);
	const typed = field(formOf(button(out.root, 'Sign in')), 'key');
	typed.value = key;
	out.pageHide();
	assert.equal(typed.value, '');
});

test('a key pasted with a line break is refused without repeating it; a browser refusal naming the key is not shown', async () => {
	// Review: a browser refuses a header holding a line break, and its
	// message (Firefox's, Node's) repeats the value: the key, on the page.
	const key = await signup();
	const broken = key.slice(0, 12) + '\n' + key.slice(12);
	const ui = await mount(null);
	const before = ui.requests.length;
	await submit(ui.root, 'Sign in', { key: broken });
	assert.equal(ui.requests.length, before, 'nothing sent');
	assert.equal(ui.storage.getItem(KEY_ITEM), null);
	assert.match(alerts(ui).join(), /That is not a key: it holds a line break/);
	for (const part of [key.slice(0, 12), key.slice(12)]) assert.ok(!ui.root.textContent.includes(part), 'the key is not repeated');

	// A key the browser refuses to send, however it was stored: its
	// refusal (Node's names the header's value) is not shown.
	const stored = await mount(broken, '#/effects');
	assert.match(alerts(stored).join(), /The service did not answer \(the network failed, or the browser refused to send the request\)\.$/);
	for (const part of [key.slice(0, 12), key.slice(12)]) assert.ok(!stored.root.textContent.includes(part), 'the key is not repeated');
	const signedIn = await mount(key, '#/approvals');
	signedIn.offline = new TypeError(`Window.fetch: Bearer ${key} is an invalid header value.`);
	await go(signedIn, '#/effects');
	assert.match(alerts(signedIn).join(), /did not answer/);
	assert.ok(!signedIn.root.textContent.includes(key));
});

test('keys: each names the key that minted it, and what a compromised key minted is listed and revoked', async () => {
	// Security review: revoking a key leaves the keys it minted live, and
	// nothing showed which key minted which.
	const key = await signup();
	const operatorId = (await api('GET', '/keys/current', key)).body.id;
	const leaky = (await api('POST', '/keys', key, { name: 'leaky', scopes: ['keys:write', 'effects:begin'] })).body;
	const kids = [];
	for (const name of ['kid1', 'kid2']) kids.push((await api('POST', '/keys', leaky.secret, { name, scopes: ['effects:begin'] })).body);
	await api('POST', '/keys', key, { name: 'bystander', preset: 'AGENT' });

	const ui = await mount(key, '#/keys');
	assert.match(row(ui, 'kid1').textContent, new RegExp(`minted by ${leaky.id}`));
	assert.match(row(ui, 'leaky').textContent, new RegExp(`minted by ${operatorId}`));
	assert.match(row(ui, 'this console’s key').textContent, /signup/);
	assert.doesNotMatch(row(ui, 'this console’s key').textContent, /minted by/);

	await click(row(ui, 'leaky'), 'Revoke');
	const mints = row(ui, 'leaky').querySelectorAll('a').find((a) => a.textContent === 'keys it minted');
	assert.equal(mints.getAttribute('href'), '#/keys?created_by=' + leaky.id);
	await go(ui, mints.getAttribute('href'));
	assert.deepEqual(alerts(ui), []);
	assert.ok(ui.root.querySelectorAll('h2').some((e) => e.textContent === `Keys minted by ${leaky.id}`));
	const names = ui.root.querySelectorAll('td[data-label="Name"]').map((td) => td.textContent);
	assert.deepEqual(names, ['kid1', 'kid2'], 'its own, live though it is revoked');
	for (const name of ['kid1', 'kid2']) await click(row(ui, name), 'Revoke');
	const listed = (await api('GET', '/keys?created_by=' + leaky.id, key)).body.data;
	assert.deepEqual(listed.map((k) => k.id), kids.map((k) => k.id));
	assert.ok(listed.every((k) => k.revoked_at), 'each revoked');
	assert.equal((await api('GET', '/keys/current', kids[0].secret)).status, 401);
	assert.equal((await api('GET', '/keys', key)).body.data.find((k) => k.name === 'bystander').revoked_at, null);

	// The filter takes a key id typed in.
	await go(ui, '#/keys');
	await submit(ui.root, 'Filter', { created_by: operatorId });
	const mine = ui.root.querySelectorAll('td[data-label="Name"]').map((td) => td.textContent);
	assert.deepEqual(mine, ['leaky', 'bystander']);
});

test('keys: a compromised key is revoked with every key minted from it, down the tree', async () => {
	const key = await signup();
	const mintBy = async (by, name, scopes) => (await api('POST', '/keys', by, { name, scopes })).body;
	const leaky = await mintBy(key, 'leaky', ['keys:write', 'effects:begin']);
	const middle = await mintBy(leaky.secret, 'middle', ['keys:write', 'effects:begin']);
	const bottom = await mintBy(middle.secret, 'bottom', ['effects:begin']);
	await api('POST', '/keys', key, { name: 'bystander', preset: 'AGENT' });

	const ui = await mount(key, '#/keys');
	await click(row(ui, 'bottom'), 'Revoke'); // revoked before: left as it was
	await click(row(ui, 'leaky'), 'Revoke with minted keys');
	assert.match(ui.confirms.at(-1), /and every live key minted from it/);
	assert.deepEqual(alerts(ui), []);
	const keys = (await api('GET', '/keys', key)).body.data;
	for (const name of ['leaky', 'middle', 'bottom']) {
		assert.ok(keys.find((k) => k.name === name).revoked_at, name);
		assert.match(row(ui, name).textContent, /revoked/, name);
	}
	assert.equal(keys.find((k) => k.name === 'bystander').revoked_at, null);
	assert.equal((await api('GET', '/keys/current', middle.secret)).status, 401);
	assert.equal(ui.storage.getItem(KEY_ITEM), key, 'still signed in');

	// A key revoked alone before: what it minted, still live, is revoked
	// from its row.
	const alone = await mintBy(key, 'alone', ['keys:write', 'effects:begin']);
	const orphan = await mintBy(alone.secret, 'orphan', ['effects:begin']);
	const again = await mount(key, '#/keys');
	await click(row(again, 'alone'), 'Revoke');
	assert.equal((await api('GET', '/keys/current', orphan.secret)).status, 200, 'a plain revoke leaves it');
	await click(row(again, 'alone'), 'Revoke minted keys');
	assert.match(again.confirms.at(-1), /Revoke every live key minted from "alone"/);
	assert.equal((await api('GET', '/keys/current', orphan.secret)).status, 401);

	// The console's own key in the tree signs it out, as the confirmation
	// says.
	const boss = await mintBy(key, 'boss', ['keys:write', 'effects:begin']);
	const own = await mintBy(boss.secret, 'console', ['keys:write', 'effects:begin']);
	const mine = await mount(own.secret, '#/keys');
	await click(row(mine, 'boss'), 'Revoke with minted keys');
	assert.match(mine.confirms.at(-1), /If this console’s key is among them, the console signs out/);
	assert.equal(mine.storage.getItem(KEY_ITEM), null);
	assert.match(mine.root.textContent, new RegExp(`This console’s key \\(${own.id}\\) is revoked: sign in with another key\\.`));
	assert.doesNotMatch(mine.root.textContent, /refused this key/);
});

test('a key or subscription made while its list has more pages is listed beside its secret; Load more then adds the rest once', async () => {
	// Console QA: keys and subscriptions are listed oldest first, so with
	// more than a page the new one was not listed; and "Load more" on the
	// list redrawn after the create failed with a TypeError.
	const key = await signup();
	for (const name of ['k1', 'k2']) await api('POST', '/keys', key, { name, preset: 'AGENT' });
	const ui = await mount(key, '#/keys?limit=2');
	const f = await submit(ui.root, 'Create key', { name: 'fresh', preset: 'AGENT', tools: '', ceiling: '', rate: '' });
	const secret = f.querySelector('input.secret-value').value;
	assert.match(secret, /^rk_/);
	assert.match(row(ui, 'fresh').textContent, /effects:begin/, 'listed beside its secret');
	assert.ok(!ui.root.querySelector('table').textContent.includes(secret), 'the secret is not in the list');
	await click(ui.root, 'Load more');
	assert.deepEqual(alerts(ui), []);
	const names = ui.root.querySelectorAll('td[data-label="Name"]').map((td) => td.textContent);
	assert.deepEqual([...names].sort(), ['fresh', 'k1', 'k2', 'operator (this console’s key)']);

	await api('POST', '/webhooks', key, { url: 'https://example.com/first', events: ['run.finished'] });
	await go(ui, '#/webhooks?limit=1');
	const w = fillSubscribe(ui, 'https://example.com/second', ['step.exhausted']);
	await w.dispatch('submit');
	await app.rendered();
	assert.match(w.querySelector('input.secret-value').value, /\S{16,}/);
	assert.match(row(ui, 'example.com/second').textContent, /step\.exhausted/, 'listed beside its secret');
	await click(ui.root, 'Load more');
	assert.deepEqual(alerts(ui), []);
	assert.deepEqual(ui.root.querySelectorAll('td[data-label="URL"]').map((td) => td.textContent).sort(), ['https://example.com/first', 'https://example.com/second']);
});

test('runs, steps and the queue: a step cancelled, then replayed naming what its preview saw', async () => {
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'onboarding' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'send_welcome_email', version: '1', input: { to: 'a@example.com' } })).body;
	const ui = await mount(key, '#/runs');
	assert.match(row(ui, run.id).textContent, /onboarding.*RUNNING/);
	await go(ui, '#/runs/' + run.id);
	assert.match(row(ui, step.stepId).textContent, /send_welcome_email@1/);
	await go(ui, '#/queue');
	assert.match(row(ui, 'send_welcome_email@1').textContent, /1/);
	assert.match(ui.root.textContent, /send_welcome_email/); // its endpoint

	await go(ui, '#/steps/' + step.stepId);
	assert.match(ui.root.textContent, /QUEUED/);
	assert.ok(!ui.root.textContent.includes('a@example.com'), 'the input as its redacted preview');
	await click(ui.root, 'Cancel step');
	assert.equal((await api('GET', `/steps/${step.stepId}`, key)).body.durableJob.status, 'CANCELLED');

	// The replay's count is of executions beyond those made.
	assert.match(formOf(button(ui.root, 'Replay')).textContent, /Additional executions \(1–10, beyond the attempts so far\)/);
	// The acknowledgement is required: the browser asks for it before the
	// replay is sent (README: what cannot be undone asks first). The service
	// is still the authority: a replay without it (sent here past the
	// browser's check, which the stand-in DOM does not make) is refused.
	const f = formOf(button(ui.root, 'Replay'));
	assert.ok(field(f, 'ack').hasAttribute('required'), 'the acknowledgement is asked for before sending');
	await submit(ui.root, 'Replay', { maxAttempts: '2', reason: 'vendor fixed' });
	assert.match(alerts(ui).join(), /acknowledgeDuplicateRisk/);
	field(f, 'ack').checked = true;
	// Its answer lost, sent again: answered the replay made, not a second.
	ui.loseAnswer = true;
	await f.dispatch('submit');
	await app.rendered();
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	await f.dispatch('submit');
	await app.rendered();
	assert.deepEqual(alerts(ui), []);
	const job = (await api('GET', `/steps/${step.stepId}`, key)).body.durableJob;
	assert.equal(job.status, 'QUEUED');
	assert.equal(job.maxAttempts, 2);
	assert.ok(ui.requests.includes(`POST /api/v1/steps/${step.stepId}/replay`));
	// Said in words (console QA, in a browser: the page redrew silently).
	assert.deepEqual(notices(ui), ['Replayed: the job is QUEUED, with 2 more executions allowed, on handler version 1.']);
	// The replay is listed under the attempts, from the job's audit
	// (console QA: not shown anywhere).
	assert.equal(job.replays.length, 1);
	const [audit] = job.replays;
	const replays = replayRows(ui);
	assert.equal(replays.length, 1, ui.root.textContent);
	assert.deepEqual(cells(replays[0]), {
		Replayed: time(audit.createdAt),
		'By key': audit.keyId + ' (this console’s key)',
		Reason: 'vendor fixed',
		Found: `CANCELLED after attempt ${audit.priorAttempt}`,
		Added: '2 (ceiling 2)',
		Handler: '1',
		Contract: '—',
	});
});

test("an endpoint's page: pause and resume, its policy edited naming its version, its attempts", async () => {
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'billing' })).body;
	await api('POST', `/runs/${run.id}/steps`, key, { name: 'charge_card', version: '2', input: { amount: 5 } });
	const endpoint = (await api('GET', '/endpoints', key)).body.data.find((e) => e.name === 'charge_card');
	const ui = await mount(key, '#/queue');
	const rows = ui.root.querySelectorAll('tr').filter((r) => r.textContent.includes('charge_card') && !r.textContent.includes('@2'));
	assert.equal(rows.length, 1, 'the endpoint, beside its queue health row');
	await click(rows[0], 'Pause');
	assert.equal((await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body.paused, true);
	await go(ui, '#/endpoints/' + endpoint.id);
	assert.match(ui.root.textContent, /Paused.*yes/);
	await click(ui.root, 'Resume');
	assert.equal((await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body.paused, false);

	const area = field(formOf(button(ui.root, 'Save endpoint policy')), 'policy');
	const policy = JSON.parse(area.value);
	assert.equal(policy.preset, 'STANDARD');
	await submit(ui.root, 'Save endpoint policy', { policy: area.value });
	assert.match(alerts(ui).join(), /Nothing changed/);
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ ...policy, maxAttempts: 3 }) });
	assert.match(alerts(ui).join(), /maxAttempts: is only allowed with preset CUSTOM/, 'the refused field named');
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ ...policy, rateLimitPerMinute: 60, maxConcurrent: 4 }) });
	let e = (await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body;
	assert.deepEqual([e.rateLimitPerMinute, e.maxConcurrent, e.maxAttempts, e.policyPreset], [60, 4, 5, 'STANDARD']);
	assert.deepEqual(alerts(ui), []);

	// Changed elsewhere meanwhile: refused, not overwritten.
	assert.equal((await api('PUT', `/endpoints/${endpoint.id}/policy`, key, { expectedVersion: e.version, rateLimitPerMinute: 30 })).status, 200);
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ ...policy, rateLimitPerMinute: 90 }) });
	assert.match(alerts(ui).join(), /version_conflict/);
	e = (await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body;
	assert.equal(e.rateLimitPerMinute, 30);

	// Switched to CUSTOM: the whole schedule is sent, from the editor (a
	// built-in preset shown expanded), not only the preset (console QA:
	// refused "maxAttempts is required for a CUSTOM policy").
	await go(ui, '#/queue');
	await go(ui, '#/endpoints/' + endpoint.id);
	const fresh = field(formOf(button(ui.root, 'Save endpoint policy')), 'policy');
	assert.equal(fresh.getAttribute('aria-label'), 'Policy of endpoint charge_card (JSON)');
	const shown = JSON.parse(fresh.value);
	assert.deepEqual([shown.maxAttempts, shown.initialDelayMs, shown.multiplier, shown.maxDelayMs, shown.jitterPercent], [5, 30000, 2, 900000, 20]);
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ preset: 'CUSTOM' }) });
	assert.match(alerts(ui).join(), /A CUSTOM policy needs its whole schedule: add maxAttempts, initialDelayMs, multiplier, maxDelayMs, jitterPercent/);
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ ...shown, preset: 'CUSTOM' }) });
	assert.deepEqual(alerts(ui), []);
	e = (await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body;
	assert.deepEqual([e.policyPreset, e.maxAttempts, e.retryPolicy.initialDelayMs, e.retryPolicy.maxDelayMs, e.rateLimitPerMinute], ['CUSTOM', 5, 30000, 900000, 30]);
	assert.equal(ui.root.querySelector('p.notice').textContent, `Saved (version ${e.version}).`);
	// Then edited field by field, as any CUSTOM policy.
	const custom = JSON.parse(field(formOf(button(ui.root, 'Save endpoint policy')), 'policy').value);
	await submit(ui.root, 'Save endpoint policy', { policy: JSON.stringify({ ...custom, maxAttempts: 3 }) });
	e = (await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body;
	assert.deepEqual([e.policyPreset, e.maxAttempts], ['CUSTOM', 3]);

	// Its attempts: one a worker failed.
	const { worker, workerId } = await registerWorker(key, 'charge_card', '2');
	const [job] = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
	const report = await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: 'card declined', retryable: false } });
	assert.equal(report.status, 200);
	await go(ui, '#/endpoints/' + endpoint.id + '?outcome=FAILED');
	assert.match(row(ui, job.stepId).textContent, /card declined/);
});

test("a lapsed attempt's warning is shown on its step's page and its endpoint's attempts", async () => {
	// Console QA: an attempt whose lease lapsed without a report reads
	// FAILED with no error message, and only its warning says that its side
	// effect may have happened; the pages did not show it.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'export' })).body;
	// The test server's lease grace is 500 ms (TestConsole).
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'export_rows', version: '1', input: {}, timeoutMs: 1000 })).body;
	const { worker, workerId } = await registerWorker(key, 'export_rows', '1');
	const claim = async () => (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
	assert.equal((await claim()).length, 1);
	await new Promise((r) => setTimeout(r, 1700));
	assert.equal((await claim()).length, 1, 'claimed again once its lease lapsed');
	const s = (await api('GET', `/steps/${step.stepId}`, key)).body;
	const lapsed = s.durableJob.attempts.find((a) => a.attempt === 1);
	assert.deepEqual([lapsed.outcome, lapsed.errorMessage], ['FAILED', null]);
	assert.match(lapsed.warning, /^Lease expired without a report/);

	const ui = await mount(key, '#/steps/' + step.stepId);
	assert.equal(document.title, `Step ${step.stepId} — Ratchet console`);
	const rows = ui.root.querySelectorAll('tr').filter((r) => r.textContent.startsWith('1' + workerId));
	assert.equal(rows.length, 1, ui.root.textContent);
	assert.equal(rows[0].querySelector('td[data-label="Error (redacted) / warning"]').textContent, 'Warning: ' + lapsed.warning);

	const endpoint = (await api('GET', '/endpoints', key)).body.data.find((e) => e.name === 'export_rows');
	await go(ui, '#/endpoints/' + endpoint.id + '?outcome=FAILED');
	assert.ok(row(ui, step.stepId).textContent.includes('Warning: ' + lapsed.warning));
});

test('a step replayed while its cancelled attempt may still run says it waits for that attempt, on its page, its run and the queue', async () => {
	// Console QA: a step cancelled while RUNNING and replayed is given to no
	// worker until the cancelled attempt reports or its lease expires
	// (migrations 0060, 0061); its page read QUEUED with a plain due time,
	// and the attempt "—", as if nothing ran.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'held' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'slow_export', version: '1', input: {}, timeoutMs: 60000 })).body;
	const { worker, workerId } = await registerWorker(key, 'slow_export', '1');
	const [job] = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key, {})).status, 200);
	const lease = (await api('GET', `/steps/${step.stepId}`, key)).body.durableJob.leaseExpiresAt;
	assert.ok(lease);

	const ui = await mount(key, '#/steps/' + step.stepId);
	assert.deepEqual(notices(ui), [`Attempt 1 was running when the step was cancelled and may still be: its worker learns of the cancel at its next heartbeat, and its lease expires ${time(lease)}. A replay waits for it to report or for its lease to expire.`]);
	assert.equal(fieldValue(ui, 'Lease until'), time(lease));
	const f = formOf(button(ui.root, 'Replay'));
	field(f, 'ack').checked = true;
	await f.dispatch('submit');
	await app.rendered();
	const held = (await api('GET', `/steps/${step.stepId}`, key)).body.durableJob;
	assert.deepEqual([held.status, held.dueAt, held.leaseExpiresAt], ['QUEUED', lease, lease]);
	assert.deepEqual(notices(ui), [
		'Replayed: the job is QUEUED, with 1 more execution allowed, on handler version 1.',
		`Waiting for its cancelled attempt 1, which may still be running: no worker is given this step until that attempt reports or its lease expires (${time(lease)}), whichever comes first. Its worker learns of the cancel at its next heartbeat.`,
	]);
	assert.equal(fieldValue(ui, 'Due'), `${time(lease)}, or sooner if attempt 1 reports`);

	await go(ui, '#/runs/' + run.id);
	assert.equal(cells(row(ui, step.stepId)).Job, 'QUEUED, 1/2, waiting for cancelled attempt 1');
	await go(ui, '#/queue');
	const health = cells(row(ui, 'slow_export@1'));
	assert.equal(health.Due, '0');
	assert.match(health.Note, /a replayed job waits for its cancelled attempt, which may still be running/);

	// Its attempt reports: the step is due, and waits for nothing.
	assert.equal((await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'SUCCEEDED', output: {} })).status, 200);
	const due = (await api('GET', `/steps/${step.stepId}`, key)).body.durableJob;
	assert.equal(due.leaseExpiresAt, null);
	await go(ui, '#/steps/' + step.stepId);
	assert.deepEqual(notices(ui), []);
	assert.equal(fieldValue(ui, 'Due'), time(due.dueAt));
	assert.equal(cells(ui.root.querySelectorAll('tr').find((r) => r.querySelector('td[data-label="Worker"]'))).Outcome, 'SUCCEEDED');
	await go(ui, '#/runs/' + run.id);
	assert.equal(cells(row(ui, step.stepId)).Job, 'QUEUED, 1/2');
});

test("a step's retry policy as enqueued, a CUSTOM one spelled out, and a worker's retryAfterMs", async () => {
	// Console QA: the step page showed neither the policy its job runs
	// under (a CUSTOM one's name says nothing of its schedule) nor the
	// retryAfterMs a worker reported, which put its due time past the
	// policy's delay.
	const key = await signup();
	assert.equal((await api('POST', '/endpoints', key, { name: 'slow_vendor', preset: 'CUSTOM', maxAttempts: 4, initialDelayMs: 2000, multiplier: 3, maxDelayMs: 60000, jitterPercent: 0 })).status, 201);
	const run = (await api('POST', '/runs', key, { name: 'retry' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'notify_vendor', version: '1', input: {}, endpoint: 'slow_vendor', maxAttempts: 3, timeoutMs: 45000 })).body;
	const plain = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'notify_vendor', version: '1', input: { n: 2 } })).body;
	const { worker, workerId } = await registerWorker(key, 'notify_vendor', '1');
	const jobs = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 2 })).body.jobs;
	const job = jobs.find((j) => j.stepId === step.stepId);
	const report = await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: 'slow down', retryable: true, retryAfterMs: 120000 } });
	assert.equal(report.body.status, 'RETRY_SCHEDULED');
	const s = (await api('GET', `/steps/${step.stepId}`, key)).body;
	assert.equal(s.durableJob.policy.preset, 'CUSTOM');

	const ui = await mount(key, '#/steps/' + step.stepId);
	assert.equal(fieldValue(ui, 'Retry policy'), 'CUSTOM: 3 attempts, retried after 2 s, then ×3 each time up to 60 s (±0% jitter); timeout 45 s (as enqueued: endpoint policy version 1)');
	assert.equal(fieldValue(ui, 'Due'), time(s.durableJob.dueAt));
	const attempt = cells(ui.root.querySelectorAll('tr').find((r) => r.querySelector('td[data-label="Worker"]')));
	assert.deepEqual([attempt.Retryable, attempt['Retry after'], attempt['Error (redacted) / warning']], ['yes', 'at least 2 min (asked by the worker)', 'slow down']);

	await go(ui, '#/steps/' + plain.stepId);
	assert.equal(fieldValue(ui, 'Retry policy'), 'STANDARD: 5 attempts, retried after 30 s, then ×2 each time up to 15 min (±20% jitter); timeout 30 s (as enqueued: endpoint policy version 1)');
	assert.equal(cells(ui.root.querySelectorAll('tr').find((r) => r.querySelector('td[data-label="Worker"]')))['Retry after'], '—');
});

test("an endpoint's open circuit says since when and when a probe may run; its limits are shown", async () => {
	// Console QA: an open breaker read "open, 1 failures in a row", not
	// when its jobs would move again; maxConcurrent and rateLimitPerMinute,
	// which the queue's notes name as holding jobs, showed only in the
	// policy's JSON.
	const key = await signup();
	const endpoint = (await api('POST', '/endpoints', key, { name: 'flaky_vendor', circuitFailureThreshold: 1, circuitCooldownMs: 600000, maxConcurrent: 2, rateLimitPerMinute: 30 })).body;
	const run = (await api('POST', '/runs', key, { name: 'breaker' })).body;
	for (const n of [1, 2]) await api('POST', `/runs/${run.id}/steps`, key, { name: 'call_vendor', version: '1', input: { n }, endpoint: 'flaky_vendor' });
	const { worker, workerId } = await registerWorker(key, 'call_vendor', '1');
	const [job] = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
	assert.equal((await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: 'down', retryable: true } })).status, 200);
	const e = (await api('GET', `/endpoints/${endpoint.id}/policy`, key)).body;
	assert.equal(e.circuit.state, 'open');

	const ui = await mount(key, '#/endpoints/' + endpoint.id);
	assert.equal(fieldValue(ui, 'Circuit'), `open since ${time(e.circuit.openedAt)}: its jobs wait; one probe may be claimed from ${time(e.circuit.probeAt)}; 1 failure in a row (opens after 1 in a row, probes every 10 min)`);
	assert.equal(fieldValue(ui, 'Limits'), 'at most 2 running at once; at most 30 started a minute');
	await go(ui, '#/queue');
	const listed = ui.root.querySelectorAll('tr').filter((r) => cells(r).Endpoint === 'flaky_vendor');
	assert.equal(listed.length, 1);
	assert.deepEqual([cells(listed[0]).Circuit, cells(listed[0]).Limits], ['open', 'at most 2 running at once; at most 30 started a minute']);
	assert.match(cells(row(ui, 'call_vendor@1')).Note, /The circuit of endpoint flaky_vendor is open/);

	await click(listed[0], 'Close circuit');
	await go(ui, '#/endpoints/' + endpoint.id);
	assert.match(fieldValue(ui, 'Circuit'), /^closed; \d+ failures? in a row \(opens after 1 in a row, probes every 10 min\)$/);
	const other = (await api('POST', '/endpoints', key, { name: 'plain_vendor' })).body;
	await go(ui, '#/endpoints/' + other.id);
	assert.equal(fieldValue(ui, 'Limits'), 'none');
	assert.equal(fieldValue(ui, 'Circuit'), 'closed; 0 failures in a row (the breaker is off)');
});

test("a tool's next contract is drafted from its newest, also when its list has more pages", async () => {
	// Console QA: the draft was the first page's last contract, an older
	// one past a page (or a first page ended early at 4 MB of schemas), and
	// so was the test job's handler version.
	const key = await signup();
	for (const v of [1, 2, 3]) {
		assert.equal((await api('POST', '/tools/paged_tool/contracts', key, { handlerVersion: String(v), inputSchema: { type: 'object' }, outputSchema: true, timeoutMs: 1000 * v })).status, 201);
	}
	const ui = await mount(key, '#/tools/paged_tool?limit=1');
	assert.deepEqual(ui.root.querySelectorAll('td[data-label="Contract"]').map((td) => td.textContent), ['1']);
	assert.ok(button(ui.root, 'Load more'));
	const draft = JSON.parse(field(formOf(button(ui.root, 'Publish')), 'contract').value);
	assert.deepEqual([draft.handlerVersion, draft.timeoutMs], ['3', 3000]);
	assert.equal(field(formOf(button(ui.root, 'Enqueue test job')), 'version').value, '3');
	assert.deepEqual(alerts(ui), []);
});

test('an attempt whose error message the server cannot decrypt says so', async () => {
	// Seal QA: a server no longer configured with the key that sealed an
	// attempt's message answers it null with errorMessageUnreadable (as
	// lib/reseal's TestAnUnreadableErrorMessageLeavesTheRestReadable reads
	// it); the cell would read "—", as if the worker had said nothing.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'notify' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'send_sms', version: '1', input: {}, maxAttempts: 1 })).body;
	const { worker, workerId } = await registerWorker(key, 'send_sms', '1');
	const [job] = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
	const report = await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: 'carrier down', retryable: false } });
	assert.equal(report.status, 200);
	const unreadable = async (url, res) => {
		if (!url.startsWith('/api/v1/steps/')) return res;
		const body = await res.json();
		for (const a of body.durableJob.attempts) Object.assign(a, { errorMessage: null, errorMessageUnreadable: true });
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/steps/' + step.stepId, unreadable);
	const cells = ui.root.querySelectorAll('td[data-label="Error (redacted) / warning"]');
	assert.equal(cells.length, 1, ui.root.textContent);
	assert.equal(cells[0].textContent, 'Message unreadable: sealed with an encryption key this server is not configured with');
	assert.ok(!ui.root.textContent.includes('carrier down'));
});

test('a replay preview whose saved input the server cannot decrypt says so for each contract', async () => {
	// Seal QA: a server no longer configured with the key that sealed a
	// step's input previews its replay with inputUnreadable and every
	// upgrade compatible: false, validation [] (as lib/reseal's
	// TestAnUnreadableInputStillPreviewsItsReplay reads it); the cell read
	// "does not fit: " with no reason.
	const key = await signup();
	assert.equal((await api('POST', '/tools/send_fax/contracts', key, { handlerVersion: '2', inputSchema: { type: 'object' }, outputSchema: {} })).status, 201);
	const run = (await api('POST', '/runs', key, { name: 'fax' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'send_fax', version: '1', input: { to: 'secret-number' } })).body;
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key)).status, 200);
	const unreadable = async (url, res) => {
		if (url !== `/api/v1/steps/${step.stepId}/replay`) return res;
		const body = await res.json();
		body.inputUnreadable = true;
		for (const u of body.upgrades) Object.assign(u, { compatible: false, validation: [] });
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/steps/' + step.stepId, unreadable);
	const cells = ui.root.querySelectorAll('td[data-label="Saved input"]');
	assert.equal(cells.length, 1, ui.root.textContent);
	assert.equal(cells[0].textContent, 'unknown: the saved input is sealed with an encryption key this server is not configured with');
	assert.ok(!ui.root.textContent.includes('contract 1: handler 2'), 'no contract offered to run with');
	// Every replay of it is refused (500, changing nothing): a note, no form.
	assert.deepEqual(ui.root.querySelectorAll('button').filter((b) => b.textContent === 'Replay'), []);
	assert.match(ui.root.textContent, /No replay for now: the saved input is sealed with an encryption key this server is not configured with, or damaged/);
});

test('an effect whose result the server cannot decrypt says so on its page and in the list', async () => {
	// Seal QA: a server that cannot decrypt an effect's result answers it
	// null with result_unreadable (lib/reseal's
	// TestAnUnreadableResultReadsAsResultUnreadable); the console showed
	// nothing of it, though a begin on its key is refused until it can.
	const key = await signup();
	const d = (await api('POST', '/effects/begin', key, { effect_type: 'email.send', idempotency_key: 'sealed:1', payload: { to: 'a' } })).body;
	assert.equal((await api('POST', `/effects/${d.effect_id}/report`, key, { lease_token: d.lease_token, outcome: 'succeeded', result: { id: 'msg_1' } })).status, 200);
	const unreadable = async (url, res) => {
		if (!url.startsWith('/api/v1/effects')) return res;
		const body = await res.json();
		for (const e of body.data || [body]) Object.assign(e, { result: null, result_unreadable: true });
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/effects/' + d.effect_id, unreadable);
	assert.match(ui.root.textContent, /Result unreadable: the recorded result is sealed with an encryption key this server is not configured with, or damaged\./);
	assert.equal(ui.root.querySelectorAll('p.notice').length, 1);
	await go(ui, '#/effects');
	assert.equal(row(ui, 'sealed:1').querySelectorAll('td[data-label="State"]')[0].textContent, 'succeeded (result unreadable)');

	const plain = await mount(key, '#/effects/' + d.effect_id);
	assert.ok(!plain.root.textContent.includes('Result unreadable'), 'said only when so');
	await go(plain, '#/effects');
	assert.equal(row(plain, 'sealed:1').querySelectorAll('td[data-label="State"]')[0].textContent, 'succeeded');
});

test('a webhook whose signing secret the server cannot decrypt says no delivery is sent', async () => {
	// Seal QA: a subscription whose secret the server cannot decrypt reads
	// secret_unreadable (lib/webhooks'
	// TestASecretThatCannotBeOpenedReadsSecretUnreadable): its deliveries
	// are not sent, and only the server's log said so.
	const key = await signup();
	const hook = (await api('POST', '/webhooks', key, { url: 'https://example.com/sealed', events: ['run.finished'] })).body;
	const unreadable = async (url, res) => {
		if (!url.startsWith('/api/v1/webhooks') || url.includes('/deliveries')) return res;
		const body = await res.json();
		for (const w of body.data || [body]) w.secret_unreadable = true;
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/webhooks', unreadable);
	assert.equal(row(ui, 'example.com/sealed').querySelectorAll('td[data-label="Signing secret"]')[0].textContent, 'unreadable: no delivery is sent');
	await go(ui, '#/webhooks/' + hook.id);
	assert.match(ui.root.textContent, /Signing secretunreadable/);
	assert.match(ui.root.textContent, /This server cannot decrypt the signing secret .* so no delivery is sent/);

	const plain = await mount(key, '#/webhooks');
	assert.equal(row(plain, 'example.com/sealed').querySelectorAll('td[data-label="Signing secret"]')[0].textContent, 'readable');
	await go(plain, '#/webhooks/' + hook.id);
	assert.ok(!plain.root.textContent.includes('cannot decrypt'), 'said only when so');
});

// A step not eligible for replay says why, as the replay's refusal would
// (agent QA: a CANCELLED step read "not eligible" with no reason).
test('a cancelled step waiting for its dependency says why it cannot be replayed yet', async () => {
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'chain' })).body;
	const first = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'fetch', version: '1', input: {} })).body;
	const then = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'fetch', version: '1', input: { n: 2 }, afterStepId: first.stepId, afterStatus: 'SUCCEEDED' })).body;
	assert.equal((await api('POST', `/steps/${then.stepId}/cancel`, key, {})).status, 200);
	const ui = await mount(key, '#/steps/' + then.stepId);
	assert.match(ui.root.textContent, /Not eligible for replay \(job CANCELLED\): The step this one depends on \(afterStepId\) has not ended; replay after it\./);
	assert.deepEqual(ui.root.querySelectorAll('button').filter((b) => b.textContent === 'Replay'), []);
});

test("a group's page lists its effects and what each compensates", async () => {
	const key = await signup();
	const group = (await api('POST', '/groups', key, { name: 'order-7' })).body;
	const begun = (await api('POST', '/effects/begin', key, {
		effect_type: 'inventory.reserve',
		idempotency_key: 'reserve:7',
		payload: { sku: 'a' },
		group_id: group.id,
		compensation: { effect_type: 'inventory.release', payload: { sku: 'a' } },
	})).body;
	const ui = await mount(key, '#/effects/' + begun.effect_id);
	await go(ui, '#/groups/' + group.id); // as the effect page links it
	assert.match(ui.root.textContent, /order-7/);
	assert.match(row(ui, begun.effect_id).textContent, /inventory\.reserve.*reserve:7.*leased.*declared/);
});

test("an unwinding group's page shows what its rollback still owes; an open group's page starts none", async () => {
	const key = await signup();
	const group = (await api('POST', '/groups', key, { name: 'order-8' })).body;
	const forward = async (k, compensated) => {
		const b = (await api('POST', '/effects/begin', key, {
			effect_type: 'inventory.reserve',
			idempotency_key: 'reserve:' + k,
			payload: { sku: k },
			group_id: group.id,
			...(compensated ? { compensation: { effect_type: 'inventory.release', payload: { sku: k } } } : {}),
		})).body;
		assert.equal(b.decision, 'execute', JSON.stringify(b));
		assert.equal((await api('POST', `/effects/${b.effect_id}/report`, key, { lease_token: b.lease_token, outcome: 'succeeded' })).status, 200);
		return b.effect_id;
	};
	const a = await forward('a', true);
	const b = await forward('b', true);
	const c = await forward('c', false);
	const d = await forward('d', true);
	const compensate = async (step, k, sku) => {
		const r = (await api('POST', '/effects/begin', key, { effect_type: 'inventory.release', idempotency_key: k, payload: { sku }, compensates_effect_id: step })).body;
		assert.equal(r.decision, 'execute', JSON.stringify(r));
		return r;
	};

	// Not unwinding: the page asks for no plan (unwind would start a rollback).
	let ui = await mount(key, '#/groups/' + group.id);
	assert.ok(!ui.requests.some((r) => r.endsWith('/unwind')), ui.requests.join());
	assert.doesNotMatch(ui.root.textContent, /Unwind plan/);
	assert.equal((await api('GET', `/groups/${group.id}`, key)).body.state, 'open');

	assert.equal((await api('POST', `/groups/${group.id}/unwind`, key)).status, 200);
	const undoD = await compensate(d, 'compensate:' + d, 'd');
	assert.equal((await api('POST', `/effects/${undoD.effect_id}/report`, key, { lease_token: undoD.lease_token, outcome: 'succeeded' })).status, 200);
	const undoB = await compensate(b, 'undo-b', 'b'); // in flight, under a key of its own

	const plan = (ui) => Object.fromEntries(
		ui.root.querySelectorAll('tr').filter((r) => r.querySelector('td[data-label="Suggested idempotency key"]')).map((r) => [cells(r).Step, cells(r)]),
	);
	ui = await mount(key, '#/groups/' + group.id);
	assert.match(ui.root.textContent, /Unwind plan/);
	let p = plan(ui);
	assert.deepEqual(Object.keys(p)[0], b, 'the plan first');
	assert.deepEqual(p[b], { Step: b, Type: 'inventory.reserve', Compensation: `begun (leased) ${undoB.effect_id}`, 'Suggested idempotency key': 'undo-b' });
	assert.deepEqual(p[d].Compensation, `succeeded ${undoD.effect_id}`);
	assert.deepEqual(p[d]['Suggested idempotency key'], '—');
	assert.deepEqual(p[c].Compensation, 'irreversible (none declared)');
	assert.deepEqual(p[a].Compensation, 'owed');
	assert.match(p[a]['Suggested idempotency key'], /not offered yet/);
	assert.match(ui.root.textContent, new RegExp(`The plan stops at an outcome not known yet \\(in flight, or to check at the vendor and resolve\\): ${undoB.effect_id}\\.`));

	assert.equal((await api('POST', `/effects/${undoB.effect_id}/report`, key, { lease_token: undoB.lease_token, outcome: 'succeeded' })).status, 200);
	ui = await mount(key, '#/groups/' + group.id);
	p = plan(ui);
	assert.deepEqual(p[a], { Step: a, Type: 'inventory.reserve', Compensation: 'owed', 'Suggested idempotency key': 'compensate:' + a });
	assert.deepEqual(p[b].Compensation, `succeeded ${undoB.effect_id}`);
	assert.doesNotMatch(ui.root.textContent, /plan stops/);
	assert.equal((await api('GET', `/groups/${group.id}`, key)).body.state, 'unwinding');
});

test("an unwind plan cut to fit one answer says so, and what it left out is offered on its next read", async () => {
	// Size QA (de46bcd): a plan that would pass 4 MB holds its first items
	// with plan_truncated; the console read the rest as held by an unknown
	// outcome that did not exist. Compensations of 1 MiB are too big to
	// make here: the service's answer is cut as the router cuts it.
	const key = await signup();
	const group = (await api('POST', '/groups', key, { name: 'order-9' })).body;
	const steps = [];
	for (const k of ['a', 'b']) {
		const b = (await api('POST', '/effects/begin', key, {
			effect_type: 'inventory.reserve',
			idempotency_key: 'reserve-9:' + k,
			payload: { sku: k },
			group_id: group.id,
			compensation: { effect_type: 'inventory.release', payload: { sku: k } },
		})).body;
		assert.equal((await api('POST', `/effects/${b.effect_id}/report`, key, { lease_token: b.lease_token, outcome: 'succeeded' })).status, 200);
		steps.push(b.effect_id);
	}
	const whole = (await api('POST', `/groups/${group.id}/unwind`, key)).body;
	assert.deepEqual([whole.plan.map((p) => p.effect_id), whole.plan_truncated], [[steps[1], steps[0]], false]);
	const cut = async (url, res) => {
		if (url !== `/api/v1/groups/${group.id}/unwind`) return res;
		const body = await res.json();
		body.plan = body.plan.slice(0, 1);
		body.plan_truncated = true;
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/groups/' + group.id, cut);
	assert.deepEqual(notices(ui), ['This read of the plan holds its first 1 compensation only: the rest would pass what one answer holds (about 4 MB). Perform them, then reload this page for the rest.']);
	assert.doesNotMatch(ui.root.textContent, /plan stops|not offered yet/);
	const suggested = (id) => cells(ui.root.querySelectorAll('tr').find((r) => r.querySelector('td[data-label="Suggested idempotency key"]') && cells(r).Step === id))['Suggested idempotency key'];
	assert.equal(suggested(steps[1]), whole.plan[0].suggested_idempotency_key);
	assert.equal(suggested(steps[0]), 'not in this read of the plan (cut to fit one answer): perform those above, then reload this page');

	const plain = await mount(key, '#/groups/' + group.id);
	assert.deepEqual(notices(plain), []);
});

test("a group read cut to fit one answer says so and pages the rest with Load more; an unwinding one's plan reads them all", async () => {
	// Size QA (3b962a4): a group whose steps would pass 4 MB is read with
	// its first steps and steps_truncated (GET …/steps pages the rest); the
	// console showed the first as if they were all, and its unwind plan
	// left out what the later steps owed. Some 3 000 steps of long keys are
	// too many to make here: the group's read is cut as the router cuts it.
	const key = await signup();
	const group = (await api('POST', '/groups', key, { name: 'order-10' })).body;
	const steps = [];
	for (const k of ['a', 'b', 'c']) {
		const b = (await api('POST', '/effects/begin', key, {
			effect_type: 'inventory.reserve',
			idempotency_key: 'reserve-10:' + k,
			payload: { sku: k },
			group_id: group.id,
			compensation: { effect_type: 'inventory.release', payload: { sku: k } },
		})).body;
		assert.equal((await api('POST', `/effects/${b.effect_id}/report`, key, { lease_token: b.lease_token, outcome: 'succeeded' })).status, 200);
		steps.push(b.effect_id);
	}
	const whole = (await api('GET', `/groups/${group.id}`, key)).body;
	assert.deepEqual([whole.steps.map((st) => st.effect_id), whole.steps_truncated], [steps, false]);
	const cut = async (url, res) => {
		if (url !== `/api/v1/groups/${group.id}`) return res;
		const body = await res.json();
		body.steps = body.steps.slice(0, 1);
		body.steps_truncated = true;
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const shownSteps = (ui) => ui.root.querySelectorAll('tr').filter((r) => r.querySelector('td[data-label="Effect"]')).map((r) => cells(r).Effect);
	const ui = await mount(key, `#/groups/${group.id}?limit=1`, cut);
	assert.deepEqual(notices(ui), ['This read of the group holds its first 1 step only: the rest would pass what one answer holds (about 4 MB). “Load more” below reads them.']);
	assert.deepEqual(shownSteps(ui), steps.slice(0, 1));
	await click(ui.root, 'Load more');
	assert.deepEqual(shownSteps(ui), steps.slice(0, 2));
	assert.equal(ui.requests.at(-1), `GET /api/v1/groups/${group.id}/steps?limit=1&cursor=${steps[0]}`, 'after the last one shown');
	await click(ui.root, 'Load more');
	assert.deepEqual(shownSteps(ui), steps);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Load more'));

	// Unwinding: every step is read, and the plan offers each one's compensation.
	const unwind = (await api('POST', `/groups/${group.id}/unwind`, key)).body;
	assert.deepEqual(unwind.plan.map((p) => p.effect_id), [...steps].reverse());
	const again = await mount(key, '#/groups/' + group.id, cut);
	assert.deepEqual(shownSteps(again), steps);
	assert.deepEqual(notices(again), []);
	assert.ok(!again.root.querySelectorAll('button').some((b) => b.textContent === 'Load more'));
	const suggested = Object.fromEntries(again.root.querySelectorAll('tr').filter((r) => r.querySelector('td[data-label="Suggested idempotency key"]'))
		.map((r) => [cells(r).Step, cells(r)['Suggested idempotency key']]));
	assert.deepEqual(suggested, Object.fromEntries(unwind.plan.map((p) => [p.effect_id, p.suggested_idempotency_key])));

	const plain = await mount(key, '#/groups/' + group.id);
	assert.deepEqual(shownSteps(plain), steps);
	assert.ok(!plain.requests.some((r) => r.includes('/steps')), 'a whole read pages nothing');
});

test("a step replayed past 50 times says its earlier attempts and replays are left out, and loads them above those shown", async () => {
	// Size QA (3b962a4): a step answers its job's last 50 attempts and last
	// 50 replays (attemptsTruncated, replaysTruncated; GET …/attempts and
	// …/replays page them all); the console showed the last 50 as if they
	// were all.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'replayed' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'replayed_export', version: '1', input: {}, maxAttempts: 1 })).body;
	const { worker, workerId } = await registerWorker(key, 'replayed_export', '1');
	const replays = 52; // attempts: one more
	for (let i = 0; ; i++) {
		const [job] = (await api('POST', `/workers/${workerId}/claim`, worker, { limit: 1 })).body.jobs;
		assert.ok(job, `attempt ${i + 1} claimed`);
		const report = await api('POST', `/jobs/${job.jobId}/report`, worker, { leaseToken: job.leaseToken, status: 'FAILED', error: { message: `failure ${i + 1}`, retryable: false } });
		assert.equal(report.status, 200);
		if (i === replays) break;
		const r = await api('POST', `/steps/${step.stepId}/replay`, key, { acknowledgeDuplicateRisk: true, reason: `replay ${i + 1}`, expectedAttempt: i + 1 });
		assert.equal(r.status, 200, JSON.stringify(r.body));
	}
	const job = (await api('GET', `/steps/${step.stepId}`, key)).body.durableJob;
	assert.deepEqual([job.attempts.length, job.attempts[0].attempt, job.attemptsTruncated], [50, 4, true]);
	assert.deepEqual([job.replays.length, job.replays[0].reason, job.replaysTruncated], [50, 'replay 3', true]);

	const numbers = (ui) => ui.root.querySelectorAll('tr').filter((r) => r.querySelector('td[data-label="#"]')).map((r) => Number(cells(r)['#']));
	const reasons = (ui) => replayRows(ui).map((r) => cells(r).Reason);
	const span = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);
	const ui = await mount(key, `#/steps/${step.stepId}?limit=2`);
	assert.deepEqual(notices(ui), [
		'Only the last 50 attempts are shown (from attempt 4): the step’s read leaves the earlier ones out.',
		`Only the last 50 replays are shown (from ${time(job.replays[0].createdAt)}): the step’s read leaves the earlier ones out.`,
	]);
	assert.deepEqual(numbers(ui), span(4, 53));
	assert.deepEqual(reasons(ui), span(3, 52).map((n) => `replay ${n}`));

	// A page of 2 at a time: attempts 1 and 2 above those shown, then 3
	// (the page's 4 is shown already: the list is whole).
	button(ui.root, 'Load earlier attempts').focus();
	await click(ui.root, 'Load earlier attempts');
	assert.deepEqual(numbers(ui), [1, 2, ...span(4, 53)]);
	assert.equal(document.activeElement, button(ui.root, 'Load earlier attempts'), 'the next one has the focus');
	assert.equal(ui.requests.at(-1), `GET /api/v1/steps/${step.stepId}/attempts?limit=2`);
	await click(ui.root, 'Load earlier attempts');
	assert.equal(ui.requests.at(-1), `GET /api/v1/steps/${step.stepId}/attempts?limit=2&cursor=2`);
	assert.deepEqual(numbers(ui), span(1, 53));
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Load earlier attempts'));
	const first = ui.root.querySelectorAll('tr').find((r) => r.querySelector('td[data-label="#"]') && cells(r)['#'] === '1');
	assert.equal(cells(first)['Error (redacted) / warning'], 'failure 1');

	await click(ui.root, 'Load earlier replays');
	assert.deepEqual(reasons(ui), span(1, 52).map((n) => `replay ${n}`));
	await click(ui.root, 'Load earlier replays'); // its 3 is shown already
	assert.deepEqual(reasons(ui), span(1, 52).map((n) => `replay ${n}`));
	assert.deepEqual(notices(ui), ['All 53 attempts are shown.', 'All 52 replays are shown.']);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Load earlier replays'));
	assert.deepEqual(alerts(ui), []);

	// A step with fewer says nothing of the kind.
	const other = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'replayed_export', version: '1', input: { n: 2 } })).body;
	const plain = await mount(key, '#/steps/' + other.stepId);
	assert.deepEqual(notices(plain), []);
	assert.ok(!plain.root.querySelectorAll('button').some((b) => /^Load earlier/.test(b.textContent)));
});

test('a key without effects:resolve is told so on an unknown outcome, not asked to confirm a resolve it would be refused', async () => {
	const key = await signup();
	const begun = (await api('POST', '/effects/begin', key, { effect_type: 'email.send', idempotency_key: 'e:1', payload: {}, lease_seconds: 1 })).body;
	await new Promise((r) => setTimeout(r, 1200));
	const needs = /Resolving needs the scope effects:resolve, which this key lacks/;

	// Any key's scopes are read from its own record (GET /keys/current),
	// whatever they are: no form, nothing to confirm, nothing refused.
	const narrow = (await api('POST', '/keys', key, { name: 'narrow', scopes: ['effects:read'] })).body.secret;
	let ui = await mount(narrow, '#/effects/' + begun.effect_id);
	assert.match(ui.root.textContent, /indeterminate/);
	assert.match(ui.root.textContent, needs);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Resolve'), 'no form');
	assert.ok(ui.requests.includes('GET /api/v1/keys/current'));
	assert.ok(!ui.requests.some((r) => r.startsWith('POST /api/v1/effects/')), 'nothing sent to be refused');
	const asked = ui.confirms.length;

	// The operator's key holds it: offered the form.
	ui = await mount(key, '#/effects/' + begun.effect_id);
	assert.doesNotMatch(ui.root.textContent, needs);
	button(ui.root, 'Resolve');
	assert.equal(asked, 0);
	assert.equal((await api('GET', `/effects/${begun.effect_id}`, key)).body.state, 'indeterminate');
});

test('a replay onto another handler: the contracts that fit offered, the version change acknowledged', async () => {
	const key = await signup();
	const publish = (handlerVersion, inputSchema) =>
		api('POST', '/tools/resize_image/contracts', key, { handlerVersion, inputSchema, timeoutMs: 30000, retryPreset: 'STANDARD' });
	assert.equal((await publish('1', { type: 'object' })).status, 201);
	assert.equal((await publish('2', { type: 'object', required: ['url'] })).status, 201);
	assert.equal((await publish('3', { type: 'object', required: ['bucket'] })).status, 201);
	const run = (await api('POST', '/runs', key, { name: 'images' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'resize_image', version: '1', contractVersion: 1, input: { url: 'https://x/y.png' } })).body;
	assert.equal(step.status, 'QUEUED', JSON.stringify(step));
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key, {})).status, 200);

	const ui = await mount(key, '#/steps/' + step.stepId);
	assert.match(row(ui, 'does not fit').textContent, /^3.*bucket/);
	const f = formOf(button(ui.root, 'Replay'));
	const target = field(f, 'target');
	assert.deepEqual(target.querySelectorAll('option').map((o) => o.value), ['', '2'], 'only the contract the input fits');
	// The handler's review is asked for only when another handler is
	// chosen, and then required; the same handler asks for none.
	const reviewed = () => {
		const box = field(f, 'ackVersion');
		return [!box.parentNode.hasAttribute('hidden'), box.hasAttribute('required')];
	};
	assert.deepEqual(reviewed(), [false, false], 'the same handler: no review asked for');
	target.value = '2';
	await target.dispatch('change');
	assert.deepEqual(reviewed(), [true, true], 'another handler: its review asked for');
	target.value = '';
	await target.dispatch('change');
	assert.deepEqual(reviewed(), [false, false], 'the same handler again: none asked for');

	// The version change unacknowledged (past the browser's check): refused
	// by the service, nothing replayed.
	await submit(ui.root, 'Replay', { target: '2' });
	field(f, 'ack').checked = true;
	await f.dispatch('submit');
	await app.rendered();
	assert.match(alerts(ui).join(), /acknowledgeVersionChange/);
	assert.equal((await api('GET', `/steps/${step.stepId}`, key)).body.durableJob.status, 'CANCELLED');

	field(f, 'ackVersion').checked = true;
	await f.dispatch('submit');
	await app.rendered();
	const s = (await api('GET', `/steps/${step.stepId}`, key)).body;
	assert.deepEqual([s.durableJob.status, s.version, s.contractVersion], ['QUEUED', '2', 2]);
	const replays = replayRows(ui);
	assert.equal(replays.length, 1, ui.root.textContent);
	const [replayed] = replays;
	assert.deepEqual([cells(replayed).Handler, cells(replayed).Contract, cells(replayed).Reason], ['1 → 2', '1 → 2', '—']);
});

test('a replay of a handler version whose every contract is FORBIDDEN offers only an upgrade', async () => {
	// Jobs QA: the preview read eligible and the form offered "the same
	// handler", which the service refuses (409) for a FORBIDDEN version.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'images' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'crop_image', version: '1', input: { url: 'https://x/y.png' } })).body;
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key, {})).status, 200);
	const publish = (handlerVersion, status) => api('POST', '/tools/crop_image/contracts', key, { handlerVersion, inputSchema: { type: 'object' }, status });
	assert.equal((await publish('1', 'FORBIDDEN')).status, 201);
	assert.equal((await publish('2', 'ACTIVE')).status, 201);

	const ui = await mount(key, '#/steps/' + step.stepId);
	const f = formOf(button(ui.root, 'Replay'));
	const target = field(f, 'target');
	assert.deepEqual(target.querySelectorAll('option').map((o) => o.value), ['2'], 'no same-handler replay');
	const box = field(f, 'ackVersion');
	assert.deepEqual([box.parentNode.hasAttribute('hidden'), box.hasAttribute('required')], [false, true], 'its review asked for at once');
	field(f, 'ack').checked = true;
	box.checked = true;
	await f.dispatch('submit');
	await app.rendered();
	const s = (await api('GET', `/steps/${step.stepId}`, key)).body;
	assert.deepEqual([s.durableJob.status, s.version], ['QUEUED', '2'], alerts(ui).join());
});

test('an upgrade the preview did not check is offered, said not checked, and checked by the replay', async () => {
	// Console QA: an upgrade the preview's budget did not reach (checked:
	// false, compatible: false, one validation entry saying so) read "does
	// not fit: input: was not checked…" and could not be chosen; with every
	// contract of the step's handler version FORBIDDEN the form then
	// offered the same handler, which answers 409. The replay checks it.
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'images' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'crop_image', version: '1', input: { url: 'https://x/y.png' } })).body;
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key, {})).status, 200);
	const publish = (handlerVersion, status, inputSchema) => api('POST', '/tools/crop_image/contracts', key, { handlerVersion, inputSchema, status });
	assert.equal((await publish('1', 'FORBIDDEN', { type: 'object' })).status, 201);
	assert.equal((await publish('2', 'ACTIVE', { type: 'object' })).status, 201);
	assert.equal((await publish('3', 'ACTIVE', { type: 'object', required: ['size'] })).status, 201);
	// The preview as it reads when its budget ran out after contract 3:
	// contract 2, which fits, not checked.
	const budgetSpent = async (url, res) => {
		if (url !== `/api/v1/steps/${step.stepId}/replay`) return res;
		const body = await res.json();
		const [newest, older] = body.upgrades;
		assert.deepEqual([newest.contractVersion, newest.checked, newest.compatible, older.contractVersion, older.checked], [3, true, false, 2, true]);
		Object.assign(older, { compatible: false, checked: false, validation: [{ field: 'input', message: 'was not checked against this contract’s inputSchema' }] });
		return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
	};
	const ui = await mount(key, '#/steps/' + step.stepId, budgetSpent);
	const cells = ui.root.querySelectorAll('td[data-label="Saved input"]').map((c) => c.textContent);
	assert.equal(cells.length, 3, ui.root.textContent);
	assert.match(cells[0], /^does not fit: input\.size: /, 'checked: contract 3 does not fit');
	assert.deepEqual(cells.slice(1), ['not checked (checked at replay)', 'forbidden']);
	const f = formOf(button(ui.root, 'Replay'));
	const target = field(f, 'target');
	assert.deepEqual(
		target.querySelectorAll('option').map((o) => [o.value, o.textContent]),
		[['2', 'contract 2: handler 2 (not checked (checked at replay))']],
		'the upgrade not checked; no same-handler replay',
	);
	assert.equal(target.value, '2', 'chosen from the start');
	field(f, 'ack').checked = true;
	field(f, 'ackVersion').checked = true;
	await f.dispatch('submit');
	await app.rendered();
	const s = (await api('GET', `/steps/${step.stepId}`, key)).body;
	assert.deepEqual([s.durableJob.status, s.version], ['QUEUED', '2'], alerts(ui).join());
});

test('the pages an operator watches refresh themselves in place, but not under an edit', async () => {
	const key = await signup();
	await api('PUT', '/policies/push.send', key, { mode: 'require_approval' });
	const ui = await mount(key, '#/approvals');
	assert.match(ui.root.textContent, /No approval is pending\..*refreshed every 15 s/);
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: 'p1', payload: {} })).body;
	const main = ui.root.querySelector('main');
	const tick = async () => {
		const timer = ui.timers.shift();
		assert.equal(timer.ms, 15000);
		timer.fn();
		await app.rendered();
	};
	assert.equal(document.activeElement, ui.root.querySelector('h1'), 'the heading, focused by the draw, is no control in use');
	await tick();
	assert.equal(ui.root.querySelector('main'), main, 'the same page, redrawn in place');
	assert.match(row(ui, held.effect_id).textContent, /push\.send/);
	assert.equal(document.activeElement, ui.root.querySelector('h1'), 'the redrawn heading keeps the focus');

	// A control with the keyboard focus keeps it: the refresh waits a
	// period, and redraws once the focus has left the page (console QA:
	// every refresh dropped the focus to the body).
	const focused = button(row(ui, held.effect_id), 'Approve');
	focused.focus();
	await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: 'p0', payload: {} });
	await tick();
	assert.equal(ui.root.querySelectorAll('tr').length - 1, 1, 'not redrawn under the focus');
	assert.equal(document.activeElement, focused);
	assert.ok(ui.root.querySelectorAll('button').includes(focused), 'the focused button still on the page');
	assert.equal(ui.timers.length, 1, 'still refreshing');
	focused.blur();
	await tick();
	assert.equal(ui.root.querySelectorAll('tr').length - 1, 2, 'redrawn once the focus left');
	assert.equal(ui.timers.length, 1);

	// A note being typed is not wiped by the next refresh.
	field(formOf(button(row(ui, held.effect_id), 'Approve')), 'note').value = 'half a no';
	await main.dispatch('input');
	await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: 'p2', payload: {} });
	await tick();
	assert.equal(ui.root.querySelectorAll('tr').length - 1, 2, 'not redrawn');
	assert.equal(ui.timers.length, 0, 'and no longer refreshing');
	assert.match(main.textContent, /not refreshed while you edit or act here/);

	// Pages that are not watched, and pages left, are not refreshed.
	await go(ui, '#/effects');
	assert.equal(ui.timers.length, 0);
	await go(ui, '#/circuits');
	assert.equal(ui.timers.length, 1);
	await go(ui, '#/keys');
	const sent = ui.requests.length;
	await tick(); // the circuits page's, left before it fired
	assert.match(ui.root.querySelector('h1').textContent, /Keys/);
	assert.equal(ui.requests.length, sent, 'nothing fetched for a page no longer shown');
});

test("a live page's refresh keeps the line saying what was just done", async () => {
	// Console QA, in a browser: "Approved: …" was dropped by the next
	// refresh 15 s later, leaving nothing to say what had been done.
	const key = await signup();
	await api('PUT', '/policies/push.send', key, { mode: 'require_approval' });
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: 'k1', payload: {} })).body;
	const ui = await mount(key, '#/approvals');
	await submit(row(ui, held.effect_id), 'Approve', { note: 'fine' });
	const said = [`Approved: push.send ${held.effect_id} — fine.`];
	assert.deepEqual(notices(ui), said);
	const main = ui.root.querySelector('main');
	const later = (await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: 'k2', payload: {} })).body;
	ui.timers.at(-1).fn();
	await app.rendered();
	assert.equal(ui.root.querySelector('main'), main, 'redrawn in place');
	assert.match(row(ui, later.effect_id).textContent, /push\.send/, 'the refresh drew the new row');
	assert.deepEqual(notices(ui), said);
	// A full redraw (the page's own link) says nothing more.
	await go(ui, '#/effects');
	await go(ui, '#/approvals');
	assert.deepEqual(notices(ui), []);
});

test("a refresh never replaces an action's answer, nor the rows Load more added", async () => {
	// Console QA: a refresh fetched while a rejection was sent replaced the
	// page: the rejection's 409 (another operator had approved) was written
	// into a detached element and the approved row vanished, so the
	// rejection looked done.
	const key = await signup();
	await api('PUT', '/policies/push.send', key, { mode: 'require_approval' });
	const held = [];
	for (const k of ['r1', 'r2', 'r3']) held.push((await api('POST', '/effects/begin', key, { effect_type: 'push.send', idempotency_key: k, payload: {} })).body);
	const ui = await mount(key, '#/approvals');
	assert.equal((await api('POST', `/approvals/${held[0].approval_id}/approve`, key, { note: 'elsewhere' })).status, 200);
	const reject = formOf(button(row(ui, held[0].effect_id), 'Reject'));
	field(reject, 'note').value = 'too late';
	ui.timers.shift().fn(); // the refresh starts fetching...
	await reject.dispatch('submit'); // ...and the rejection is sent meanwhile
	await app.rendered();
	assert.match(alerts(ui).join(), /invalid_state/, 'the refusal stays on screen');
	assert.match(row(ui, held[0].effect_id).textContent, /push\.send/, 'beside its row');
	assert.equal(ui.timers.length, 0, 'and nothing refreshes it away');

	// Rows loaded with Load more stay.
	const paged = await mount(key, '#/approvals?limit=1');
	assert.equal(paged.root.querySelectorAll('tr').length - 1, 1);
	await click(paged.root, 'Load more');
	assert.equal(paged.root.querySelectorAll('tr').length - 1, 2);
	const timer = paged.timers.shift();
	timer.fn();
	await app.rendered();
	assert.equal(paged.root.querySelectorAll('tr').length - 1, 2, 'not refreshed back to one page');
});

test('a key without steps:replay still reads a replayable step', async () => {
	const key = await signup();
	const run = (await api('POST', '/runs', key, { name: 'r' })).body;
	const step = (await api('POST', `/runs/${run.id}/steps`, key, { name: 'sync', version: '1', input: {} })).body;
	assert.equal((await api('POST', `/steps/${step.stepId}/cancel`, key, {})).status, 200);
	const ingest = (await api('POST', '/keys', key, { name: 'ingest', preset: 'INGEST' })).body.secret;
	const ui = await mount(ingest, '#/steps/' + step.stepId);
	assert.match(ui.root.textContent, /sync@1/);
	assert.match(ui.root.textContent, /CANCELLED/);
	assert.match(alerts(ui).join(), /steps:replay/);
});

test('sign-in keeps the page a link named; the current page reloads from its link; a lost answer is said to be unknown', async () => {
	const key = await signup();
	const begun = (await api('POST', '/effects/begin', key, { effect_type: 'x.y', idempotency_key: 'deep', payload: {} })).body;
	const ui = await mount(null, '#/effects/' + begun.effect_id);
	await submit(ui.root, 'Sign in', { key });
	assert.equal(ui.location.hash, '#/effects/' + begun.effect_id);
	assert.match(ui.root.textContent, /deep/);

	await go(ui, '#/approvals');
	assert.match(ui.root.textContent, /No approval is pending\./);
	await api('PUT', '/policies/x.y', key, { mode: 'require_approval' });
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'x.y', idempotency_key: 'later', payload: {} })).body;
	const current = ui.root.querySelectorAll('a').find((a) => a.className === 'current');
	assert.equal(current.textContent, 'Approvals');
	assert.equal(await current.dispatch('click'), false, 'the browser does not follow it');
	await app.rendered();
	assert.match(row(ui, held.effect_id).textContent, /x\.y/);

	ui.offline = true;
	await submit(row(ui, held.effect_id), 'Approve', {});
	assert.match(alerts(ui).join(), /did not answer.*may or may not have been applied/);
	await go(ui, '#/effects');
	assert.match(alerts(ui).join(), /did not answer \(the network failed, or the browser refused to send the request\)\.$/);
	ui.offline = false;
});

test('an effect held for approval is decided from its own page; filters keep the page size; an id goes to its page', async () => {
	const key = await signup();
	await api('PUT', '/policies/wire.send', key, { mode: 'require_approval' });
	const held = (await api('POST', '/effects/begin', key, { effect_type: 'wire.send', idempotency_key: 'w1', payload: {} })).body;
	const ui = await mount(key, '#/effects/' + held.effect_id);
	assert.match(ui.root.textContent, /Held: policy_requires_approval\./);
	await submit(ui.root, 'Approve', { note: 'called the customer' });
	assert.equal((await api('GET', `/approvals/${held.approval_id}`, key)).body.state, 'approved');
	assert.match(ui.root.textContent, /approved \d{4}-.* UTC \(held: policy_requires_approval\) — called the customer/);
	// A rejected one's effect, denied by its next begin, still shows the
	// decision and its note (console QA: the page an approval's id opens
	// said nothing of it once the effect had moved on).
	const turned = (await api('POST', '/effects/begin', key, { effect_type: 'wire.send', idempotency_key: 'w2', payload: {} })).body;
	assert.equal((await api('POST', `/approvals/${turned.approval_id}/reject`, key, { note: 'wrong account' })).status, 200);
	assert.equal((await api('POST', '/effects/begin', key, { effect_type: 'wire.send', idempotency_key: 'w2', payload: {} })).body.decision, 'denied');
	await go(ui, '#/approvals/' + turned.approval_id);
	assert.match(ui.root.textContent, /Denialapproval_rejected/);
	assert.match(ui.root.textContent, /rejected \d{4}-.* UTC \(held: policy_requires_approval\) — wrong account/);
	await go(ui, '#/effects/' + held.effect_id);

	await go(ui, '#/effects?limit=5');
	await submit(ui.root, 'Filter', { state: 'awaiting_approval' });
	assert.equal(ui.location.hash, '#/effects?state=awaiting_approval&limit=5');

	const goto = ui.root.querySelector('form.goto');
	field(goto, 'id').value = ' ' + held.effect_id + ' ';
	await goto.dispatch('submit');
	await app.rendered();
	assert.equal(ui.location.hash, '#/effects/' + held.effect_id);
	field(ui.root.querySelector('form.goto'), 'id').value = 'nope_123';
	await ui.root.querySelector('form.goto').dispatch('submit');
	assert.equal(ui.location.hash, '#/effects/' + held.effect_id);
	assert.equal(field(ui.root.querySelector('form.goto'), 'id').getAttribute('aria-invalid'), 'true');
	assert.match(ui.root.querySelector('form.goto').textContent, /Not an id this box opens: eff_…, apr_…/);

	// An approval's id, as its alert carries it, opens its effect.
	field(ui.root.querySelector('form.goto'), 'id').value = held.approval_id;
	await ui.root.querySelector('form.goto').dispatch('submit');
	await app.rendered();
	assert.equal(ui.location.hash, '#/approvals/' + held.approval_id);
	assert.match(ui.root.querySelector('h1').textContent, new RegExp('Effect ' + held.effect_id));
});

test("reconcile: the vendor's CSV compared, an unknown outcome it settles resolved, the rest listed", async () => {
	const key = await signup();
	const begin = (k, lease) => api('POST', '/effects/begin', key, { effect_type: 'refund.issue', idempotency_key: k, payload: {}, cost_micros: 2_500_000, ...(lease ? { lease_seconds: lease } : {}) });
	const done = (await begin('r:1')).body;
	assert.equal((await api('POST', `/effects/${done.effect_id}/report`, key, { lease_token: done.lease_token, outcome: 'succeeded' })).status, 200);
	const lost = (await begin('r:2', 1)).body;
	await new Promise((r) => setTimeout(r, 1200));
	const ui = await mount(key, '#/reconcile');
	const csv = 'idempotency_key,status,amount_micros\r\nr:1,succeeded,2500000\n"r:2",succeeded,\n"r:""9""",failed,7\n\n';
	// Its answer lost, sent again: answered what the first did (the
	// unknown outcome it resolved), not a second reconciliation's.
	ui.loseAnswer = true;
	await submit(ui.root, 'Reconcile', { effect_type: 'refund.issue', records: csv });
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	await submit(ui.root, 'Reconcile', {});
	assert.match(ui.confirms.at(-1), /Reconcile refund\.issue from .* Unknown outcomes the records settle are resolved/);
	assert.match(ui.root.textContent, /resolved: 1 · status mismatch: 0 · amount mismatch: 0 · missing at vendor: 0 · unknown to ratchet: 1 · unsettled: 0 · matched: 1/);
	assert.match(row(ui, lost.effect_id).textContent, /r:2/);
	// The row reads the state the reconciliation left, not the one it found
	// (console QA: "Here: indeterminate" under "Resolved now").
	assert.equal(cells(row(ui, lost.effect_id)).Here, 'succeeded (resolved now; was indeterminate)');
	assert.match(row(ui, 'r:"9"').textContent, /failed/);
	assert.equal((await api('GET', `/effects/${lost.effect_id}`, key)).body.state, 'succeeded');

	// Malformed records are refused before anything is asked or sent.
	const asked = ui.confirms.length;
	for (const [records, message] of [
		['', /Paste the vendor/],
		['key,status\nr:1,succeeded', /names no idempotency_key column/],
		['idempotency_key,status,amount_micros\nr:1,succeeded,2.5', /Line 2: amount_micros "2\.5"/],
		['idempotency_key,status,amount_micros\nr:1,succeeded,99999999999999999', /99999999999999999/],
		['idempotency_key,status\n"r:1,succeeded', /ends inside a quoted field/],
		['[{"idempotency_key": ', /not valid JSON/],
		['{"idempotency_key": "r:1"}', /Paste the vendor|CSV header/],
	]) {
		await submit(ui.root, 'Reconcile', { effect_type: 'refund.issue', records });
		assert.match(alerts(ui).join(), message, records);
	}
	assert.equal(ui.confirms.length, asked);
	assert.deepEqual(app.parseRecords('[{"idempotency_key":"a","status":"failed","amount_micros":null}]'), [{ idempotency_key: 'a', status: 'failed', amount_micros: null }]);

	// The service's own refusals are shown with their field.
	await submit(ui.root, 'Reconcile', { effect_type: 'refund.issue', from: 'yesterday', records: 'idempotency_key,status\nr:1,succeeded' });
	assert.match(alerts(ui).join(), /from/);
});

test('webhooks: a subscription made with its events, its deliveries page, then ended', async () => {
	const key = await signup();
	const ui = await mount(key, '#/webhooks');
	const f = fillSubscribe(ui, 'https://example.com/hooks/ratchet', ['approval.requested', 'effect.indeterminate']);
	// Its answer lost, sent again: one subscription, its secret shown
	// (review: a second was made, the first's secret never seen).
	ui.loseAnswer = true;
	await f.dispatch('submit');
	await app.rendered();
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	await f.dispatch('submit');
	await app.rendered();
	assert.deepEqual(alerts(ui), []);
	assert.match(f.querySelector('input.secret-value').value, /\S{16,}/);
	assert.equal((await api('GET', '/webhooks', key)).body.data.length, 1, 'one subscription, not two');
	const hook = (await api('GET', '/webhooks', key)).body.data[0];
	assert.deepEqual([...hook.events].sort(), ['approval.requested', 'effect.indeterminate']);
	const first = f.querySelector('input.secret-value').value;
	assert.match(row(ui, 'example.com/hooks').textContent, /approval\.requested/, 'listed beside its secret, before Done');
	await click(f, 'Done');
	// Rotated, its answer lost: the click sent again is given the same
	// rotation (a second one would be refused while the previous secret
	// signs) and its secret, shown once; the previous one kept signing.
	ui.loseAnswer = true;
	await click(row(ui, 'example.com/hooks'), 'Rotate secret');
	assert.match(alerts(ui).join(), /may or may not have been applied/);
	await click(row(ui, 'example.com/hooks'), 'Rotate secret');
	assert.match(ui.confirms.at(-1), /new signing secret/);
	const rotated = row(ui, 'example.com/hooks').querySelector('input.secret-value').value;
	assert.match(rotated, /^whsec_\S{16,}/);
	assert.notEqual(rotated, first);
	assert.match(row(ui, 'example.com/hooks').textContent, /signed with both secrets/);
	// Its expiry as the page shows times, and in the row's column at once
	// (console QA: raw ISO with microseconds, and "—" until a reload).
	const expiresRaw = (await api('GET', '/webhooks', key)).body.data[0].previous_secret_expires_at;
	const expires = time(expiresRaw);
	assert.match(expires, /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);
	assert.match(row(ui, 'example.com/hooks').querySelector('.secret').textContent, new RegExp(`Until ${expires} deliveries are signed`));
	assert.equal(row(ui, 'example.com/hooks').querySelector('td[data-label="Previous secret signs until"]').textContent, expires);
	// Clicked again once its answer was read: a rotation of its own,
	// refused while the previous secret signs (console QA: answered with
	// the first rotation's secret, shown again as new and "shown once").
	await click(row(ui, 'example.com/hooks'), 'Rotate secret');
	assert.match(alerts(ui).join(), /invalid_state/);
	assert.equal(row(ui, 'example.com/hooks').querySelector('input.secret-value'), null);
	assert.equal((await api('GET', '/webhooks', key)).body.data[0].previous_secret_expires_at, expiresRaw, 'nothing rotated');
	// A second rotation while the previous secret signs: refused, and a
	// confirmed replacement offered (the console could not send
	// replace_previous before).
	await go(ui, '#/webhooks/' + hook.id);
	await go(ui, '#/webhooks');
	assert.equal(row(ui, 'example.com/hooks').querySelector('td[data-label="Previous secret signs until"]').textContent, expires);
	await click(row(ui, 'example.com/hooks'), 'Rotate secret');
	assert.match(alerts(ui).join(), /invalid_state/);
	assert.equal(row(ui, 'example.com/hooks').querySelector('input.secret-value'), null);
	assert.match(row(ui, 'example.com/hooks').textContent, /Replacing it stops it at once/);
	ui.confirmAnswer = false;
	await click(row(ui, 'example.com/hooks'), 'Replace the previous secret now');
	assert.match(ui.confirms.at(-1), /^Stop the previous signing secret of "https:\/\/example\.com\/hooks\/ratchet" \(signing until .* UTC\) at once/);
	assert.equal(row(ui, 'example.com/hooks').querySelector('input.secret-value'), null, 'declined: nothing sent');
	ui.confirmAnswer = true;
	await click(row(ui, 'example.com/hooks'), 'Replace the previous secret now');
	const replaced = row(ui, 'example.com/hooks').querySelector('input.secret-value').value;
	assert.match(replaced, /^whsec_\S{16,}/);
	assert.notEqual(replaced, rotated);
	const after = (await api('GET', '/webhooks', key)).body.data[0];
	assert.notEqual(after.previous_secret_expires_at, expiresRaw, 'the previous secret replaced');
	assert.equal(row(ui, 'example.com/hooks').querySelector('td[data-label="Previous secret signs until"]').textContent, time(after.previous_secret_expires_at));
	await go(ui, '#/webhooks/' + hook.id);
	assert.match(ui.root.textContent, /Nothing delivered yet\./);
	await go(ui, '#/webhooks');
	await click(row(ui, 'example.com/hooks'), 'Delete');
	assert.equal((await api('GET', '/webhooks', key)).body.data.length, 0);
	assert.deepEqual(notices(ui), [`Deleted: the subscription to ${hook.url}.`]);
});

test('webhooks: disabled and enabled again, and edited, keeping its secret', async () => {
	const key = await signup();
	const hook = (await api('POST', '/webhooks', key, { url: 'https://example.com/hooks/edit', events: ['run.finished'] })).body;
	const ui = await mount(key, '#/webhooks');
	assert.equal(cells(row(ui, 'example.com/hooks/edit')).State, 'enabled');
	ui.confirmAnswer = false;
	await click(row(ui, 'example.com/hooks/edit'), 'Disable');
	assert.match(ui.confirms.at(-1), /^Disable "https:\/\/example\.com\/hooks\/edit"\? Nothing is sent to it/);
	assert.equal((await api('GET', '/webhooks/' + hook.id, key)).body.disabled, false, 'declined: nothing sent');
	ui.confirmAnswer = true;
	await click(row(ui, 'example.com/hooks/edit'), 'Disable');
	const disabled = (await api('GET', '/webhooks/' + hook.id, key)).body;
	assert.equal(disabled.disabled, true);
	assert.equal(cells(row(ui, 'example.com/hooks/edit')).State, `disabled since ${time(disabled.disabled_at)}: nothing is sent`);
	await click(row(ui, 'example.com/hooks/edit'), 'Enable');
	assert.equal((await api('GET', '/webhooks/' + hook.id, key)).body.disabled, false);
	assert.equal(cells(row(ui, 'example.com/hooks/edit')).State, 'enabled');

	// Its page: the state, the same toggle, and an edit of its URL and events.
	await go(ui, '#/webhooks/' + hook.id);
	assert.equal(fieldValue(ui, 'State'), 'enabled');
	// The tab's title names it by id, not by its URL, which may carry a
	// token and would land in the browser's history (review).
	assert.equal(document.title, `Webhook ${hook.id} — Ratchet console`);
	await click(ui.root, 'Disable');
	assert.match(fieldValue(ui, 'State'), /^disabled since .* UTC: nothing is sent$/);
	const f = formOf(button(ui.root, 'Save subscription'));
	assert.equal(field(f, 'url').value, 'https://example.com/hooks/edit');
	const boxes = f.querySelectorAll('input').filter((i) => i.name === 'events');
	assert.deepEqual(boxes.filter((b) => b.checked).map((b) => b.value), ['run.finished'], 'its events ticked');
	await f.dispatch('submit');
	await app.rendered();
	assert.match(alerts(ui).join(), /Nothing changed/);
	field(f, 'url').value = 'https://example.com/hooks/moved';
	for (const box of boxes) box.checked = ['run.finished', 'step.exhausted'].includes(box.value);
	await f.dispatch('submit');
	await app.rendered();
	const edited = (await api('GET', '/webhooks/' + hook.id, key)).body;
	assert.equal(edited.url, 'https://example.com/hooks/moved');
	assert.deepEqual(edited.events, ['run.finished', 'step.exhausted']);
	assert.equal(edited.disabled, true, 'an edit leaves it disabled');
	assert.match(ui.root.querySelector('h1').textContent, /example\.com\/hooks\/moved/, 'the page redrawn');
	assert.equal(document.title, `Webhook ${hook.id} — Ratchet console`);
	// Said in words, as a policy's save is (console QA, in a browser).
	assert.deepEqual(notices(ui), ['Saved.']);
	// Refused as the service refuses it, with its field.
	const again = formOf(button(ui.root, 'Save subscription'));
	for (const box of again.querySelectorAll('input').filter((i) => i.name === 'events')) box.checked = false;
	await again.dispatch('submit');
	await app.rendered();
	assert.match(alerts(ui).join(), /events: must name at least one event type/);
	await click(ui.root, 'Enable');
	assert.equal(fieldValue(ui, 'State'), 'enabled');
});

// sweep runs one pass of the service's sweeper (its cron route), which
// sends due webhook deliveries.
async function sweep() {
	const res = await fetch(base + '/api/cron/sweep', {
		method: 'POST',
		headers: { Authorization: 'Bearer ' + process.env.RATCHET_TEST_CRON_SECRET },
	});
	assert.equal(res.status, 200, await res.text());
}

test('webhooks: a delivered event is sent again from its deliveries page', async () => {
	const key = await signup();
	const got = [];
	const receiver = createServer((req, res) => {
		let body = '';
		req.on('data', (c) => (body += c));
		req.on('end', () => {
			got.push(JSON.parse(body).id);
			res.end();
		});
	});
	await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
	try {
		const url = `http://127.0.0.1:${receiver.address().port}/hook`;
		const hook = (await api('POST', '/webhooks', key, { url, events: ['circuit.tripped'] })).body;
		assert.equal((await api('POST', '/circuits/console.resend/open', key, { action: 'deny' })).status, 200);
		await sweep();
		assert.equal(got.length, 1);
		const ui = await mount(key, '#/webhooks/' + hook.id);
		assert.match(row(ui, 'circuit.tripped').textContent, /delivered/);
		// Its answer lost, clicked again: sent under the same
		// Idempotency-Key, answered as the first was.
		ui.loseAnswer = true;
		await click(row(ui, 'circuit.tripped'), 'Send again');
		assert.match(alerts(ui).join(), /may or may not have been applied/);
		await click(row(ui, 'circuit.tripped'), 'Send again');
		assert.deepEqual(alerts(ui), []);
		const resent = ui.idempotencyKeys.filter((_, i) => ui.requests[i].endsWith('/deliveries/retry'));
		assert.equal(resent.length, 2);
		assert.ok(resent[0] && resent[0] === resent[1]);
		assert.match(ui.confirms.at(-1), /Send this circuit\.tripped event/);
		assert.match(row(ui, 'circuit.tripped').textContent, /pending/, 'the page redrawn with the delivery due again');
		assert.ok(!row(ui, 'circuit.tripped').querySelectorAll('button').some((b) => b.textContent === 'Send again'));
		await sweep();
		assert.deepEqual(got, [got[0], got[0]], 'sent once more, under the same event id');
	} finally {
		receiver.close();
	}
});

test('a key over its rate limit is told when it may ask again', async () => {
	const operator = await signup();
	const limited = (await api('POST', '/keys', operator, { name: 'slow', scopes: ['effects:read'], rate_limit_per_minute: 1 })).body.secret;
	const ui = await mount(limited, '#/effects');
	await go(ui, '#/effects?state=failed');
	const [message] = alerts(ui);
	assert.match(message, /rate_limited/);
	assert.match(message, /Try again in \d+ s\./);
});

// Console QA, in a browser: after every draw, action and Load more the
// focus fell to the top of the document, so a keyboard user tabbed through
// the whole header again.
test('the keyboard focus: on the page drawn, kept by a refused action, on a secret shown, on what Load more added', async () => {
	const signIn = await mount(null);
	assert.equal(document.activeElement, signIn.root.querySelector('input[name="key"]'), 'the sign-in takes the key');

	const operator = await signup();
	const ui = await mount(operator, '#/keys');
	assert.equal(document.activeElement, ui.root.querySelector('h1'), 'a page drawn focuses its heading');
	const create = button(ui.root, 'Create key');
	create.focus();
	const f = await submit(ui.root, 'Create key', { name: 'focus', preset: 'AGENT' });
	assert.equal(document.activeElement, f.querySelector('input.secret-value'), 'the secret shown once has the focus');
	await click(f, 'Done');
	assert.equal(document.activeElement, ui.root.querySelector('h1'));

	// An action and a save that fail keep the focus on their button, which
	// was disabled while they were sent.
	await api('POST', '/endpoints', operator, { name: 'focus-endpoint' });
	const endpoint = (await api('GET', '/endpoints', operator)).body.data[0];
	const failing = await mount(operator, '#/endpoints/' + endpoint.id);
	failing.offline = true;
	const pause = button(failing.root, 'Pause');
	pause.focus();
	await click(failing.root, 'Pause');
	assert.match(alerts(failing).join(), /did not answer/);
	assert.equal(document.activeElement, pause, 'the failed action keeps the focus');
	failing.offline = false;
	await go(failing, '#/policies/focus.test');
	failing.offline = true;
	const save = button(failing.root, 'Save policy');
	save.focus();
	await submit(failing.root, 'Save policy', { policy: JSON.stringify({ max_attempts: 3 }) });
	assert.match(alerts(failing).join(), /did not answer/);
	assert.equal(document.activeElement, save, 'the failed save keeps the focus');

	// Load more: the next Load more, then the first row the last page added.
	for (let i = 0; i < 3; i++) await api('POST', '/effects/begin', operator, { effect_type: 'focus.test', idempotency_key: 'f' + i, payload: {} });
	const list = await mount(operator, '#/effects?limit=1');
	button(list.root, 'Load more').focus();
	await click(list.root, 'Load more');
	assert.equal(document.activeElement, button(list.root, 'Load more'), 'the next Load more has the focus');
	await click(list.root, 'Load more');
	const rows = list.root.querySelector('tbody').children;
	assert.equal(rows.length, 3);
	assert.equal(document.activeElement, rows[2].querySelector('a'), 'the row added has the focus');
});

// A key known to lack a scope (its own record, GET /keys/current, lists
// its scopes) is shown what it may read and not offered what it would be
// refused (console QA: Save policy, Pause and Publish were offered, and only
// the refusal told it).
test('a key is not offered the edits its scopes do not allow, and is told which scope they need', async () => {
	const operator = await signup();
	await api('POST', '/endpoints', operator, { name: 'read-only-endpoint' });
	const endpoint = (await api('GET', '/endpoints', operator)).body.data[0];
	await api('PUT', '/policies/narrow.test', operator, { max_attempts: 4 });
	const reader = (await api('POST', '/keys', operator, { name: 'reader', scopes: ['runs:read', 'policies:read'] })).body.secret;
	const ui = await mount(reader, '#/endpoints/' + endpoint.id);
	const noButton = (label) => assert.deepEqual(ui.root.querySelectorAll('button').filter((b) => b.textContent === label), [], label);
	noButton('Pause');
	noButton('Save endpoint policy');
	assert.match(ui.root.textContent, /editing its policy, needs the scope endpoints:write, which this key lacks/);
	assert.match(ui.root.textContent, /"maxAttempts": \d+/, 'the policy is shown');
	await go(ui, '#/queue');
	noButton('Pause');
	assert.match(ui.root.textContent, /read-only-endpoint/);
	assert.match(ui.root.textContent, /needs the scope endpoints:write/);
	await go(ui, '#/policies/narrow.test');
	noButton('Save policy');
	assert.match(ui.root.textContent, /"max_attempts": 4/, 'the policy is shown');
	assert.match(ui.root.textContent, /Editing a policy needs the scope policies:write/);
	await go(ui, '#/tools/send_email');
	noButton('Publish');
	noButton('Enqueue test job');
	assert.match(ui.root.textContent, /testing a handler version needs the scope contracts:write/);
	assert.deepEqual(alerts(ui), [], 'nothing was refused');

	// The operator's key is offered them all.
	const full = await mount(operator, '#/endpoints/' + endpoint.id);
	for (const label of ['Pause', 'Save endpoint policy']) button(full.root, label);
	await go(full, '#/policies/narrow.test');
	button(full.root, 'Save policy');
	await go(full, '#/tools/send_email');
	button(full.root, 'Publish');
});

test('lists page with Load more until the cursor runs out', async () => {
	const key = await signup();
	for (let i = 0; i < 3; i++) {
		await api('POST', '/effects/begin', key, { effect_type: 'page.test', idempotency_key: 'p' + i, payload: {} });
	}
	const ui = await mount(key, '#/effects?limit=2');
	assert.equal(ui.root.querySelectorAll('tr').length - 1, 2);
	await click(ui.root, 'Load more');
	assert.equal(ui.root.querySelectorAll('tr').length - 1, 3);
	assert.ok(!ui.root.querySelectorAll('button').some((b) => b.textContent === 'Load more'));
});

test('routes: pages by fragment, unknown ones answered plainly', async () => {
	assert.deepEqual(app.parseRoute(''), { section: 'approvals', page: 'approvals', id: undefined, params: {} });
	assert.deepEqual(app.parseRoute('#/effects/eff_1'), { section: 'effects', page: 'effect', id: 'eff_1', params: {} });
	assert.deepEqual(app.parseRoute('#/policies/a%2Fb?x=1+2'), { section: 'policies', page: 'policy', id: 'a/b', params: { x: '1 2' } });
	assert.equal(app.parseRoute('#/effect').page, null, 'a detail page needs its id');
	assert.equal(app.parseRoute('#/keys/key_1').page, null);
	assert.equal(app.parseRoute('#/effects/eff_1/x').page, null);
	assert.equal(app.parseRoute('#/%E0%A4%A').page, null);
	const key = await signup();
	const ui = await mount(key, '#/nope');
	assert.match(alerts(ui).join(), /No such page/);
	await go(ui, '#/effects/eff_00000000000000000000000000');
	assert.match(alerts(ui).join(), /not_found/);
	// "." and ".." (or %2E) in a link are no id: a URL parser reads them as
	// steps along the path, so none is sent (console review: #/effects/..
	// asked GET /api/v1/, and #/tools/.. another route).
	for (const section of ['effects', 'approvals', 'policies', 'runs', 'steps', 'endpoints', 'webhooks', 'groups', 'tools']) {
		for (const dots of ['..', '.', '%2E%2E', '%2e']) {
			ui.requests.length = 0;
			await go(ui, `#/${section}/${dots}`);
			assert.match(alerts(ui).join(), /not_found/, `#/${section}/${dots}`);
			const stepped = ui.requests.filter((r) => /\/\.{1,2}(\/|\?|$)/.test(r.split(' ')[1]));
			assert.deepEqual(stepped, [], `#/${section}/${dots}`);
		}
	}
});

// The console never parses markup: agents write effect types, keys,
// previews and notes, and one holding <img onerror=...> must stay text.
test('the console builds no element from markup', () => {
	const source = readFileSync(new URL('../static/console.js', import.meta.url), 'utf8');
	for (const sink of ['innerHTML', 'outerHTML', 'insertAdjacentHTML', 'document.write', 'eval(', 'new Function', 'DOMParser', 'createContextualFragment']) {
		assert.ok(!source.includes(sink), `console.js uses ${sink}`);
	}
	const page = readFileSync(new URL('../static/index.html', import.meta.url), 'utf8');
	assert.doesNotMatch(page, /<script>|\son[a-z]+=|style=/i, 'no inline script, handler or style (the CSP forbids them)');
});
