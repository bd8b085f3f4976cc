//go:build !race

package kernel

// raceEnabled says the race detector is on: its instrumentation moves
// values to the heap that otherwise stay on the stack.
const raceEnabled = false
