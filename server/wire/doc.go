// Package wire holds Wicket's /v0 wire protocol: header names, the HMAC
// request signature, and the request and response bodies of every route.
// It imports only the standard library, so agent SDKs and the webhook
// sender can use it without pulling in the kernel or the HTTP router.
//
// # Basics
//
// Agents authenticate with two headers: [HeaderAgentID] names the agent and
// a signature made with its secret, under the agent's scheme:
//
//   - [SigningV1] (the default): [HeaderWicketSignature] carries
//     "t=<unix seconds>,v1=<hex>", the HMAC-SHA256 of
//     [SignedRequest.Message] (the timestamp, method, request target, lease
//     headers and raw body), made by [SignV1] or [SignRequest] and checked
//     by [VerifyV1] in constant time and within a tolerance of the clock.
//   - [SigningBody] (the Rebuno scheme): [HeaderSignature] carries
//     "sha256=<hex HMAC-SHA256(secret, raw body)>", made by [Sign] and
//     checked by [Verify].
//
// The kernel signs its webhooks ([WebhookPayload]) the same way. Mutations
// of an execution also carry the agent's lease in [HeaderDispatchID] and
// [HeaderDispatchAttempt]; a step submission may carry the step id the
// agent computed in [HeaderStepID].
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
