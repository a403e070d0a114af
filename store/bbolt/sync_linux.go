package bbolt

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// fdatasync flushes f's data (and the metadata needed to read it back) to
// the disk.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// writebackSupported reports whether startWriteback does anything here.
const writebackSupported = true

// startWriteback starts writing f's dirty pages to the disk and returns
// without waiting for them (sync_file_range with SYNC_FILE_RANGE_WRITE,
// over the whole file). It is a hint to the OS, not a sync: it makes no
// page durable and no metadata is written; the next fdatasync of f has
// that much less to write.
func startWriteback(f *os.File) error {
	if err := unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE); err != nil {
		return &os.PathError{Op: "sync_file_range", Path: f.Name(), Err: err}
	}
	return nil
}
