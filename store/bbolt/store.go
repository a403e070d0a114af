package bbolt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/wicket-run/wicket/kernel"
)

// Defaults of Options.
const (
	DefaultTimeout  = 2 * time.Second
	DefaultMaxBatch = 128
)

// FileMode is the mode of a store file Open creates.
const FileMode fs.FileMode = 0o600

// DirMode is the mode of a parent directory Open creates.
const DirMode fs.FileMode = 0o700

var (
	// ErrLocked is returned by Open when another process (or another Store
	// in this one) holds the file's lock for longer than Options.Timeout.
	ErrLocked = errors.New("store is locked by another process")
	// ErrInsecureFile is returned by Open for an existing file that group or
	// others may write.
	ErrInsecureFile = errors.New("store file is writable by group or others")
	// ErrUnclean is returned by a read-only Open (and CheckClean, Compact,
	// Space) of a file whose write-ahead log is still there although no
	// kernel holds the file: the last one did not stop cleanly, and the
	// log holds commits the file lacks. (Beside a running kernel they
	// return ErrLocked.)
	ErrUnclean = errors.New("store has a write-ahead log (a kernel runs on it, or did not stop cleanly: start `wicket serve` on it once to apply the log)")
)

// Options configure Open. The zero value is usable: fsync on, DefaultTimeout
// and DefaultMaxBatch.
type Options struct {
	// NoSync skips fsync on commit. Faster, and a crash may lose or corrupt
	// recent commits: for tests and benchmarks only. The writer keeps its
	// transaction open across batches as with a log (CommitInterval), but
	// without one: should the later commit of the file fail, the batches
	// answered since the last one are lost (the store fails, and every
	// later Update and View returns the error).
	NoSync bool
	// Timeout bounds the wait for the file lock (zero: DefaultTimeout;
	// negative: wait forever).
	Timeout time.Duration
	// MaxBatch caps how many Update functions share one commit (zero:
	// DefaultMaxBatch; 1 disables group commit).
	MaxBatch int
	// GatherWindow is how long the writer may hold a batch open for the
	// callers of the previous commit to come back with their next Update
	// (zero: DefaultGatherWindow; negative: never wait), and never longer
	// than the last commit took. Without it, N steady writers split into
	// two alternating half-size batches.
	GatherWindow time.Duration
	// NoFreelistSync leaves bbolt's free-page list out of every commit
	// (bbolt rebuilds it by scanning the file at Open instead).
	NoFreelistSync bool
	// OnCommit, when set, is called by the writer after each commit with
	// the time the commit took (write and fsync) and the number of Update
	// functions it carried. It must be quick: the writer waits for it.
	OnCommit func(took time.Duration, updates int)
	// WAL makes each commit durable with one append and one fdatasync to a
	// write-ahead log beside the file (WALDir) instead of bbolt's two
	// fsyncs over every page the commit wrote; the file itself is synced
	// at checkpoints, and Open replays the log after a crash. Ignored with
	// NoSync and ReadOnly. See the package doc, Write-ahead log.
	WAL bool
	// CheckpointInterval is how often, at most, a store with a WAL syncs
	// its file and trims the log (zero: DefaultCheckpointInterval).
	CheckpointInterval time.Duration
	// CommitInterval, with a WAL, is how long the writer keeps one bbolt
	// transaction open across batches before committing it to the file
	// (zero: DefaultCommitInterval; negative: one commit per batch, as
	// without a WAL). Each batch is durable once its log record is
	// synced; the file's commit only makes the log shorter to replay.
	CommitInterval time.Duration
	// ReadOnly opens an existing file for reading only, under a shared lock
	// (a running kernel's exclusive lock excludes it): Update fails, nothing
	// is migrated, and a file of another schema version is refused. For
	// offline tools such as `wicket store check`.
	ReadOnly bool

	walMmap    int   // tests: the address space reserved with a log (walMmapReserve)
	walSegment int64 // tests: the size of a log segment (walSegmentSize)
	// onCheckpoint, for tests, is called with the file's path once each
	// checkpoint is durable.
	onCheckpoint func(path string)
	// onWriteback, for tests, is called with startWriteback's result each
	// time the checkpointer starts writing the file's pages back.
	onWriteback func(error)
}

// DefaultGatherWindow is the default Options.GatherWindow. Over HTTP the
// callers of a commit come back (answer, agent, next request, its read)
// after well over 400 µs on a busy 2-core machine; 2 ms lets ten agents
// share a commit (7.5 updates per commit instead of 5) for less CPU per
// step (docs/benchmarks.md). The writer never waits longer than its last
// commit took, a lone writer never waits, and a window that brings nobody
// is switched off for the next 16 commits.
const DefaultGatherWindow = 2 * time.Millisecond

