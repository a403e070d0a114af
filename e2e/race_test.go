//go:build race

package e2e

// raceEnabled reports whether the race detector is on.
const raceEnabled = true
