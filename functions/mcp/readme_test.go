package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// mcpClients are the clients seed 003 names: the MCP tools work "with Claude
// Code, Claude Desktop, Cursor, and any MCP client — see Get started for
// each".
var mcpClients = []string{"Claude Code", "Cursor", "Claude Desktop"}

// clientConfig is an MCP client's configuration file as README writes it:
// a server reached over streamable HTTP (url, headers; Claude Code's type
// "http") or a process the client launches (command, env).
type clientConfig struct {
	MCPServers map[string]struct {
		Type    string            `json:"type"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
		Command string            `json:"command"`
		Args    []string          `json:"args"`
		Env     map[string]string `json:"env"`
	} `json:"mcpServers"`
}

// README's MCP section gives each client the seed names its configuration,
// and each is used here as that client uses it, with the reader's key and
// server in place of README's rk_… and http://localhost:8787: an
// initialize, tools/list (the nine tools) and a ratchet_begin under the key
// (docs QA: README configured Claude Desktop alone, and nothing ran it).
func TestReadmeClientConfigurationsConnect(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	readme := string(raw)
	start := strings.Index(readme, "\n## MCP\n")
	require.GreaterOrEqual(t, start, 0, "README has no MCP section")
	section := readme[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	// Each client's block follows a paragraph that begins with its name.
	blocks := map[string]string{}
	re := regexp.MustCompile("(?s)```json\n(.*?)\n```")
	for _, m := range re.FindAllStringSubmatchIndex(section, -1) {
		before := strings.TrimRight(section[:m[0]], "\n ")
		para := before[strings.LastIndex(before, "\n\n")+2:]
		for _, c := range mcpClients {
			if strings.HasPrefix(para, c+",") || strings.HasPrefix(para, c+" ") {
				require.NotContains(t, blocks, c, "two configurations of %s", c)
				blocks[c] = section[m[2]:m[3]]
			}
		}
	}

	env := apitest.Start(t)
	ws := env.Signup()
	for i, client := range mcpClients {
		block, ok := blocks[client]
		require.True(t, ok, "README's MCP section has no configuration for %s", client)
		var cfg clientConfig
		require.NoError(t, json.Unmarshal([]byte(block), &cfg), "%s's configuration is not JSON", client)
		require.Len(t, cfg.MCPServers, 1, client)
		srv, ok := cfg.MCPServers["ratchet"]
		require.True(t, ok, "%s names no ratchet server", client)
		key := env.Key(ws, map[string]any{"name": client, "preset": "AGENT"})
		begin := fmt.Sprintf(`{"effect_type":"email.send","idempotency_key":"readme:%d"}`, i)
		switch {
		case srv.URL != "":
			u, err := url.Parse(srv.URL)
			require.NoError(t, err, client)
			require.Equal(t, "http://localhost:8787", u.Scheme+"://"+u.Host, "%s: README's server", client)
			require.Equal(t, "/api/v1/mcp", u.Path, client)
			if client == "Claude Code" {
				require.Equal(t, "http", srv.Type, "Claude Code reads a url only under type http")
			}
			require.Equal(t, map[string]string{"Authorization": "Bearer rk_…"}, srv.Headers, client)
			header := http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
			for k, v := range srv.Headers {
				header.Set(k, strings.ReplaceAll(v, "rk_…", key))
			}
			post := func(body string) map[string]any {
				req, err := http.NewRequest("POST", env.Server.URL+u.Path, strings.NewReader(body))
				require.NoError(t, err)
				req.Header = header.Clone()
				res, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer res.Body.Close()
				require.Equal(t, http.StatusOK, res.StatusCode, client)
				var answer map[string]any
				require.NoError(t, json.NewDecoder(res.Body).Decode(&answer))
				return answer
			}
			post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
			requireNineToolsAndAGrant(t, client, post(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`),
				post(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ratchet_begin","arguments":`+begin+`}}`))
		default:
			require.Equal(t, "ratchet-mcp", filepath.Base(srv.Command), "%s launches the stdio binary", client)
			require.Empty(t, srv.Args, client)
			names := make([]string, 0, len(srv.Env))
			for k := range srv.Env {
				names = append(names, k)
			}
			sort.Strings(names)
			require.Equal(t, []string{"RATCHET_API_KEY", "RATCHET_BASE_URL"}, names, "%s: the settings ratchet-mcp reads", client)
			require.Equal(t, "http://localhost:8787", srv.Env["RATCHET_BASE_URL"], client)
			require.Equal(t, "rk_…", srv.Env["RATCHET_API_KEY"], client)
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "RATCHET_MCP_MAIN=1", "RATCHET_BASE_URL="+env.Server.URL, "RATCHET_API_KEY="+key)
			cmd.Stdin = strings.NewReader(strings.Join([]string{
				`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
				`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
				`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
				`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ratchet_begin","arguments":` + begin + `}}`,
			}, "\n") + "\n")
			out, err := cmd.Output()
			require.NoError(t, err, "%s: ratchet-mcp", client)
			byID := map[string]map[string]any{}
			sc := bufio.NewScanner(bytes.NewReader(out))
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var m map[string]any
				require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "not JSON-RPC: %s", sc.Text())
				byID[fmt.Sprint(m["id"])] = m
			}
			requireNineToolsAndAGrant(t, client, byID["2"], byID["3"])
		}
	}
}

// requireNineToolsAndAGrant holds a tools/list answer to the nine tools and
// a ratchet_begin answer to an execute.
func requireNineToolsAndAGrant(t *testing.T, client string, list, call map[string]any) {
	t.Helper()
	result, ok := list["result"].(map[string]any)
	require.True(t, ok, "%s: tools/list answered %v", client, list)
	require.Len(t, result["tools"], 9, client)
	result, ok = call["result"].(map[string]any)
	require.True(t, ok, "%s: ratchet_begin answered %v", client, call)
	require.NotEqual(t, true, result["isError"], "%s: ratchet_begin answered %v", client, result)
	require.Equal(t, "execute", result["structuredContent"].(map[string]any)["decision"], client)
}
