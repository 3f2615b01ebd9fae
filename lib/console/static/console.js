// The Ratchet console: one page over the same origin's /api/v1, for the
// operator tasks the API serves (approvals, unknown outcomes, circuits and the
// emergency stop, policies, runs and replays, queue health, keys, webhooks).
//
// Two rules hold throughout. Every element is built with textContent, never
// from markup: effect types, idempotency keys, previews, notes and error
// messages are written by agents and workers, and must never be parsed as
// HTML. And the key lives in sessionStorage only (this tab, until it
// closes), is sent only as the Authorization header to this origin, and is
// forgotten on sign-out or the first 401.

const API = '/api/v1';
const KEY_ITEM = 'ratchet.console.key';

// The environment the console runs in: the browser's in a page, a stand-in in
// tests (lib/console/jstest).
let env;

/** A failed call: the API's error envelope, or a network failure. */
export class ConsoleError extends Error {
	constructor(code, message, status, requestId, detail) {
		super(message);
		this.code = code;
		this.status = status;
		this.requestId = requestId;
		this.detail = detail;
	}
}

// ---- elements -------------------------------------------------------------

// h builds an element. Props named on* become listeners, class the class
// name, value an input's value; children are elements or text (never markup).
function h(tag, props, ...children) {
	const el = env.document.createElement(tag);
	for (const [name, v] of Object.entries(props || {})) {
		if (v === undefined || v === null || v === false) continue;
		if (name.startsWith('on')) el.addEventListener(name.slice(2), v);
		else if (name === 'class') el.className = v;
		else if (name === 'value') el.value = String(v);
		else if (name === 'checked') el.checked = Boolean(v);
		else el.setAttribute(name, v === true ? '' : String(v));
	}
	for (const c of children.flat(Infinity)) {
		if (c === undefined || c === null || c === false) continue;
		el.append(typeof c === 'object' ? c : String(c));
	}
	return el;
}

// link points inside the console only: every href is a fragment it builds,
// so a stored value can never become a javascript: or off-site link.
function link(parts, text) {
	return h('a', { href: '#/' + parts.map((p) => encodeURIComponent(p)).join('/') }, text);
}

function time(s) {
	return s ? String(s).replace('T', ' ').replace(/(\.\d+)?Z$/, ' UTC') : '—';
}

function micros(n) {
	if (n === null || n === undefined) return '—';
	return '$' + (n / 1e6).toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 6 });
}

function text(v) {
	if (v === null || v === undefined || v === '') return '—';
	if (Array.isArray(v)) return v.length ? v.join(', ') : '—';
	return String(v);
}

function pick(o, names) {
	return Object.fromEntries(names.filter((n) => n in o).map((n) => [n, o[n]]));
}

function json(v) {
	return h('pre', { class: 'json' }, v === null || v === undefined ? '—' : JSON.stringify(v, null, 2));
}

// preview is a stored value as the API shows it: its redacted preview.
function preview(title, value) {
	return [h('h2', null, title + ' (redacted preview)'), json(value)];
}

