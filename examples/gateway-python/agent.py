#!/usr/bin/env python3
"""An agent in Python whose model calls go through Wicket's LLM gateway.

Standard library only. It serves the kernel's webhook, verifies its v1
signature, and for each dispatch asks the gateway (OpenAI's wire format,
as the stock `openai` client speaks it: POST {base_url}/chat/completions
with the webhook's llm_gateway_token as the API key) for a plain and a
streamed chat completion, then completes the execution with both answers.
Every model call is an llm_call step: recorded once, replayed byte for byte
when the execution is delivered again, refused with the rebuno_refusal
marker when policy says no.

    python3 agent.py --kernel http://127.0.0.1:8080 --listen 127.0.0.1:5005 \
        --id py-llm --secret "$WICKET_AGENT_SECRET" --model gpt-4o-mini

Register it first (wicket agent put py-llm --webhook-url
http://127.0.0.1:5005/webhook --secret ...). Its input is {"prompt": "..."}.
With the stock client the same calls read:

    client = OpenAI(base_url=kernel + "/llm/openai/v1", api_key=token,
                    default_headers={"Rebuno-Dispatch-Id": dispatch_id,
                                     "Rebuno-Dispatch-Attempt": str(attempt)})
"""

import argparse
import hashlib
import hmac
import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

MARKER = "rebuno_refusal"


class Refused(Exception):
    """A call the kernel refused: the marker's decision and reason."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        rest = message.split(MARKER + ": ", 1)[-1]
        self.decision, _, self.reason = rest.partition(" reason=")


def raise_for_refusal(status, body):
    """What the Rebuno SDKs' raise_for_refusal does: find the marker."""
    try:
        err = json.loads(body).get("error", {})
    except ValueError:
        return
    msg = err.get("message", "") if isinstance(err, dict) else ""
    if isinstance(err, dict) and err.get("type") == MARKER and msg.startswith(MARKER + ": "):
        raise Refused(status, msg)


