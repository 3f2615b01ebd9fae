package main

import (
	"fmt"
	"io"
	"time"
)

// cpuWindow records where a figure's CPU went: the whole machine's busy time
// (from /proc/stat, Linux only) and this process's own (server and clients),
// so that the rest is, on a machine running nothing else, the database's.
// It is a comment line in the output, not a figure.
type cpuWindow struct {
	start     time.Time
	mono      time.Duration // CLOCK_MONOTONIC, perf's -k CLOCK_MONOTONIC time base
	busy, own time.Duration
	ok        bool
}

func startCPUWindow() cpuWindow {
	busy, ok := machineBusy()
	return cpuWindow{start: time.Now(), mono: monotonic(), busy: busy, own: ownCPU(), ok: ok}
}

// cpuSpan is what a cpuWindow saw.
type cpuSpan struct {
	wall, machine, own time.Duration
	from, to           time.Duration // CLOCK_MONOTONIC
	ok                 bool
}

func (c cpuWindow) stop() cpuSpan {
	busy, ok := machineBusy()
	return cpuSpan{wall: time.Since(c.start), from: c.mono, to: monotonic(), machine: busy - c.busy, own: ownCPU() - c.own, ok: ok && c.ok}
}

// report writes "# cpu <label>: ..." to w, per op when n > 0.
func (s cpuSpan) report(w io.Writer, label string, n int) {
	if !s.ok {
		return
	}
	rest := s.machine - s.own
	fmt.Fprintf(w, "# cpu %s: wall %.2f s, machine busy %.2f s, this process %.2f s, the rest (the database, if nothing else runs) %.2f s",
		label, s.wall.Seconds(), s.machine.Seconds(), s.own.Seconds(), rest.Seconds())
	if n > 0 {
		fmt.Fprintf(w, "; per op: this process %.0f µs, the rest %.0f µs", float64(s.own.Microseconds())/float64(n), float64(rest.Microseconds())/float64(n))
	}
	// perf record -k CLOCK_MONOTONIC … ; perf report --time <from>,<to>
	fmt.Fprintf(w, "; perf --time %.6f,%.6f\n", s.from.Seconds(), s.to.Seconds())
}