// fields is a list of labelled values; a null pair is left out.
function fields(pairs) {
	return h('dl', { class: 'fields' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
}

// duration is a length of time given in milliseconds, as an operator
// reads it ("90 s", "15 min", "2 h").
function duration(ms) {
	if (!Number.isFinite(ms)) return '—';
	const round = (n) => String(Math.round(n * 10) / 10);
	if (ms < 1000) return ms + ' ms';
	if (ms < 120000) return round(ms / 1000) + ' s';
	if (ms < 7200000) return round(ms / 60000) + ' min';
	return round(ms / 3600000) + ' h';
}

// row is one table row; each cell is labelled with its column's title (a
// phone shows each row as a card of labelled cells).
function row(columns, r) {
	return h('tr', null, columns.map((c) => h('td', { 'data-label': c.title || null }, c.cell(r))));
}

function table(columns, rows, empty) {
	if (!rows.length) return h('p', { class: 'empty' }, empty || 'Nothing here.');
	return h(
		'table',
		null,
		h('thead', null, h('tr', null, columns.map((c) => h('th', null, c.title)))),
		h('tbody', null, rows.map((r) => row(columns, r))),
	);
}

function errorBox(err) {
	const parts = [err.message];
	if (err.code && err.code !== 'network') parts.push(` (${err.code}`, err.requestId ? `, request ${err.requestId})` : ')');
	const detail = err.detail || {};
	return h(
		'div',
		{ class: 'error', role: 'alert' },
		h('p', null, parts.join('')),
		// A route any one of several scopes opens names the first in
		// required and all of them in any_of (console QA: only the first
		// was shown, as if no other would do).
		Array.isArray(detail.any_of) && detail.any_of.length > 1
			? h('p', null, 'This key holds none of the scopes ' + text(detail.any_of) + '; any one of them would do.')
			: detail.required
				? h('p', null, 'This key lacks the scope ' + text(detail.required) + '.')
				: null,
		// A 429 says when the key may ask again (console QA: the page read
		// only "Too many requests", and a reload was refused again).
		Number.isFinite(detail.retry_after_seconds) ? h('p', null, `Try again in ${detail.retry_after_seconds} s.`) : null,
		Array.isArray(detail.validation)
			? h('ul', null, detail.validation.map((v) => h('li', null, `${v.field}: ${v.message}`)))
			: null,
	);
}

// action is a button that runs fn once at a time (disabled while in flight,
// so a double click sends one request), asks first when confirmText is set,
// and shows a failure beside itself; on success it re-renders the page.
function action(label, fn, opts = {}) {
	const out = h('span', { class: 'action' });
	const button = h('button', { type: 'button', class: opts.danger ? 'danger' : null }, label);
	const status = h('span', { class: 'status' });
	button.addEventListener('click', async () => {
		if (opts.confirm && !env.confirm(opts.confirm)) return;
		holdLive();
		const refocus = keepFocus(button);
		button.disabled = true;
		status.replaceChildren();
		try {
			const result = await fn();
			if (opts.after) opts.after(result, status);
			else rerender();
		} catch (err) {
			status.replaceChildren(errorBox(asError(err)));
		} finally {
			button.disabled = false;
			refocus();
		}
	});
	out.append(button, status);
	return out;
}

// revokeKeyAction is a key's Revoke button, or, withMinted, its "Revoke
// with minted keys" (DELETE /keys/{id}?include_minted=true: every live key
// minted from it, down the tree, too; "Revoke minted keys" once it is
// revoked). The console's own key revoked, itself or in the tree, signs it
// out, as the confirmation says (console QA: the redraw was refused, and
// the sign-in read "The service refused this key (revoked, or mistyped)").
function revokeKeyAction(k, withMinted) {
	const own = ownKeyId();
	const label = withMinted ? (k.revoked_at ? 'Revoke minted keys' : 'Revoke with minted keys') : 'Revoke';
	const what = withMinted
		? `${k.revoked_at ? 'Revoke every live key minted from' : 'Revoke the key'} ${JSON.stringify(k.name)} (${k.id})` +
			`${k.revoked_at ? '' : ' and every live key minted from it'}, the keys those minted, and so on, for good?` +
			' If this console’s key is among them, the console signs out.'
		: `Revoke the key ${JSON.stringify(k.name)} (${k.id}) for good?` +
			(k.id === own ? ' It is the key this console is signed in with: the console signs out.' : '');
	return action(label, () => call('DELETE', `/keys/${seg(k.id)}` + (withMinted ? query({ include_minted: 'true' }) : '')), {
		danger: true,
		confirm: what,
		after: (revoked) => {
			if (revoked && (revoked.id === own || (revoked.minted_revoked || []).includes(own))) {
				return signOut(`This console’s key (${own}) is revoked: sign in with another key.`);
			}
			return rerender();
		},
	});
}

// keepFocus is called before el (a button) is disabled for a request: a
// browser moves the focus off a disabled control, to the body, and does not
// give it back. The function it returns gives it back once el is enabled,
// if el had it and nothing else took it since (console QA: a refused
// action sent from the keyboard left the focus at the top of the page).
function keepFocus(el) {
	const had = env.document.activeElement === el;
	return () => {
		const now = env.document.activeElement;
		if (had && (!now || now === env.document.body) && el.isConnected !== false) el.focus();
	};
}

// form is a <form> whose submit runs fn with the named controls' values, one
// submission at a time.
function form(controls, submitLabel, fn, opts = {}) {
	const status = h('div', { class: 'status' });
	// opts.name: the button's accessible name where its label alone repeats
	// on the page (each approval row's Approve).
	const submit = h('button', { type: 'submit', class: opts.danger ? 'danger' : null, 'aria-label': opts.name || null }, submitLabel);
	const f = h('form', { class: opts.inline ? 'inline' : null }, controls, submit, status);
	// once: a creating form (workspace, key, webhook) stays on screen after
	// success; it stays disabled until it is edited, so the second click of a
	// double click (or an impatient re-click) cannot create a second one and
	// replace the first one's secret, which is shown only once.
	let locked = false;
	if (opts.once) f.addEventListener('input', () => {
		if (locked) submit.disabled = locked = false;
	});
	f.addEventListener('submit', async (ev) => {
		ev.preventDefault();
		if (locked || submit.disabled) return;
		if (opts.validate) {
			try {
				opts.validate(values(f));
			} catch (err) {
				holdLive();
				status.replaceChildren(errorBox(asError(err)));
				return;
			}
		}
		if (opts.confirm && !env.confirm(typeof opts.confirm === 'function' ? opts.confirm(values(f)) : opts.confirm)) return;
		holdLive();
		const refocus = keepFocus(submit);
		submit.disabled = true;
		status.replaceChildren();
		try {
			const result = await fn(values(f));
			if (opts.after) {
				if (opts.once) locked = true;
				opts.after(result, status);
			} else rerender();
		} catch (err) {
			status.replaceChildren(errorBox(asError(err)));
		} finally {
			submit.disabled = locked;
			if (!locked) refocus();
		}
	});
	return f;
}

function values(f) {
	const out = {};
	for (const el of f.querySelectorAll('input, select, textarea')) {
		if (!el.name) continue;
		if (el.type === 'checkbox') {
			if (el.hasAttribute('data-list')) {
				out[el.name] = out[el.name] || [];
				if (el.checked) out[el.name].push(el.value);
			} else out[el.name] = el.checked;
		} else out[el.name] = el.value;
	}
	return out;
}

function input(label, name, props = {}) {
	return h('label', null, label, ' ', h('input', { name, ...props }));
}

// shown shows or hides el (the hidden attribute, which console.css keeps
// over a display of its own).
function shown(el, on) {
	if (on) el.removeAttribute('hidden');
	else el.setAttribute('hidden', '');
}

function select(label, name, options, selected) {
	return h(
		'label',
		null,
		label,
		' ',
		h(
			'select',
			{ name },
			options.map(([value, title]) => h('option', { value, selected: value === selected }, title)),
		),
	);
}

function asError(err) {
	return err instanceof ConsoleError ? err : new ConsoleError('console', String((err && err.message) || err));
}

// parseJSONField reads a textarea holding JSON; an empty one is undefined.
// A number JavaScript cannot carry exactly is refused, not sent changed
// (console QA: a budget of 123456789012345678 micros was saved as
// …680, and 1e400 sent as null).
function parseJSONField(name, raw) {
	if (!raw || !raw.trim()) return undefined;
	let value;
	try {
		value = JSON.parse(raw);
	} catch (e) {
		throw new ConsoleError('invalid_json', `${name} is not valid JSON: ${e.message}`);
	}
	const inexact = inexactNumber(raw);
	if (inexact !== null) {
		throw new ConsoleError('invalid_json', `${name} holds ${inexact.length > 40 ? inexact.slice(0, 40) + '…' : inexact}, a number this page cannot send exactly (an integer beyond 2^53, or beyond any 64-bit float): set it through the API.`);
	}
	return value;
}

// inexactNumber answers the first number of valid JSON text that a
// JavaScript number does not hold exactly (an integer literal it rounds, or
// any literal beyond its range), or null. Decimal fractions are read as the
// 64-bit float they name, as the API reads them.
export function inexactNumber(text) {
	const numbers = /"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)/g;
	for (const m of text.matchAll(numbers)) {
		const literal = m[1];
		if (literal === undefined) continue; // a string
		const n = Number(literal);
		if (!Number.isFinite(n)) return literal;
		if (/^-?\d+$/.test(literal) && BigInt(literal) !== BigInt(n)) return literal;
	}
	return null;
}

// wholeNumber reads a form field holding a whole number (a ceiling, a
// limit), refusing one this page cannot send exactly.
function wholeNumber(name, raw) {
	const v = String(raw).trim();
	if (v === '') return undefined;
	if (!/^\d+$/.test(v) || !Number.isSafeInteger(Number(v))) {
		throw new ConsoleError('invalid_request', `${name} must be a whole number this page can send exactly (at most 2^53 − 1).`);
	}
	return Number(v);
}

// hasUnsafeInteger says whether v holds an integer beyond 2^53 (a value
// JSON.parse has rounded).
function hasUnsafeInteger(v) {
	if (typeof v === 'number') return Number.isInteger(v) && !Number.isSafeInteger(v);
	if (v && typeof v === 'object') return Object.values(v).some(hasUnsafeInteger);
	return false;
}

// contractOf reads the contract form's JSON object.
function contractOf(v) {
	const body = parseJSONField('The contract', v.contract);
	if (!body || typeof body !== 'object' || Array.isArray(body)) throw new ConsoleError('invalid_json', 'The contract must be a JSON object.');
	return body;
}

// newNonce is a random string for an Idempotency-Key.
function newNonce() {
	if (globalThis.crypto && globalThis.crypto.randomUUID) return globalThis.crypto.randomUUID();
	return Date.now().toString(36) + Math.random().toString(36).slice(2);
}

// secretOnce shows a secret the API returns only at creation.
function secretOnce(title, secret, note) {
	return h(
		'div',
		{ class: 'secret', role: 'status' },
		h('p', null, h('strong', null, title), ' ', note || 'It is shown once: store it now.'),
		h('input', { readonly: true, value: secret, 'aria-label': title, class: 'secret-value', autocomplete: 'off' }),
	);
}

// showSecret puts a secretOnce (and what follows it) in status and gives
// its field the keyboard focus, selected to copy (console QA: the focus was
// left on the create button, which stays disabled, so it fell to the top of
// the page).
function showSecret(status, ...nodes) {
	status.replaceChildren(...nodes);
	const field = status.querySelector('input.secret-value');
	if (field) {
		field.focus();
		if (field.select) field.select();
	}
}

// ---- the API --------------------------------------------------------------

export function key() {
	return env.storage.getItem(KEY_ITEM);
}

// ownKeyId is the signed-in key's id: a secret is rk_<id>_<random>, the
// key's id key_<id>.
function ownKeyId() {
	const m = /^rk_([a-z0-9]+)_/.exec(key() || '');
	return m ? 'key_' + m[1] : null;
}

async function call(method, path, body, extraHeaders) {
	const headers = { Accept: 'application/json', ...extraHeaders };
	const k = key();
	if (k) headers.Authorization = 'Bearer ' + k;
	if (body !== undefined) headers['Content-Type'] = 'application/json';
	let res;
	try {
		res = await env.fetch(API + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
	} catch {
		// A change whose answer was lost may have been applied: say so, as
		// the gate itself would (an unknown outcome is not a failure). The
		// browser's own message is not shown: one refusing a header may
		// repeat its value, the key (review: Firefox's does).
		const unknown = method === 'GET' ? '' : ' It may or may not have been applied: check before trying again.';
		throw new ConsoleError('network', 'The service did not answer (the network failed, or the browser refused to send the request).' + unknown);
	}
	const raw = await res.text();
	let data = null;
	try {
		data = raw ? JSON.parse(raw) : null;
	} catch {
		data = null;
	}
	if (res.ok) return data;
	const e = (data && data.error) || {};
	const err = new ConsoleError(
		e.code || 'http_' + res.status,
		e.message || `The service answered HTTP ${res.status}.`,
		res.status,
		res.headers.get('X-Request-Id'),
		e.detail,
	);
	if (res.status === 403 && k && k === key()) {
		// What a refusal names, the key lacks (its scopes never change):
		// a page asked again offers no form this key would be refused. Only
		// while that key is still the signed-in one (review: an answer
		// landing after another key signed in was counted against it).
		const named = [].concat(Array.isArray(e.detail && e.detail.required) ? e.detail.required : [], Array.isArray(e.detail && e.detail.any_of) ? e.detail.any_of : []);
		for (const s of named) scopesKnown().lacking.add(String(s));
	}
	if (res.status === 401 && k && k === key()) {
		// The key was revoked or mistyped: forget it and ask again, on the
		// page the operator was on, so that signing in with another key
		// returns there (console QA: it went to the start). Only while it
		// is still the signed-in one (review: a refusal of a key signed
		// out since, its page still loading, signed out the key signed in
		// after it).
		signOut('The service refused this key (revoked, or mistyped). Sign in again.', true);
	}
	throw err;
}

// idempotent is a call that sends an Idempotency-Key (the creates README's
// "Retrying a call whose answer was lost" lists), for a form or button that
// may be sent again after its answer was lost: without one the service
// acts twice, and a second key or secret is made while the first stays
// live, its secret never seen (review). The same body sent again before
// an answer was read reuses the key, and is answered what the first made;
// once a success is read, or the body changes (the form edited: a changed
// body under a used key is refused, 409 idempotency_key_reuse), the next
// send has a key of its own. A refusal keeps it: the service frees the key
// of a request that failed.
function idempotent(prefix) {
	let held = null; // {key, body}: the key of the body sent last, not yet answered
	return async (method, path, body) => {
		const sent = JSON.stringify(body === undefined ? null : body);
		if (!held || held.body !== sent) held = { key: prefix + ':' + newNonce(), body: sent };
		const answer = await call(method, path, body, { 'Idempotency-Key': held.key });
		held = null;
		return answer;
	};
}

// keyed is a button's or form's handler, send(…) an idempotent() call made
// once for the control as drawn: an action sent again after its answer was
// lost is then answered what the first did, rather than undoing a change
// another operator made since (closing a breaker that tripped again,
// lifting a newer stop, cancelling a replay). v is the form's values.
function keyed(prefix, act) {
	const send = idempotent(prefix);
	return (v) => act(send, v);
}

// scopesKnown is what the console knows of the signed-in key's scopes: held
// (a Set, once read from its own record; null until then or if it cannot be
// read) and lacking (the scopes a 403 named). It is forgotten when the key
// changes.
let scopes = { keyId: null, held: null, read: false, lacking: new Set() };
function scopesKnown() {
	const id = ownKeyId();
	if (scopes.keyId !== id) scopes = { keyId: id, held: null, read: false, lacking: new Set() };
	return scopes;
}

// lacking says that what needs scope is not offered to this key.
function lacking(what, scope, purpose = '') {
	return h('p', { class: 'empty' }, `${what} needs the scope ${scope}, which this key lacks: sign in with a key that holds it (an OPERATOR key)${purpose}.`);
}

// lacksScope says whether the signed-in key is known to lack scope: a
// refusal named it, or the key's own record (GET /keys/current, which any
// key may read) lists its scopes without it.
async function lacksScope(scope) {
	const known = scopesKnown();
	if (known.lacking.has(scope)) return true;
	if (!known.read && known.keyId) {
		known.read = true;
		try {
			const own = await call('GET', '/keys/current');
			known.held = new Set(own.scopes || []);
		} catch {
			known.read = false; // asked again next time
		}
	}
	return Boolean(known.held && !known.held.has(scope));
}

function query(params) {
	const q = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== '');
	return q.length ? '?' + q.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join('&') : '';
}

// seg is one segment of an API path. "." and ".." are never sent: a URL
// parser reads them, and their %2E spellings, as steps along the path, so
// a link to #/effects/.. (or a tool name an earlier release took) asked
// GET /api/v1/ instead, and #/tools/../… another route than the page's
// (console review). They name no record.
function seg(s) {
	const v = String(s);
	if (v === '.' || v === '..') throw new ConsoleError('not_found', 'No such record: "." and ".." name none (a URL path reads them as steps along it).');
	return encodeURIComponent(v);
}

// ---- pages ----------------------------------------------------------------

// pager renders a list route's pages, with "Load more" while the API has a
// next cursor (next_cursor on gate routes, nextCursor on job routes); the
// element's firstRows are the first page's rows, and firstNext its next
// cursor (null on a last page): a page may end before its limit, at about
// 4 MB, with a cursor. ?limit= in the fragment
// overrides params.limit. enrich, when given, completes each page's rows
// (with what another route knows) before they are drawn. first, when given,
// is the first page already read ({data, next_cursor}: a group's steps as
// its read holds them), drawn without asking path for it. The element's
// reload draws the first page again in place, and its show adds a row that
// is not shown (see refreshList); a row already shown is not drawn twice.
async function pager(path, params, columns, empty, enrich, first) {
	const body = h('div', { class: 'pager' });
	let shown = new Set(); // the ids of the rows drawn
	const more = async (cursor, given) => {
		const page = given || (await call('GET', path + query({ ...params, limit: pageSize ?? params.limit, cursor })));
		const read = page.data || [];
		if (enrich) await enrich(read);
		const next = page.next_cursor ?? page.nextCursor ?? null;
		if (!cursor) {
			body.firstRows = read;
			body.firstNext = next;
			body.replaceChildren();
			shown = new Set();
		}
		const rows = read.filter((r) => r.id === undefined || !shown.has(r.id));
		for (const r of rows) if (r.id !== undefined) shown.add(r.id);
		const last = body.lastChild;
		if (last && last.className === 'more') last.remove();
		if (cursor && rows.length) {
			body.querySelector('tbody').append(...rows.map((r) => row(columns, r)));
		} else if (!cursor) {
			body.append(table(columns, rows, empty));
		}
		if (next) body.append(h('p', { class: 'more' }, action('Load more', () => more(next), { after: () => {} })));
		// The button clicked is gone: the focus goes to the next one, or
		// to the first row added (console QA: it fell to the top of the
		// page, and a keyboard user tabbed through the whole page again).
		if (cursor) {
			const again = next && body.lastChild.querySelector('button');
			const added = body.querySelector('tbody')?.children || [];
			const first = rows.length && added[added.length - rows.length];
			let target = again || (first && first.querySelector('a, button, input, select, textarea'));
			if (!target && first) {
				first.setAttribute('tabindex', '-1');
				target = first;
			}
			if (target) target.focus();
		}
	};
	body.reload = () => more(undefined);
	body.show = (r) => {
		if (shown.has(r.id)) return;
		shown.add(r.id);
		const tbody = body.querySelector('tbody');
		if (tbody) tbody.append(row(columns, r));
		else body.replaceChildren(table(columns, [r], empty), ...[...body.childNodes].filter((c) => c.className === 'more'));
	};
	await more(undefined, first);
	return body;
}

function filters(route, current, controls) {
	return form(controls, 'Filter', async (v) => navigate(route, { ...v, limit: current.limit }), { inline: true, after: () => {} });
}

const pages = {
	async approvals(params) {
		const state = params.state || 'pending';
		const columns = [
			{ title: 'Requested', cell: (a) => time(a.created_at) },
			{ title: 'Effect type', cell: (a) => a.effect_type },
			{ title: 'Effect', cell: (a) => link(['effects', a.effect_id], a.effect_id) },
			{ title: 'Idempotency key', cell: (a) => (a.effect ? h('code', null, a.effect.idempotency_key) : '—') },
			{ title: 'Cost', cell: (a) => (a.effect ? micros(a.effect.cost_micros) : '—') },
			{ title: 'Reason', cell: (a) => a.reason },
			{ title: 'State', cell: (a) => h('span', { class: 'state ' + a.state }, a.state) },
			{ title: 'Decided', cell: (a) => (a.decided_at ? [time(a.decided_at), answered(a) ? ` (${answered(a).slice(2)})` : '', a.note ? ' — ' + a.note : ''] : '—') },
			{
				title: '',
				cell: (a) => (a.state === 'pending' ? decide(a, a.effect) : ''),
			},
		];
		return [
			h('h1', null, 'Approvals'),
			h('p', { class: 'lead' }, 'Effects held for a human. Approving lets the next begin on the key execute; rejecting denies it for good.'),
			filters('approvals', params, [select('State', 'state', [['pending', 'pending'], ['approved', 'approved'], ['rejected', 'rejected'], ['any', 'any']], state)]),
			await pager('/approvals', { state: state === 'any' ? undefined : state }, columns, state === 'pending' ? 'No approval is pending.' : 'No approvals.', withEffects),
		];
	},

	async effects(params) {
		const columns = [
			{ title: 'Created', cell: (e) => time(e.created_at) },
			{ title: 'Effect', cell: (e) => link(['effects', e.id], e.id) },
			{ title: 'Type', cell: (e) => e.effect_type },
			{ title: 'Idempotency key', cell: (e) => h('code', null, e.idempotency_key) },
			// A result the server cannot decrypt (result_unreadable) is said
			// beside the state: a begin on its key is refused until it can.
			{ title: 'State', cell: (e) => [h('span', { class: 'state ' + e.state }, e.state), e.result_unreadable ? h('em', null, ' (result unreadable)') : null] },
			{ title: 'Attempt', cell: (e) => e.attempt },
			{ title: 'Cost', cell: (e) => micros(e.cost_micros) },
		];
		const states = ['', 'leased', 'succeeded', 'failed', 'indeterminate', 'awaiting_approval', 'denied'];
		return [
			h('h1', null, 'Effects'),
			h('p', { class: 'lead' }, 'Every effect asked for, newest first. Indeterminate ones wait for you to check the vendor and resolve them.'),
			filters('effects', params, [
				select('State', 'state', states.map((s) => [s, s || 'any']), params.state || ''),
				input('Effect type', 'effect_type', { value: params.effect_type || '', placeholder: 'email.send' }),
			]),
			await pager('/effects', { state: params.state, effect_type: params.effect_type }, columns, 'No effects match.'),
		];
	},

	// An approval's id (an approval.requested alert carries it) opens its
	// effect's page, where a pending one is decided.
	async approval(params, id) {
		const a = await call('GET', `/approvals/${seg(id)}`);
		return pages.effect(params, a.effect_id);
	},

	async effect(params, id) {
		const e = await call('GET', `/effects/${seg(id)}`);
		const attempts = [
			{ title: '#', cell: (a) => a.attempt },
			{ title: 'Outcome', cell: (a) => text(a.outcome) },
			{ title: 'Probe', cell: (a) => (a.probe ? 'yes' : 'no') },
			{ title: 'Started', cell: (a) => time(a.started_at) },
			{ title: 'Lease until', cell: (a) => time(a.lease_expires_at) },
			{ title: 'Reported', cell: (a) => time(a.reported_at) },
			// Who resolved it, as the service records (console QA: not shown).
			{ title: 'Resolved', cell: (a) => (a.resolved_at ? [time(a.resolved_at), a.resolved_by_key_id ? [' by ', h('code', null, a.resolved_by_key_id)] : '', a.resolve_note ? ' — ' + a.resolve_note : ''] : '—') },
		];
		const out = [
			h('h1', null, 'Effect ', h('code', null, e.id)),
			fields([
				['Type', e.effect_type],
				['Idempotency key', h('code', null, e.idempotency_key)],
				['State', h('span', { class: 'state ' + e.state }, e.state)],
				['Attempt', e.attempt],
				['Cost', micros(e.cost_micros)],
				['Denial', text(e.denial_code)],
				['Approval', text(e.approval_id)],
				['Run', e.run_id ? link(['runs', e.run_id], e.run_id) : '—'],
				['Group', e.group_id ? link(['groups', e.group_id], e.group_id) : '—'],
				['Compensates', e.compensates_effect_id ? link(['effects', e.compensates_effect_id], e.compensates_effect_id) : '—'],
				['Lease until', time(e.lease_expires_at)],
				['Created', time(e.created_at)],
				['Updated', time(e.updated_at)],
			]),
			preview('Payload', e.payload_preview),
			preview('Result', e.result_preview),
			e.result_unreadable ? h('p', { class: 'notice' }, unreadableResult) : null,
			h('h2', null, 'Attempts'),
			table(attempts, e.attempts || [], 'No attempt has begun.'),
		];
		// The approval, pending or decided, with its decision's note: an
		// approval's id (an approval.decided alert's) opens this page
		// (console QA: a decided one showed no note, and none at all once
		// its effect had moved on, denied or executed).
		// A key that may not read approvals is told so only where one waits
		// for a decision.
		if (e.approval_id) {
			const a = await call('GET', `/approvals/${seg(e.approval_id)}`).catch((err) => err);
			if (!(a instanceof Error)) {
				out.push(
					h('h2', null, 'Approval'),
					a.state === 'pending'
						? [h('p', null, `Held: ${a.reason}.`), decide(a, e)]
						: h('p', null, `${a.state} ${time(a.decided_at)} (held: ${a.reason}${answered(a)})`, a.note ? ' — ' + a.note : ''),
				);
			} else if (e.state === 'awaiting_approval' || a.status !== 403) {
				out.push(h('h2', null, 'Approval'), errorBox(asError(a)));
			}
		}
		if (e.state === 'indeterminate' && (await lacksScope('effects:resolve'))) {
			// Console QA: the form asked "It cannot be changed afterwards"
			// of a key the service then refused.
			out.push(h('h2', null, 'Resolve'), lacking('Resolving', 'effects:resolve', ' to record what the vendor shows'));
		} else if (e.state === 'indeterminate') {
			// The resolve names the attempt shown, so one sent again after
			// its answer was lost, or from a page left open while the key
			// ran again, never settles a later attempt nobody checked
			// (resolve QA): the service refuses it, naming the attempt
			// unknown now.
			const unknown = unknownAttempt(e);
			out.push(
				h('h2', null, 'Resolve'),
				h('p', null, 'Check the vendor for this action first, then record what you found. Succeeded makes the next begin on its key a duplicate; failed lets it run again.'),
				unknown ? h('p', null, `This records attempt ${unknown.attempt}, the one whose outcome is unknown (started ${time(unknown.started_at)}).`) : null,
				form(
					[
						select('Outcome at the vendor', 'outcome', [['', 'choose what the vendor shows…'], ['succeeded', 'succeeded: it happened'], ['failed', 'failed: it did not happen']], ''),
						h('label', null, 'Result (JSON, optional) ', h('textarea', { name: 'result', rows: 4, cols: 60, class: 'code', spellcheck: 'false' })),
						input('Note', 'note', { maxlength: maxLengths['POST /effects/{id}/resolve note'] }),
					],
					'Resolve',
					(v) =>
						call('POST', `/effects/${seg(e.id)}/resolve`, {
							outcome: v.outcome,
							result: parseJSONField('Result', v.result),
							note: v.note || undefined,
							attempt: unknown ? unknown.attempt : undefined,
						}),
					{
						validate: (v) => {
							if (!v.outcome) throw new ConsoleError('invalid_request', 'Choose the outcome you found at the vendor.');
							parseJSONField('Result', v.result);
						},
						confirm: (v) => `Record ${e.effect_type} ${e.id}${unknown ? ` (attempt ${unknown.attempt})` : ''} as ${v.outcome.toUpperCase()} at the vendor? It cannot be changed afterwards.`,
						// Said, not only seen in the redrawn state (console QA).
						after: (r) => redrawSaying(`Resolved: recorded as ${r.state}.`),
					},
				),
			);
		}
		return out;
	},

	async circuits() {
		const actions = [['require_approval', 'require approval'], ['deny', 'deny'], ['monitor', 'monitor']];
		// A key that may only read them (policies:read) is shown the
		// breakers and the stop, not offered their changes (console QA).
		const readOnly = await lacksScope('policies:write');
		const columns = [
			{ title: 'Effect type', cell: (c) => c.effect_type },
			{ title: 'State', cell: (c) => h('span', { class: 'state ' + c.state }, c.state) },
			{ title: 'Opened by', cell: (c) => text(c.opened_by) },
			{ title: 'Action', cell: (c) => text(c.action) },
			{ title: 'Reason', cell: (c) => text(c.reason) },
			{ title: 'Last hour', cell: (c) => c.volume_last_hour },
			{ title: 'Median hourly', cell: (c) => text(c.baseline_median_hourly) },
			{ title: 'Threshold', cell: (c) => text(c.threshold) },
			{ title: 'Opened', cell: (c) => time(c.opened_at) },
			{ title: 'Closes', cell: (c) => time(c.closes_at) },
			{
				title: '',
				cell: (c) =>
					c.opened_by === 'stop'
						? h('span', { class: 'empty' }, 'Held by the emergency stop: release it above.')
						: readOnly
						? null
						: c.state === 'open'
						? action('Close', keyed('console-circuit-close', (send) => send('POST', `/circuits/${seg(c.effect_type)}/close`)), {
								confirm: `Close the ${c.effect_type} breaker? It gets a fresh allowance from now.`,
							})
						: form(
								[select('Action', 'action', actions, 'require_approval'), input('Reason', 'reason', { maxlength: maxLengths['POST /circuits/{effect_type}/open reason'] })],
								'Open',
								keyed('console-circuit-open', (send, v) => send('POST', `/circuits/${seg(c.effect_type)}/open`, { action: v.action, reason: v.reason || undefined })),
								{ inline: true, danger: true, confirm: `Open the ${c.effect_type} breaker by hand? It stays open until you close it.` },
							),
			},
		];
		// The banner reads the stop itself: the list shows it only on the
		// types it holds, not on those a stricter breaker of their own holds.
		const [list, stop] = await Promise.all([
			pager('/circuits', { limit: 200 }, columns, 'No effect type has been seen or configured yet.'),
			call('GET', '/circuits/stop'),
		]);
		const stopped = stop.state === 'open' ? stop : null;
		return [
			h('h1', null, 'Circuits'),
			h('p', { class: 'lead' }, 'Surge breakers per effect type. A breaker you open by hand, and the emergency stop, stay open until you close them.'),
			h(
				'section',
				{ class: 'stop' },
				h('h2', null, 'Emergency stop'),
				stopped
					? h('p', { class: 'error', role: 'status' }, `The emergency stop is ON since ${time(stopped.opened_at)} (${stopped.action}): ${text(stopped.reason)}`)
					: h('p', { class: 'empty' }, 'The emergency stop is off.'),
				// While the stop is on, the form holds its action and reason, so
				// that pulling it again changes only what is edited (console QA:
				// it reset to require_approval and no reason, and silently
				// replaced a deny).
				readOnly
					? lacking('Changing a breaker or the emergency stop', 'policies:write')
					: form(
						[
							select('Action', 'action', actions, stopped ? stopped.action : 'require_approval'),
							input('Reason', 'reason', { maxlength: maxLengths['POST /circuits/stop reason'], value: stopped ? stopped.reason || '' : '' }),
						],
						'Stop every effect type',
						keyed('console-stop', (send, v) => send('POST', '/circuits/stop', { action: v.action, reason: v.reason || undefined })),
						{
							inline: true,
							danger: true,
							confirm: (v) =>
								stopped
									? `Replace the current emergency stop (${stopped.action}${stopped.reason ? ': ' + stopped.reason : ''}) with ${v.action}${v.reason ? ': ' + v.reason : ', no reason'}? Every effect type stays held until you release it.`
									: 'Hold every effect type in this workspace until you release the stop?',
						},
					),
				stopped && !readOnly
					? action('Release the stop', keyed('console-release', (send) => send('POST', '/circuits/release', {})), {
							confirm: 'Lift the emergency stop? Breakers of single types stay as they are.',
						})
					: null,
			),
			list,
		];
	},

	async policies() {
		const columns = [
			{ title: 'Effect type', cell: (p) => link(['policies', p.effect_type], p.effect_type) },
			{ title: 'Mode', cell: (p) => p.mode },
			{ title: 'On indeterminate', cell: (p) => p.on_indeterminate },
			{ title: 'Lease', cell: (p) => p.lease_seconds + ' s' },
			{ title: 'Max attempts', cell: (p) => p.max_attempts },
			{ title: 'Max cost', cell: (p) => micros(p.max_cost_micros) },
			{ title: 'Daily budget', cell: (p) => micros(p.daily_budget_micros) },
			{ title: 'Surge', cell: (p) => (p.surge_per_hour ? p.surge_per_hour + '/h' : p.surge_multiplier ? p.surge_multiplier + '× normal' : 'off') },
			{ title: 'Version', cell: (p) => p.version },
		];
		return [
			h('h1', null, 'Policies'),
			h('p', { class: 'lead' }, 'What each effect type may do. An unconfigured type gets the safe default (allow, block on an unknown outcome).'),
			form([input('Effect type', 'effect_type', { required: true, placeholder: 'payment.charge', maxlength: 100 })], 'Open policy', async (v) =>
				navigate('policies/' + encodeURIComponent(v.effect_type.trim())), { inline: true, after: () => {} }),
			await pager('/policies', {}, columns, 'No policy is configured yet.'),
		];
	},

	async policy(params, type) {
		const p = await call('GET', `/policies/${seg(type)}`);
		// The fields the server keeps itself are shown, not offered for
		// editing (a PUT naming one is refused).
		const { effect_type: _t, version, updated_at: _u, last_reconciled_at: _r, ...editable } = p;
		const area = h('textarea', { name: 'policy', rows: 24, class: 'code', spellcheck: 'false', 'aria-label': `Policy of ${p.effect_type} (JSON)` });
		area.value = JSON.stringify(editable, null, 2);
		// An amount beyond 2^53 micros reached this page rounded: it is kept
		// as stored unless its field is changed, since only changed fields
		// are sent.
		const rounded = Object.keys(editable).filter((k) => hasUnsafeInteger(editable[k]));
		const head = [
			h('h1', null, 'Policy ', h('code', null, p.effect_type)),
			fields([
				['Version', version],
				['Updated', time(p.updated_at)],
				['Last reconciled', time(p.last_reconciled_at)],
			]),
		];
		const roundedNote = (kept) =>
			rounded.length ? h('p', { class: 'empty' }, `${rounded.join(', ')}: beyond what this page shows exactly (2^53), shown rounded${kept}.`) : null;
		// A key known to lack the scope is shown the policy, not offered
		// its edit, as the resolve form is not offered (console QA: only
		// the refusal told it). A rounded amount is said to be rounded there
		// too (console QA: shown as if stored so).
		if (await lacksScope('policies:write')) return [head, roundedNote(''), json(editable), lacking('Editing a policy', 'policies:write')];
		return [
			head,
			h('p', null, 'Edit the fields and save: only the fields changed are sent (an omitted field keeps its value, null clears it). The save names this version, so an edit made meanwhile elsewhere is refused (version_conflict) rather than overwritten.'),
			roundedNote('; kept as stored unless changed'),
			form([area], 'Save policy', keyed('console-policy', async (send, v) => {
				const body = parseJSONField('Policy', v.policy);
				if (!body || typeof body !== 'object' || Array.isArray(body)) throw new ConsoleError('invalid_json', 'The policy must be a JSON object.');
				const changed = Object.fromEntries(Object.entries(body).filter(([k, val]) => JSON.stringify(val) !== JSON.stringify(editable[k])));
				if (!Object.keys(changed).length) throw new ConsoleError('unchanged', 'Nothing changed.');
				return send('PUT', `/policies/${seg(p.effect_type)}`, { ...changed, expected_version: version });
			}), { after: saved }),
		];
	},

	async runs(params) {
		const columns = [
			{ title: 'Created', cell: (r) => time(r.createdAt) },
			{ title: 'Run', cell: (r) => link(['runs', r.id], r.id) },
			{ title: 'Name', cell: (r) => r.name },
			{ title: 'Status', cell: (r) => h('span', { class: 'state ' + r.status.toLowerCase() }, r.status) },
			{ title: 'Spent', cell: (r) => [micros(r.spentMicros), r.budgetMicros !== null && r.budgetMicros !== undefined ? ' of ' + micros(r.budgetMicros) : ''] },
			{ title: 'Finished', cell: (r) => time(r.finishedAt) },
		];
		return [
			h('h1', null, 'Runs'),
			filters('runs', params, [select('Status', 'status', [['', 'any'], ['RUNNING', 'running'], ['SUCCEEDED', 'succeeded'], ['FAILED', 'failed']], params.status || '')]),
			await pager('/runs', { status: params.status }, columns, 'No runs.'),
		];
	},

	async run(params, id) {
		const r = await call('GET', `/runs/${seg(id)}`);
		return [
			h('h1', null, 'Run ', h('code', null, r.id)),
			fields([
				['Name', r.name],
				['Status', h('span', { class: 'state ' + r.status.toLowerCase() }, r.status)],
				['Completion requested', r.completionRequested ? 'yes' : 'no'],
				['Spent', micros(r.spentMicros)],
				['Budget', micros(r.budgetMicros)],
				['Created', time(r.createdAt)],
				['Finished', time(r.finishedAt)],
			]),
			h('h2', null, 'Steps'),
			await pager(`/runs/${seg(r.id)}/steps`, {}, stepColumns, 'No steps.'),
		];
	},

	async step(params, id) {
		const s = await call('GET', `/steps/${seg(id)}`);
		const job = s.durableJob || {};
		const ended = ['SUCCEEDED', 'EXHAUSTED', 'CANCELLED', 'SKIPPED'].includes(job.status);
		const held = heldAttempt(job);
		const attempts = job.attempts || [];
		const replays = job.replays || [];
		const out = [
			h('h1', null, 'Step ', h('code', null, s.id)),
			fields([
				['Run', link(['runs', s.runId], s.runId)],
				['Tool', `${s.name}@${s.version}`],
				['Endpoint', s.endpoint],
				['Idempotency key', h('code', null, s.idempotencyKey)],
				['Status', s.status],
				['Job', `${text(job.status)}, attempt ${text(job.attempt)} of ${text(job.maxAttempts)}`],
				// A replayed step waiting for its cancelled attempt is due when
				// that attempt's lease expires, or at its report if sooner
				// (console QA: the time read as a plain due time).
				['Due', held && job.status === 'QUEUED' ? `${time(job.dueAt)}, or sooner if attempt ${held} reports` : time(job.dueAt)],
				job.status === 'RUNNING' || held ? ['Lease until', time(job.leaseExpiresAt)] : null,
				['Cancel requested', job.cancelRequested ? 'yes' : 'no'],
				['Retry policy', retryPolicyText(s)],
				['After step', s.afterStepId ? link(['steps', s.afterStepId], s.afterStepId) : '—'],
				['Created', time(s.createdAt)],
				['Finished', time(s.finishedAt)],
			]),
			held ? h('p', { class: 'notice' }, heldNote(job, held)) : null,
			preview('Input', s.inputPreview),
			preview('Output', s.outputPreview),
			h('h2', null, 'Attempts'),
			lastOf(
				`/steps/${seg(s.id)}/attempts`,
				[
					{ title: '#', cell: (a) => a.attempt },
					{ title: 'Worker', cell: (a) => a.workerId },
					{ title: 'Outcome', cell: (a) => text(a.outcome) },
					{ title: 'Retryable', cell: (a) => (a.retryable === null || a.retryable === undefined ? '—' : a.retryable ? 'yes' : 'no') },
					// A worker's retryAfterMs holds the retry back past the
					// policy's delay (console QA: the due time read as if the
					// policy alone had set it).
					{ title: 'Retry after', cell: (a) => (Number.isFinite(a.retryAfterMs) ? `at least ${duration(a.retryAfterMs)} (asked by the worker)` : '—') },
					{ title: 'Error (redacted) / warning', cell: attemptProblem },
					{ title: 'Started', cell: (a) => time(a.startedAt) },
					{ title: 'Reported', cell: (a) => time(a.reportedAt) },
				],
				attempts,
				job.attemptsTruncated,
				(a) => a.attempt,
				'No attempt has started.',
				'attempts',
				`Only the last ${attempts.length} attempts are shown (from attempt ${attempts.length ? attempts[0].attempt : '—'}): the step’s read leaves the earlier ones out.`,
			),
			// The job's replay audit (console QA: not shown anywhere).
			h('h2', null, 'Replays'),
			lastOf(
				`/steps/${seg(s.id)}/replays`,
				replayColumns,
				replays,
				job.replaysTruncated,
				(r) => r.id,
				'Never replayed.',
				'replays',
				`Only the last ${replays.length} replays are shown (from ${replays.length ? time(replays[0].createdAt) : '—'}): the step’s read leaves the earlier ones out.`,
			),
		];
		if (!ended) {
			out.push(action('Cancel step', keyed('console-cancel', (send) => send('POST', `/steps/${seg(s.id)}/cancel`, {})), {
				danger: true,
				confirm: 'Cancel this step? A running job sees it at its next heartbeat.',
			}));
		}
		if (job.status === 'EXHAUSTED' || job.status === 'CANCELLED') {
			out.push(h('h2', null, 'Replay'), await replayForm(s.id).catch((err) => errorBox(asError(err))));
		}
		return out;
	},

	async queue() {
		const health = [
			{ title: 'Tool', cell: (q) => [link(['tools', q.name], q.name), '@' + q.version] },
			{ title: 'Queued', cell: (q) => q.queued },
			{ title: 'Due', cell: (q) => q.due },
			{ title: 'Oldest queued', cell: (q) => (q.oldestQueuedAgeSeconds === null || q.oldestQueuedAgeSeconds === undefined ? '—' : q.oldestQueuedAgeSeconds + ' s') },
			{ title: 'Workers seen', cell: (q) => q.workersSeen },
			{ title: 'Note', cell: (q) => text(q.message) },
		];
		const endpoints = [
			{ title: 'Endpoint', cell: (e) => link(['endpoints', e.id], e.name) },
			{ title: 'Paused', cell: (e) => (e.paused ? 'yes' : 'no') },
			{ title: 'Circuit', cell: (e) => h('span', { class: 'state ' + e.circuit.state.toLowerCase() }, e.circuit.state) },
			{ title: 'Preset', cell: (e) => text(e.policyPreset) },
			{ title: 'Max attempts', cell: (e) => e.maxAttempts },
			// The limits that hold due jobs by design, which the health
			// notes above name (console QA: shown nowhere but the policy's
			// JSON).
			{ title: 'Limits', cell: endpointLimits },
		];
		// A key known to lack the scope is not offered the actions (console
		// QA: only the refusal told it).
		const readOnly = await lacksScope('endpoints:write');
		if (!readOnly) endpoints.push({ title: '', cell: endpointActions });
		return [
			h('h1', null, 'Queue'),
			h('h2', null, 'Health by exact name@version'),
			await pager('/queue/health', {}, health, 'Nothing is queued.'),
			h('h2', null, 'Endpoints'),
			readOnly ? lacking('Pausing, resuming or closing the circuit of an endpoint', 'endpoints:write') : null,
			await pager('/endpoints', {}, endpoints, 'No endpoints yet.'),
		];
	},

	async tools() {
		return [
			h('h1', null, 'Tools'),
			h(
				'p',
				{ class: 'lead' },
				'The contracts of the tools your workers run: the input and output each handler version takes, its timeout and retries, and the versions no longer allowed to run. The queue page lists the tools with jobs.',
			),
			form([input('Tool name', 'name', { required: true, placeholder: 'send_welcome_email', maxlength: 200 })], 'Open tool', async (v) =>
				navigate('tools/' + encodeURIComponent(v.name.trim())), { inline: true, after: () => {} }),
		];
	},

	async tool(params, name) {
		const columns = [
			{ title: 'Contract', cell: (c) => c.contractVersion },
			{ title: 'Handler version', cell: (c) => c.handlerVersion },
			{ title: 'Status', cell: (c) => h('span', { class: 'state ' + c.status.toLowerCase() }, c.status) },
			{ title: 'Timeout', cell: (c) => c.timeoutMs + ' ms' },
			{ title: 'Retries', cell: (c) => (c.retryPolicy ? `CUSTOM: ${c.retryPolicy.maxAttempts} attempts` : c.retryPreset) },
			{ title: 'Input schema', cell: (c) => json(c.inputSchema) },
			{ title: 'Output schema', cell: (c) => json(c.outputSchema) },
			{ title: 'Published', cell: (c) => time(c.createdAt) },
		];
		const list = await pager(`/tools/${seg(name)}/contracts`, {}, columns, 'No contract is published: each handler version runs under its implicit contract (any input, any output).');
		// A new version starts from the newest one (contracts are
		// immutable: publishing adds one), which is the first page's last
		// only when no page follows it (console QA: past a page, or a first
		// page ended early at 4 MB of schemas, the draft and the test's
		// handler version were an older contract's).
		const newest = await newestContract(name, list);
		const draft = newest
			? pick(newest, ['handlerVersion', 'inputSchema', 'outputSchema', 'timeoutMs', 'retryPreset', ...(newest.retryPolicy ? ['retryPolicy'] : []), 'status'])
			: { handlerVersion: '1', inputSchema: { type: 'object' }, outputSchema: true, timeoutMs: 30000, retryPreset: 'STANDARD', status: 'ACTIVE' };
		const area = h('textarea', { name: 'contract', rows: 16, class: 'code', spellcheck: 'false', 'aria-label': `New contract version of ${name} (JSON)` });
		area.value = JSON.stringify(draft, null, 2);
		// Labelled on screen, as every other field is (console QA: an
		// unnamed box under the handler version).
		const input_ = h('textarea', { name: 'input', rows: 6, class: 'code', spellcheck: 'false' });
		input_.value = '{}';
		const head = [h('h1', null, 'Tool ', h('code', null, name)), h('h2', null, 'Contracts'), list];
		// A key known to lack the scope is not offered the forms (console
		// QA: only the refusal told it).
		if (await lacksScope('contracts:write')) return [head, lacking('Publishing a contract or testing a handler version', 'contracts:write')];
		const publish = idempotent('console-contract');
		const enqueueTest = idempotent('console-tool-test');
		return [
			head,
			h('h2', null, 'Publish a contract version'),
			h('p', null, 'JSON Schema 2020-12 for inputSchema and outputSchema; status FORBIDDEN stops its handler version from being enqueued or claimed. A contract cannot be changed once published: publish the next version.'),
			form([area], 'Publish', (v) => publish('POST', `/tools/${seg(name)}/contracts`, contractOf(v)), {
				validate: contractOf,
				confirm: `Publish a new contract version of ${name}? It cannot be changed or removed afterwards.`,
			}),
			h('h2', null, 'Test a handler version'),
			h('p', null, 'Enqueues one synthetic job with this input in a run of its own, attempted once, for a worker of name@version to run: it acts as any job would.'),
			form(
				[input('Handler version', 'version', { required: true, maxlength: maxLengths['POST /tools/{name}/test version'], value: newest ? newest.handlerVersion : '' }), h('label', null, 'Input (JSON) ', input_)],
				'Enqueue test job',
				(v) => enqueueTest('POST', `/tools/${seg(name)}/test`, { version: v.version.trim(), input: parseJSONField('The input', v.input) ?? {} }),
				{
					validate: (v) => parseJSONField('The input', v.input),
					confirm: (v) => `Enqueue a test job of ${name}@${v.version.trim()}? A worker runs it, side effects included.`,
					after: (t, status) => status.replaceChildren(h('p', { role: 'status' }, `Enqueued (${t.status}): `, link(['steps', t.stepId], t.stepId), ' in ', link(['runs', t.runId], t.runId), '.')),
				},
			),
		];
	},

	async endpoint(params, id) {
		const e = await call('GET', `/endpoints/${seg(id)}/policy`);
		const columns = [
			{ title: 'Started', cell: (a) => time(a.startedAt) },
			{ title: 'Step', cell: (a) => link(['steps', a.stepId], a.stepId) },
			{ title: 'Tool', cell: (a) => `${a.name}@${a.version}` },
			{ title: '#', cell: (a) => a.attempt },
			{ title: 'Outcome', cell: (a) => text(a.outcome) },
			{ title: 'Error (redacted) / warning', cell: attemptProblem },
			{ title: 'Worker', cell: (a) => a.workerId },
		];
		// The editable fields, as PUT names them; only those changed are
		// sent, so a field left alone is never re-validated against a
		// preset it was not written for. A built-in preset's schedule is
		// shown expanded, as a starting point for a CUSTOM one.
		const editable = {
			preset: e.policyPreset,
			maxAttempts: e.maxAttempts,
			...pick(e.retryPolicy || retryPresets[e.policyPreset] || {}, ['initialDelayMs', 'multiplier', 'maxDelayMs', 'jitterPercent']),
			defaultTimeoutMs: e.defaultTimeoutMs,
			maxConcurrent: e.maxConcurrent,
			rateLimitPerMinute: e.rateLimitPerMinute,
			circuitFailureThreshold: e.circuitFailureThreshold,
			circuitCooldownMs: e.circuitCooldownMs,
		};
		// A key known to lack the scope is shown the policy, not offered
		// the actions (console QA: only the refusal told it).
		const readOnly = await lacksScope('endpoints:write');
		return [
			h('h1', null, 'Endpoint ', h('code', null, e.name)),
			fields([
				['Paused', e.paused ? 'yes: jobs are accepted, not claimed' : 'no'],
				['Circuit', endpointCircuit(e)],
				['Limits', endpointLimits(e)],
				['Policy version', e.version],
				['Retry policy', e.retryPolicy ? json(e.retryPolicy) : e.policyPreset],
				['Updated', time(e.updatedAt)],
			]),
			readOnly
				? lacking('Pausing, resuming or closing the circuit of an endpoint, or editing its policy,', 'endpoints:write')
				: endpointActions(e),
			h('h2', null, 'Policy'),
			readOnly ? json(editable) : endpointPolicyForm(e, editable),
			h('h2', null, 'Attempts'),
			filters('endpoints/' + encodeURIComponent(id), params, [
				select('Outcome', 'outcome', [['', 'any'], ['SUCCEEDED', 'succeeded'], ['FAILED', 'failed']], params.outcome || ''),
			]),
			await pager(`/endpoints/${seg(id)}/attempts`, { outcome: params.outcome }, columns, 'No attempts.'),
		];
	},

	async group(params, id) {
		const g = await call('GET', `/groups/${seg(id)}`);
		const shown = g.steps || [];
		// A group whose steps would pass what one answer holds is read with
		// its first steps (steps_truncated); GET …/steps pages the rest,
		// after the last one shown (console QA: a cut group read as if it
		// had no other step, and its rollback as if they owed nothing). An
		// unwinding group's are all read, for its plan.
		const all = g.state === 'unwinding' ? await allGroupSteps(g) : null;
		const cut = !all && g.steps_truncated && shown.length > 0;
		const columns = [
			{ title: 'Effect', cell: (s) => link(['effects', s.effect_id], s.effect_id) },
			{ title: 'Type', cell: (s) => s.effect_type },
			{ title: 'Idempotency key', cell: (s) => h('code', null, s.idempotency_key) },
			{ title: 'State', cell: (s) => h('span', { class: 'state ' + s.state }, s.state) },
			{ title: 'Compensation', cell: (s) => (s.has_compensation ? 'declared' : 'none') },
			{ title: 'Compensates', cell: (s) => (s.compensates_effect_id ? link(['effects', s.compensates_effect_id], s.compensates_effect_id) : '—') },
		];
		return [
			h('h1', null, 'Group ', h('code', null, g.name)),
			fields([
				['Group', h('code', null, g.id)],
				['State', h('span', { class: 'state ' + g.state }, g.state)],
				['Created', time(g.created_at)],
				['Committed', time(g.committed_at)],
				['Unwind started', time(g.unwind_started_at)],
				['Finished', time(g.finished_at)],
			]),
			h('h2', null, 'Steps'),
			cut
				? h('p', { class: 'notice', role: 'status' }, `This read of the group holds its first ${shown.length} step${shown.length === 1 ? '' : 's'} only: the rest would pass what one answer holds (about 4 MB). “Load more” below reads them.`)
				: null,
			await pager(`/groups/${seg(g.id)}/steps`, { limit: 200 }, columns, 'No effect has joined this group.', undefined, {
				data: all || shown,
				next_cursor: cut ? shown[shown.length - 1].effect_id : null,
			}),
			all ? await unwindPlan(g, all) : null,
		];
	},

	// ?created_by= lists the keys one key minted: revoking a key leaves
	// them live (security review), so each row links to its own, and
	// offers to revoke them with it.
	async keys(params) {
		const columns = [
			{ title: 'Name', cell: (k) => [k.name, k.id === ownKeyId() ? h('strong', null, ' (this console’s key)') : null] },
			{ title: 'Key', cell: (k) => h('code', null, k.id) },
			{
				title: 'Minted by',
				cell: (k) => [
					k.created_by_key_id ? ['minted by ', h('code', null, k.created_by_key_id)] : 'signup',
					' · ',
					h('a', { href: '#/keys' + query({ created_by: k.id }) }, 'keys it minted'),
				],
			},
			{ title: 'Scopes', cell: (k) => text(k.scopes) },
			{ title: 'Tools', cell: (k) => text(k.tools) },
			{ title: 'Daily ceiling', cell: (k) => micros(k.daily_spend_ceiling_micros) },
			{ title: 'Per minute', cell: (k) => text(k.rate_limit_per_minute) },
			{ title: 'Created', cell: (k) => time(k.created_at) },
			{
				title: '',
				// A key found compromised is revoked with what it minted
				// (?include_minted=true); a key revoked alone before may
				// still have its live minted keys revoked so.
				cell: (k) =>
					k.revoked_at
						? ['revoked ' + time(k.revoked_at), ' ', revokeKeyAction(k, true)]
						: [revokeKeyAction(k, false), ' ', revokeKeyAction(k, true)],
			},
		];
		const createdBy = (params.created_by || '').trim();
		const list = await pager('/keys', { created_by: createdBy }, columns, createdBy ? `Key ${createdBy} minted no key.` : 'No keys.');
		const createKey = idempotent('console-key');
		return [
			h('h1', null, 'Keys'),
			h('p', { class: 'lead' }, 'Give an agent an AGENT key (begin and report only) and a worker a WORKER key for its exact tools, never this console’s key. Revoking a key leaves the keys it minted live (list them: “keys it minted”); “Revoke with minted keys” revokes them with it, down the tree, for a key found compromised.'),
			filters('keys', params, [input('Minted by (key id)', 'created_by', { value: createdBy, placeholder: 'key_…' })]),
			h('h2', null, 'New key'),
			form(
				[
					input('Name', 'name', { required: true, maxlength: maxLengths['POST /keys name'] }),
					select('Preset', 'preset', [['AGENT', 'AGENT (begin, report)'], ['WORKER', 'WORKER (jobs:work)'], ['INGEST', 'INGEST (runs)'], ['OPERATOR', 'OPERATOR (every scope)']], 'AGENT'),
					input('Tools (WORKER: name@version, comma-separated)', 'tools', { placeholder: 'send_welcome_email@1' }),
					input('Daily spend ceiling (micros)', 'ceiling', { type: 'number', min: 0, step: 1 }),
					input('Requests per minute', 'rate', { type: 'number', min: 1, step: 1 }),
				],
				'Create key',
				async (v) => {
					const k = await createKey('POST', '/keys', {
						name: v.name,
						preset: v.preset,
						tools: v.tools.trim() ? v.tools.split(',').map((t) => t.trim()).filter(Boolean) : undefined,
						daily_spend_ceiling_micros: wholeNumber('The daily spend ceiling', v.ceiling),
						rate_limit_per_minute: wholeNumber('Requests per minute', v.rate),
					});
					// The list shows the new key beside its secret (console QA:
					// only once "Done" redrew the page).
					// A list of another key's mints does not hold it.
					if (!createdBy || k.created_by_key_id === createdBy) await refreshList(list, k);
					return k;
				},
				{ once: true, after: (k, status) => showSecret(status, secretOnce(`Key ${k.name} (${k.id})`, k.secret), action('Done', async () => {}, {})) },
			),
			h('h2', null, createdBy ? ['Keys minted by ', h('code', null, createdBy)] : 'Keys'),
			list,
		];
	},

	async webhooks() {
		const columns = [
			{ title: 'URL', cell: (w) => h('code', null, w.url) },
			{ title: 'Events', cell: (w) => text(w.events) },
			{ title: 'Created', cell: (w) => time(w.created_at) },
			{ title: 'State', cell: webhookState },
			{ title: 'Previous secret signs until', cell: (w) => time(w.previous_secret_expires_at) },
			// A signing secret the server cannot decrypt (secret_unreadable)
			// sends nothing: said here, not only in the server's log.
			{ title: 'Signing secret', cell: (w) => (w.secret_unreadable ? h('strong', { class: 'warning' }, 'unreadable: no delivery is sent') : 'readable') },
			{
				title: '',
				cell: (w) => {
					// One Idempotency-Key per rotation: a click sent again after a
					// lost answer is given the secret the first one made. Once an
					// answer is read, the next click is a rotation of its own
					// (console QA: a second rotation, confirmed, was answered with
					// the first one's secret, shown again as new and "shown once",
					// and never refused while the previous secret still signed).
					const rotation = idempotent('console-rotate:' + w.id);
					const rotate = () => rotateSecret(w, {}, rotation);
					return [
						link(['webhooks', w.id], 'Edit, deliveries'),
						' ',
						webhookToggle(w),
						' ',
						action('Rotate secret', rotate, {
							confirm: `Give ${JSON.stringify(w.url)} a new signing secret? The current one keeps signing beside it for a day (refused while an earlier rotation's previous secret still signs).`,
							after: (r, status) => (r.refused ? offerReplace(w, r.refused, status) : rotated(w, r, status)),
						}),
						' ',
						action('Delete', () => call('DELETE', `/webhooks/${seg(w.id)}`), {
							danger: true,
							confirm: `End the subscription to ${JSON.stringify(w.url)}? Its pending deliveries are abandoned.`,
							// Said, as the row just leaves the list (console QA, in a browser).
							after: () => redrawSaying(`Deleted: the subscription to ${w.url}.`),
						}),
					];
				},
			},
		];
		const list = await pager('/webhooks', {}, columns, 'No subscriptions.');
		const subscribe = idempotent('console-webhook');
		return [
			h('h1', null, 'Webhooks'),
			h('h2', null, 'New subscription'),
			form(
				[
					input('URL', 'url', { required: true, type: 'url', placeholder: 'https://example.com/ratchet' }),
					eventChecks([]),
				],
				'Subscribe',
				async (v) => {
					const w = await subscribe('POST', '/webhooks', { url: v.url, events: v.events });
					// The list shows the new subscription beside its secret, as the
					// keys page does (console QA: only once "Done" redrew the page).
					await refreshList(list, w);
					return w;
				},
				{ once: true, after: (w, status) => showSecret(status, secretOnce(`Signing secret for ${w.url}`, w.secret, 'It is shown once: verify Ratchet-Signature with it.'), action('Done', async () => {}, {})) },
			),
			h('h2', null, 'Subscriptions'),
			list,
		];
	},

	async reconcile() {
		const now = new Date();
		const reconcile = idempotent('console-reconcile');
		const iso = (d) => d.toISOString().replace(/\.\d+Z$/, 'Z');
		const lists = [
			['resolved', 'Resolved now: unknown outcomes the records settle'],
			['status_mismatch', 'Status mismatch: one side says it happened, the other that it did not'],
			['amount_mismatch', 'Amount mismatch'],
			['missing_at_vendor', 'Succeeded here, no record at the vendor'],
			['unknown_to_ratchet', 'At the vendor, unknown here'],
			['unsettled', 'Still unknown (no record, a live lease, or pending at the vendor)'],
			['matched', 'Matched'],
		];
		const columns = [
			{ title: 'Idempotency key', cell: (r) => h('code', null, r.idempotency_key) },
			{ title: 'Effect', cell: (r) => (r.effect_id ? link(['effects', r.effect_id], r.effect_id) : '—') },
			// A row this reconciliation resolved reads the state it left
			// (its outcome), not the one it found (console QA: "Here:
			// indeterminate" under "Resolved now").
			{ title: 'Here', cell: (r) => (r.outcome ? [h('span', { class: 'state ' + r.outcome }, r.outcome), ` (resolved now; was ${text(r.ratchet_state)})`] : text(r.ratchet_state)) },
			{ title: 'Vendor', cell: (r) => text(r.vendor_status) },
			{ title: 'Amount here', cell: (r) => micros(r.ratchet_amount_micros) },
			{ title: 'Vendor amount', cell: (r) => micros(r.vendor_amount_micros) },
		];
		return [
			h('h1', null, 'Reconcile'),
			h('p', { class: 'lead' }, 'Compare an effect type with the vendor’s own record of the same window. Records are matched by idempotency key; an unknown outcome a record settles is resolved as an operator’s resolve would be.'),
			form(
				[
					input('Effect type', 'effect_type', { required: true, maxlength: maxLengths['POST /reconcile effect_type'], placeholder: 'payment.charge' }),
					input('From (RFC 3339)', 'from', { required: true, value: iso(new Date(now.getTime() - 86400000)) }),
					input('To', 'to', { required: true, value: iso(now) }),
					h(
						'label',
						null,
						'Vendor records: CSV with the header idempotency_key,status,amount_micros (status succeeded, refunded, failed or pending), or a JSON array of those objects ',
						h('textarea', { name: 'records', rows: 10, cols: 80, class: 'code', spellcheck: 'false' }),
					),
				],
				'Reconcile',
				(v) => reconcile('POST', '/reconcile', { effect_type: v.effect_type.trim(), from: v.from.trim(), to: v.to.trim(), records: parseRecords(v.records) }),
				{
					validate: (v) => parseRecords(v.records),
					confirm: (v) => `Reconcile ${v.effect_type.trim()} from ${v.from.trim()} to ${v.to.trim()}? Unknown outcomes the records settle are resolved, which cannot be undone.`,
					after: (r, status) =>
						status.replaceChildren(
							h('p', { role: 'status' }, lists.map(([k]) => `${k.replace(/_/g, ' ')}: ${(r[k] || []).length}`).join(' · ')),
							...lists.filter(([k]) => (r[k] || []).length).flatMap(([k, title]) => [h('h2', null, title), table(columns, r[k])]),
						),
				},
			),
		];
	},

	async webhook(params, id) {
		const w = await call('GET', `/webhooks/${seg(id)}`);
		const resend = idempotent('console-delivery-retry');
		const columns = [
			{ title: 'Created', cell: (d) => time(d.created_at) },
			{ title: 'Event', cell: (d) => d.event_type },
			{ title: 'State', cell: (d) => h('span', { class: 'state ' + d.state }, d.state) },
			{ title: 'Attempts', cell: (d) => d.attempts },
			{ title: 'Last status', cell: (d) => text(d.last_status_code) },
			{ title: 'Last error', cell: (d) => text(d.last_error) },
			{ title: 'Delivered', cell: (d) => time(d.delivered_at) },
			{ title: 'Next attempt', cell: (d) => time(d.next_attempt_at) },
			{
				title: '',
				// Ended (delivered, or failed after its last attempt): sent
				// again on request, once the receiver is mended.
				cell: (d) =>
					d.state === 'pending'
						? ''
						: action('Send again', () => resend('POST', `/webhooks/${seg(id)}/deliveries/retry`, { delivery_ids: [d.id] }), {
								confirm: `Send this ${d.event_type} event to ${JSON.stringify(w.url)} again? A receiver that deduplicates by event id skips it if it took it.`,
							}),
			},
		];
		return [
			// The tab's title names it by id: a title lands in the browser's
			// history, and a receiver's URL may carry a token (review).
			h('h1', { 'data-title': 'Webhook ' + w.id }, 'Webhook ', h('code', null, w.url)),
			fields([
				['Events', text(w.events)],
				['Created', time(w.created_at)],
				['State', webhookState(w)],
				['Signing secret', w.secret_unreadable ? h('strong', { class: 'warning' }, 'unreadable') : 'readable'],
			]),
			webhookToggle(w),
			w.secret_unreadable ? h('p', { class: 'notice' }, unreadableSecret) : null,
			h('h2', null, 'Edit'),
			h('p', null, 'A new URL takes every delivery not yet sent (a send already on its way, at most 10 s, may still reach the old one). New events apply to the events from now on; pending deliveries of a type taken out end failed. The signing secret and the deliveries are kept.'),
			form(
				[input('URL', 'url', { required: true, type: 'url', value: w.url }), eventChecks(w.events)],
				'Save subscription',
				keyed('console-webhook-edit', (send, v) => {
					// Only what changed is sent: a save that names the URL
					// unchanged is not refused as a private address the
					// server has since stopped allowing.
					const changed = {};
					if (v.url !== w.url) changed.url = v.url;
					if (JSON.stringify([...v.events].sort()) !== JSON.stringify([...w.events].sort())) changed.events = v.events;
					if (!Object.keys(changed).length) throw new ConsoleError('unchanged', 'Nothing changed.');
					return send('PATCH', `/webhooks/${seg(id)}`, changed);
				}),
				{
					// Said, as a policy's save is (console QA, in a browser:
					// the page redrew with no word of the save).
					after: () => redrawSaying('Saved.'),
				},
			),
			h('h2', null, 'Deliveries'),
			await pager(`/webhooks/${seg(id)}/deliveries`, {}, columns, 'Nothing delivered yet.'),
		];
	},
};

// webhookEvents are the event types a subscription may name (a test in
// lib/console holds them to the service's).
const webhookEvents = ['effect.indeterminate', 'circuit.tripped', 'circuit.closed', 'approval.requested', 'approval.decided', 'reconciliation.due', 'run.finished', 'step.exhausted', 'step.replayed'];

// eventChecks are a subscription form's event types, those of checked
// ticked.
function eventChecks(checked) {
	return h('fieldset', null, h('legend', null, 'Events'), webhookEvents.map((e) => h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'events', value: e, 'data-list': true, checked: checked.includes(e) }), ' ', e)));
}

