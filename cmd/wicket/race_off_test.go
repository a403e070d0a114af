//go:build !race

package main

// raceEnabled: the race detector is on (its shadow memory counts against
// a process's memory cap).
const raceEnabled = false
