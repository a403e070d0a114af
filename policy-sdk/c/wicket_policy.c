/*
 * wicket_policy.c: the Wicket wasm ABI (policy-sdk/ABI.md) for freestanding
 * C. Memory is one bump arena above __heap_base, reset by every wicket_alloc:
 * the input, decoded strings and the output all live there until the next
 * evaluation.
 */
#include "wicket_policy.h"

#define WK_EXPORT(name) __attribute__((export_name(name)))
#define WK_PAGE 65536u

extern unsigned char __heap_base;

static wk_size arena_top; /* next free byte; 0 = not initialised */

static wk_size align8(wk_size n) { return (n + 7u) & ~(wk_size)7u; }

/* wk_alloc_bytes returns n bytes from the arena, growing memory as needed,
 * or 0 when memory cannot grow. */
static void *wk_alloc_bytes(wk_size n) {
	if (arena_top == 0) arena_top = align8((wk_size)&__heap_base);
	wk_size start = arena_top, end = start + align8(n);
	if (end < start) return 0;
	wk_size have = __builtin_wasm_memory_size(0) * WK_PAGE;
	if (end > have) {
		wk_size pages = (end - have + WK_PAGE - 1) / WK_PAGE;
		if (__builtin_wasm_memory_grow(0, pages) == (wk_size)-1) return 0;
	}
	arena_top = end;
	return (void *)start;
}

struct wk_input {
	const char *json;
	wk_size len;
};

/* ---- ABI exports ---- */

WK_EXPORT("wicket_abi_version") int wicket_abi_version(void) { return 1; }

WK_EXPORT("wicket_alloc") void *wicket_alloc(int size) {
	if (size <= 0) return 0;
	arena_top = align8((wk_size)&__heap_base); /* a new evaluation: reset */
	return wk_alloc_bytes((wk_size)size);
}

/* ---- output ---- */

typedef struct {
	char *buf;
	wk_size len, cap;
	int failed;
} wk_buf;

static void out_byte(wk_buf *b, char c) {
	if (b->len == b->cap) {
		wk_size ncap = b->cap ? b->cap * 2 : 256;
		char *n = wk_alloc_bytes(ncap);
		if (!n) { b->failed = 1; return; }
		for (wk_size i = 0; i < b->len; i++) n[i] = b->buf[i];
		b->buf = n;
		b->cap = ncap;
	}
	b->buf[b->len++] = c;
}

static void out_lit(wk_buf *b, const char *s) {
	while (*s) out_byte(b, *s++);
}

/* out_json_stringn writes the n bytes at s as a JSON string. */
static void out_json_stringn(wk_buf *b, const char *s, wk_size n) {
	static const char hex[] = "0123456789abcdef";
	const char *end = s + n;
	out_byte(b, '"');
	for (; s < end; s++) {
		unsigned char c = (unsigned char)*s;
		switch (c) {
		case '"': out_lit(b, "\\\""); break;
		case '\\': out_lit(b, "\\\\"); break;
		case '\n': out_lit(b, "\\n"); break;
		case '\r': out_lit(b, "\\r"); break;
		case '\t': out_lit(b, "\\t"); break;
		default:
			if (c < 0x20) {
				out_lit(b, "\\u00");
				out_byte(b, hex[c >> 4]);
				out_byte(b, hex[c & 15]);
			} else {
				out_byte(b, (char)c);
			}
		}
	}
	out_byte(b, '"');
}

static void out_json_string(wk_buf *b, const char *s) {
	wk_size n = 0;
	while (s[n]) n++;
	out_json_stringn(b, s, n);
}

static void out_field(wk_buf *b, const char *key, const char *val, int *first) {
	if (!val) return;
	if (!*first) out_byte(b, ',');
	*first = 0;
	out_json_string(b, key);
	out_byte(b, ':');
	out_json_string(b, val);
}

static void out_key(wk_buf *b, const char *key, int *first) {
	if (!*first) out_byte(b, ',');
	*first = 0;
	out_json_string(b, key);
	out_byte(b, ':');
}

static void out_uint(wk_buf *b, unsigned long v) {
	char digits[24];
	int n = 0;
	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n) out_byte(b, digits[--n]);
}

/* out_approval writes {"approvers":[...],"timeout":...,"message":...}; the
 * approvers string is split on commas. */