// webhookState says whether subscription w is sent anything.
function webhookState(w) {
	return w.disabled ? h('strong', { class: 'warning' }, `disabled since ${time(w.disabled_at)}: nothing is sent`) : 'enabled';
}

// webhookToggle disables subscription w, or enables it again.
function webhookToggle(w) {
	return w.disabled
		? action('Enable', keyed('console-webhook-enable', (send) => send('PATCH', `/webhooks/${seg(w.id)}`, { disabled: false })))
		: action('Disable', keyed('console-webhook-disable', (send) => send('PATCH', `/webhooks/${seg(w.id)}`, { disabled: true })), {
				confirm: `Disable ${JSON.stringify(w.url)}? Nothing is sent to it until you enable it again: its pending deliveries wait, and the events recorded meanwhile are never sent to it.`,
			});
}

// The built-in retry presets' schedules (lib/jobs Presets; a test in
// lib/console holds them equal): the policy routes show a built-in preset
// without its schedule, which a switch to CUSTOM starts from.
// maxLengths are the API's limits on the text fields the console's forms
// send, keyed by route and field: a form that let through what its route
// refuses showed the operator a refusal after the fact, and one cut shorter
// refused what the API takes (console QA: notes held to 1 000 characters
// where the routes take 2 000). lib/console's tests hold each to the
// OpenAPI document's maxLength.
const maxLengths = {
	'POST /effects/{id}/resolve note': 2000,
	'POST /approvals/{id}/approve note': 2000,
	'POST /approvals/{id}/reject note': 2000,
	'POST /circuits/{effect_type}/open reason': 500,
	'POST /circuits/stop reason': 500,
	'POST /tools/{name}/test version': 100,
	'POST /keys name': 100,
	'POST /reconcile effect_type': 100,
	'POST /steps/{id}/replay reason': 1000,
	'POST /workspaces name': 100,
};

