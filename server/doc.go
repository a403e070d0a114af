// Package server is Wicket's inbound HTTP API (/v0, docs/protocol.md) on top of a
// *kernel.Kernel: routing, authentication and authorisation, body limits,
// strict JSON decoding, the error envelope, Server-Sent Events, and the
// open health, readiness and metrics endpoints. It is the only package that
// imports gorilla/mux; the wire shapes live in server/wire.
//
// # Basics
//
//	srv := server.New(k, server.Config{AdminKey: key})
//	httpSrv := &http.Server{Addr: addr, Handler: srv.Handler()}
//	...
//	srv.SetReady(false) // while shutting down: /v0/ready answers 503
//
// The server decides nothing about the domain: the kernel validates every
// rule and returns a *kernel.Error whose code the server maps to an HTTP
// status in one table (statusOf). Internal errors are logged and answered
// with "internal error", never with their text.
//
// # Authentication
//
// Every request runs through one function, authenticate, that yields a
// Principal, and one check, authorize, against its route's class:
//
//   - Bearer keys. The configured admin key (compared as sha256 digests in
//     constant time) is role admin of tenant default; any other key is looked
//     up with kernel.AuthenticateKey and carries its tenant and role. Only
//     admin principals may name another tenant with ?tenant=.
//   - Agents. Rebuno-Agent-Id plus a signature under the agent's scheme:
//     Wicket-Signature (v1: timestamp, method, target, lease and body,
//     within Config.SignatureTolerance) or, for agents registered with
//     signing: body, Rebuno-Signature (the raw body); the other scheme is
//     refused. The execution in the path fixes the
//     tenant; an agent that is not the execution's own gets 404 (existence is
//     never revealed, and nothing succeeds). Agent mutations also carry the
//     lease in Rebuno-Dispatch-Id and Rebuno-Dispatch-Attempt.
//   - Config.AuthDisabled. With no keys configured (the kernel then binds to
//     loopback only), a request without a bearer key acts as admin. Agent
//     signatures are still required on agent routes.
//
// Route classes: client routes (executions) admit client, tenant-admin and
// admin; admin routes (agents, policies, bundles, policy eval, approvals)
// admit tenant-admin and admin; tenant routes admit admin only; agent routes
// admit the execution's agent only; reads of an execution, its steps and its
// events admit a bearer principal of the execution's tenant or the
// execution's own agent.
//
// # Request bodies
//
// A body is read whole (at most Config.MaxBodyBytes, or MaxBundleBytes for
// PUT /v0/bundles; more is 413 too_large) before the signature is checked.
// JSON bodies must be one JSON object in valid UTF-8 with no duplicate keys
// at any depth and nothing after it; an empty body counts as {}. Unknown
// fields are ignored so that newer clients work against older kernels.
//
// # Caveats
//
// Step deltas (POST .../steps/{step_id}/stream) are fanned out in memory to
// the SSE subscribers of this process only; they are never stored, and a
// subscriber too slow to keep up loses deltas rather than slowing the agent.
package server
