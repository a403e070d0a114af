//go:build race

package worker

// raceFactor scales the memory cap of a worker built with the race
// detector (tests), whose shadow memory is counted in RLIMIT_DATA too.
const raceFactor = 8