const retryPresets = {
	STANDARD: { maxAttempts: 5, initialDelayMs: 30000, multiplier: 2, maxDelayMs: 900000, jitterPercent: 20 },
	AGGRESSIVE: { maxAttempts: 8, initialDelayMs: 5000, multiplier: 2, maxDelayMs: 300000, jitterPercent: 20 },
	RELAXED: { maxAttempts: 3, initialDelayMs: 120000, multiplier: 2, maxDelayMs: 1800000, jitterPercent: 20 },
};

// The fields a CUSTOM endpoint policy must name when it becomes CUSTOM.
const customRetryFields = ['maxAttempts', 'initialDelayMs', 'multiplier', 'maxDelayMs', 'jitterPercent'];

// newestContract is tool name's newest contract: the last of list (its
// contracts, oldest first) once the pages after the first are read, null
// for none.
async function newestContract(name, list) {
	let last = list.firstRows[list.firstRows.length - 1] || null;
	for (let cursor = list.firstNext; cursor; ) {
		const page = await call('GET', `/tools/${seg(name)}/contracts` + query({ limit: 200, cursor }));
		const rows = page.data || [];
		if (rows.length) last = rows[rows.length - 1];
		cursor = page.nextCursor ?? null;
	}
	return last;
}

// endpointLimits says endpoint e's maxConcurrent and rateLimitPerMinute.
function endpointLimits(e) {
	const parts = [];
	if (Number.isFinite(e.maxConcurrent)) parts.push(`at most ${e.maxConcurrent} running at once`);
	if (Number.isFinite(e.rateLimitPerMinute)) parts.push(`at most ${e.rateLimitPerMinute} started a minute`);
	return parts.length ? parts.join('; ') : 'none';
}

