package main

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// output is what one suite printed in one round: its figures, its comment
// lines (configuration, TODO markers) and whether it failed.
type output struct {
	Suite    string
	Round    int
	Values   map[string]float64
	Comments []string
	Err      error
}

// parseOutput reads `name value` lines; `#` lines are kept as comments and
// anything else is an error (a suite that prints garbage on stdout is
// broken, and silently ignoring it would hide a missing figure).
func parseOutput(r io.Reader) (map[string]float64, []string, error) {
	values := map[string]float64{}
	var comments []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			comments = append(comments, line)
		default:
			f := strings.Fields(line)
			if len(f) != 2 {
				return values, comments, fmt.Errorf("not a `name value` line: %q", line)
			}
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return values, comments, fmt.Errorf("not a number in %q", line)
			}
			if _, dup := values[f[0]]; dup {
				return values, comments, fmt.Errorf("figure %s printed twice", f[0])
			}
			values[f[0]] = v
		}
	}
	return values, comments, sc.Err()
}

// table is every figure of the run, by round.
type table struct {
	Rounds int
	Values map[string][]*float64 // figure → value per round (nil: not measured that round)
}

func newTable(rounds int, outs []output) *table {
	t := &table{Rounds: rounds, Values: map[string][]*float64{}}
	for _, o := range outs {
		for name, v := range o.Values {
			if t.Values[name] == nil {
				t.Values[name] = make([]*float64, rounds)
			}
			t.Values[name][o.Round-1] = &v
		}
	}
	return t
}

// Names lists the figures grouped by side (ratchet, river, pgbench) then by
// name.
func (t *table) Names() []string {
	names := make([]string, 0, len(t.Values))
	for n := range t.Values {
		names = append(names, n)
	}
	order := func(n string) int {
		switch {
		case strings.HasPrefix(n, "ratchet."):
			return 0
		case strings.HasPrefix(n, "river."):
			return 1
		default:
			return 2
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if d := order(a) - order(b); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	return names
}

// ratioValues divides num by den within each round (figures from different
// rounds are never compared: the machine's load differs between them).
func (t *table) ratioValues(num, den string) []*float64 {
	out := make([]*float64, t.Rounds)
	a, b := t.Values[num], t.Values[den]
	if a == nil || b == nil {
		return out
	}
	for i := range out {
		if a[i] != nil && b[i] != nil && *b[i] != 0 {
			r := *a[i] / *b[i]
			out[i] = &r
		}
	}
	return out
}

// median of the rounds that have a value; ok is false when none has.
func median(vals []*float64) (float64, bool) {
	var s []float64
	for _, v := range vals {
		if v != nil {
			s = append(s, *v)
		}
	}
	if len(s) == 0 {
		return 0, false
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

func formatValue(v float64) string {
	if v >= 100 || v == float64(int64(v)) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func formatRatio(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "×" }

// writeTables writes the figures table and the ratio table in Markdown, ready
// to paste into BENCHMARKS.md.
func (t *table) writeTables(w io.Writer) {
	header := func(first string) {
		fmt.Fprintf(w, "| %s |", first)
		for r := 1; r <= t.Rounds; r++ {
			fmt.Fprintf(w, " round %d |", r)
		}
		fmt.Fprintln(w, " median |")
		fmt.Fprint(w, "|---|")
		for range t.Rounds + 1 {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprintln(w)
	}
	row := func(name string, vals []*float64, f func(float64) string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, v := range vals {
			if v == nil {
				fmt.Fprint(w, " — |")
			} else {
				fmt.Fprintf(w, " %s |", f(*v))
			}
		}
		if m, ok := median(vals); ok {
			fmt.Fprintf(w, " **%s** |\n", f(m))
		} else {
			fmt.Fprintln(w, " — |")
		}
	}

	fmt.Fprintf(w, "### Figures (median of %d round(s))\n\n", t.Rounds)
	header("figure")
	for _, n := range t.Names() {
		row("`"+n+"`", t.Values[n], formatValue)
	}

	fmt.Fprint(w, "\n### Ratios (computed within each round, then the median)\n\n")
	header("ratio")
	var waiting []string
	for _, r := range ratios {
		vals := t.ratioValues(r.Num, r.Den)
		if _, ok := median(vals); !ok {
			waiting = append(waiting, fmt.Sprintf("`%s` / `%s`", r.Num, r.Den))
			continue
		}
		row(fmt.Sprintf("%s: `%s` / `%s`", r.Label, r.Num, r.Den), vals, formatRatio)
	}
	if len(waiting) > 0 {
		fmt.Fprintf(w, "\nRatios waiting for a figure: %s.\n", strings.Join(waiting, ", "))
	}
}
