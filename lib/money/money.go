// Package money bounds amounts of money: integer micros of USD (API.md §0).
package money

// MaxMicros is the largest amount the API takes, 10^18 micros ($1 trillion).
// Ceilings add a grant's cost to a day's counter before comparing, and two
// amounts within this bound always sum within int64, so no counter
// overflows into an internal error instead of answering the ceiling.
const MaxMicros int64 = 1_000_000_000_000_000_000

// Valid reports whether v is an amount the API takes: 0 to MaxMicros.
func Valid(v int64) bool { return v >= 0 && v <= MaxMicros }

// Rule is the validation message for an amount field.
const Rule = "must be an integer from 0 to 10^18 (micros of USD)"
