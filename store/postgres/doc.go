// Package postgres implements kernel.Store on PostgreSQL, with
// github.com/jackc/pgx/v5. Several stores, in several processes (replicas
// of the kernel), may share one database.
//
// # Basics
//
// [Open] connects, creates or migrates the schema (forward only, under an
// advisory lock, so replicas starting together migrate once) and starts the
// writer. The returned [*Store] implements kernel.Store; kernel/storetest
// is its conformance suite, [Store.Check] verifies its invariants.
//
// # Layout
//
// One table per kind of record, every key starting with the tenant (schema.go
// has the DDL). A record is stored as the JSON of its kernel type in a
// bytea column, doc, beside the columns that queries and indexes need:
//
//	executions   (tenant, id)             doc, agent_id, status, idem_key,
//	                                      dispatch_state, due_at, lease_until, last_seq
//	                                      unique (id); unique (tenant, idem_key);
//	                                      due index: queued, by due_at;
//	                                      lease index: delivering or acked, by lease_until
//	steps        (tenant, execution_id, id)   doc, seq
//	occurrences  (tenant, execution_id, key)  dispatch_id, attempt, count
//	events       (tenant, execution_id, seq)  type, at, payload
//	agents       (tenant, id)             doc
//	approvals    (tenant, id)             doc, status, expires_at, created_at;
//	                                      expiry index: pending, by expires_at
//	bundles      (tenant, name)           doc, archive
//	counters     (tenant, key)            value
//	tenants      (id)                     doc
//	api_keys     (tenant, id)             doc, hash (unique)
//	wicket_schema (version)               the migrations applied
//
// Text keys use the "C" collation (byte order, as bbolt's keys); free-form
// keys (idempotency, counter and occurrence keys) are bytea and keep any
// bytes; identifiers must be UTF-8 without NUL (ErrValidation otherwise).
// Times are Unix nanoseconds in bigint columns.
//
// # Transactions
//
// [Store.View] runs in a REPEATABLE READ READ ONLY transaction on a pooled
// connection: one snapshot, as many Views at once as the pool allows.
//
// [Store.Update] hands its function to the store's writer goroutine, which
// runs the functions waiting at that moment (up to Options.MaxBatch) one
// after the other in one REPEATABLE READ transaction: group commit, one
// COMMIT (one WAL flush) for the batch. Writes are buffered in memory and
// sent with the COMMIT in one round trip; reads see them (see writeTx). A
// function that fails or panics gets its error and its writes are dropped;
// the others commit.
//
// REPEATABLE READ is the isolation the kernel's rules need. Every kernel
// transaction writes the records its decision depends on (the execution
// above all, the approval, the rate-limit counter), and PostgreSQL refuses
// the second of two concurrent transactions that update the same row
// (serialization failure), or insert the same key (unique violation): no
// update is lost, no step, event or idempotency key is recorded twice, and
// a rate limit counts exactly across replicas. A failed batch runs again
// (after a short random pause) up to Options.MaxRetries times — the retry
// contract of kernel.Store, whose functions may run more than once.
// SERIALIZABLE (Options.Serializable) adds predicate locks whose page-level
// false conflicts between replicas cost throughput for nothing the kernel
// needs.
//
// A broken connection before COMMIT runs the batch again on another; a
// connection that breaks while the COMMIT is on its way leaves the outcome
// unknown, and Update says so (ErrUnavailable) instead of guessing.
package postgres
