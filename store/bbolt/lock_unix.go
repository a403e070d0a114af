//go:build unix

package bbolt

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFree takes path's lock (the one bbolt takes: flock, exclusive) if
// nobody holds it and returns its release; held reports that another
// process (or Store) has it.
func lockFree(path string) (release func(), held bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, false, nil
}
