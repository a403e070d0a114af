//go:build !linux

package bbolt

import "os"

// fdatasync flushes f to the disk (fsync: not every system has
// fdatasync).
func fdatasync(f *os.File) error { return f.Sync() }

// writebackSupported reports whether startWriteback does anything here:
// not every system can start a file's writeback without waiting for it.
const writebackSupported = false

// startWriteback does nothing here (see sync_linux.go).
func startWriteback(*os.File) error { return nil }
