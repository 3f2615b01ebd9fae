package apitest

import (
	"os"
	"strconv"
	"testing"
)

// ModelSeeds is the seeds a model test (a seeded random sequence of
// operations checked against a plain Go model) runs: MODEL_SEED alone
// when set, else MODEL_SEEDS (default n) seeds from 1.
func ModelSeeds(t *testing.T, n int) []uint64 {
	if s := os.Getenv("MODEL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MODEL_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	n = ModelEnvInt(t, "MODEL_SEEDS", n)
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// ModelEnvInt is the positive integer in the environment variable name
// (MODEL_OPS, MODEL_SEEDS), def when it is unset.
func ModelEnvInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}