// DefaultCommitInterval is how long, by default, the writer keeps a bbolt
// transaction open across batches (Options.CommitInterval).
const DefaultCommitInterval = 20 * time.Millisecond

func (o Options) withDefaults() Options {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.GatherWindow == 0 {
		o.GatherWindow = DefaultGatherWindow
	}
	if o.CommitInterval == 0 {
		o.CommitInterval = DefaultCommitInterval
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.walSegment <= 0 {
		o.walSegment = walSegmentSize
	}
	if o.walMmap <= 0 {
		o.walMmap = walMmapReserve
	}
	return o
}

// Store is a kernel.Store on one bbolt file. It is safe for concurrent use.
type Store struct {
	db       *bolt.DB
	path     string
	maxBatch int
	// gather, expect, others and cool belong to the writer goroutine:
	// see gatherMore. others is how many Updates were waiting for the
	// writer as it answered the last batch: other writers than its own.
	gather time.Duration
	expect int
	others int
	cool   int
	// lastCommit is how long the last commit took (write and fsync); the
	// writer's too.
	lastCommit time.Duration
	// file is the file bbolt opened, and fileChecked when the writer last
	// checked (without a log: checkFile) that the path still names it.
	file        *os.File
	fileChecked time.Time

	reqs      chan *request // unbuffered: a sender blocks until the writer takes it
	closing   chan struct{} // closed by Close
	stopped   chan struct{} // closed when the writer returns
	closeOnce sync.Once
	closeErr  error
	readOnly  bool // Options.ReadOnly: no writer runs
	onCommit  func(time.Duration, int)

	waiting  atomic.Int64  // Updates waiting for the writer to take them
	commits  atomic.Uint64 // committed write transactions
	updates  atomic.Uint64 // Update functions committed
	retries  atomic.Uint64 // batches rolled back because one function failed
	fnTime   atomic.Int64  // writer nanoseconds in Begin and the Update functions
	logTime  atomic.Int64  // writer nanoseconds appending and syncing the log
	fileTime atomic.Int64  // writer nanoseconds in bbolt's Commit

	// decoded agent and tenant records, for read transactions
	agents  recordCache[kernel.Agent]
	tenants recordCache[kernel.Tenant]

	// wal is the write-ahead log (nil: none); the writer's once Open
	// returns.
	wal     *walState
	ckptReq chan ckptRequest // tests' requests to the writer
	// onCheckpoint is Options.onCheckpoint.
	onCheckpoint func(path string)
	// onWriteback is Options.onWriteback.
	onWriteback func(error)
	// failure, once set, is returned by every Update: the log or the file
	// failed a write, and only a restart knows what is on disk.
	failure atomic.Pointer[error]

	// The writer's open transaction (with a log, see tryOpen): batches
	// answered and in the log, not yet committed to the file. mu guards
	// open for View; the writer holds it while a batch's functions run
	// and whenever it changes open (reopen, commitOpen), not during a
	// record's sync (see tryOpen).
	mu          sync.RWMutex
	open        *bolt.Tx
	openAt      time.Time
	openFor     time.Duration // how long a transaction stays open (0: one per batch)
	pending     [][]byte      // the record payloads of the batches in open
	pendingSize int           // their bytes
	noSync      bool          // Options.NoSync: open transactions without a log
	rec         walBatch      // the writes of a batch, without a log
	// applied counts the batches with a log record run in the open
	// transaction, durable those whose record is synced (under mu, and
	// for durable also atomically); synced is closed once batch applied
	// is synced or failed.
	applied uint64
	durable atomic.Uint64
	synced  chan struct{}
	// lost is set when the store failed with batches answered and no
	// longer readable: View then fails too.
	lost        atomic.Bool
	fileCommits atomic.Uint64 // commits of the file (open transactions committed)
	idleWakes   atomic.Uint64 // times the writer woke to commit an idle open transaction (tests)
	windows     atomic.Uint64 // gather windows the writer held a batch open for (tests)
}

var _ kernel.Store = (*Store)(nil)

// Open opens the store at path, creating the file (mode 0600) and its parent
// directory (mode 0700) when missing (never with ReadOnly), and migrates it
// to SchemaVersion.
//
// # Errors
//
// Open refuses an existing file writable by group or others
// (ErrInsecureFile), an empty, truncated or corrupt-headed file
// (ErrDamaged, see CheckFile), a file with a newer schema
// (ErrNewerSchema), and a file whose lock is held beyond opts.Timeout
// (ErrLocked). Every error names path.
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts.withDefaults(), 0)
}

