package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wicket-run/wicket/kernel"
)

// request is one Update waiting for the writer.
type request struct {
	ctx  context.Context
	fn   func(kernel.Tx) error
	done chan error // buffered (1): the writer never blocks answering
	ferr error      // fn's error in the last attempt (the writer's alone)
}

// PanicError is what Update returns when its function panicked.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the goroutine stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("postgres: update function panicked: %v", e.Value)
}

// run is the writer goroutine: it owns every write transaction and its
// connection. It returns when Close is called, after committing the
// requests already waiting.
func (s *Store) run() {
	defer close(s.stopped)
	defer func() {
		if s.wconn != nil {
			_ = s.wconn.Close(context.Background())
		}
	}()
	batch := make([]*request, 0, s.opts.MaxBatch)
	for {
		select {
		case r := <-s.reqs:
			s.commit(s.collect(append(batch[:0], r)), false)
		case <-s.closing:
			for {
				select {
				case r := <-s.reqs:
					s.commit(s.collect(append(batch[:0], r)), false)
				default:
					return
				}
			}
		}
	}
}

// collect adds to batch every request already waiting, up to MaxBatch. It
// never waits: a lone request is committed at once.
func (s *Store) collect(batch []*request) []*request {
	for len(batch) < s.opts.MaxBatch {
		select {
		case r := <-s.reqs:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// PostgreSQL error classes the writer handles.
const (
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
	codeUniqueViolation      = "23505"
)

// connectionLost reports whether err means the connection failed (its
// transaction, if any, did not commit unless the COMMIT was already sent):
// no answer from the server, or the server ending the session.
func connectionLost(err error) bool {
	switch code := pgCode(err); {
	case code == "":
		return true
	case strings.HasPrefix(code, "08"): // connection exception
		return true
	case code == "57P01" || code == "57P02" || code == "57P03": // admin or crash shutdown, cannot connect now
		return true
	}
	return false
}

// pgCode returns the SQLSTATE of a server error ("" for others).
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// commit runs batch in one transaction and answers every request, running
// it again as long as the transaction fails for a reason that a new
// attempt may not meet:
//
//   - a serialization failure or a deadlock (another transaction, often of
//     another replica, touched the same rows): the same functions run
//     again, after a short random pause, up to MaxRetries times;
//   - a unique violation at COMMIT (a write this transaction believed new
//     was not) and any other error of a batch of several: each function
//     runs alone in strict mode, so that the one at fault gets the error;
//   - a broken connection before the COMMIT was sent: again, on a new one.
//
// A function that fails has its writes dropped; the others commit without
// it. Its error is answered once the batch has committed: it may rest on
// what functions before it in the batch wrote, so if the batch fails it
// runs again with them. An error while the COMMIT was on its way leaves the
// outcome unknown: every request gets it, none runs again (running it
// again could apply it twice).
func (s *Store) commit(batch []*request, strict bool) {
	live := batch[:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- fmt.Errorf("postgres: update: %w", err)
			continue
		}
		live = append(live, r)
	}
	for attempt := 1; len(live) > 0; attempt++ {
		t0 := time.Now()
		ran, err, committing := s.try(live, strict)
		live = ran
		if err == nil {
			committed := 0
			for _, r := range live {
				if r.ferr == nil {
					committed++
				}
			}
			if committed > 0 {
				s.commits.Add(1)
				s.updates.Add(uint64(committed))
				if s.opts.OnCommit != nil {
					s.opts.OnCommit(time.Since(t0), committed)
				}
			}
			for _, r := range live {
				r.done <- r.ferr
			}
			return
		}
		code, lost := pgCode(err), connectionLost(err)
		switch {
		case len(live) == 0:
			return
		case (code == codeSerializationFailure || code == codeDeadlockDetected) && attempt <= s.opts.MaxRetries:
			s.conflicts.Add(1)
			pause(attempt)
			continue
		case code == codeUniqueViolation && !strict:
			s.solo(live)
			return
		case code == codeUniqueViolation && attempt <= 3:
			pause(attempt) // another replica took the key first: the checks now see it
			continue
		case lost && !committing && attempt <= 3:
			pause(attempt)
			continue
		case !lost && len(live) > 1:
			s.solo(live)
			return
		}
		err = s.failure(err, code, lost, committing)
		for _, r := range live {
			r.done <- err
		}
		return
	}
}

// solo commits each request in its own transaction, in strict mode.
func (s *Store) solo(batch []*request) {
	for _, r := range batch {
		s.commit([]*request{r}, true)
	}
}

// failure wraps the error that ends a batch for its callers.
func (s *Store) failure(err error, code string, lost, committing bool) error {
	switch {
	case code == codeSerializationFailure || code == codeDeadlockDetected:
		return fmt.Errorf("postgres: update: still conflicting with concurrent transactions after %d attempts: %w: %w",
			s.opts.MaxRetries, kernel.ErrUnavailable, err)
	case code == codeUniqueViolation:
		return fmt.Errorf("postgres: update: %w: %w", kernel.ErrConflict, err)
	case lost && committing:
		return fmt.Errorf("postgres: update on %s: outcome unknown (the connection failed during COMMIT): %w: %w",
			s.name, kernel.ErrUnavailable, err)
	case lost:
		return fmt.Errorf("postgres: update on %s: %w: %w", s.name, kernel.ErrUnavailable, err)
	}
	return fmt.Errorf("postgres: update: %w", err)
}

// pause sleeps before attempt+1: a random time up to 1 ms doubled per
// attempt, at most 100 ms, so that transactions that collided do not
// collide again.
func pause(attempt int) {
	ceiling := min(time.Millisecond<<min(attempt-1, 7), 100*time.Millisecond)
	time.Sleep(time.Duration(rand.Int64N(int64(ceiling)) + 1))
}

// try runs the functions of batch in order in one transaction and commits
// it, setting each request's ferr to its function's error (whose writes
// are then dropped). It returns the requests whose functions ran or must
// run again (a request whose context ended before its function ran is
// answered and left out), the transaction's error, and whether that error
// was met while the COMMIT was on its way.
func (s *Store) try(batch []*request, strict bool) (ran []*request, err error, committing bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.TxTimeout)
	defer cancel()
	conn, err := s.writerConn(ctx)
	if err != nil {
		return batch, fmt.Errorf("connect: %w", err), false
	}
	defer func() {
		// A connection left inside a transaction, or broken, is replaced.
		if conn.IsClosed() || conn.PgConn().TxStatus() != 'I' {
			_ = conn.Close(context.WithoutCancel(ctx))
			s.wconn = nil
		}
	}()
	begin := "BEGIN ISOLATION LEVEL REPEATABLE READ"
	if s.opts.Serializable {
		begin = "BEGIN ISOLATION LEVEL SERIALIZABLE"
	}
	sess := newSession(ctx, conn, begin)
	tx := newWriteTx(sess, strict)
	ran = make([]*request, 0, len(batch))
	committed := 0
	for i, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.done <- fmt.Errorf("postgres: update: %w", err)
			continue
		}
		tx.beginFn()
		r.ferr = call(r.fn, tx)
		if sess.err != nil {
			// The database failed under fn: the transaction is lost, and
			// fn's error (if any) may be that failure's consequence.
			sess.rollback()
			return append(ran, batch[i:]...), sess.err, false
		}
		tx.endFn(r.ferr == nil)
		ran = append(ran, r)
		if r.ferr == nil {
			committed++
		}
	}
	if committed == 0 {
		sess.rollback()
		return ran, nil, false
	}
	if err := sess.end(true, tx.finalStatements(s.channel, s.origin)); err != nil {
		return ran, err, true
	}
	return ran, nil, false
}

// writerConn returns the writer's own connection, connecting when it has
// none: writes never wait for a connection that Views hold.
func (s *Store) writerConn(ctx context.Context) (*pgx.Conn, error) {
	if s.wconn != nil && !s.wconn.IsClosed() {
		return s.wconn, nil
	}
	c, err := pgx.ConnectConfig(ctx, s.connConfig.Copy())
	if err != nil {
		return nil, err
	}
	s.wconn = c
	return c, nil
}

// call runs fn, turning a panic into a *PanicError.
func call(fn func(kernel.Tx) error, tx *writeTx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return fn(tx)
}
