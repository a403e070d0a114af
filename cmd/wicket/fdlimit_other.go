//go:build !unix

package main

// fdLimit: no limit is known on this platform.
func fdLimit() (uint64, bool) { return 0, false }
