// Package bbolt implements kernel.Store on one bbolt file.
//
// # Basics
//
// [Open] opens (or creates, mode 0600) the file, takes its lock, applies the
// forward-only schema migrations and starts the group-commit writer. The
// returned [*Store] implements kernel.Store; kernel/storetest is its
// conformance suite.
//
// # Layout
//
// Every record key starts with its tenant; parts of a key are joined with a
// NUL byte, which is why no identifier may contain one. The records of the
// step hot path (executions, steps, occurrence counters, events) are in a
// compact binary form since schema 2; the others are JSON (see codec.go,
// the only place that knows the encodings). The buckets are:
//
//	meta          schema_version → 8-byte big-endian version
//	executions    tenant␀execID → Execution (its input: null)
//	              ␀tenant␀execID → the execution's input (when not null)
//	exec_tenant   execID → tenant (global: agent routes name only the id)
//	idem          tenant␀idempotencyKey → execID
//	steps         tenant␀execID␀name → slot: the seq of step name and/or
//	              the occurrence counter stored under key name (slot.go)
//	events        tenant␀execID␀seq(8-byte BE) → Event
//	              tenant␀execID␀seq(8)stepID → Step (seq: its first event's)
//	agents        tenant␀agentID → Agent
//	approvals     tenant␀approvalID → Approval
//	bundles       tenant␀name → BundleRecord
//	counters      tenant␀key → opaque bytes
//	tenants       tenantID → Tenant
//	apikeys       tenant␀keyID → APIKey
//	apikey_hash   hash → tenant␀keyID
//	due           time(8) tenant␀execID → ∅   (Dispatch.State queued, by DueAt)
//	leases        time(8) tenant␀execID → ∅   (delivering or acked, by LeaseUntil)
//	approval_exp  time(8) tenant␀approvalID → ∅ (pending approvals, by ExpiresAt)
//
// An execution's log, the events bucket, holds its events and, since
// schema 6, the records of its steps, each right after the step's first
// event: a step's records and events are appended at the same place, so a
// commit writes one leaf (and its parent) per execution for both. The
// kernel keys a call's occurrence counter by the id of the call's first
// step, and the steps bucket keeps the counter and that step's index entry
// in one slot: a new step costs one write there. An execution's input,
// which never changes, is stored apart from its record (before every
// record: no tenant id is empty), written once, not with the record at
// every commit. A step's event keys are
// exactly 8 bytes longer than its execution's prefix, its record's key
// longer still. BenchmarkCommitPages measures the pages a commit writes,
// by bucket.
//
// time(8) is the Unix time in nanoseconds as a big-endian integer with its
// sign bit flipped, so that byte order is time order (the zero time sorts
// first). The index buckets are maintained by PutExecution and PutApproval,
// which read the index fields of the previous version of the record in the
// same transaction (not the whole record) and replace the index entries
// that changed; [Store.Check] verifies that they match.
//
// # Schema
//
// schema.go lists the forward-only migrations: 1 creates the buckets, 2
// rewrites the hot records of a schema 1 file (all JSON) in binary
// (codec_v1.go keeps the schema 1 decoder for it), 3 marks the agents
// stored before signing schemes existed "signing": "body"
// (migrate_signing.go), 4 gives every bundle an owner (the admin for the
// bundles a tenant names as guards, else the tenant), 5 changes nothing
// stored (binary format 2 for executions and steps), 6 moves the step
// records into the events bucket, the occ bucket's counters into the
// steps bucket's slots and the executions' inputs apart from their records,
// 7 changes nothing stored: events, step records and occurrence counters
// are written in binary format 3 from then on (codec.go, pack.go), about
// half the bytes of format 1 and 2, which still read.
//
// # Space
//
// [Space] (`wicket store stats`) reports where a file's bytes go: pages
// by use, each bucket's leaf bytes in use against those allocated, and the
// records by type with their key and value sizes.
//
// # Group commit
//
// A bbolt commit costs two fsyncs. [Store.Update] hands its function to a
// single writer goroutine, which runs every function waiting at that moment
// (up to Options.MaxBatch) in one bbolt transaction and commits once. A
// function that fails or panics rolls the batch back; it gets its error and
// the others are run again, without it, in a new transaction. A lone Update
// does not wait for company: it is committed as soon as the writer is free.
// [Store.View] uses bbolt read transactions directly and runs concurrently
// with the writer.
package bbolt
