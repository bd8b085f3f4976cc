// Package option fills in the unset fields of the Options structs the
// packages take, so that the zero Options is useful.
package option

// Default sets *v to d unless *v is positive: a zero (unset) or negative
// bound, count or duration means the default, never "no limit".
func Default[T ~int | ~int32 | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