static void out_approval(wk_buf *b, const wk_approval *a) {
	int first = 1;
	out_byte(b, '{');
	if (a->approvers && *a->approvers) {
		out_key(b, "approvers", &first);
		out_byte(b, '[');
		const char *s = a->approvers;
		int firstName = 1;
		while (*s) {
			const char *e = s;
			while (*e && *e != ',') e++;
			const char *ns = s, *ne = e; /* trim spaces around the name */
			while (ns < ne && *ns == ' ') ns++;
			while (ne > ns && ne[-1] == ' ') ne--;
			if (ne > ns) {
				if (!firstName) out_byte(b, ',');
				firstName = 0;
				out_json_stringn(b, ns, (wk_size)(ne - ns));
			}
			s = *e ? e + 1 : e;
		}
		out_byte(b, ']');
	}
	out_field(b, "timeout", a->timeout, &first);
	out_field(b, "message", a->message, &first);
	out_byte(b, '}');
}

static void out_rate_limit(wk_buf *b, const wk_rate_limit *r) {
	int first = 1;
	out_byte(b, '{');
	out_key(b, "max_calls", &first);
	out_uint(b, r->max_calls);
	out_field(b, "window", r->window, &first);
	out_field(b, "per", r->per, &first);
	out_field(b, "algorithm", r->algorithm, &first);
	out_field(b, "on_limiter_error", r->on_limiter_error, &first);
	out_byte(b, '}');
}

WK_EXPORT("wicket_evaluate") unsigned long long wicket_evaluate(const char *ptr, int len) {
	wk_input in = {ptr, (wk_size)(len < 0 ? 0 : len)};
	wk_decision d = wicket_policy(&in);
	wk_buf b = {0, 0, 0, 0};
	int first = 1;
	if (d.error) {
		out_byte(&b, '{');
		out_field(&b, "error", d.error, &first);
		out_byte(&b, '}');
	} else if (d.decision) {
		out_byte(&b, '{');
		out_field(&b, "decision", d.decision, &first);
		out_field(&b, "reason", d.reason, &first);
		out_field(&b, "rule_id", d.rule_id, &first);
		if (d.approval) {
			out_key(&b, "approval", &first);
			out_approval(&b, d.approval);
		}
		if (d.rate_limit) {
			out_key(&b, "rate_limit", &first);
			out_rate_limit(&b, d.rate_limit);
		}
		out_byte(&b, '}');
	} else {
		return 0; /* no match */
	}
	if (b.failed) __builtin_trap(); /* out of memory */
	return ((unsigned long long)(wk_size)b.buf << 32) | (unsigned long long)b.len;
}

/* ---- a small JSON reader: enough to walk objects and skip any value ---- */

typedef struct {
	const char *p, *end;
} wk_cur;

static void skip_ws(wk_cur *c) {
	while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/*
 * Scanning is word-at-a-time where it matters: under a host that can
 * interrupt guest code (wazero with a deadline) every loop iteration costs
 * a check, so fewer iterations mean faster evaluations.
 */
typedef unsigned long long wk_u64;

static wk_u64 load64(const char *p) {
	wk_u64 w;
	__builtin_memcpy(&w, p, 8); /* unaligned loads are fine in wasm */
	return w;
}

#define WK_ONES 0x0101010101010101ull
#define WK_HIGHS 0x8080808080808080ull

/* has_byte is non-zero when some byte of w equals c. */
static wk_u64 has_byte(wk_u64 w, unsigned char c) {
	wk_u64 x = w ^ (WK_ONES * c);
	return (x - WK_ONES) & ~x & WK_HIGHS;
}

/* skip_string moves past a string starting at '"'; returns 0 on error. */
static int skip_string(wk_cur *c) {
	if (c->p >= c->end || *c->p != '"') return 0;
	c->p++;
	for (;;) {
		while (c->end - c->p >= 8) {
			wk_u64 w = load64(c->p);
			if (has_byte(w, '"') | has_byte(w, '\\')) break;
			c->p += 8;
		}
		if (c->p >= c->end) return 0;
		if (*c->p == '\\') { c->p += 2; continue; }
		if (*c->p == '"') { c->p++; return 1; }
		c->p++;
	}
}

/* skip_value moves past any JSON value; returns 0 on error. */
static int skip_value(wk_cur *c) {
	skip_ws(c);
	if (c->p >= c->end) return 0;
	char ch = *c->p;
	if (ch == '"') return skip_string(c);
	if (ch == '{' || ch == '[') {
		int depth = 0;
		while (c->p < c->end) {
			/* Jump over runs of bytes that are not structural. */
			while (c->end - c->p >= 8) {
				wk_u64 w = load64(c->p);
				if (has_byte(w, '"') | has_byte(w, '{') | has_byte(w, '}') | has_byte(w, '[') | has_byte(w, ']')) break;
				c->p += 8;
			}
			if (c->p >= c->end) return 0;
			ch = *c->p;
			if (ch == '"') { if (!skip_string(c)) return 0; continue; }
			if (ch == '{' || ch == '[') depth++;
			else if (ch == '}' || ch == ']') { if (--depth == 0) { c->p++; return 1; } }
			c->p++;
		}
		return 0;
	}
	/* number, true, false, null */
	while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ']' &&
	       *c->p != ' ' && *c->p != '\n' && *c->p != '\r' && *c->p != '\t') c->p++;
	return 1;
}

