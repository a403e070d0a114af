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
// A commit costs two fsyncs without a log (below), one with it. [Store.Update] hands its function to a
// single writer goroutine, which runs every function waiting at that moment
// (up to Options.MaxBatch) in one bbolt transaction and commits once. A
// function that fails or panics rolls the batch back; it gets its error and
// the others are run again, without it, in a new transaction. A lone Update
// does not wait for company: it is committed as soon as the writer is free.
// [Store.View] uses bbolt read transactions directly and runs concurrently
// with the writer.
//
// # Write-ahead log
//
// With Options.WAL (what `wicket serve` uses) a commit is made durable by
// the log, not by bbolt: the writer records every Put and Delete of the
// batch (wbucket, the only way the package writes), appends them as one
// record to the active segment of the log (WALDir(path)), fdatasyncs it,
// and only then makes the writes visible; the bbolt transaction is
// committed without fsync (bbolt's NoSync), and not after every batch
// (see the writer's open transaction below). Readers therefore never see
// a write that is not on disk. A
// bbolt commit costs two fsyncs and one pwrite per page it dirtied,
// scattered over the file; the log costs one write and one fdatasync of a
// sequential file. Segments are written in place over zeros written when
// they were made (in the background, ahead of need), so an append changes
// neither the file's size nor its blocks and its fdatasync needs no
// journal commit of the file system.
//
// # The writer's open transaction
//
// A batch is durable once its record is synced, so the file need not be
// committed with every batch. With the log (and without fsync, Options.
// NoSync), the writer keeps one bbolt write transaction open across
// batches and commits it to the file only every Options.CommitInterval
// (20 ms by default), past 4 MiB of records, when a reader of the file's
// own transactions asks (Backup, Export, Check) and at Close. A bbolt
// commit costs little per update when it carries many: the leaf and
// branch pages that a batch of a few updates would each copy, split and
// write are copied and written once for all of them, and the nodes read
// for a write stay decoded in the transaction for the next batch.
//
// Views read the open transaction, under a read lock that the writer
// takes while a batch's functions run. The writer lets it go while the
// batch's record is synced: a View may then read the batch, and returns
// once the sync is done (or, should it fail, returns the store's failure
// instead of what it read). So a reader never hands out a batch before it
// is durable, and always sees a batch whose Update returned. Every bucket is opened in the transaction
// when it begins, so that concurrent readers only read bbolt's cache of
// opened buckets. A function that fails (or a batch past the largest
// record, or a failed log append) rolls the open transaction back; the
// records of the batches already answered, kept in memory until the
// commit, are applied again to a fresh one. A checkpoint is only taken
// right after the open transaction was committed, when the file holds
// every record in the log. A negative CommitInterval commits every batch
// to the file, as the store did before.
//
// The file itself is made durable at checkpoints (Options.
// CheckpointInterval, and whenever a segment fills): the writer opens a
// read transaction on its last commit and reads that commit's meta page;
// the checkpointer goroutine syncs the file, writes the checkpoint (the
// last lsn in the file, the transaction id, its meta page, the checksum of
// its root page) atomically, releases the previous checkpoint's read
// transaction and deletes the segments it covers. Between checkpoints,
// after each commit of the open transaction, the checkpointer asks Linux
// to start writing the file's dirty pages back without waiting for them
// (sync_file_range), so that the checkpoint's sync does not hand the disk
// 100 ms of commits at once, in front of the log's next sync.
//
// The read transaction is what makes recovery sound. Between checkpoints
// the file is written without fsync, so after a power cut any page
// written since the last checkpoint may hold its old bytes, its new ones
// or garbage, and so may both meta pages. But bbolt never overwrites a
// page that an open read transaction can reach: every page of the
// checkpoint's tree (and its free list) is exactly as the checkpoint's
// fsync left it. Open, when a log is left beside the file and nobody
// holds the file's lock, checks that the file still holds the
// checkpoint's root page (a backup restored over it does not), writes the
// checkpoint's meta page over both of the file's, opens the file — now
// exactly the checkpoint's state — and applies every record after it, in
// lsn order (a record cut short or failing its CRC ends the log only in
// the last segment, with no sound record after it; anywhere else it is
// damage, and Open refuses). It
// syncs the result and removes the log, the checkpoint first (a crash
// part way then leaves records the file holds, and no checkpoint to take
// it back to). Close syncs the file and removes the log: a store closed
// cleanly is one file, as without a log. An Open that found the lock held
// and got it once the kernel holding it died (a restart racing the old
// process's death) starts again, and so applies the log that kernel left;
// so does one that restored the checkpoint and then lost the lock to
// another kernel's recovery (a double start), and one whose file was
// renamed over while it waited (`wicket store compact`).
//
// bbolt cannot remap its memory map while a read transaction is open, so
// with a log it maps 1 TiB of address space up front (address space, not
// memory); past half of it the store syncs, drops its log and goes on
// with bbolt's own fsyncs. A record holds at most 1 GiB of writes (a
// longer one would read back as damage): a batch past it is committed
// one Update at a time, and an Update past it alone fails. A failed log write or a commit that failed
// after its record was written fails the store (every later Update
// returns the error); the next Open recovers from the log.
//
// TestWALReplayMatchesConformance replays the log of every conformance
// test onto its checkpoint and compares the result with the store (a
// write that bypassed wbucket, or a commit that overwrote a checkpoint's
// page, makes it differ); TestWALSurvivesLostWrites gives every page
// written since the checkpoint old bytes, new bytes or garbage, cuts the
// log's last record, and requires everything acknowledged back.
package bbolt