class Kernel:
    """Signed calls to the kernel's agent routes (the v1 scheme)."""

    def __init__(self, url, agent_id, secret):
        self.url, self.agent_id, self.secret = url.rstrip("/"), agent_id, secret.encode()

    def sign(self, method, target, dispatch_id, attempt, body):
        t = str(int(time.time()))
        msg = "\n".join(["v1", t, method, target, dispatch_id, attempt]).encode() + b"\n" + body
        mac = hmac.new(self.secret, msg, hashlib.sha256).hexdigest()
        return "t=%s,v1=%s" % (t, mac)

    def call(self, method, target, lease=None, payload=None):
        body = b"" if payload is None else json.dumps(payload).encode()
        did, att = lease if lease else ("", "")
        req = urllib.request.Request(self.url + target, data=body if payload is not None else None, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Rebuno-Agent-Id", self.agent_id)
        if lease:
            req.add_header("Rebuno-Dispatch-Id", did)
            req.add_header("Rebuno-Dispatch-Attempt", att)
        req.add_header("Wicket-Signature", self.sign(method, target, did, att, body))
        with urllib.request.urlopen(req, timeout=30) as resp:
            data = resp.read()
            return json.loads(data) if data else None

    def verify(self, headers, target, body):
        sig = headers.get("Wicket-Signature", "")
        fields = dict(kv.split("=", 1) for kv in sig.split(",") if "=" in kv)
        t = fields.get("t", "0")
        if not t.isdigit() or abs(time.time() - int(t)) > 300:
            return False
        msg = "\n".join(["v1", t, "POST", target, headers.get("Rebuno-Dispatch-Id", ""),
                         headers.get("Rebuno-Dispatch-Attempt", "")]).encode() + b"\n" + body
        want = hmac.new(self.secret, msg, hashlib.sha256).hexdigest()
        got = [v for k, v in (kv.split("=", 1) for kv in sig.split(",") if "=" in kv) if k == "v1"]
        return any(hmac.compare_digest(want, g) for g in got)


class Chat:
    """The part of the OpenAI client this agent uses, over urllib: a base
    URL, an API key and default headers, as OpenAI(base_url=..., api_key=...,
    default_headers=...) takes them."""

    def __init__(self, base_url, api_key, default_headers):
        self.base_url, self.api_key, self.headers = base_url.rstrip("/"), api_key, default_headers

    def create(self, stream=False, **params):
        params["stream"] = stream
        req = urllib.request.Request(self.base_url + "/chat/completions", data=json.dumps(params).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", "Bearer " + self.api_key)
        for k, v in self.headers.items():
            req.add_header(k, v)
        try:
            resp = urllib.request.urlopen(req, timeout=120)
        except urllib.error.HTTPError as e:
            body = e.read()
            raise_for_refusal(e.code, body)
            raise RuntimeError("chat completion: %d %s" % (e.code, body[:500]))
        with resp:
            replayed = resp.headers.get("Wicket-Replay") == "true"
            if not stream:
                return json.loads(resp.read())["choices"][0]["message"]["content"], replayed
            text = []
            for raw in resp:  # server-sent events, one "data:" line each
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                for choice in chunk.get("choices", []):  # the usage chunk has none
                    text.append(choice.get("delta", {}).get("content") or "")
            return "".join(text), replayed


def handle(kernel, args, payload):
    exec_id, did, att = payload["execution_id"], payload["dispatch_id"], str(payload["dispatch_attempt"])
    lease = (did, att)
    x = kernel.call("GET", "/v0/executions/" + exec_id)
    prompt = (x.get("input") or {}).get("prompt", "hello")
    chat = Chat(args.kernel.rstrip("/") + "/llm/openai/v1", payload["llm_gateway_token"],
                {"Rebuno-Execution-Id": exec_id, "Rebuno-Dispatch-Id": did, "Rebuno-Dispatch-Attempt": att})
    try:
        reply, r1 = chat.create(model=args.model, messages=[{"role": "user", "content": prompt}])
        streamed, r2 = chat.create(stream=True, model=args.model, messages=[{"role": "user", "content": prompt}])
    except Refused as r:
        print("refused: %s %s" % (r.decision, r.reason), flush=True)
        if r.decision in ("blocked", "execution_blocked", "execution_terminal"):
            return  # parked or over: the kernel delivers the execution again when it may go on
        kernel.call("POST", "/v0/executions/%s/fail" % exec_id, lease,
                    {"error": {"message": str(r), "decision": r.decision}})
        return
    print("attempt %s: replayed=%s,%s" % (att, r1, r2), flush=True)
    kernel.call("POST", "/v0/executions/%s/complete" % exec_id, lease,
                {"output": {"reply": reply, "streamed": streamed, "replayed": r1 and r2}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default=os.environ.get("WICKET_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--listen", default="127.0.0.1:5005")
    ap.add_argument("--id", default="py-llm")
    ap.add_argument("--secret", default=os.environ.get("WICKET_AGENT_SECRET", ""))
    ap.add_argument("--model", default="gpt-4o-mini")
    args = ap.parse_args()
    if len(args.secret) < 16:
        sys.exit("--secret (WICKET_AGENT_SECRET) must be at least 16 bytes")
    kernel = Kernel(args.kernel, args.id, args.secret)

    class Webhook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(min(int(self.headers.get("Content-Length", "0")), 65536))
            if not kernel.verify(self.headers, self.path, body):
                self.send_response(401)
                self.end_headers()
                return
            payload = json.loads(body)
            self.send_response(202)
            self.end_headers()

            def run():
                try:
                    handle(kernel, args, payload)
                except Exception as e:  # the dispatch ends; the kernel delivers it again
                    print("dispatch failed: %r" % e, flush=True)

            threading.Thread(target=run, daemon=True).start()

        def log_message(self, *a):
            pass

    host, port = args.listen.rsplit(":", 1)
    srv = http.server.ThreadingHTTPServer((host, int(port)), Webhook)
    print("listening on http://%s/webhook" % args.listen, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
