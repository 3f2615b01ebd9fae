package apitest

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// EachModelSeed runs a model test (a seeded random sequence of operations
// checked against a plain Go model) once per seed, as subtest seed=<n>:
// MODEL_SEED alone when set, else MODEL_SEEDS (default seeds) seeds from
// 1, each sequence MODEL_OPS (default ops) operations long.
func EachModelSeed(t *testing.T, seeds, ops int, run func(t *testing.T, seed uint64, ops int)) {
	ops = modelEnvInt(t, "MODEL_OPS", ops)
	for _, seed := range modelSeeds(t, seeds) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { run(t, seed, ops) })
	}
}

// modelSeeds is the seeds to run: MODEL_SEED alone when set, else
// MODEL_SEEDS (default n) seeds from 1.
func modelSeeds(t *testing.T, n int) []uint64 {
	if s := os.Getenv("MODEL_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("MODEL_SEED=%q: %v", s, err)
		}
		return []uint64{seed}
	}
	n = modelEnvInt(t, "MODEL_SEEDS", n)
	seeds := make([]uint64, n)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	return seeds
}

// modelEnvInt is the positive integer in the environment variable name,
// def when it is unset.
func modelEnvInt(t *testing.T, name string, def int) int {
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
