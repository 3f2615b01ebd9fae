package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCPUSpanReportLine(t *testing.T) {
	s := cpuSpan{wall: 2 * time.Second, machine: 3 * time.Second, own: time.Second,
		from: 10 * time.Second, to: 12 * time.Second, ok: true}
	var b bytes.Buffer
	s.report(&b, "x.fig", 1000)
	require.Equal(t, "# cpu x.fig: wall 2.00 s, machine busy 3.00 s, this process 1.00 s, "+
		"the rest (the database, if nothing else runs) 2.00 s; per op: this process 1000 µs, the rest 2000 µs; "+
		"perf --time 10.000000,12.000000\n", b.String())

	b.Reset()
	cpuSpan{}.report(&b, "x.fig", 1) // not measured (not Linux): nothing printed
	require.Empty(t, b.String())
}

// The window sees CPU this process burns, and the machine's busy time
// includes it (to /proc/stat's 10 ms resolution).
func TestCPUWindowSeesThisProcessesWork(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the CPU window reads Linux's /proc/stat")
	}
	w := startCPUWindow()
	// Spin until this process has used 60 ms of CPU, however busy the
	// machine is (other test packages share it).
	for deadline := time.Now().Add(10 * time.Second); ownCPU()-w.own < 60*time.Millisecond && time.Now().Before(deadline); {
	}
	s := w.stop()
	require.True(t, s.ok)
	require.GreaterOrEqual(t, s.own, 60*time.Millisecond)
	require.GreaterOrEqual(t, s.machine, s.own-30*time.Millisecond)
	require.Greater(t, s.to, s.from)
	var b bytes.Buffer
	s.report(&b, "spin", 0)
	require.True(t, strings.HasPrefix(b.String(), "# cpu spin: wall "), b.String())
	require.NotContains(t, b.String(), "per op")
}
