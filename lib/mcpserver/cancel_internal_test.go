package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apierr"
)

// answering is a Caller that answers every call with the API's refusal e.
type answering struct{ e *apierr.Error }

func (a answering) Call(context.Context, string, string, string, []byte) (int, []byte, error) {
	body, err := json.Marshal(map[string]any{"error": a.e.Wire()})
	return a.e.Status, body, err
}

// A tool call stopped by its MCP request's cancellation, or by the end of
// the HTTP request that carried it, says so, under the code README
// documents: the REST call's message, written for a REST client ("the
// request's body did not arrive… Send it again"), misled through MCP (MCP
// audit). A call not stopped keeps the REST message.
func TestAStoppedToolCallSaysItWasStopped(t *testing.T) {
	message := func(ctx context.Context, e *apierr.Error) (code, msg string) {
		t.Helper()
		res, err := call(ctx, answering{e}, nil, "", http.MethodPost, beginPath, map[string]any{"effect_type": "x"})
		require.NoError(t, err)
		require.True(t, res.IsError)
		wire := res.StructuredContent.(map[string]any)["error"].(map[string]any)
		var text map[string]map[string]any
		require.NoError(t, json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &text))
		require.Equal(t, wire["message"], text["error"]["message"], "the text says what the structured content says")
		return wire["code"].(string), wire["message"].(string)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	carrier, hangUp := context.WithCancel(context.Background())
	hungUp, stop := boundToCarrier(context.WithValue(context.Background(), carrierKey{}, carrier))
	defer stop()
	hangUp()
	<-hungUp.Done()

	code, msg := message(cancelled, apierr.RequestTimeout())
	require.Equal(t, apierr.CodeRequestTimeout, code)
	require.Equal(t, "This tool call was stopped before its REST call had read its arguments, because its MCP "+
		"request was cancelled (notifications/cancelled): nothing was done.", msg)
	code, msg = message(hungUp, apierr.ClientClosed())
	require.Equal(t, apierr.CodeClientClosedRequest, code)
	require.Contains(t, msg, "This tool call was stopped where it was, because its HTTP request ended (the client "+
		"hung up, or the request's time ran out): a ratchet_begin not yet granted grants nothing")

	_, msg = message(context.Background(), apierr.RequestTimeout())
	require.Equal(t, apierr.RequestTimeout().Message, msg, "a call not stopped is answered as REST answers it")
	_, msg = message(cancelled, apierr.NotFound("effect"))
	require.Equal(t, apierr.NotFound("effect").Message, msg, "another refusal is answered as REST answers it")
}
