//go:build race

package store

// raceEnabled says the race detector is on: it makes sync.Pool drop what
// it is given now and then, so allocation counts are not exact.
const raceEnabled = true