// openAttempts bounds the times open starts again because another
// process changed the file while this one waited for its lock.
const openAttempts = 10

// open is Open; attempt counts the times it started again.
func open(path string, opts Options, attempt int) (*Store, error) {
	again := func() (*Store, error) {
		if attempt+1 >= openAttempts {
			return nil, fmt.Errorf("bbolt: open %s: the file or its log changed %d times while waiting for its lock", path, openAttempts)
		}
		return open(path, opts, attempt+1)
	}
	if !opts.ReadOnly {
		if err := os.MkdirAll(filepath.Dir(path), DirMode); err != nil {
			return nil, fmt.Errorf("bbolt: open %s: create directory: %w", path, err)
		}
	}
	var cp *checkpoint
	fi, err := os.Stat(path)
	switch {
	case err == nil:
		if fi.IsDir() {
			return nil, fmt.Errorf("bbolt: open %s: is a directory", path)
		}
		if perm := fi.Mode().Perm(); perm&0o022 != 0 {
			return nil, fmt.Errorf("bbolt: open %s: mode %04o: %w (chmod 600 it)", path, perm, ErrInsecureFile)
		}
		if cp, err = checkLog(path, opts.ReadOnly); err != nil {
			return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
		}
		if err := CheckFile(path); err != nil {
			return nil, err
		}
	case opts.ReadOnly && errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("bbolt: open %s read-only: %w", path, err)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
	default:
		if err := createFile(path); err != nil {
			return nil, fmt.Errorf("bbolt: open %s: create: %w", path, err)
		}
		return again()
	}
	useWAL := opts.WAL && !opts.NoSync && !opts.ReadOnly
	bopts := &bolt.Options{
		Timeout:        opts.Timeout,
		NoSync:         opts.NoSync,
		FreelistType:   bolt.FreelistMapType,
		NoFreelistSync: opts.NoFreelistSync,
		ReadOnly:       opts.ReadOnly,
	}
	if useWAL || cp != nil {
		// A read transaction protects the checkpoint's pages while the
		// log is in use, and bbolt cannot remap while one is open.
		bopts.InitialMmapSize = opts.walMmap
	}
	if opts.Timeout < 0 {
		bopts.Timeout = 0 // bbolt: zero waits forever
	}
	if testHookBeforeLock != nil {
		testHookBeforeLock()
	}
	var file *os.File // the file bbolt opened, then waited for the lock of
	bopts.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}
	db, err := bolt.Open(path, FileMode, bopts)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("bbolt: open %s: %w (gave up after %s)", path, ErrLocked, opts.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
	}
	if err := sameFile(path, file); err != nil {
		// Another file took the name while bbolt waited for the lock of
		// the one it opened: `wicket store compact` renames its copy over
		// the file and then lets the old one's lock go. The old file is
		// no longer the store (writes to it would be lost, and a log's
		// checkpoint would read the new one's meta page): open the new.
		_ = db.Close()
		if errors.Is(err, errReplaced) {
			return again()
		}
		return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
	}
	if cp == nil && logLeft(path) {
		// checkLog found the file locked, and the kernel holding it died
		// before bbolt took the lock, its log left (see logLeft): that
		// log must be applied first, and the lock is free now.
		_ = db.Close()
		if opts.ReadOnly {
			return nil, fmt.Errorf("bbolt: open %s: %w", path, ErrUnclean)
		}
		return again()
	}
	if cp != nil && !stillAt(db, path, cp) {
		// checkLog took the file back to the log's checkpoint cp, and let
		// its lock go for bbolt to take; another kernel took it first (a
		// double start), applied the log, wrote on and died: the file and
		// its log are no longer those cp describes. Look again.
		_ = db.Close()
		return again()
	}
	var lsn uint64
	if cp != nil {
		lsn, err = replayWAL(db, path, cp)
	}
	if err == nil && opts.ReadOnly {
		err = checkSchema(db)
	} else if err == nil {
		err = migrate(db)
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
	}
	s := &Store{
		db:       db,
		path:     path,
		file:     file,
		maxBatch: opts.MaxBatch,
		gather:   opts.GatherWindow,
		onCommit: opts.OnCommit,
		openFor:  max(opts.CommitInterval, 0),
		noSync:   opts.NoSync,
		reqs:     make(chan *request),
		ckptReq:  make(chan ckptRequest),
		closing:  make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	if opts.ReadOnly {
		s.readOnly = true
		close(s.stopped)
		return s, nil
	}
	if useWAL {
		s.onCheckpoint = opts.onCheckpoint
		s.onWriteback = opts.onWriteback
		if err := s.startWAL(lsn, opts.CheckpointInterval, opts.walMmap, opts.walSegment); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("bbolt: open %s: %w", path, err)
		}
	}
	go s.run()
	return s, nil
}