// endpointCircuit says endpoint e's breaker: while open, since when and
// when its next probe may be claimed (console QA: the page read "open, 3
// failures in a row", and not when its jobs would move again).
function endpointCircuit(e) {
	const c = e.circuit;
	const failures = `${c.consecutiveFailures} failure${c.consecutiveFailures === 1 ? '' : 's'} in a row`;
	const breaker = Number.isFinite(e.circuitFailureThreshold)
		? `opens after ${e.circuitFailureThreshold} in a row, probes every ${duration(e.circuitCooldownMs)}`
		: 'the breaker is off';
	const open = String(c.state).toLowerCase() !== 'closed';
	return [
		h('span', { class: 'state ' + String(c.state).toLowerCase() }, c.state),
		open ? ` since ${time(c.openedAt)}: its jobs wait; one probe may be claimed from ${time(c.probeAt)}` : '',
		`; ${failures} (${breaker})`,
	];
}

// endpointActions are endpoint e's pause or resume, and the close of its
// circuit when it is not closed.
function endpointActions(e) {
	return [
		e.paused
			? action('Resume', keyed('console-endpoint-resume', (send) => send('POST', `/endpoints/${seg(e.id)}/resume`, {})))
			: action('Pause', keyed('console-endpoint-pause', (send) => send('POST', `/endpoints/${seg(e.id)}/pause`, {})), {
					confirm: `Pause ${e.name}? Its jobs are accepted but not claimed until you resume it.`,
				}),
		e.circuit.state.toLowerCase() !== 'closed' ? closeCircuit(e) : null,
	];
}