/* key_eq compares a raw (escaped) JSON key [k, k+n) to a path segment. Keys
 * with escapes never match; input keys are plain ASCII. */
static int key_eq(const char *k, wk_size n, const char *seg, wk_size segn) {
	if (n != segn) return 0;
	for (wk_size i = 0; i < n; i++) if (k[i] != seg[i]) return 0;
	return 1;
}

/* find_key positions c at the value of key seg in the object at c. */
static int find_key(wk_cur *c, const char *seg, wk_size segn) {
	skip_ws(c);
	if (c->p >= c->end || *c->p != '{') return 0;
	c->p++;
	for (;;) {
		skip_ws(c);
		if (c->p >= c->end) return 0;
		if (*c->p == '}') return 0;
		const char *k = c->p + 1;
		if (!skip_string(c)) return 0;
		wk_size kn = (wk_size)(c->p - 1 - k);
		skip_ws(c);
		if (c->p >= c->end || *c->p != ':') return 0;
		c->p++;
		skip_ws(c);
		if (key_eq(k, kn, seg, segn)) return 1;
		if (!skip_value(c)) return 0;
		skip_ws(c);
		if (c->p < c->end && *c->p == ',') c->p++;
	}
}

/* lookup positions c at the value at a dotted path. */
static int lookup(const wk_input *in, const char *path, wk_cur *c) {
	c->p = in->json;
	c->end = in->json + in->len;
	while (*path) {
		const char *seg = path;
		while (*path && *path != '.') path++;
		if (!find_key(c, seg, (wk_size)(path - seg))) return 0;
		if (*path == '.') path++;
	}
	return 1;
}

static int hexval(char h) {
	if (h >= '0' && h <= '9') return h - '0';
	if (h >= 'a' && h <= 'f') return h - 'a' + 10;
	if (h >= 'A' && h <= 'F') return h - 'A' + 10;
	return -1;
}

static int read_hex4(const char *p, const char *end, unsigned *out) {
	if (end - p < 4) return 0;
	unsigned v = 0;
	for (int i = 0; i < 4; i++) {
		int h = hexval(p[i]);
		if (h < 0) return 0;
		v = v << 4 | (unsigned)h;
	}
	*out = v;
	return 1;
}

static char *put_utf8(char *o, unsigned cp) {
	if (cp < 0x80) { *o++ = (char)cp; }
	else if (cp < 0x800) { *o++ = (char)(0xc0 | cp >> 6); *o++ = (char)(0x80 | (cp & 0x3f)); }
	else if (cp < 0x10000) { *o++ = (char)(0xe0 | cp >> 12); *o++ = (char)(0x80 | (cp >> 6 & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f)); }
	else { *o++ = (char)(0xf0 | cp >> 18); *o++ = (char)(0x80 | (cp >> 12 & 0x3f)); *o++ = (char)(0x80 | (cp >> 6 & 0x3f)); *o++ = (char)(0x80 | (cp & 0x3f)); }
	return o;
}