// Path returns the file's path.
func (s *Store) Path() string { return s.path }

// Close stops the writer once it has committed every Update already handed
// to it, then closes the file. Updates and Views after Close fail with an
// error matching kernel.ErrUnavailable. Close is idempotent.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		<-s.stopped
		if err := s.stopWAL(); err != nil {
			s.closeErr = fmt.Errorf("bbolt: close %s: %w", s.path, err)
		}
		if err := s.db.Close(); err != nil && s.closeErr == nil {
			s.closeErr = fmt.Errorf("bbolt: close %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

func (s *Store) closed() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

func errClosed(op string) error {
	return fmt.Errorf("bbolt: %s: store closed: %w", op, kernel.ErrUnavailable)
}

// View runs fn in a read-only snapshot, concurrently with other Views. tx
// must not be used after fn returns; the records it returns are copies and
// may be kept. A panic in fn propagates.
//
// With the writer's open transaction (Options.CommitInterval), fn reads
// that transaction under a read lock, which the writer takes while a
// batch's functions run: a View waits out those functions, and a View
// that runs long holds up every write meanwhile, so fn must read and
// return, never wait. fn may read a batch whose record is being synced;
// View then returns once it is synced, or, should the sync fail, returns
// the store's failure instead of what fn read. fn must
// not call Update, View, Backup or Check (nor may an Update function or
// OnCommit call View): each would wait on a lock its caller holds.
func (s *Store) View(ctx context.Context, fn func(tx kernel.ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bbolt: view: %w", err)
	}
	if s.closed() {
		return errClosed("view")
	}
	s.mu.RLock()
	if s.open != nil {
		// Batches the writer answered are in its open transaction, and
		// so may be one whose record is being synced: what fn read of it
		// is returned once that sync is done.
		seen, synced := s.applied, s.synced
		err := func() error {
			defer s.mu.RUnlock()
			return fn(&readTx{tx: s.open, agents: &s.agents, tenants: &s.tenants})
		}()
		if seen > s.durable.Load() {
			select {
			case <-synced:
			case <-ctx.Done():
				return fmt.Errorf("bbolt: view: %w", ctx.Err())
			}
			if seen > s.durable.Load() {
				return *s.failure.Load()
			}
		}
		return err
	}
	s.mu.RUnlock()
	if s.lost.Load() {
		return *s.failure.Load()
	}
	err := s.db.View(func(btx *bolt.Tx) error { return fn(&readTx{tx: btx, agents: &s.agents, tenants: &s.tenants}) })
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return errClosed("view")
	}
	return err
}

// Update runs fn in a read-write transaction and returns once it is
// committed (and fsync'd unless Options.NoSync). It hands fn to the writer
// goroutine, which may commit it together with other Updates (see the
// package doc); fn may therefore run more than once and must have no effect
// outside tx. fn's error is returned unchanged; a panic in fn is returned as
// a *PanicError. Either rolls back everything fn wrote.
//
// ctx is honoured until the writer takes fn (and checked once more just
// before fn runs); after that Update waits for the commit, so that its
// answer is always the truth. tx must not be used after fn returns; fn
// must read through tx (a View would not see tx's writes) and must not call
// Update (it would wait for itself). A slow fn delays every writer.
func (s *Store) Update(ctx context.Context, fn func(tx kernel.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bbolt: update: %w", err)
	}
	if s.closed() {
		return errClosed("update")
	}
	if s.readOnly {
		return fmt.Errorf("bbolt: update %s: opened read-only", s.path)
	}
	if f := s.failure.Load(); f != nil {
		return *f
	}
	r := &request{ctx: ctx, fn: fn, done: make(chan error, 1)}
	// The writer takes the count back as it takes the request.
	s.waiting.Add(1)
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		s.waiting.Add(-1)
		return fmt.Errorf("bbolt: update: %w", ctx.Err())
	case <-s.closing:
		s.waiting.Add(-1)
		return errClosed("update")
	}
	return <-r.done
}

