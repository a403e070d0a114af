#!/usr/bin/env python3
"""A Wicket agent in Python, written from docs/ alone (standard library only).

It does by hand what the Go SDK does: serves the kernel's webhook and checks
its v1 signature, holds the lease and heartbeats, submits each effect as a
step with the id it computes itself (canonical JSON, args_hash, step_id,
occurrences: docs/identity.md) and sends it in Rebuno-Step-Id, runs an effect
only when told `proceed`, records its result or its failure, and settles the
execution. Delivered again (after a crash, or after an approval), it runs
from the top and the kernel replays what is recorded.

    python3 agent.py --kernel http://127.0.0.1:8080 --listen 127.0.0.1:5006 \
        --id py-research --secret "$WICKET_AGENT_SECRET"

Register it first (wicket agent put py-research --webhook-url
http://127.0.0.1:5006/webhook --secret ...). Its input is {"topic": "..."}.

    python3 agent.py --check-vectors kernel/canon/testdata/vectors.json

checks this file's step identity against the kernel's test vectors.
"""

import argparse
import calendar
import hashlib
import hmac
import http.client
import json
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ---------------------------------------------------------------- identity


class CanonError(ValueError):
    """JSON that has no canonical form (docs/identity.md, refused inputs)."""


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


class _Canon:
    """A strict JSON reader that writes the canonical form as it reads."""

    def __init__(self, data):
        self.b, self.i, self.depth = data, 0, 0

    def fail(self, what):
        raise CanonError("%s at byte offset %d" % (what, self.i))

    def ws(self):
        while self.i < len(self.b) and self.b[self.i] in b" \t\n\r":
            self.i += 1

    def value(self):
        self.ws()
        c = self.b[self.i:self.i + 1]
        if c in (b"{", b"["):
            self.depth += 1
            if self.depth > 256:
                self.fail("nesting deeper than 256")
            out = self.obj() if c == b"{" else self.arr()
            self.depth -= 1
            return out
        if c == b'"':
            return quote(self.string())
        for lit in (b"true", b"false", b"null"):
            if self.b.startswith(lit, self.i):
                self.i += len(lit)
                return lit
        m = _NUMBER.match(self.b, self.i)
        if not m:
            self.fail("not JSON")
        if len(m.group()) > 256:
            self.fail("number literal longer than 256 bytes")
        self.i = m.end()
        return m.group()  # copied exactly as received

    def expect(self, closing):
        self.ws()
        c = self.b[self.i:self.i + 1]
        self.i += 1
        if c == closing:
            return False
        if c != b",":
            self.fail("expected ',' or %r" % closing.decode())
        return True

    def obj(self):
        self.i += 1
        members = {}
        self.ws()
        if self.b[self.i:self.i + 1] == b"}":
            self.i += 1
            return b"{}"
        while True:
            self.ws()
            if self.b[self.i:self.i + 1] != b'"':
                self.fail("expected a string key")
            key = self.string()
            if key in members:
                self.fail("duplicate key %r" % key)
            self.ws()
            if self.b[self.i:self.i + 1] != b":":
                self.fail("expected ':'")
            self.i += 1
            members[key] = self.value()
            if not self.expect(b"}"):
                break
        # sorted by the UTF-8 bytes of the keys, not by UTF-16 code units
        keys = sorted(members, key=lambda k: k.encode("utf-8"))
        return b"{" + b",".join(quote(k) + b":" + members[k] for k in keys) + b"}"

    def arr(self):
        self.i += 1
        self.ws()
        if self.b[self.i:self.i + 1] == b"]":
            self.i += 1
            return b"[]"
        items = [self.value()]
        while self.expect(b"]"):
            items.append(self.value())
        return b"[" + b",".join(items) + b"]"

    def hex4(self):
        h = self.b[self.i + 1:self.i + 5]
        if len(h) != 4 or not all(c in b"0123456789abcdefABCDEF" for c in h):
            self.fail("bad \\u escape")
        self.i += 5
        return int(h, 16)

    def string(self):
        """Reads a string and returns it unescaped."""
        self.i += 1
        out = []
        while True:
            if self.i >= len(self.b):
                self.fail("unterminated string")
            c = self.b[self.i]
            if c == 0x22:
                self.i += 1
                return "".join(out)
            if c < 0x20:
                self.fail("control character in a string")
            if c != 0x5C:
                j = self.i
                while j < len(self.b) and self.b[j] not in b'"\\' and self.b[j] >= 0x20:
                    j += 1
                try:
                    out.append(self.b[self.i:j].decode("utf-8"))  # refuses surrogates and overlong forms
                except UnicodeDecodeError:
                    self.fail("invalid UTF-8")
                self.i = j
                continue
            self.i += 1
            e = chr(self.b[self.i]) if self.i < len(self.b) else ""
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                self.i += 1
                continue
            if e != "u":
                self.fail("bad escape")
            cp = self.hex4()
            if 0xD800 <= cp <= 0xDBFF and self.b[self.i:self.i + 2] == b"\\u":
                self.i += 1
                lo = self.hex4()
                if not 0xDC00 <= lo <= 0xDFFF:
                    self.fail("unpaired surrogate")
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            elif 0xD800 <= cp <= 0xDFFF:
                self.fail("unpaired surrogate")
            out.append(chr(cp))


