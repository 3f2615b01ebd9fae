package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

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

// A tool call stopped by the end of the HTTP request that carried it says
// so, under the code README documents, naming what ended it: its client
// closed the connection, or its deadline passed. The REST call's message,
// written for a REST client ("the request's body did not arrive… Send it
// again"), misled through MCP (MCP audit). A call stopped otherwise, its own
// context cancelled (notifications/cancelled, whose answer no client is
// sent: hygiene QA, the message named that cause), or not stopped, keeps
// the REST message.
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
	carried := func(carrier context.Context) context.Context {
		ctx, stop := boundToCarrier(context.WithValue(context.Background(), carrierKey{}, carrier))
		t.Cleanup(stop)
		return ctx
	}
	carrier, hangUp := context.WithCancel(context.Background())
	hungUp := carried(carrier)
	hangUp()
	<-hungUp.Done()
	late, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	pastDeadline := carried(late)
	<-pastDeadline.Done()

	code, msg := message(hungUp, apierr.RequestTimeout())
	require.Equal(t, apierr.CodeRequestTimeout, code)
	require.Equal(t, "This tool call was stopped before its REST call had read its arguments, because its client "+
		"closed the connection of the HTTP request that carried it: nothing was done.", msg)
	code, msg = message(hungUp, apierr.ClientClosed())
	require.Equal(t, apierr.CodeClientClosedRequest, code)
	require.Contains(t, msg, "This tool call was stopped where it was, because its client closed the connection "+
		"of the HTTP request that carried it: a ratchet_begin not yet granted grants nothing")
	code, msg = message(pastDeadline, apierr.ClientClosed())
	require.Equal(t, apierr.CodeClientClosedRequest, code)
	require.Contains(t, msg, "This tool call was stopped where it was, because the HTTP request that carried it "+
		"reached its deadline: a ratchet_begin not yet granted grants nothing")

	cancelled, cancelCall := context.WithCancel(carried(context.Background()))
	cancelCall() // as the SDK cancels a call a notifications/cancelled names
	for _, ctx := range []context.Context{cancelled, context.Background()} {
		_, msg = message(ctx, apierr.RequestTimeout())
		require.Equal(t, apierr.RequestTimeout().Message, msg, "a call its carrier did not stop is answered as REST answers it")
		_, msg = message(ctx, apierr.ClientClosed())
		require.Equal(t, apierr.ClientClosed().Message, msg)
	}
	_, msg = message(hungUp, apierr.NotFound("effect"))
	require.Equal(t, apierr.NotFound("effect").Message, msg, "another refusal is answered as REST answers it")
}
