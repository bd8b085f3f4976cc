//go:build !race

// Package race says whether the binary was built with the race detector,
// for tests that count allocations: its instrumentation moves values to
// the heap that otherwise stay on the stack, and makes sync.Pool drop what
// it is given now and then, so counts are exact only without it.
package race

// Enabled is true in a build with the race detector.
const Enabled = false
