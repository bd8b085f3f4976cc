// Package recordsum is the checksum of the records the store's journal and
// its segment log write: the CRC-32C (Castagnoli) of a record's payload,
// seeded with the number of the segment that holds it, so that what an
// earlier life of a recycled segment left behind never reads as a record
// of its current one.
package recordsum

import "hash/crc32"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Of returns the checksum of payload, a record of segment.
func Of(segment uint64, payload []byte) uint32 {
	return crc32.Update(seed(segment), castagnoli, payload)
}

// seed is the CRC-32C of segment's number, eight bytes little-endian,
// worked out a byte at a time with the table as crc32 does for short
// input: the eight bytes handed to crc32 would escape to the heap, an
// allocation per record.
func seed(segment uint64) uint32 {
	crc := ^uint32(0)
	for i := range 8 {
		crc = castagnoli[byte(crc)^byte(segment>>(8*i))] ^ crc>>8
	}
	return ^crc
}