def quote(s):
    """A string escaped as Go's encoding/json escapes it by default."""
    out = []
    for ch in s:
        c = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\b\f\n\r\t":
            out.append({"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif c < 0x20 or ch in "<>&\u2028\u2029":
            out.append("\\u%04x" % c)
        else:
            out.append(ch)
    return ('"' + "".join(out) + '"').encode("utf-8")


def canonical(raw):
    """The canonical form of raw JSON text (bytes)."""
    p = _Canon(raw)
    out = p.value()
    p.ws()
    if p.i != len(raw):
        p.fail("data after the JSON value")
    return out


def args_hash(raw):
    return hashlib.sha256(canonical(raw)).hexdigest()


def step_id(execution_id, kind, target, a_hash, occurrence):
    fields = [execution_id, kind, target, a_hash, str(occurrence)]
    pre = b"".join(b"%d:%s" % (len(f.encode()), f.encode()) for f in fields)
    return hashlib.sha256(pre).hexdigest()


def check_vectors(path):
    v = json.load(open(path, encoding="utf-8"))
    bad = 0
    for c in v["canonical"]:
        raw = c["input"].encode()
        if canonical(raw).decode() != c["canonical"] or args_hash(raw) != c["args_hash"]:
            bad += 1
            print("canonical %s: got %s" % (c["name"], canonical(raw).decode()))
    for s in v["step_ids"]:
        if step_id(s["execution_id"], s["kind"], s["target"], s["args_hash"], s["occurrence"]) != s["step_id"]:
            bad += 1
            print("step id %r differs" % s)
    for r in v["rejected"]:
        raw = bytes.fromhex(r["input_hex"]) if "input_hex" in r else r["input"].encode()
        try:
            canonical(raw)
            bad += 1
            print("refused %s: accepted" % r["name"])
        except CanonError:
            pass
    print("%d canonical, %d step ids, %d refused: %s" % (len(v["canonical"]), len(v["step_ids"]), len(v["rejected"]),
                                                         "all agree" if not bad else "%d differ" % bad))
    return bad == 0


# ---------------------------------------------------------------- signing


def sign_v1(secret, t, method, target, dispatch_id, attempt, body):
    msg = ("v1\n%d\n%s\n%s\n%s\n%s\n" % (t, method, target, dispatch_id, attempt)).encode() + body
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify_v1(secret, header, target, dispatch_id, attempt, body):
    """A webhook's Wicket-Signature, checked as the kernel checks the agent's."""
    fields = [kv.partition("=") for kv in (header or "").split(",")]
    t = next((v for k, _, v in fields if k.strip() == "t"), "")
    sigs = [v for k, _, v in fields if k.strip() == "v1"]
    if not t.isdigit() or not sigs or len(sigs) > 4 or abs(time.time() - int(t)) > 300:
        return False
    want = sign_v1(secret, int(t), "POST", target, dispatch_id, attempt, body)
    return sum(hmac.compare_digest(want, s) for s in sigs) > 0


class APIError(Exception):
    def __init__(self, status, body):
        super().__init__("%d %s" % (status, body))
        self.status, self.code = status, (body or {}).get("code")


class Kernel:
    """The agent routes, signed v1."""

    def __init__(self, url, agent_id, secret):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.agent_id, self.secret = u.hostname, u.port, agent_id, secret

    def call(self, method, target, payload=None, lease=None, headers=None):
        body = b"" if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        did, att = lease or ("", "")
        t = int(time.time())
        h = {"Rebuno-Agent-Id": self.agent_id, "Content-Type": "application/json",
             "Wicket-Signature": "t=%d,v1=%s" % (t, sign_v1(self.secret, t, method, target, did, att, body))}
        if lease:
            h["Rebuno-Dispatch-Id"], h["Rebuno-Dispatch-Attempt"] = did, str(att)
        h.update(headers or {})
        for wait in (0.1, 0.2, 0.5, 1, 2, 4, 8, 15, None):  # a kernel restarting: its acked leases hold
            c = http.client.HTTPConnection(self.host, self.port, timeout=30)
            try:
                c.request(method, target, body=body or None, headers=h)
                r = c.getresponse()
                data = r.read()
                break
            except ConnectionRefusedError:  # never reached the kernel: safe to send again
                if wait is None:
                    raise
                time.sleep(wait)
            finally:
                c.close()
        doc = json.loads(data) if data else None
        if r.status >= 400:
            raise APIError(r.status, doc)
        return doc


# ---------------------------------------------------------------- the execution


class Unwind(Exception):
    """The dispatch ends without settling the execution: blocked, superseded or over."""


class StepError(Exception):
    """A step whose effect failed (now or in the recorded run)."""

    def __init__(self, error, replayed):
        super().__init__(json.dumps(error))
        self.error, self.replayed = error, replayed


class Refused(Exception):
    """Policy did not let the step run (denied or rate limited)."""

    def __init__(self, decision, reason, rule_id):
        super().__init__("%s: %s (%s)" % (decision, reason, rule_id))
        self.decision, self.reason, self.rule_id = decision, reason, rule_id


def parse_time(s):
    """Seconds since the epoch of the kernel's RFC 3339 UTC times."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", s or "")
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + float(m.group(2) or 0) if m else None


class Execution:
    """One dispatch attempt: its lease, its heartbeats, its occurrence counters."""

    def __init__(self, kernel, execution_id, lease, log):
        self.k, self.id, self.lease, self.log = kernel, execution_id, lease, log
        self.occurrences = {}
        self.done = threading.Event()
        threading.Thread(target=self.heartbeat, daemon=True).start()

    def heartbeat(self):
        interval = 1.0
        while not self.done.wait(interval):
            try:
                until = parse_time(self.k.call("POST", "/v0/executions/%s/heartbeat" % self.id, {}, self.lease)["lease_until"])
            except APIError as e:
                self.log("heartbeat: %s" % e)
                if e.code == "lease_superseded":
                    return
                continue
            except OSError as e:
                self.log("heartbeat: %r" % e)
                continue
            if until:  # a third of what is left, as the SDKs do with 30 s of 90
                interval = min(30.0, max(0.2, (until - time.time()) / 3))

    def step(self, kind, target, args, run=None, value=None, **options):
        """Submits a step; runs run() only on proceed. Returns the result."""
        raw = json.dumps(args).encode()
        a_hash = args_hash(raw)
        n = self.occurrences.get((kind, target, a_hash), 0)
        sid = step_id(self.id, kind, target, a_hash, n)
        body = dict(options, kind=kind, target=target)
        if value is not None:
            body["result"] = value  # a local step's value, recorded with its decision
        body = json.dumps(body)[:-1].encode() + b', "args": ' + raw + b"}"
        d = self.k.call("POST", "/v0/executions/%s/steps" % self.id, body, self.lease, {"Rebuno-Step-Id": sid})
        decision = d["decision"]
        if decision in ("execution_blocked", "execution_terminal"):
            raise Unwind(decision)
        if d["step_id"] != sid or d["occurrence"] != n:  # the kernel checks it too (step_id_divergence)
            raise RuntimeError("step id %s (occurrence %d), the kernel's %s (%d)" % (sid, n, d["step_id"], d["occurrence"]))
        if decision != "blocked":  # a blocked answer consumes no occurrence
            self.occurrences[(kind, target, a_hash)] = n + 1
        self.log("step %s %s #%d %s: %s" % (kind, target, n, sid[:12], decision))
        if decision == "replay":
            if "error" in d:
                raise StepError(d["error"], True)
            return d.get("result")
        if decision in ("denied", "rate_limited"):
            raise Refused(decision, d.get("reason"), d.get("rule_id"))
        if decision == "blocked":
            raise Unwind("blocked on approval %s" % d["approval_id"])
        if decision != "proceed":
            raise Unwind(decision)
        steps = "/v0/executions/%s/steps/%s" % (self.id, sid)
        self.log("effect %s %s" % (target, sid[:12]))
        try:
            result = run()
        except Exception as e:
            error = {"message": str(e), "code": type(e).__name__}
            self.k.call("POST", steps + "/fail", {"error": error}, self.lease)
            raise StepError(error, False) from None
        self.k.call("POST", steps + "/complete", {"result": result}, self.lease)
        return result


# ---------------------------------------------------------------- the agent's work

SLOW = set()  # tools that take a minute (--slow), to watch an agent killed mid-effect


def tool(name, fn):
    def run():
        if name in SLOW:
            time.sleep(60)
        return fn()
    return run


def unreachable():
    raise ConnectionError("example.invalid does not resolve")


def research(x, topic):
    """Searches, summarises, tries a cleanup policy forbids, publishes."""
    out = {"at": x.step("local", "now", {}, value=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))}
    hits = x.step("tool_call", "search", {"q": topic}, tool("search", lambda: ["%s: paper %d" % (topic, i) for i in (1, 2)]),
                  effect="read_only")
    try:
        x.step("tool_call", "fetch", {"url": "https://example.invalid/" + topic}, tool("fetch", unreachable),
               idempotency="safe_to_retry", effect="read_only")
    except StepError as e:
        out["fetch"] = e.error
    out["summary"] = x.step("llm_call", "summarize", {"model": "small", "prompt": "summarise: " + "; ".join(hits)},
                            tool("summarize", lambda: "%d papers on %s" % (len(hits), topic)))
    try:
        x.step("tool_call", "delete_drafts", {"topic": topic}, tool("delete_drafts", lambda: True), effect="destructive")
    except Refused as r:
        out["delete_drafts"] = r.decision + ": " + (r.reason or "")
    try:
        out["published"] = x.step("tool_call", "publish", {"topic": topic, "summary": out["summary"]},
                                  tool("publish", lambda: {"url": "https://blog.example/" + topic}), effect="remote_mutation")
    except StepError as e:  # e.g. indeterminate: it was in flight when an earlier attempt died
        out["published"] = {"error": e.error}
    return out


def serve(args):
    secret = args.secret.encode()
    kernel = Kernel(args.kernel, args.id, secret)
    running = set()

    def log(msg):
        print(msg, flush=True)

    def work(execution_id, lease):
        x = Execution(kernel, execution_id, lease, lambda m: log("%s/%d %s" % (execution_id[-6:], lease[1], m)))
        try:
            ex = kernel.call("GET", "/v0/executions/" + execution_id)
            out = research(x, (ex.get("input") or {}).get("topic", "wicket"))
            kernel.call("POST", "/v0/executions/%s/complete" % execution_id, {"output": out}, lease)
            x.log("completed")
        except Unwind as u:
            x.log("unwound: %s" % u)
        except APIError as e:
            x.log("kernel: %s" % e)  # e.g. lease_superseded: a newer attempt runs
        except Exception as e:
            x.log("failed: %r" % e)
            try:
                kernel.call("POST", "/v0/executions/%s/fail" % execution_id, {"error": {"message": repr(e)}}, lease)
            except APIError as e2:
                x.log("kernel: %s" % e2)
        finally:
            x.done.set()

    class Webhook(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, status):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            did, att = self.headers.get("Rebuno-Dispatch-Id", ""), self.headers.get("Rebuno-Dispatch-Attempt", "")
            if not verify_v1(secret, self.headers.get("Wicket-Signature"), self.path, did, att, body):
                return self.answer(401)
            p = json.loads(body)
            if p.get("dispatch_id") != did or str(p.get("dispatch_attempt")) != att:
                return self.answer(400)  # a payload naming another lease than its headers
            self.answer(202)
            key = (p["execution_id"], did, att)
            if key not in running:  # a duplicate of a delivery already running is acknowledged only
                running.add(key)
                threading.Thread(target=work, args=(p["execution_id"], (did, int(att))), daemon=True).start()

    host, _, port = args.listen.rpartition(":")
    srv = ThreadingHTTPServer((host, int(port)), Webhook)
    log("listening on %s" % args.listen)
    srv.serve_forever()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernel", default="http://127.0.0.1:8080")
    ap.add_argument("--listen", default="127.0.0.1:5006")
    ap.add_argument("--id", default="py-research")
    ap.add_argument("--secret")
    ap.add_argument("--slow", default="", help="comma-separated tools that take a minute")
    ap.add_argument("--check-vectors", metavar="FILE", help="check step identity against the kernel's vectors and exit")
    args = ap.parse_args()
    if args.check_vectors:
        sys.exit(0 if check_vectors(args.check_vectors) else 1)
    if not args.secret:
        ap.error("--secret is required")
    SLOW.update(t for t in args.slow.split(",") if t)
    serve(args)


if __name__ == "__main__":
    main()
