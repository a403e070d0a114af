//go:build race

package agent_test

// raceEnabled: allocation guards skip themselves (the race detector
// allocates on its own).
const raceEnabled = true
