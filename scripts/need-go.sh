# Sourced by scripts/dev and scripts/test (from the repository's root): stop
# at once, saying what to install, when there is no go that can build the
# project, rather than with "gofmt: command not found" or an old go's
# "invalid go version"; and set GOFMT to the gofmt of the toolchain go.mod
# selects (the one on PATH may be an older release's, which formats
# differently from the go that builds).
need_go() {
	local want root
	want=$(sed -n 's/^go //p' go.mod)
	if ! command -v go >/dev/null 2>&1; then
		echo "$1: no go on PATH. Install Go $want or later (https://go.dev/dl/); Go 1.21 or later downloads $want itself on first use." >&2
		exit 1
	fi
	if ! root=$(go env GOROOT 2>&1); then
		echo "$1: $(go version 2>/dev/null || echo 'this go') cannot build the project, which needs Go $want or later (Go 1.21 or later downloads it itself on first use); go said: $root" >&2
		exit 1
	fi
	GOFMT="$root/bin/gofmt"
}