// endpointPolicyForm edits endpoint e's policy, its fields shown as
// editable; only those changed are sent.
function endpointPolicyForm(e, editable) {
	const area = h('textarea', { name: 'policy', rows: 14, class: 'code', spellcheck: 'false', 'aria-label': `Policy of endpoint ${e.name} (JSON)` });
	area.value = JSON.stringify(editable, null, 2);
	return [
		h('p', null, 'Jobs already enqueued keep the policy they were enqueued with. The save names this version, so an edit made meanwhile elsewhere is refused (version_conflict).'),
		form([area], 'Save endpoint policy', async (v) => {
			const body = parseJSONField('Policy', v.policy);
			if (!body || typeof body !== 'object' || Array.isArray(body)) throw new ConsoleError('invalid_json', 'The policy must be a JSON object.');
			const changed = Object.fromEntries(Object.entries(body).filter(([k, val]) => JSON.stringify(val) !== JSON.stringify(editable[k])));
			if (!Object.keys(changed).length) throw new ConsoleError('unchanged', 'Nothing changed.');
			// A policy becoming CUSTOM must name its whole schedule (the
			// service refuses it otherwise), changed from what is shown or
			// not (console QA: switching the preset alone was refused
			// "maxAttempts is required for a CUSTOM policy").
			if (body.preset === 'CUSTOM' && editable.preset !== 'CUSTOM') {
				const missing = customRetryFields.filter((k) => body[k] === undefined);
				if (missing.length) throw new ConsoleError('invalid_request', `A CUSTOM policy needs its whole schedule: add ${missing.join(', ')}.`);
				Object.assign(changed, pick(body, customRetryFields));
			}
			return call('PUT', `/endpoints/${seg(e.id)}/policy`, { ...changed, expectedVersion: e.version });
		}, { after: saved }),
	];
}

// refreshList redraws a list in place after a create whose secret is shown
// once, and shows created in it (without its secret) where its first page
// does not: keys and subscriptions are listed oldest first, so a new one is
// on the last page (console QA: with more than a page of keys, the new key
// was not listed beside its secret; and the list redrawn by moving another
// list's rows into it answered "Load more" with a TypeError). A list that
// cannot be read now stays as it was, shown again at the next redraw.
async function refreshList(list, created) {
	try {
		await list.reload();
	} catch {
		// shown at the next redraw
	}
	const { secret: _secret, ...item } = created;
	list.show(item);
}

// saved redraws a policy's page after its save, saying which version it
// made.
function saved(p) {
	redrawSaying(`Saved (version ${p.version}).`);
}

// redrawSaying redraws the page after an action, with line under its heading
// saying what was done.
function redrawSaying(line) {
	flash = line;
	rerender();
}

// rotateSecret rotates w's signing secret, sent by send (an idempotent
// call); a refusal because an earlier
// rotation's previous secret still signs is answered as {refused}, for the
// page to offer replacing it.
async function rotateSecret(w, body, send) {
	try {
		return await send('POST', `/webhooks/${seg(w.id)}/rotate-secret`, body);
	} catch (err) {
		if (err.code === 'invalid_state' && err.detail && err.detail.previous_secret_expires_at) return { refused: err };
		throw err;
	}
}

// rotated shows a rotation's new secret once, beside its row, and the
// row's previous secret's expiry (console QA: it read "—" until a reload).
function rotated(w, r, status) {
	showSecret(
		status,
		secretOnce(`New signing secret for ${w.url}`, r.secret, `It is shown once. Until ${time(r.previous_secret_expires_at)} deliveries are signed with both secrets: deploy this one to the receiver before then.`),
	);
	let tr = status;
	while (tr && tr.tagName !== 'TR') tr = tr.parentNode;
	const cell = tr && tr.querySelector('td[data-label="Previous secret signs until"]');
	if (cell) cell.replaceChildren(time(r.previous_secret_expires_at));
}

// offerReplace answers a rotation refused while an earlier rotation's
// previous secret still signs: the refusal, and a confirmed rotation that
// stops that secret at once.
function offerReplace(w, err, status) {
	const until = time(err.detail.previous_secret_expires_at);
	const replacement = idempotent('console-rotate-replace:' + w.id);
	status.replaceChildren(
		errorBox(err),
		h('p', null, `An earlier rotation's previous secret signs until ${until}, beside the current one. Replacing it stops it at once: a receiver that still verifies with it alone fails every delivery from now on. The current secret then signs beside the new one for a day.`),
		action('Replace the previous secret now', () => rotateSecret(w, { replace_previous: true }, replacement), {
			danger: true,
			confirm: `Stop the previous signing secret of ${JSON.stringify(w.url)} (signing until ${until}) at once, and give it a new one? Deploy the current secret to the receiver first: from now on it and the new one sign.`,
			after: (r, inner) => (r.refused ? inner.replaceChildren(errorBox(r.refused)) : rotated(w, r, status)),
		}),
	);
}

function closeCircuit(e) {
	return action('Close circuit', keyed('console-endpoint-circuit-close', (send) => send('POST', `/endpoints/${seg(e.id)}/circuit/close`, {})), {
		confirm: `Close ${JSON.stringify(e.name)}'s circuit? Its jobs are claimed again at once: check the service it calls first.`,
	});
}

// withEffects gives each approval its effect (a.effect, null when it cannot
// be read): an approval names neither the cost nor the idempotency key. The
// pending ones' effects are awaiting approval, read in one list; a pending
// one the list missed is read by itself, as its Approve names the amount.
// Decided ones show what an earlier draw read (a key and a cost do not
// change), never one request a row: the page redraws every 15 s, and GETs
// count against the key's rate limit (review).
// The cache is the signed-in key's: another key, which may not read
// effects, starts empty.
const effectsSeen = new Map();
let effectsSeenBy = null;
async function withEffects(approvals) {
	if (!approvals.length) return;
	if (effectsSeen.size > 1000 || effectsSeenBy !== ownKeyId()) {
		effectsSeen.clear();
		effectsSeenBy = ownKeyId();
	}
	const by = effectsSeenBy;
	let readable = true;
	if (approvals.some((a) => a.state === 'pending')) {
		try {
			const page = await call('GET', '/effects' + query({ state: 'awaiting_approval', limit: 200 }));
			// An answer that lands after another key signed in is not kept
			// for it (review).
			if (ownKeyId() !== by) return;
			for (const e of page.data || []) effectsSeen.set(e.id, e);
		} catch (err) {
			if (err.status === 403) readable = false; // this key lacks effects:read
		}
	}
	await Promise.all(
		approvals.map(async (a) => {
			if (a.state === 'pending' && !effectsSeen.has(a.effect_id) && readable) {
				try {
					const e = await call('GET', `/effects/${seg(a.effect_id)}`);
					if (ownKeyId() === by) effectsSeen.set(a.effect_id, e);
				} catch {
					// shown without its cost and key
				}
			}
			a.effect = effectsSeen.get(a.effect_id) || null;
		}),
	);
}

// answered names what an approved approval answers beyond the reason it was
// asked for (API.md: a yes carries the key through every reason that held
// when it was given, the emergency stop or a breaker included), as "; also
// answers circuit_open"; '' when it answers only its reason, or nothing.
// Console QA: an operator could not tell that a yes had let a key through
// a breaker.
// unknownAttempt is the attempt a resolve of indeterminate effect e settles
// and names: its latest attempt whose outcome reads unknown (a retry after
// it may have been reported failed; what blocked answers' prior_attempt
// names). Undefined when none reads so.
function unknownAttempt(e) {
	return (e.attempts || []).filter((a) => a.outcome === 'indeterminate').reduce((last, a) => (!last || a.attempt > last.attempt ? a : last), undefined);
}

function answered(a) {
	const more = (a.answers || []).filter((r) => r !== a.reason);
	return more.length ? `; also answers ${more.join(', ')}` : '';
}

// decide is a pending approval's two forms; effect, when known, names its
// cost and key in the approval's confirmation.
function decide(a, effect) {
	const amount = !effect
		? 'a cost this page cannot read'
		: effect.cost_micros === null || effect.cost_micros === undefined
		? 'no declared cost'
		: micros(effect.cost_micros);
	const keyNote = effect ? ` (idempotency key ${JSON.stringify(effect.idempotency_key)})` : '';
	// Every row has the same two forms: their controls are named by the
	// effect they decide, for a screen reader's list of controls (console QA).
	return h('div', { class: 'decide' }, [
		form([input('Note', 'note', { maxlength: maxLengths['POST /approvals/{id}/approve note'], 'aria-label': `Note approving ${a.effect_id}` })], 'Approve', (v) => call('POST', `/approvals/${seg(a.id)}/approve`, { note: v.note || undefined }), {
			inline: true,
			name: `Approve ${a.effect_type} ${a.effect_id}`,
			confirm: `Approve ${a.effect_type} ${a.effect_id} for ${amount}${keyNote}? The next begin on its key executes.`,
			after: decided,
		}),
		form([input('Note', 'note', { maxlength: maxLengths['POST /approvals/{id}/reject note'], 'aria-label': `Note rejecting ${a.effect_id}` })], 'Reject', (v) => call('POST', `/approvals/${seg(a.id)}/reject`, { note: v.note || undefined }), {
			inline: true,
			danger: true,
			name: `Reject ${a.effect_type} ${a.effect_id}`,
			confirm: `Reject ${a.effect_type} ${a.effect_id}? Every begin on its key is then denied.`,
			after: decided,
		}),
	]);
}

// decided redraws the page an approval was decided on, saying which one and
// how (console QA, in a browser: the approved row just left the list and
// the focus went to the heading, so nothing said what had been done).
function decided(a) {
	redrawSaying(`${a.state === 'approved' ? 'Approved' : a.state === 'rejected' ? 'Rejected' : 'Now ' + a.state}: ${a.effect_type} ${a.effect_id}${a.note ? ' — ' + a.note : ''}.`);
}

// retryPolicyText is step s's policy snapshot (durableJob.policy: its
// contract's policy when it has one, else its endpoint's as the job was
// enqueued, an enqueue's maxAttempts and timeoutMs included), spelled out:
// a CUSTOM one has no name that says its schedule (console QA: the step
// page did not show it at all).
function retryPolicyText(s) {
	const job = s.durableJob || {};
	const p = job.policy;
	if (!p || typeof p !== 'object') return '—';
	const delays = p.maxAttempts > 1
		? `, retried after ${duration(p.initialDelayMs)}, then ×${p.multiplier} each time up to ${duration(p.maxDelayMs)} (±${p.jitterPercent}% jitter)`
		: '';
	const from = s.contractVersion !== null && s.contractVersion !== undefined
		? `contract ${s.contractVersion}'s`
		: Number.isFinite(job.policyVersion) ? `endpoint policy version ${job.policyVersion}` : 'the endpoint’s';
	return `${p.preset}: ${p.maxAttempts} attempt${p.maxAttempts === 1 ? '' : 's'}${delays}; timeout ${duration(p.timeoutMs)} (as enqueued: ${from})`;
}

// heldAttempt is the number of a job's attempt that may still be running
// although the job is not (cancelled, or replayed since): durableJob's
// leaseExpiresAt is set while an attempt holds the lease, and outside
// RUNNING only for such an attempt, which has not reported. 0 for none.
function heldAttempt(job) {
	if (!job || !job.leaseExpiresAt || job.status === 'RUNNING') return 0;
	const open = (job.attempts || []).find((a) => a.attempt === job.attempt && !a.outcome);
	return open ? open.attempt : 0;
}

// heldNote says what a held attempt means for the step: a replay of a step
// cancelled while it ran is not claimed until the cancelled attempt
// reports or its lease expires (console QA: the page read QUEUED and due,
// though no claim would take it, and the attempt read "—" as if nothing
// ran).
function heldNote(job, n) {
	const until = time(job.leaseExpiresAt);
	if (job.status === 'QUEUED') {
		return `Waiting for its cancelled attempt ${n}, which may still be running: no worker is given this step until that attempt reports or its lease expires (${until}), whichever comes first. Its worker learns of the cancel at its next heartbeat.`;
	}
	return `Attempt ${n} was running when the step was cancelled and may still be: its worker learns of the cancel at its next heartbeat, and its lease expires ${until}. A replay waits for it to report or for its lease to expire.`;
}

// attemptProblem is a job attempt's error cell: the message its worker
// reported and the service's warning, which a lapsed lease or an output its
// contract refused carries without any message (console QA: a lapsed
// attempt read FAILED with nothing to say that its side effect may have
// happened). A message the server cannot decrypt (errorMessageUnreadable)
// says so, rather than read "—" as if the worker had said nothing.
function attemptProblem(a) {
	const message = a.errorMessage
		? h('span', null, a.errorMessage)
		: a.errorMessageUnreadable
			? h('em', null, 'Message unreadable: sealed with an encryption key this server is not configured with')
			: null;
	if (!message && !a.warning) return '—';
	return [
		message,
		message && a.warning ? ' ' : null,
		a.warning ? h('strong', { class: 'warning' }, 'Warning: ', a.warning) : null,
	];
}

// unwindPlan is what an unwinding group still owes: each succeeded step
// with its compensation's state (owed, begun, succeeded, irreversible) and
// the key the plan suggests for it. It re-reads the rollback with POST
// …/unwind, which changes nothing for a group already unwinding (only a
// group shown unwinding is asked: for an open or committed one it would
// start the rollback). Compensation payloads, which only the plan opens,
// are not shown. steps is every step of the group (allGroupSteps, past a
// read cut to fit one answer): without the plan (a key that may read the
// group but not unwind it) the states are what they show.
async function unwindPlan(g, steps) {
	const u = await call('POST', `/groups/${seg(g.id)}/unwind`).catch((err) => err);
	const plan = u instanceof Error ? [] : u.plan || [];
	const planned = new Map(plan.map((p) => [p.effect_id, p]));
	const has = (list, id) => !(u instanceof Error) && (u[list] || []).includes(id);
	const compOf = (id) => steps.find((c) => c.compensates_effect_id === id) || null;
	const forward = steps.filter((st) => !st.compensates_effect_id && st.state === 'succeeded');
	// In the plan's order (reverse order of success), then the others.
	const rows = [...plan.map((p) => forward.find((st) => st.effect_id === p.effect_id)).filter(Boolean), ...forward.filter((st) => !planned.has(st.effect_id))];
	const stateOf = (st) => {
		const comp = compOf(st.effect_id);
		if (has('reversed', st.effect_id)) return ['succeeded', comp];
		if (has('irreversible', st.effect_id) || !st.has_compensation) return ['irreversible', comp];
		const p = planned.get(st.effect_id);
		if (p) return p.compensation_state ? ['begun', comp, p.compensation_state] : ['owed', comp];
		if (comp) return [comp.state === 'succeeded' ? 'succeeded' : 'begun', comp, comp.state];
		return ['owed', comp];
	};
	const columns = [
		{ title: 'Step', cell: (st) => link(['effects', st.effect_id], st.effect_id) },
		{ title: 'Type', cell: (st) => st.effect_type },
		{
			title: 'Compensation',
			cell: (st) => {
				const [state, comp, compState] = stateOf(st);
				return [
					h('span', { class: 'state ' + state }, state),
					state === 'irreversible' && !st.has_compensation ? ' (none declared)' : null,
					compState && state === 'begun' ? ` (${compState})` : null,
					comp ? [' ', link(['effects', comp.effect_id], comp.effect_id)] : null,
				];
			},
		},
		{
			title: 'Suggested idempotency key',
			cell: (st) => {
				const p = planned.get(st.effect_id);
				if (p) return h('code', null, p.suggested_idempotency_key);
				const [state] = stateOf(st);
				if ((state !== 'owed' && state !== 'begun') || u instanceof Error) return '—';
				// A plan cut to fit one answer (plan_truncated) offers the
				// rest on its next read (console QA: they read as held by an
				// unknown outcome that did not exist).
				return u.plan_truncated ? 'not in this read of the plan (cut to fit one answer): perform those above, then reload this page' : 'not offered yet: an outcome not known yet comes first';
			},
		},
	];
	const unresolved = u instanceof Error ? [] : u.unresolved || [];
	return [
		h('h2', null, 'Unwind plan'),
		h('p', null, 'What the rollback still owes, in the order to perform it (reverse order of success): begin each compensation with its declared effect type and payload, under the suggested idempotency key, naming the step as compensates_effect_id, and report it as usual. A retried compensation under its suggested key is a duplicate, never a second one.'),
		u instanceof Error ? errorBox(asError(u)) : null,
		!(u instanceof Error) && u.state !== g.state ? h('p', { class: 'notice', role: 'status' }, `The rollback has ended: ${u.state}.`) : null,
		!(u instanceof Error) && u.plan_truncated
			? h('p', { class: 'notice', role: 'status' }, `This read of the plan holds its first ${plan.length} compensation${plan.length === 1 ? '' : 's'} only: the rest would pass what one answer holds (about 4 MB). Perform them, then reload this page for the rest.`)
			: null,
		unresolved.length
			? h('p', { class: 'error', role: 'status' }, 'The plan stops at an outcome not known yet (in flight, or to check at the vendor and resolve): ', unresolved.map((id, i) => [i ? ', ' : '', link(['effects', id], id)]), '. What succeeded before it is offered once it is known.')
			: null,
		table(columns, rows, 'No step succeeded: nothing to compensate.'),
	];
}

