//go:build race

package server

// raceEnabled: allocation guards skip themselves (the race detector
// allocates on its own).
const raceEnabled = true
