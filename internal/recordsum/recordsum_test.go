package recordsum

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// TestOfIsTheCRC32COfSegmentThenPayload pins the checksum to what the
// journal and the segment log wrote before it was shared: the CRC-32C of
// the segment's number, little-endian, continued over the payload.
// Records already on disk are read with it.
func TestOfIsTheCRC32COfSegmentThenPayload(t *testing.T) {
	for _, c := range []struct {
		segment uint64
		payload string
	}{
		{0, ""},
		{1, "a"},
		{2, "record"},
		{255, "x"},
		{256, "x"},
		{1 << 32, "a longer payload, longer than one word"},
		{0x0123456789abcdef, "y"},
		{1<<64 - 1, "z"},
	} {
		var seg [8]byte
		binary.LittleEndian.PutUint64(seg[:], c.segment)
		tab := crc32.MakeTable(crc32.Castagnoli)
		want := crc32.Update(crc32.Checksum(seg[:], tab), tab, []byte(c.payload))
		if got := Of(c.segment, []byte(c.payload)); got != want {
			t.Errorf("Of(%#x, %q) = %#x, want %#x", c.segment, c.payload, got, want)
		}
	}
}

// TestOfAllocatesNothing: it runs for every record written and read.
func TestOfAllocatesNothing(t *testing.T) {
	payload := []byte("payload")
	if n := testing.AllocsPerRun(100, func() { _ = Of(7, payload) }); n != 0 {
		t.Fatalf("Of: %v allocations, want none", n)
	}
}
