// Package answer holds the one bound on what an answer of the API may hold
// (Budget), and how a call narrows it for the answers made on its behalf
// (Within): the MCP endpoint, whose tool results carry a REST answer
// twice, asks its list calls for pages a third of its room.
package answer

import "context"

// Budget is the most one answer holds, in bytes of JSON: the serverless
// platforms refuse a larger one, and the work behind it is lost with it.
// Vercel answers at most 4.5 MB of body (its functions run on Lambda, whose
// 6 MB payload then holds the body base64-encoded); a Lambda Function URL
// answers at most 6 MB of the function's JSON response, in which the body
// is a string (lib/lambdaurl keeps it within 4/3 of the body, as base64
// would). 4 MB leaves room under both for the headers and the rest.
//
// A list's page ends early, with its next cursor, before its items pass it
// (httpapi.NewPage), and an answer that cannot be cut (a reconciliation's)
// is refused before it changes anything; the MCP endpoint holds a batch's
// answers to it together.
const Budget = 4_000_000

type budgetKey struct{}

// Within is ctx under which an answer holds at most n bytes, when n is less
// than what ctx allows already (never less than 1).
func Within(ctx context.Context, n int) context.Context {
	if n < 1 {
		n = 1
	}
	if n >= Of(ctx) {
		return ctx
	}
	return context.WithValue(ctx, budgetKey{}, n)
}

// Of is the most an answer made under ctx holds: Budget, or less where
// Within said so.
func Of(ctx context.Context) int {
	if n, ok := ctx.Value(budgetKey{}).(int); ok {
		return n
	}
	return Budget
}
