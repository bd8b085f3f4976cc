package main

import (
	"fmt"
	"math"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag holding a size in bytes, given as a plain number or
// with a unit: 64MiB and 2GiB are powers of two, 64MB and 2GB powers of
// ten.
type byteSize int64

func (b byteSize) String() string {
	if b <= 0 {
		return "0"
	}
	return humanize.IBytes(uint64(b))
}

func (b *byteSize) Set(v string) error {
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return fmt.Errorf("want a size such as 512MiB or 2GB: %w", err)
	}
	if n > math.MaxInt64 {
		return fmt.Errorf("size %q is too large", v)
	}
	*b = byteSize(n)
	return nil
}