/* decode_string decodes the JSON string at c. */
static wk_str decode_string(wk_cur *c) {
	wk_str none = {0, 0, 0};
	const char *start = c->p;
	if (!skip_string(c)) return none;
	const char *s = start + 1, *e = c->p - 1;
	int escaped = 0;
	for (const char *q = s; q < e; q++) if (*q == '\\') { escaped = 1; break; }
	if (!escaped) { wk_str r = {s, (wk_size)(e - s), 1}; return r; }
	char *buf = wk_alloc_bytes((wk_size)(e - s)); /* decoded is never longer */
	if (!buf) return none;
	char *o = buf;
	for (const char *q = s; q < e; q++) {
		if (*q != '\\') { *o++ = *q; continue; }
		if (++q >= e) return none;
		switch (*q) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			unsigned cp, lo;
			if (!read_hex4(q + 1, e, &cp)) return none;
			q += 4;
			if (cp >= 0xd800 && cp < 0xdc00 && e - q > 6 && q[1] == '\\' && q[2] == 'u' &&
			    read_hex4(q + 3, e, &lo) && lo >= 0xdc00 && lo < 0xe000) {
				cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				q += 6;
			} else if (cp >= 0xd800 && cp < 0xe000) {
				cp = 0xfffd; /* lone surrogate */
			}
			o = put_utf8(o, cp);
			break;
		}
		default: return none;
		}
	}
	wk_str r = {buf, (wk_size)(o - buf), 1};
	return r;
}

wk_str wk_get_string(const wk_input *in, const char *path) {
	wk_str none = {0, 0, 0};
	wk_cur c;
	if (!lookup(in, path, &c)) return none;
	return decode_string(&c);
}

double wk_get_number(const wk_input *in, const char *path, double def) {
	wk_cur c;
	if (!lookup(in, path, &c) || c.p >= c.end) return def;
	const char *p = c.p;
	int neg = 0;
	if (*p == '-') { neg = 1; p++; }
	if (p >= c.end || *p < '0' || *p > '9') return def;
	double v = 0, scale = 1;
	while (p < c.end && *p >= '0' && *p <= '9') v = v * 10 + (*p++ - '0');
	if (p < c.end && *p == '.') {
		p++;
		while (p < c.end && *p >= '0' && *p <= '9') { v = v * 10 + (*p++ - '0'); scale *= 10; }
	}
	return (neg ? -v : v) / scale;
}

wk_str wk_tenant(const wk_input *in) { return wk_get_string(in, "tenant"); }
wk_str wk_agent_id(const wk_input *in) { return wk_get_string(in, "agent_id"); }
wk_str wk_step_kind(const wk_input *in) { return wk_get_string(in, "step.kind"); }
wk_str wk_step_target(const wk_input *in) { return wk_get_string(in, "step.target"); }
wk_str wk_step_effect(const wk_input *in) { return wk_get_string(in, "step.effect"); }

wk_str wk_arg_string(const wk_input *in, const char *key) {
	wk_str none = {0, 0, 0};
	wk_cur c;
	if (!lookup(in, "step.args", &c)) return none;
	wk_size n = 0;
	while (key[n]) n++;
	if (!find_key(&c, key, n)) return none;
	return decode_string(&c);
}

/* ---- string helpers ---- */

static wk_size lit_len(const char *s) { wk_size n = 0; while (s[n]) n++; return n; }

static int mem_eq(const char *a, const char *b, wk_size n) {
	for (wk_size i = 0; i < n; i++) if (a[i] != b[i]) return 0;
	return 1;
}

int wk_eq(wk_str s, const char *lit) {
	wk_size n = lit_len(lit);
	return s.ok && s.len == n && mem_eq(s.ptr, lit, n);
}

int wk_has_prefix(wk_str s, const char *lit) {
	wk_size n = lit_len(lit);
	return s.ok && s.len >= n && mem_eq(s.ptr, lit, n);
}

int wk_has_suffix(wk_str s, const char *lit) {
	wk_size n = lit_len(lit);
	return s.ok && s.len >= n && mem_eq(s.ptr + s.len - n, lit, n);
}

int wk_contains(wk_str s, const char *lit) {
	wk_size n = lit_len(lit);
	if (!s.ok || s.len < n) return 0;
	for (wk_size i = 0; i + n <= s.len; i++) if (mem_eq(s.ptr + i, lit, n)) return 1;
	return 0;
}