// allGroupSteps is every step of group g: those its read holds, and, when
// it was cut to fit one answer (steps_truncated), the rest, paged from
// GET …/steps after the last one shown.
async function allGroupSteps(g) {
	const steps = [...(g.steps || [])];
	let cursor = g.steps_truncated && steps.length ? steps[steps.length - 1].effect_id : null;
	while (cursor) {
		const page = await call('GET', `/groups/${seg(g.id)}/steps` + query({ limit: 200, cursor }));
		steps.push(...(page.data || []));
		cursor = page.next_cursor ?? null;
	}
	return steps;
}

// lastOf is a list a step's read holds only the last items of (its job's
// last 50 attempts and last 50 replays: attemptsTruncated,
// replaysTruncated): the table of those shown, and, when earlier ones are
// left out, a note that says so and a button that reads them from path
// (the route that pages them all, oldest first), a page a click, drawn
// above those shown, until it meets the first one shown (console QA: a
// step replayed more than 50 times read as if its first attempt shown were
// its first, and its first replay shown its first). keyOf names an item;
// noun is the items' name, plural.
function lastOf(path, columns, rows, truncated, keyOf, empty, noun, note) {
	const list = table(columns, rows, empty);
	if (!truncated || !rows.length) return list;
	const shown = new Set(rows.map(keyOf));
	const anchor = list.querySelector('tbody').children[0];
	const said = h('p', { class: 'notice', role: 'status' }, note);
	const box = h('div', { class: 'pager' }, said, list);
	let added = 0;
	const offer = (cursor) => list.before(h('p', { class: 'more' }, action(`Load earlier ${noun}`, () => more(cursor), { after: () => {} })));
	const more = async (cursor) => {
		const page = await call('GET', path + query({ limit: pageSize ?? 200, cursor }));
		const read = page.data || [];
		const met = read.findIndex((r) => shown.has(keyOf(r)));
		const fresh = met < 0 ? read : read.slice(0, met);
		const next = met < 0 ? page.nextCursor ?? null : null;
		const trs = fresh.map((r) => row(columns, r));
		if (trs.length) anchor.before(...trs);
		added += trs.length;
		box.querySelector('p.more')?.remove();
		if (next) offer(next);
		else said.textContent = `All ${added + rows.length} ${noun} are shown.`;
		// The focus goes to the next button, or to the first row added, as
		// "Load more" gives it.
		const again = next && box.querySelector('p.more').querySelector('button');
		let target = again || (trs[0] && trs[0].querySelector('a, button, input, select, textarea'));
		if (!target && trs[0]) {
			trs[0].setAttribute('tabindex', '-1');
			target = trs[0];
		}
		if (target) target.focus();
	};
	offer(undefined);
	return box;
}

// replayColumns are a step's replays (durableJob.replays, oldest first):
// who replayed it, why, what it found, and what it changed.
const replayColumns = [
	{ title: 'Replayed', cell: (r) => time(r.createdAt) },
	{ title: 'By key', cell: (r) => [h('code', null, r.keyId), r.keyId === ownKeyId() ? ' (this console’s key)' : null] },
	{ title: 'Reason', cell: (r) => text(r.reason) },
	{ title: 'Found', cell: (r) => `${r.priorStatus} after attempt ${r.priorAttempt}` },
	{ title: 'Added', cell: (r) => `${r.additionalAttempts} (ceiling ${r.maxAttempts})` },
	{ title: 'Handler', cell: (r) => (r.oldHandlerVersion === r.newHandlerVersion ? r.oldHandlerVersion : `${r.oldHandlerVersion} → ${r.newHandlerVersion}`) },
	{ title: 'Contract', cell: (r) => (r.oldContractVersion === r.newContractVersion ? text(r.oldContractVersion) : `${text(r.oldContractVersion)} → ${text(r.newContractVersion)}`) },
];

const stepColumns = [
	{ title: 'Step', cell: (s) => link(['steps', s.id], s.id) },
	{ title: 'Tool', cell: (s) => `${s.name}@${s.version}` },
	{ title: 'Status', cell: (s) => h('span', { class: 'state ' + String(s.status).toLowerCase() }, s.status) },
	{
		title: 'Job',
		cell: (s) => {
			if (!s.durableJob) return '—';
			const j = s.durableJob;
			const held = heldAttempt(j);
			return [
				`${j.status}, ${j.attempt}/${j.maxAttempts}`,
				held ? h('em', null, j.status === 'QUEUED' ? `, waiting for cancelled attempt ${held}` : `, attempt ${held} may still be running`) : null,
			];
		},
	},
	{ title: 'Due', cell: (s) => time(s.durableJob && s.durableJob.dueAt) },
	{ title: 'Finished', cell: (s) => time(s.finishedAt) },
];

// parseRecords reads the vendor's records: a JSON array, or CSV whose first
// line names the columns (idempotency_key, status, amount_micros; fields
// may be double-quoted, "" inside quotes is a quote). An empty amount is
// null (not compared).
export function parseRecords(raw) {
	const src = String(raw || '').trim();
	if (!src) throw new ConsoleError('invalid_request', 'Paste the vendor’s records first.');
	if (src.startsWith('[')) {
		const records = parseJSONField('Records', src);
		if (!Array.isArray(records)) throw new ConsoleError('invalid_json', 'Records must be a JSON array.');
		return records;
	}
	const rows = csvRows(src);
	const header = rows.shift().map((c) => c.trim());
	for (const need of ['idempotency_key', 'status']) {
		if (!header.includes(need)) throw new ConsoleError('invalid_request', `The CSV header names no ${need} column.`);
	}
	return rows
		.filter((r) => r.some((c) => c.trim() !== ''))
		.map((r, i) => {
			const rec = {};
			header.forEach((name, j) => (rec[name] = r[j] === undefined ? '' : r[j]));
			const amount = String(rec.amount_micros ?? '').trim();
			if (amount !== '' && !(/^\d+$/.test(amount) && Number.isSafeInteger(Number(amount)))) {
				throw new ConsoleError('invalid_request', `Line ${i + 2}: amount_micros ${JSON.stringify(amount)} is not a whole number of micros this page can send exactly.`);
			}
			return { idempotency_key: rec.idempotency_key, status: rec.status.trim(), amount_micros: amount === '' ? null : Number(amount) };
		});
}

function csvRows(src) {
	const rows = [[]];
	let field = '';
	let quoted = false;
	for (let i = 0; i < src.length; i++) {
		const c = src[i];
		if (quoted) {
			if (c === '"' && src[i + 1] === '"') {
				field += '"';
				i++;
			} else if (c === '"') quoted = false;
			else field += c;
		} else if (c === '"' && field === '') quoted = true;
		else if (c === ',') {
			rows[rows.length - 1].push(field);
			field = '';
		} else if (c === '\n' || c === '\r') {
			if (c === '\r' && src[i + 1] === '\n') i++;
			rows[rows.length - 1].push(field);
			field = '';
			rows.push([]);
		} else field += c;
	}
	if (quoted) throw new ConsoleError('invalid_request', 'The CSV ends inside a quoted field.');
	rows[rows.length - 1].push(field);
	return rows;
}

// The notes for a stored value the server cannot decrypt (sealed with an
// encryption key it is not configured with, or damaged): what still reads,
// and what waits for the key.
const unreadableResult =
	'Result unreadable: the recorded result is sealed with an encryption key this server is not configured with, or damaged. The redacted preview above still reads; a begin on this idempotency key is refused (500) until the server can decrypt the result.';
const unreadableSecret =
	'This server cannot decrypt the signing secret (sealed with an encryption key it is not configured with, or damaged), so no delivery is sent: under a missing key they wait, pending, for an instance that has it; a damaged secret’s attempts fail. Configure the key again, or rotate the secret and give the receiver the new one.';

// replayForm previews a replay, then sends it naming what the preview saw
// (attempt and handler version), so a replay decided on stale facts is
// refused rather than run.
async function replayForm(stepId) {
	const p = await call('GET', `/steps/${seg(stepId)}/replay`);
	const replay = idempotent('console-replay');
	if (!p.eligible) return h('p', null, `Not eligible for replay (job ${p.status})`, p.ineligibleReason ? `: ${p.ineligibleReason}` : '.');
	const upgrades = p.upgrades || [];
	// A contract that is not FORBIDDEN may be chosen when the saved input
	// validates against it, or when the preview's budget ran out before
	// checking it (checked: false): the replay checks it, refusing it
	// (409) if it does not fit (console QA: it read "does not fit: input:
	// was not checked…" and could not be chosen, and a step whose handler
	// version is wholly FORBIDDEN was offered the same handler, which
	// answers 409). The others are listed with why not. A saved input the
	// server cannot decrypt (inputUnreadable) fits none that can be told:
	// said so, not "does not fit" with no reason.
	const unchecked = (u) => u.checked === false && !p.inputUnreadable;
	const choosable = upgrades.filter((u) => !u.forbidden && (u.compatible || unchecked(u)));
	const unreadable = 'unknown: the saved input is sealed with an encryption key this server is not configured with';
	const notChecked = 'not checked (checked at replay)';
	const upgradeColumns = [
		{ title: 'Contract', cell: (u) => u.contractVersion },
		{ title: 'Handler', cell: (u) => u.handlerVersion },
		{ title: 'Status', cell: (u) => u.status },
		{
			title: 'Saved input',
			cell: (u) =>
				u.forbidden
					? 'forbidden'
					: u.compatible
						? 'fits'
						: p.inputUnreadable
							? unreadable
							: unchecked(u)
								? notChecked
								: ['does not fit: ', (u.validation || []).map((v) => `${v.field}: ${v.message}`).join('; ')],
		},
	];
	// The box acknowledging a change of handler is asked for only when
	// another contract is chosen (console QA: it showed, unneeded, for the
	// same handler), and then required as the replay's own box is.
	const ackVersionBox = h('input', { type: 'checkbox', name: 'ackVersion' });
	const ackVersion = h('label', { class: 'check', hidden: true }, ackVersionBox, ' I reviewed the new handler’s schema and side effects');
	// A handler version whose every contract is FORBIDDEN is not replayed
	// as it is (409): only an upgrade is offered, chosen from the start
	// (jobs QA: the form offered the same handler, which could only fail).
	const same = p.handlerVersionForbidden ? [] : [['', `the same handler (${p.handlerVersion})`]];
	const upgradeOnly = p.handlerVersionForbidden && choosable.length > 0;
	const target = choosable.length
		? select(
				'Run with',
				'target',
				[...same, ...choosable.map((u) => [String(u.contractVersion), `contract ${u.contractVersion}: handler ${u.handlerVersion}${u.compatible ? '' : ` (${notChecked})`}`])],
				upgradeOnly ? String(choosable[0].contractVersion) : '',
			)
		: null;
	if (upgradeOnly) {
		shown(ackVersion, true);
		ackVersionBox.setAttribute('required', '');
	}
	if (target)
		target.querySelector('select').addEventListener('change', (ev) => {
			const other = ev.target.value !== '';
			shown(ackVersion, other);
			// A hidden box left required would stop the form unsent.
			if (other) ackVersionBox.setAttribute('required', '');
			else ackVersionBox.removeAttribute('required');
		});
	return h('div', null, [
		fields([
			['Handler version', p.handlerVersion],
			['Contract version', text(p.contractVersion)],
			['Attempts so far', p.attempt],
			['Endpoint paused', p.endpointPaused ? 'yes (the replay waits until it resumes)' : 'no'],
		]),
		upgrades.length ? [h('h3', null, 'Other contracts of this tool'), table(upgradeColumns, upgrades)] : null,
		// Every replay of such a step is refused (500, changing nothing):
		// said instead of a form that could only fail.
		p.inputUnreadable
			? h('p', { class: 'notice' }, 'No replay for now: the saved input is sealed with an encryption key this server is not configured with, or damaged, so a replay is refused until the server can decrypt it (configure the key again).')
			: form(
					[
						// The API's maxAttempts here counts executions beyond those made
						// (console QA: read as the job's whole ceiling).
						input('Additional executions (1–10, beyond the attempts so far)', 'maxAttempts', { type: 'number', min: 1, max: 10, value: 1 }),
						input('Reason', 'reason', { maxlength: maxLengths['POST /steps/{id}/replay reason'] }),
						target,
						target ? ackVersion : null,
						// Required: the browser asks for it before the replay is
						// sent (README: what cannot be undone asks first), not the
						// service's refusal naming its API field after; the
						// service still refuses a replay without it.
						h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'ack', required: true }), ' I understand the tool may act again (a duplicate at the destination unless it dedupes on the idempotency key)'),
					],
					'Replay',
					(v) =>
						replay('POST', `/steps/${seg(stepId)}/replay`, {
							maxAttempts: Number(v.maxAttempts) || 1,
							reason: v.reason || undefined,
							acknowledgeDuplicateRisk: v.ack,
							expectedAttempt: p.attempt,
							expectedHandlerVersion: p.handlerVersion,
							...(v.target ? { targetContractVersion: Number(v.target), acknowledgeVersionChange: v.ackVersion } : {}),
						}),
					{
						danger: true,
						// Said, not only seen in the redrawn job (console QA, in
						// a browser: the page redrew with no word of the replay).
						after: (r) => {
							const more = r.maxAttempts - r.attempt;
							redrawSaying(`Replayed: the job is ${r.status}, with ${more} more execution${more === 1 ? '' : 's'} allowed, on handler version ${r.handlerVersion}.`);
						},
					},
				),
	]);
}

