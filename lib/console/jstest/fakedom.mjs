// A stand-in for the few DOM features the console uses, so its pages can be
// driven from Node against the real service without a browser. It has no
// HTML parser on purpose: the console must never need one.

class Text {
	constructor(data) {
		this.nodeType = 3;
		this.data = String(data);
		this.parentNode = null;
	}
	get textContent() {
		return this.data;
	}
	remove() {
		if (this.parentNode) this.parentNode.removeChild(this);
	}
}

export class Element {
	constructor(tag) {
		this.nodeType = 1;
		this.tagName = tag.toUpperCase();
		this.attributes = new Map();
		this.childNodes = [];
		this.parentNode = null;
		this.listeners = new Map();
		this._disabled = false;
		this.checked = false;
		this._value = undefined;
	}

	// A control disabled while it has the keyboard focus loses it, as in a
	// browser (the focus goes to the body, and is not given back when it is
	// enabled again).
	get disabled() {
		return this._disabled;
	}
	set disabled(v) {
		this._disabled = Boolean(v);
		if (this._disabled && document.activeElement === this) document.activeElement = null;
	}

	setAttribute(name, value) {
		this.attributes.set(name, String(value));
	}
	getAttribute(name) {
		return this.attributes.has(name) ? this.attributes.get(name) : null;
	}
	hasAttribute(name) {
		return this.attributes.has(name);
	}
	removeAttribute(name) {
		this.attributes.delete(name);
	}
	get className() {
		return this.getAttribute('class') || '';
	}
	set className(v) {
		this.setAttribute('class', v);
	}
	get name() {
		return this.getAttribute('name') || '';
	}
	get type() {
		return (this.getAttribute('type') || (this.tagName === 'BUTTON' ? 'submit' : 'text')).toLowerCase();
	}
	get value() {
		if (this._value !== undefined) return this._value;
		if (this.tagName === 'SELECT') {
			const options = this.querySelectorAll('option');
			const chosen = options.find((o) => o.hasAttribute('selected')) || options[0];
			return chosen ? chosen.value : '';
		}
		if (this.tagName === 'OPTION') return this.getAttribute('value') ?? this.textContent;
		return this.getAttribute('value') ?? (this.tagName === 'INPUT' && this.type === 'checkbox' ? 'on' : '');
	}
	set value(v) {
		this._value = String(v);
	}

	// append takes nodes and strings, as the DOM's does; anything else (an
	// array, say) the DOM would turn into text like "[object ...]", so it
	// is refused here.
	append(...nodes) {
		for (const n of nodes) {
			if (typeof n === 'object' && !(n instanceof Element || n instanceof Text)) throw new TypeError('fakedom: append takes nodes and strings, not ' + Object.prototype.toString.call(n));
			this.appendChild(typeof n === 'object' ? n : new Text(n));
		}
	}
	appendChild(n) {
		if (n.parentNode) n.parentNode.removeChild(n);
		n.parentNode = this;
		this.childNodes.push(n);
		return n;
	}
	// before inserts nodes (and strings) just before this one, in its
	// parent, as the DOM's ChildNode.before does.
	before(...nodes) {
		const parent = this.parentNode;
		if (!parent) return;
		const made = nodes.map((n) => {
			if (typeof n === 'object' && !(n instanceof Element || n instanceof Text)) throw new TypeError('fakedom: before takes nodes and strings, not ' + Object.prototype.toString.call(n));
			return typeof n === 'object' ? n : new Text(n);
		});
		for (const n of made) if (n.parentNode) n.parentNode.removeChild(n);
		const i = parent.childNodes.indexOf(this);
		for (const n of made) n.parentNode = parent;
		parent.childNodes.splice(i, 0, ...made);
	}
	removeChild(n) {
		this.childNodes = this.childNodes.filter((c) => c !== n);
		n.parentNode = null;
	}
	replaceChildren(...nodes) {
		for (const c of this.childNodes) c.parentNode = null;
		this.childNodes = [];
		this.append(...nodes);
	}
	remove() {
		if (this.parentNode) this.parentNode.removeChild(this);
	}
	get lastChild() {
		return this.childNodes[this.childNodes.length - 1] || null;
	}
	get children() {
		return this.childNodes.filter((c) => c.nodeType === 1);
	}
	get textContent() {
		return this.childNodes.map((c) => c.textContent).join('');
	}
	set textContent(v) {
		this.replaceChildren(String(v));
	}

	// focus and blur move the keyboard focus (document.activeElement).
	focus() {
		document.activeElement = this;
	}
	blur() {
		if (document.activeElement === this) document.activeElement = null;
	}

	addEventListener(type, fn) {
		if (!this.listeners.has(type)) this.listeners.set(type, []);
		this.listeners.get(type).push(fn);
	}
	// dispatch calls the listeners and resolves when the async ones are done.
	async dispatch(type) {
		let prevented = false;
		const ev = { type, target: this, preventDefault: () => (prevented = true) };
		await Promise.all((this.listeners.get(type) || []).map((fn) => fn(ev)));
		return !prevented;
	}

	// Selectors: a comma list of tag, .class and [attr] / [attr=value] parts.
	querySelectorAll(selector) {
		const tests = selector.split(',').map((s) => compile(s.trim()));
		const out = [];
		const walk = (el) => {
			for (const c of el.children) {
				if (tests.some((t) => t(c))) out.push(c);
				walk(c);
			}
		};
		walk(this);
		return out;
	}
	querySelector(selector) {
		return this.querySelectorAll(selector)[0] || null;
	}
}

function compile(sel) {
	const m = /^([a-zA-Z0-9]*)((?:\.[\w-]+)*)(?:\[([\w-]+)(?:="([^"]*)")?\])?$/.exec(sel);
	if (!m) throw new Error('fakedom: unsupported selector ' + sel);
	const [, tag, classes, attr, value] = m;
	const wanted = classes.split('.').filter(Boolean);
	return (el) =>
		(!tag || el.tagName === tag.toUpperCase()) &&
		wanted.every((c) => el.className.split(/\s+/).includes(c)) &&
		(!attr || (el.hasAttribute(attr) && (value === undefined || el.getAttribute(attr) === value)));
}

export const document = {
	createElement: (tag) => new Element(tag),
	activeElement: null,
	title: '',
};

// MemoryStorage is sessionStorage's shape.
export class MemoryStorage {
	constructor() {
		this.items = new Map();
	}
	getItem(k) {
		return this.items.has(k) ? this.items.get(k) : null;
	}
	setItem(k, v) {
		this.items.set(k, String(v));
	}
	removeItem(k) {
		this.items.delete(k);
	}
}
