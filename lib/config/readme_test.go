package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// README's Configuration table is the reference a deployer reads (docs QA):
// every setting Config reads is a row of it, with the default Config applies
// and "required" exactly where Config requires it, and every row names a
// setting something reads (Config, or the two the local tools read
// themselves).
func TestReadmeConfigurationTableMatchesConfig(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	readme := string(raw)
	start := strings.Index(readme, "\n## Configuration\n")
	require.GreaterOrEqual(t, start, 0, "README has no Configuration section")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}

	type row struct {
		names []string
		dflt  string
	}
	rows := map[string]row{}
	code := regexp.MustCompile("`([^`]*)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a setting's row
		}
		var names []string
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
		dflt := strings.TrimSpace(cells[2])
		if m := code.FindStringSubmatch(dflt); m != nil && strings.HasPrefix(dflt, "`") {
			dflt = m[1] // `4` (local server: `16`) reads 4
		}
		for _, n := range names {
			rows[n] = row{names, dflt}
		}
	}
	require.NotEmpty(t, rows, "no table rows read from README's Configuration section")

	// functions/local (the first three), scripts/dev
	read := map[string]bool{"LOG_REQUESTS": true, "RATCHET_PPROF_ADDR": true, "RATCHET_PPROF_ALLOW_REMOTE": true,
		"RATCHET_DEV_PGDATA": true}
	typ := reflect.TypeOf(Config{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name := f.Tag.Get("envconfig")
		if name == "" {
			continue
		}
		read[name] = true
		r, ok := rows[name]
		require.True(t, ok, "README's Configuration table has no row for %s", name)
		if len(r.names) > 1 {
			continue // a shared row (SIGNUP_*) lists its defaults together
		}
		if f.Tag.Get("required") == "true" {
			require.Equal(t, "required", r.dflt, "%s is required", name)
			continue
		}
		want := f.Tag.Get("default")
		switch {
		case want == "" || want == "0s" && !strings.HasPrefix(r.dflt, "0"):
			// No default, or a duration that is off: README says so in words.
			require.NotEqual(t, "required", r.dflt, "%s is not required", name)
		default:
			require.Equal(t, want, r.dflt, "README's default for %s", name)
		}
	}
	for name := range rows {
		require.True(t, read[name], "README's Configuration table names %s, which nothing reads", name)
	}
}