// ---- signing in -----------------------------------------------------------

function signInPage(message) {
	return [
		h('h1', null, 'Ratchet console'),
		message ? h('p', { class: 'notice', role: 'status' }, message) : null,
		h('section', null, [
			h('h2', null, 'Sign in with a key'),
			h('p', null, 'The key stays in this tab only and is forgotten when you sign out or close it.'),
			form(
				// Masked, but no password to save: browsers' password managers
				// ignore autocomplete="off" on a password field and offer to
				// keep what was typed, against "the key stays in this tab
				// only". "one-time-code" (a standard autofill token) marks it
				// a secret for this once, which they neither save nor fill; an
				// attribute, so the CSP (no inline style or script) is kept,
				// and the field stays type=password, masked in every browser
				// (-webkit-text-security on a text field is not standard).
				[input('API key', 'key', { type: 'password', required: true, autocomplete: 'one-time-code', spellcheck: 'false' })],
				'Sign in',
				async (v) => {
					keyFits(v.key);
					env.storage.setItem(KEY_ITEM, v.key.trim());
					try {
						// Any call tells whether the key is known: 401 if not, 403
						// (a narrower key) still signs in.
						await call('GET', '/approvals?limit=1');
					} catch (err) {
						if (err.status !== 403) {
							env.storage.removeItem(KEY_ITEM);
							throw err;
						}
					}
				},
				{ validate: (v) => keyFits(v.key), after: () => (parseRoute(env.location.hash).page && /^#\/./.test(env.location.hash) ? rerender() : navigate('approvals')) },
			),
		]),
		h('section', null, [
			h('h2', null, 'Or create a workspace'),
			form(
				[
					input('Workspace name', 'name', { required: true, maxlength: maxLengths['POST /workspaces name'] }),
					// A server with SIGNUP_MODE=token takes a workspace only with
					// its token (console QA: the form sent none, so on such a
					// server, Lambda's default, it was always refused 401).
					// Masked and never kept, as the key is.
					input('Signup token (if this server asks for one)', 'token', { type: 'password', autocomplete: 'one-time-code', spellcheck: 'false' }),
				],
				'Create workspace',
				(v) => {
					const token = signupToken(v.token);
					return call('POST', '/workspaces', { name: v.name }, token ? { 'Ratchet-Signup-Token': token } : undefined);
				},
				{
					once: true,
					validate: (v) => signupToken(v.token),
					after: (ws, status) =>
						showSecret(
							status,
							secretOnce(`Operator key for ${ws.name}`, ws.key.secret, 'It holds every scope and is shown once: store it now, then continue.'),
							action('Continue with this key', async () => {
								env.storage.setItem(KEY_ITEM, ws.key.secret);
								navigate('approvals');
							}, { after: () => {} }),
						),
				},
			),
		]),
	];
}

// signupToken is the signup token field's value as the header carries it
// (without the whitespace around it, as the server compares it), or ''
// for none. One holding a character no header carries (a line break, a
// letter outside ASCII) is refused here, never repeated, as keyFits
// refuses such a key.
function signupToken(raw) {
	const token = String(raw || '').trim();
	if (!/^[\x20-\x7e]*$/.test(token)) {
		throw new ConsoleError('invalid_request', 'That is not a signup token: it holds a line break or a character no header can carry. Copy the token again, on one line.');
	}
	return token;
}

// keyFits refuses a key pasted with a character no key has, which a header
// cannot carry (a line break within it, say): the browser's refusal of the
// header may repeat its value, the key, in its message (review: Firefox's
// does). The refusal here never repeats it.
function keyFits(raw) {
	if (!/^[\x21-\x7e]+$/.test(String(raw).trim())) {
		throw new ConsoleError('invalid_request', 'That is not a key: it holds a line break, a space or another character no key has. Copy the key again, on one line.');
	}
}

// The page each id prefix names (API.md §0), for ids pasted from a log,
// an alert or a webhook.
const byPrefix = { eff: 'effects', apr: 'approvals', run: 'runs', stp: 'steps', grp: 'groups', end: 'endpoints', whk: 'webhooks' };

function goTo() {
	const field = h('input', { name: 'id', placeholder: 'Go to an id (eff_…, run_…, stp_…)', 'aria-label': 'Go to an id', size: 28, autocomplete: 'off', spellcheck: 'false' });
	const status = h('span', { class: 'status', role: 'status' });
	const f = h('form', { class: 'inline goto', role: 'search' }, field, status);
	f.addEventListener('input', () => {
		field.removeAttribute('aria-invalid');
		status.replaceChildren();
	});
	f.addEventListener('submit', (ev) => {
		ev.preventDefault();
		const id = field.value.trim();
		const page = byPrefix[id.split('_')[0]];
		if (page) navigate(page + '/' + encodeURIComponent(id));
		else {
			// Console QA: only the border turned red, and the operator could
			// not tell why.
			field.setAttribute('aria-invalid', 'true');
			status.replaceChildren(`Not an id this box opens: ${Object.keys(byPrefix).map((p) => p + '_…').join(', ')}.`);
		}
	});
	return f;
}

// signOut forgets the key and shows the sign-in, at the start or, with
// keepPage, on the page shown (a sign-in there returns to it).
function signOut(message, keepPage = false) {
	env.storage.removeItem(KEY_ITEM);
	signOutMessage = message || null;
	if (keepPage) rerender();
	else navigate('');
}

let signOutMessage = null;

// ---- routing --------------------------------------------------------------

const nav = [
	['approvals', 'Approvals'],
	['effects', 'Effects'],
	['circuits', 'Circuits'],
	['policies', 'Policies'],
	['reconcile', 'Reconcile'],
	['runs', 'Runs'],
	['queue', 'Queue'],
	['tools', 'Tools'],
	['keys', 'Keys'],
	['webhooks', 'Webhooks'],
];

// A route is #/<page>[/<id>][?a=b]: the list pages take their filters from
// the query, the detail pages their id from the second segment.
const detail = { effects: 'effect', approvals: 'approval', policies: 'policy', runs: 'run', steps: 'step', endpoints: 'endpoint', webhooks: 'webhook', groups: 'group', tools: 'tool' };

export function parseRoute(hash) {
	const raw = String(hash || '').replace(/^#\/?/, '');
	const [path, q] = raw.split('?');
	const parts = path.split('/').filter(Boolean).map((p) => {
		try {
			return decodeURIComponent(p);
		} catch {
			return p;
		}
	});
	const params = {};
	for (const pair of (q || '').split('&').filter(Boolean)) {
		const [k, v = ''] = pair.split('=');
		try {
			params[decodeURIComponent(k)] = decodeURIComponent(v.replace(/\+/g, ' '));
		} catch {
			// a malformed pair is ignored
		}
	}
	const [first = 'approvals', id, extra] = parts;
	let page = null;
	if (extra === undefined) page = id === undefined ? (nav.some(([p]) => p === first) ? first : null) : detail[first] || null;
	return { section: first, page, id, params };
}

function navigate(path, params) {
	const next = '#/' + path + (params ? query(params) : '');
	if (env.location.hash === next) rerender();
	else env.location.hash = next;
}

let generation = 0;
// pageSize is the lists' page size: the API's default, or ?limit= in the
// fragment.
let pageSize;
let drawing = Promise.resolve();

function rerender() {
	return render();
}

/** render draws the page the location names; a newer render wins. */
export function render() {
	drawing = draw(++generation);
	return drawing;
}

/** rendered resolves once no render is in progress (tests wait on it). */
export async function rendered() {
	let seen;
	do {
		seen = drawing;
		await seen;
	} while (seen !== drawing);
}

// The pages an operator watches redraw themselves every LIVE_MS, in place,
// until the operator edits or acts on the page shown: from then on it waits
// for a full redraw (an action's success, the page's link), so that a
// refresh never replaces what they are doing or an answer they have not
// read (console QA: a refresh landing while a rejection was sent wiped its
// 409 and the approved row with it, so the rejection looked done; and it
// dropped the rows "Load more" had added).
const live = new Set(['approvals', 'circuits', 'queue']);
const LIVE_MS = 15000;
let liveHeld = false; // the page shown was edited or acted on
let liveNote = null; // its "Shown at" line, when it is a live page
let flash = null; // a line for the next full redraw to show ("Saved (version 3).")
let shownFlash = null; // the line the page shown was drawn with: a live page's refresh keeps it

// focusWithin says whether a control inside el has the keyboard focus: a
// refresh then waits for the next period rather than redraw it away
// (console QA: every refresh dropped the focus to the body, so a keyboard
// user was sent back to the start of the page every 15 s).
function focusWithin(el) {
	const active = env.document.activeElement;
	// The page's heading (or main itself), given the focus by its draw, is
	// no control being used.
	if (active && (active === el || active.tagName === 'H1')) return false;
	for (let n = active; n; n = n.parentNode) {
		if (n === el) return true;
	}
	return false;
}

// scheduleRefresh redraws the live page drawn by render mine in LIVE_MS,
// quietly, unless it was left, acted on, or has a focused control (then it
// waits another period).
function scheduleRefresh(mine, main) {
	env.setTimeout(() => {
		if (mine !== generation || liveHeld || !key()) return;
		if (focusWithin(main)) scheduleRefresh(mine, main);
		else drawing = draw(++generation, true);
	}, LIVE_MS);
}

function holdLive() {
	if (liveHeld) return;
	liveHeld = true;
	if (liveNote) liveNote.textContent = liveNote.textContent.replace(/; refreshed every .*$/, '; not refreshed while you edit or act here (the page’s link above reloads it).');
}

async function draw(mine, quiet) {
	const root = env.root;
	if (!key()) {
		const message = signOutMessage;
		signOutMessage = null;
		env.document.title = 'Sign in — Ratchet console';
		root.replaceChildren(h('main', null, signInPage(message)));
		// The key's field has the focus, as a sign-in form's does.
		const field = root.querySelector('input[name="key"]');
		if (field) field.focus();
		return;
	}
	const route = parseRoute(env.location.hash);
	pageSize = route.params.limit;
	const header = h(
		'header',
		null,
		h('strong', { class: 'brand' }, 'Ratchet'),
		h('nav', null, nav.map(([p, title]) => h('a', {
			href: '#/' + p,
			class: route.section === p ? 'current' : null,
			// The current page's link reloads it (no hashchange fires for it).
			onclick: (ev) => {
				if (env.location.hash === '#/' + p) {
					ev.preventDefault();
					rerender();
				}
			},
		}, title))),
		// The id box and Sign out wrap together, under the links when the
		// row is short (console QA, in a browser: each wrapped on its own).
		h('div', { class: 'session' }, goTo(), h('button', { type: 'button', class: 'signout', onclick: () => signOut('Signed out.') }, 'Sign out')),
	);
	// A quiet redraw (a live page's refresh) keeps the page on screen until
	// its new content is there.
	let main = quiet ? root.querySelector('main') : null;
	// A live page's refresh keeps the line its full draw said (console QA, in
	// a browser: "Approved: …" went 15 s later, with nothing else to say it).
	let notice = quiet ? shownFlash : null;
	if (!main) {
		liveHeld = false;
		liveNote = null;
		notice = shownFlash = flash;
		flash = null;
		const section = nav.find(([p]) => p === route.section);
		env.document.title = section ? section[1] + ' — Ratchet console' : 'Ratchet console';
		main = h('main', { 'aria-busy': 'true' }, h('p', null, 'Loading…'));
		main.addEventListener('input', holdLive);
		root.replaceChildren(header, main);
	}
	let content;
	try {
		if (!route.page) throw new ConsoleError('not_found', 'No such page in the console.');
		content = await pages[route.page](route.params, route.id);
	} catch (err) {
		content = errorBox(asError(err));
	}
	if (mine !== generation || !key()) return; // another render (or a 401's sign-out) took over
	if (quiet && liveHeld) return; // acted on while this refresh was fetched
	if (quiet && focusWithin(main)) {
		// focused while this refresh was fetched: kept as it is
		scheduleRefresh(mine, main);
		return;
	}
	const headingFocused = Boolean(env.document.activeElement && env.document.activeElement.tagName === 'H1');
	const nodes = [content].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
	// A saved edit says so under the page's heading.
	if (notice) nodes.splice(nodes[0] && nodes[0].tagName === 'H1' ? 1 : 0, 0, h('p', { class: 'notice', role: 'status' }, notice));
	main.removeAttribute('aria-busy');
	main.replaceChildren(...nodes);
	// The tab's title names the page (its heading: the effect, run or
	// policy shown, or the title the heading names, data-title, for a
	// page whose heading holds what the browser's history must not), as
	// text.
	const heading = main.querySelector('h1');
	if (heading) env.document.title = (heading.getAttribute('data-title') || heading.textContent) + ' — Ratchet console';
	// A page drawn anew (a link followed, a filter, an action's success, the
	// back button) gives its heading the keyboard focus, so the next Tab
	// goes into the page and a screen reader reads where it is (console QA:
	// the focus fell to the top of the document, so a keyboard user tabbed
	// through the whole header after every action); a refresh keeps it
	// where it was.
	const target = heading || main;
	if (!quiet || headingFocused) {
		target.setAttribute('tabindex', '-1');
		target.focus({ preventScroll: true });
	}
	if (live.has(route.page) && env.setTimeout) {
		liveNote = h('p', { class: 'empty live' }, `Shown at ${time(new Date().toISOString())}; refreshed every ${LIVE_MS / 1000} s until you edit or act here (and not while a control here has the focus).`);
		main.append(liveNote);
		scheduleRefresh(mine, main);
	}
}

// forgetSecrets clears the secrets shown once, and a key typed in the
// sign-in, as the page is hidden (left, or its tab closed): a browser may
// keep the page in its back/forward cache, whatever its Cache-Control, and
// show it again as it was, secret and all (review). The list beside one
// still names the key or subscription made.
function forgetSecrets() {
	for (const box of env.root.querySelectorAll('div.secret')) {
		box.replaceChildren(h('p', null, 'The secret shown here was cleared when you left the page: it is shown once. If you did not store it, make another (and revoke or delete the one it belonged to).'));
	}
	for (const field of env.root.querySelectorAll('input[type="password"]')) field.value = '';
}

/** start runs the console in e: {document, root, storage, fetch, location, confirm, onHashChange, onPageHide, setTimeout}. */
export function start(e) {
	env = e;
	e.onHashChange(() => render());
	if (e.onPageHide) e.onPageHide(forgetSecrets);
	return render();
}

if (typeof window !== 'undefined' && typeof document !== 'undefined' && document.getElementById('app')) {
	start({
		document,
		root: document.getElementById('app'),
		storage: window.sessionStorage,
		fetch: (url, init) => window.fetch(url, { ...init, credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer' }),
		location: window.location,
		confirm: (m) => window.confirm(m),
		onHashChange: (fn) => window.addEventListener('hashchange', fn),
		onPageHide: (fn) => window.addEventListener('pagehide', fn),
		setTimeout: (fn, ms) => window.setTimeout(fn, ms),
	});
}