// Stats are counters of a Store's activity.
type Stats struct {
	// Commits counts batches committed by the writer: each a write
	// transaction of its own, or, with the writer's open transaction
	// (Options.CommitInterval), a log record in it.
	Commits uint64
	// FileCommits counts the open transactions committed to the file
	// (zero when every batch is a transaction of its own).
	FileCommits uint64
	// Updates counts Update functions committed; Updates/Commits is the
	// group-commit factor.
	Updates uint64
	// Retries counts batches rolled back because one function failed.
	Retries uint64
	// Waiting is the number of Updates now waiting for the writer.
	Waiting int64
	// Functions, Log and File are how long the writer spent, over the
	// commits counted, in a transaction's Begin and its Update functions,
	// in appending and syncing the write-ahead log's record (zero without
	// the log), and in bbolt's Commit (its page writes, and its fsyncs
	// without the log; with the log, also the checkpoint's bookkeeping
	// after it). Their sum over wall time is how busy the writer
	// was; the rest it waited for Updates.
	Functions, Log, File time.Duration
	// Size is the high-water mark of the file in bytes: the pages bbolt
	// has used so far, free ones included (the file itself may be longer:
	// bbolt grows it ahead of use).
	Size int64
	// DB are bbolt's own statistics.
	DB bolt.Stats
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	var size int64
	_ = s.db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil })
	return Stats{
		Size:        size,
		Commits:     s.commits.Load(),
		Updates:     s.updates.Load(),
		Retries:     s.retries.Load(),
		FileCommits: s.fileCommits.Load(),
		Waiting:     s.waiting.Load(),
		DB:          s.db.Stats(),

		Functions: time.Duration(s.fnTime.Load()),
		Log:       time.Duration(s.logTime.Load()),
		File:      time.Duration(s.fileTime.Load()),
	}
}

// errReplaced is sameFile's answer for a path that names another file.
var errReplaced = errors.New("replaced while waiting for its lock")

// sameFile reports (errReplaced) whether path no longer names the file f,
// opened at path: a file renamed over it since. A path removed since is
// an error of its own.
func sameFile(path string, f *os.File) error {
	if f == nil {
		return nil
	}
	opened, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat the opened file: %w", err)
	}
	named, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("the file went while waiting for its lock: %w", err)
	}
	if !os.SameFile(opened, named) {
		return errReplaced
	}
	return nil
}

// replacedError is the store's failure once its path no longer names the
// file it opened.
func replacedError(path string, err error) error {
	if errors.Is(err, errReplaced) {
		err = errors.New("another file has its name")
	}
	return fmt.Errorf("%s is no longer the file this kernel opened (it was replaced or removed while the kernel ran: %v); "+
		"writes are refused: stop the kernel; to restore a backup, see docs/operations.md#backup-and-restore", path, err)
}

// fileCheckEvery is how often, at most, a store without a log checks
// before a write that its path still names its file (the checkpoints do
// it with a log). A variable for tests.
var fileCheckEvery = 100 * time.Millisecond

// checkFile fails the store once its path names another file, or none:
// every write would go to a file no restart opens. The writer's.
func (s *Store) checkFile() error {
	if s.file == nil || time.Since(s.fileChecked) < fileCheckEvery {
		return nil
	}
	s.fileChecked = time.Now()
	if err := sameFile(s.path, s.file); err != nil {
		s.fail(replacedError(s.path, err))
		return *s.failure.Load()
	}
	return nil
}

// testHookBeforeLock, when set (tests), runs in Open after the look at
// the log, before bbolt opens the file and takes its lock.
var testHookBeforeLock func()

// stillAt reports whether db, opened once checkLog restored the
// checkpoint cp, is still at it: the file at cp's transaction and the
// log's checkpoint cp.
func stillAt(db *bolt.DB, path string, cp *checkpoint) bool {
	var txid uint64
	if err := db.View(func(tx *bolt.Tx) error { txid = uint64(tx.ID()); return nil }); err != nil || txid != cp.txid {
		return false
	}
	now, err := readCheckpoint(WALDir(path))
	return err == nil && now != nil && now.lsn == cp.lsn && now.txid == cp.txid
}

// createFile makes a new, empty store file at path whole or not at all:
// bbolt writes its first pages to a file under a temporary name, which is
// then linked to path. A kernel killed during its first start used to
// leave path empty, a file Open refuses as damaged (CheckFile), so that
// it never started again. A file another process created at path
// meanwhile is kept.
func createFile(path string) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".new-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Chmod(FileMode)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	db, err := bolt.Open(tmp, FileMode, &bolt.Options{FreelistType: bolt.FreelistMapType})
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil { // bbolt synced the pages it wrote
		return err
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		// A file system without hard links: renamed instead, unless a
		// file has the name by now.
		if _, serr := os.Lstat(path); serr == nil {
			return nil
		}
		if rerr := os.Rename(tmp, path); rerr != nil {
			return fmt.Errorf("%w; rename instead: %w", err, rerr)
		}
	}
	return syncDir(filepath.Dir(path))
}
