// Package wire holds Wicket's /v0 wire protocol: header names, the HMAC
// request signature, and the request and response bodies of every route.
// It imports only the standard library, so agent SDKs and the webhook
// sender can use it without pulling in the kernel or the HTTP router.
//
// # Basics
//
// Agents authenticate with two headers: [HeaderAgentID] names the agent and
// [HeaderSignature] carries "sha256=<hex HMAC-SHA256(secret, raw body)>",
// computed by [Sign] and checked in constant time by [Verify]. The kernel
// signs its webhooks ([WebhookPayload]) the same way. Mutations of an
// execution also carry the agent's lease in [HeaderDispatchID] and
// [HeaderDispatchAttempt].
//
// Every error answer is an [ErrorBody]: {"code","message","details"?}, with
// one of the Code* values.
//
// # Compatibility
//
// The server ignores request fields it does not know, so a newer client can
// talk to an older kernel; clients should likewise ignore unknown response
// fields.
package wire
