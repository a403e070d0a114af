//go:build !linux

package bbolt

import "os"

// fdatasync flushes f to the disk (fsync: not every system has
// fdatasync).
func fdatasync(f *os.File) error { return f.Sync() }
