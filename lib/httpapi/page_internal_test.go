package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/answer"
)

type pageItem struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

// A page ends before an item would take it past the answer's budget, with
// the cursor of the last item it holds, and holds one item whatever its
// size; pages followed by their cursors answer every item once (QA: a list
// of 200 items of a few KB each answered more than Vercel and Lambda
// deliver).
func TestPageEndsBeforeItsBudget(t *testing.T) {
	t.Parallel()
	items := make([]pageItem, 30)
	for i := range items {
		// Escapes count as they are written: each quote is two bytes.
		items[i] = pageItem{ID: fmt.Sprintf("it_%02d", i), Text: strings.Repeat(`"<&`, 100*(i%4+1))}
	}
	cursorOf := func(it pageItem) string { return it.ID }
	for _, budget := range []int{1, 500, 2_000, 5_000, 20_000, 1 << 20} {
		ctx := answer.Within(context.Background(), budget)
		var seen []string
		for pages := 0; ; pages++ {
			require.Less(t, pages, len(items)+1, "pages end")
			start := len(seen)                                  // the rows after the cursor
			fetched := items[start:min(len(items), start+10+1)] // limit 10, fetched with one more
			body, err := NewPage(ctx, fetched, 10, cursorOf)
			require.NoError(t, err)
			raw := body.(rawAnswer)
			var page Page[pageItem]
			require.NoError(t, json.Unmarshal(raw, &page))
			require.NotEmpty(t, page.Data, "a page holds at least one item")
			require.LessOrEqual(t, len(page.Data), 10, "and at most limit")
			if len(page.Data) > 1 {
				require.LessOrEqual(t, len(raw), budget, "a page of more than one item stays within its budget")
			}
			// The bytes are those of the page as json.Marshal writes it,
			// less HTML escaping.
			want, err := json.Marshal(page)
			require.NoError(t, err)
			require.JSONEq(t, string(want), string(raw))
			require.NotContains(t, string(raw), `\u003c`)
			for _, it := range page.Data {
				seen = append(seen, it.ID)
			}
			if page.NextCursor == nil {
				break
			}
			require.Equal(t, page.Data[len(page.Data)-1].ID, *page.NextCursor)
			if budget >= 1<<20 {
				require.Len(t, page.Data, 10, "a budget that holds the page ends it at limit")
			}
		}
		require.Len(t, seen, len(items), "budget %d: every item once", budget)
		for i, id := range seen {
			require.Equal(t, items[i].ID, id)
		}
	}
}

// A page's cut is exact: the page whose next item would pass the budget by
// a byte ends before it, and one that reaches it exactly holds it.
func TestPageCutIsExact(t *testing.T) {
	t.Parallel()
	items := []pageItem{{ID: "a", Text: "x"}, {ID: "b", Text: "y"}, {ID: "c", Text: "z"}}
	cursorOf := func(it pageItem) string { return it.ID }
	whole, err := NewPage(context.Background(), items[:2], 2, cursorOf)
	require.NoError(t, err)
	two, err := NewPage(context.Background(), items, 2, cursorOf)
	require.NoError(t, err)
	exact := len(two.(rawAnswer))
	for budget, want := range map[int]int{exact: 2, exact - 1: 1} {
		body, err := NewPage(answer.Within(context.Background(), budget), items, 2, cursorOf)
		require.NoError(t, err)
		var page Page[pageItem]
		require.NoError(t, json.Unmarshal(body.(rawAnswer), &page))
		require.Len(t, page.Data, want, "budget %d", budget)
		require.NotNil(t, page.NextCursor)
	}
	var page Page[pageItem]
	require.NoError(t, json.Unmarshal(whole.(rawAnswer), &page))
	require.Nil(t, page.NextCursor, "the last page says so")
	empty, err := NewCamelPage(context.Background(), []pageItem(nil), 5, cursorOf)
	require.NoError(t, err)
	require.Equal(t, `{"data":[],"nextCursor":null}`, string(empty.(rawAnswer)))
}
