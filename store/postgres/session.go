package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// session runs one transaction on one connection. It begins the
// transaction lazily: the BEGIN (and any statement queued with pre) travels
// in the same round trip as the first statement, so a transaction costs no
// round trip of its own before its first query.
//
// The first database error aborts the transaction (PostgreSQL refuses every
// later statement); session remembers it in err and answers it to every
// later call, so that a function that ignores an error still cannot commit.
type session struct {
	ctx   context.Context
	conn  *pgx.Conn
	begin string   // sent before the first statement; "" once sent
	pre   []string // statements without arguments sent before the next one
	began bool     // the BEGIN was sent
	err   error    // first database error; the transaction is aborted
}

func newSession(ctx context.Context, conn *pgx.Conn, begin string) *session {
	return &session{ctx: ctx, conn: conn, begin: begin}
}

// prefix returns the statements that must precede the next one.
func (s *session) prefix() []string {
	var out []string
	if s.begin != "" {
		out = append(out, s.begin)
	}
	return append(out, s.pre...)
}

// sent records that the prefix went out.
func (s *session) sent() {
	if s.begin != "" {
		s.begin = ""
		s.began = true
	}
	s.pre = s.pre[:0]
}

// fail records err as the session's database error and returns it.
func (s *session) fail(err error) error {
	if s.err == nil {
		s.err = err
	}
	return err
}

// query runs sql and calls each for every row.
func (s *session) query(sql string, args []any, each func(rows pgx.Rows) error) error {
	if s.err != nil {
		return s.err
	}
	pre := s.prefix()
	var rows pgx.Rows
	var br pgx.BatchResults
	var err error
	if len(pre) == 0 {
		rows, err = s.conn.Query(s.ctx, sql, args...)
	} else {
		b := &pgx.Batch{}
		for _, p := range pre {
			b.Queue(p)
		}
		b.Queue(sql, args...)
		br = s.conn.SendBatch(s.ctx, b)
		s.sent()
		for range pre {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		if err == nil {
			rows, err = br.Query()
		}
	}
	if err == nil {
		err = readRows(rows, each)
	}
	if br != nil {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		var de *decodeError
		if errors.As(err, &de) {
			return err // ours: the transaction is still sound
		}
		return s.fail(err)
	}
	return nil
}

// readRows calls each for every row of rows and closes it.
func readRows(rows pgx.Rows, each func(rows pgx.Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// queryRow runs sql, which returns at most one row, and scans it into
// dest. found is false when there is no row.
func (s *session) queryRow(sql string, args []any, dest ...any) (found bool, err error) {
	err = s.query(sql, args, func(rows pgx.Rows) error {
		found = true
		return rows.Scan(dest...)
	})
	return found, err
}

// statement is one statement of a pipeline.
type statement struct {
	sql  string
	args []any
	// check, when set, inspects the statement's command tag.
	check func(pgconn.CommandTag) error
}

// pipeline sends statements in one round trip (after the prefix) and
// checks each one's result. The first failure is returned.
func (s *session) pipeline(stmts []statement) error {
	if s.err != nil {
		return s.err
	}
	pre := s.prefix()
	if len(pre) == 0 && len(stmts) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, p := range pre {
		b.Queue(p)
	}
	for _, st := range stmts {
		b.Queue(st.sql, st.args...)
	}
	br := s.conn.SendBatch(s.ctx, b)
	s.sent()
	var err error
	for range pre {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	for i := 0; err == nil && i < len(stmts); i++ {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && stmts[i].check != nil {
			err = stmts[i].check(tag)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return s.fail(err)
	}
	return nil
}

// end commits (or rolls back) the transaction, if it began, together with
// stmts: the last round trip of a write transaction carries its buffered
// writes and its COMMIT.
func (s *session) end(commit bool, stmts []statement) error {
	if !s.began && s.begin != "" && len(stmts) == 0 {
		return s.err // nothing was sent: there is no transaction
	}
	if s.err != nil || !commit {
		s.rollback()
		if s.err != nil {
			return s.err
		}
		return nil
	}
	stmts = append(stmts, statement{sql: "COMMIT", check: func(tag pgconn.CommandTag) error {
		// COMMIT of a transaction that failed answers ROLLBACK.
		if tag.String() != "COMMIT" {
			return fmt.Errorf("commit answered %q", tag.String())
		}
		return nil
	}})
	if err := s.pipeline(stmts); err != nil {
		s.rollback()
		return err
	}
	return nil
}

// rollback ends the transaction without committing; a connection left in
// a transaction is closed (the pool then discards it).
func (s *session) rollback() {
	if !s.began {
		return
	}
	if s.conn.PgConn().TxStatus() == 'I' {
		return
	}
	if _, err := s.conn.Exec(context.WithoutCancel(s.ctx), "ROLLBACK"); err != nil || s.conn.PgConn().TxStatus() != 'I' {
		_ = s.conn.Close(context.WithoutCancel(s.ctx))
	}
}

// decodeError is a record the store cannot decode: the store's problem, not
// the transaction's.
type decodeError struct {
	what string
	err  error
}

func (e *decodeError) Error() string { return e.what + ": " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }
