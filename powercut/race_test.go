//go:build race

package powercut

// raceEnabled: this test binary runs with the race detector.
const raceEnabled = true
